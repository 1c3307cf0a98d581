package stock_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
)

func TestMain(m *testing.M) { os.Exit(redistest.Run(m)) }

// The helpers every test of the package uses, shared with the other packages' tests and the
// system tests (internal/testkit).
var (
	eachBackend       = testkit.EachBackend
	eachBackendSerial = testkit.EachBackendSerial
	newReserver       = testkit.NewReserver
	levels            = testkit.Levels
	ledger            = testkit.Ledger
	checkLedger       = testkit.CheckLedger
	drain             = testkit.Drain
	outboxLen         = testkit.OutboxLen
	available         = testkit.Available
)

// must requires the call it is given to succeed, and returns its receipt:
// rc := must(t)(r.Deduct(ctx, req)).
func must(t *testing.T, msgAndArgs ...any) func(stock.Receipt, error) stock.Receipt {
	return func(rc stock.Receipt, err error) stock.Receipt {
		t.Helper()
		require.NoError(t, err, msgAndArgs...)
		return rc
	}
}

// mustFail requires the call it is given to fail with want, and returns its receipt:
// rc := mustFail(t, stock.ErrSoldOut)(r.Deduct(ctx, req)).
func mustFail(t *testing.T, want error, msgAndArgs ...any) func(stock.Receipt, error) stock.Receipt {
	return func(rc stock.Receipt, err error) stock.Receipt {
		t.Helper()
		require.ErrorIs(t, err, want, msgAndArgs...)
		return rc
	}
}
