package stock_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/stockops"
)

func TestMain(m *testing.M) { os.Exit(redistest.Run(m)) }

// ctx is the context of the tests' calls: none is cancelled from outside the test that makes it.
var ctx = context.Background()

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

// mustCart is must for a cart: rc := mustCart(t)(r.DeductMany(ctx, cart)).
func mustCart(t *testing.T, msgAndArgs ...any) func(stock.CartReceipt, error) stock.CartReceipt {
	return func(rc stock.CartReceipt, err error) stock.CartReceipt {
		t.Helper()
		require.NoError(t, err, msgAndArgs...)
		return rc
	}
}

// mustFailCart is mustFail for a cart.
func mustFailCart(t *testing.T, want error, msgAndArgs ...any) func(stock.CartReceipt, error) stock.CartReceipt {
	return func(rc stock.CartReceipt, err error) stock.CartReceipt {
		t.Helper()
		require.ErrorIs(t, err, want, msgAndArgs...)
		return rc
	}
}

// newRelay is stockops.NewRelay, which must succeed.
func newRelay(t *testing.T, r *stock.Reserver, store stock.Store, pub stock.Publisher, o *stock.RelayOptions) *stockops.Relay {
	t.Helper()
	rl, err := stockops.NewRelay(r, store, pub, o)
	require.NoError(t, err)
	return rl
}

// newReconciler is stockops.NewReconciler, which must succeed.
func newReconciler(t *testing.T, r *stock.Reserver, store stock.Store, o *stock.ReconcileOptions) *stockops.Reconciler {
	t.Helper()
	rec, err := stockops.NewReconciler(r, store, o)
	require.NoError(t, err)
	return rec
}

// entry is id's ledger entry of sku, which must exist.
func entry(t *testing.T, r *stock.Reserver, sku, id string) stock.Entry {
	t.Helper()
	e, err := r.Ledger(context.Background(), sku, id)
	require.NoError(t, err)
	return e
}

// remaining is what the store has left of sku, which it must know.
func remaining(t *testing.T, store stock.Store, sku string) int64 {
	t.Helper()
	n, err := store.Remaining(context.Background(), sku)
	require.NoError(t, err)
	return n
}

// bucketOf is the bucket of n that a split item sends a user (or, without a user, a request id)
// to: FNV-1a of it, mod n (README "Routing"; restated so that a test can pick its keys).
func bucketOf(key string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % uint32(n))
}

// keyIn returns the first name prefix-<j> that goes to bucket b of n.
func keyIn(prefix string, b, n int) string {
	for j := 0; ; j++ {
		if k := fmt.Sprintf("%s-%d", prefix, j); bucketOf(k, n) == b {
			return k
		}
	}
}

// eachReserver runs f on every backend, with a Reserver of opts on it.
func eachReserver(t *testing.T, opts []stock.Option, f func(t *testing.T, c rueidis.Client, r *stock.Reserver)) {
	t.Helper()
	eachBackend(t, func(t *testing.T, c rueidis.Client) { f(t, c, newReserver(t, c, opts...)) })
}

// logRecords is a slog handler that keeps the records of warnings and errors, each as
// "level=LEVEL message attrs".
type logRecords struct {
	mu   sync.Mutex
	msgs []string
}

func (w *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (w *logRecords) WithAttrs([]slog.Attr) slog.Handler       { return w }
func (w *logRecords) WithGroup(string) slog.Handler            { return w }
func (w *logRecords) Handle(_ context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return nil
	}
	msg := "level=" + r.Level.String() + " " + r.Message
	r.Attrs(func(a slog.Attr) bool { msg += " " + a.String(); return true })
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, msg)
	return nil
}

// count returns how many kept records contain s.
func (w *logRecords) count(s string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, m := range w.msgs {
		if strings.Contains(m, s) {
			n++
		}
	}
	return n
}

// String returns the kept records, one a line.
func (w *logRecords) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.msgs, "\n")
}

// errOf is the error of a call that returns a value and an error: errOf(r.Deduct(ctx, req)).
func errOf[T any](_ T, err error) error { return err }
