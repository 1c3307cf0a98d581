// Package testkit holds the helpers the tests of every package of this repository share: the
// backends a test runs on (miniredis and, with STOCK_REDIS_SERVER set, a real standalone server
// and a real 3-master cluster), a Reserver, the levels and ledger checks, and draining a relay.
package testkit

import (
	"context"
	"hash/fnv"
	"os"
	"strconv"
	"testing"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/stockops"
)

// EachBackend runs f on miniredis and, when STOCK_REDIS_SERVER is set, on a real standalone
// redis-server and a real 3-master cluster, each on a clean database.
func EachBackend(t *testing.T, f func(t *testing.T, c rueidis.Client)) {
	t.Helper()
	Backends(t, func(t *testing.T, b redistest.Backend) { f(t, b.Client(t)) })
}

// Backends is EachBackend with the backend itself, for a test that needs more than one client
// of it (Pair), its name or whether it is a real server.
func Backends(t *testing.T, f func(t *testing.T, b redistest.Backend)) {
	t.Helper()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			f(t, b)
		})
	}
}

// ParallelOnMiniredis marks t parallel when it runs on servers of its own only: miniredis (a
// new one for each client) and no shared database, as in the quick tier. With STOCK_REDIS_SERVER
// or a database's variable set, t shares servers that the other tests flush, and runs alone.
// The quick tier's long tests call it, so that their waits on real time overlap.
func ParallelOnMiniredis(t *testing.T) {
	t.Helper()
	if redistest.ServerBinary(t) != "" || os.Getenv("STOCK_TEST_POSTGRES") != "" || os.Getenv("STOCK_TEST_MYSQL") != "" {
		return
	}
	t.Parallel()
}

// EachBackendSerial is EachBackend one backend at a time, for tests whose holds live for a
// fraction of a second of real time: beside other backends' traffic on a loaded machine, a
// hold can expire before the test reads it.
func EachBackendSerial(t *testing.T, f func(t *testing.T, c rueidis.Client)) {
	t.Helper()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) { f(t, b.Client(t)) })
	}
}

// NewReserver returns a Reserver on c with opts, failing the test on an error.
func NewReserver(t *testing.T, c rueidis.Client, opts ...stock.Option) *stock.Reserver {
	t.Helper()
	r, err := stock.New(c, opts...)
	require.NoError(t, err)
	return r
}

// Levels returns an item's levels, asserting loaded = available + held + sold.
func Levels(t *testing.T, r *stock.Reserver, sku string) stock.Levels {
	t.Helper()
	l, err := r.Levels(context.Background(), sku)
	require.NoError(t, err)
	require.Equal(t, l.Loaded, l.Available+l.Held+l.Sold, "loaded = available + held + sold: %+v", l)
	require.GreaterOrEqual(t, l.Available, int64(0))
	return l
}

// Ledger returns every entry of an item by id.
func Ledger(t *testing.T, r *stock.Reserver, sku string) map[string]stock.Entry {
	t.Helper()
	m := map[string]stock.Entry{}
	for e, err := range stockops.Entries(context.Background(), r, sku) {
		require.NoError(t, err)
		_, dup := m[e.ID]
		require.False(t, dup, "entry %s seen twice", e.ID)
		m[e.ID] = e
	}
	return m
}

// CheckLedger asserts that the ledger explains the levels: the units of taken deduct entries add
// up to Sold, and loaded = initial + restocks.
func CheckLedger(t *testing.T, r *stock.Reserver, sku string, initial int64) (l stock.Levels, entries map[string]stock.Entry) {
	t.Helper()
	l = Levels(t, r, sku)
	entries = Ledger(t, r, sku)
	var sold, held, restocked int64
	for _, e := range entries {
		switch {
		case e.Kind == stock.KindRestock:
			restocked += e.Qty
		case e.Taken() && e.State == stock.StateHeld:
			held += e.Qty
		case e.Taken():
			sold += e.Qty
		}
	}
	assert.Equal(t, l.Sold, sold, "sold per the ledger")
	assert.Equal(t, l.Held, held, "held per the ledger")
	assert.Equal(t, l.Loaded, initial+restocked, "loaded per the ledger")
	return l, entries
}

// Drain runs relay passes until one claims nothing, and returns their stats summed.
func Drain(t *testing.T, rl *stockops.Relay) stockops.RelayStats {
	t.Helper()
	var all stockops.RelayStats
	for range 1000 {
		st, err := rl.Once(context.Background())
		require.NoError(t, err)
		all.Add(st)
		if st.Claimed == 0 {
			return all
		}
	}
	t.Fatal("relay did not drain")
	return all
}

// OutboxLen returns the number of events in an item's outbox (default prefix).
func OutboxLen(t *testing.T, c rueidis.Client, sku string) int64 {
	n, err := c.Do(context.Background(), c.B().Zcard().Key("stock:{"+sku+"}:o").Build()).AsInt64()
	require.NoError(t, err)
	return n
}

// Err drops the first result of a call, for a check of its error alone:
// require.NoError(t, testkit.Err(r.Deduct(ctx, req))).
func Err[T any](_ T, err error) error { return err }

// Available returns the available units of a Levels call.
func Available(l stock.Levels, err error) (int64, error) { return l.Available, err }

// NewRelay is stockops.NewRelay, failing the test on an error.
func NewRelay(t testing.TB, r *stock.Reserver, store stock.Store, pub stock.Publisher, o *stock.RelayOptions) *stockops.Relay {
	t.Helper()
	rl, err := stockops.NewRelay(r, store, pub, o)
	require.NoError(t, err)
	return rl
}

// NewReconciler is stockops.NewReconciler, failing the test on an error.
func NewReconciler(t testing.TB, r *stock.Reserver, store stock.Store, o *stock.ReconcileOptions) *stockops.Reconciler {
	t.Helper()
	rc, err := stockops.NewReconciler(r, store, o)
	require.NoError(t, err)
	return rc
}

// HomeBucket is the bucket of n that a split item sends a user (or, without a user, a request
// id) to: FNV-1a of it, mod n (README "Routing"; restated so that a test can pick its keys).
func HomeBucket(key string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % uint32(n))
}

// CartRefused requires err to be a *stock.CartError naming the refusing item sku and wrapping
// want.
func CartRefused(t *testing.T, err error, sku string, want error, msgAndArgs ...any) {
	t.Helper()
	var ce *stock.CartError
	require.ErrorAs(t, err, &ce, msgAndArgs...)
	assert.Equal(t, sku, ce.SKU, msgAndArgs...)
	assert.ErrorIs(t, err, want, msgAndArgs...)
}

// Sell deducts one unit of sku n times, in order: request idPrefix<i>, of user userPrefix<i>
// (no user when userPrefix is empty), failing the test on an error.
func Sell(t *testing.T, r *stock.Reserver, sku, idPrefix, userPrefix string, n int) {
	t.Helper()
	for i := range n {
		req := stock.Request{SKU: sku, ID: idPrefix + strconv.Itoa(i), Qty: 1}
		if userPrefix != "" {
			req.User = userPrefix + strconv.Itoa(i)
		}
		_, err := r.Deduct(context.Background(), req)
		require.NoError(t, err, "sale %s", req.ID)
	}
}
