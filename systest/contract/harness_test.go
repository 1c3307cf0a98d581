package contract_test

import (
	"context"
	"os"
	"sync"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // the database/sql drivers of the SQL stores the tests open
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
)

// TestMain starts and stops the real servers the tests ask for (redistest.Run).
func TestMain(m *testing.M) { os.Exit(redistest.Run(m)) }

// ctx is the context of every call a test makes without a deadline of its own.
var ctx = context.Background()

// errFrom is the error of a call whose value the test does not need, so that one assertion
// states what the call must answer: require.NoError(t, errFrom(r.Deduct(ctx, req))).
func errFrom[T any](_ T, err error) error { return err }

// must requires that a call answered no error and gives its value:
// rc := must(r.Deduct(ctx, req))(t, "what the call is").
func must[T any](v T, err error) func(t *testing.T, msgAndArgs ...any) T {
	return func(t *testing.T, msgAndArgs ...any) T {
		t.Helper()
		require.NoError(t, err, msgAndArgs...)
		return v
	}
}

// parallel runs f(0) … f(n-1) in goroutines at once and waits for them all.
func parallel(n int, f func(i int)) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { f(i) })
	}
	wg.Wait()
}

// req is the request of qty units of sku under id, by user ("" for none).
func req(sku, id, user string, qty int64) stock.Request {
	return stock.Request{SKU: sku, ID: id, User: user, Qty: qty}
}
