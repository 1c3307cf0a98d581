package contract_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the database/sql drivers of the SQL stores the tests open
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
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

// takenByID is the units of each of ids that sku's ledger holds as taken (ids it does not know
// are left out).
func takenByID(t *testing.T, r *stock.Reserver, sku string, ids []string) map[string]int64 {
	t.Helper()
	taken := map[string]int64{}
	for _, id := range ids {
		ent, err := r.Ledger(ctx, sku, id)
		if errors.Is(err, stock.ErrUnknownID) {
			continue
		}
		require.NoError(t, err)
		if ent.Taken() {
			taken[id] = ent.Qty
		}
	}
	return taken
}

// eventuallyDelivered requires that within d the outbox of each of skus is empty, with no dead
// letter.
func eventuallyDelivered(t *testing.T, r *stock.Reserver, d time.Duration, skus ...string) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, sku := range skus {
			p, dead, err := stockops.Pending(ctx, r, sku)
			if err != nil || p != 0 || dead != 0 {
				return false
			}
		}
		return true
	}, d, 50*time.Millisecond, "every event of %v delivered", skus)
}

// eventuallyRemaining requires that within d the store has want units of each of skus left.
func eventuallyRemaining(t *testing.T, store *memstore.Store, d time.Duration, want int64, skus ...string) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, sku := range skus {
			if n, err := store.Remaining(ctx, sku); err != nil || n != want {
				return false
			}
		}
		return true
	}, d, 20*time.Millisecond, "the store reaches %d remaining of %v", want, skus)
}
