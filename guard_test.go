package stock_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// TestFailoverGuard: a restarted primary fences deducts until a reconcile pass, in this
// process and in another one sharing the Redis.
func TestFailoverGuard(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skip("real-server test: set STOCK_REDIS_SERVER to run it")
	}
	ctx := context.Background()
	srv := redistest.StartServer(t, "--appendonly", "yes", "--appendfsync", "always")
	r := newReserver(t, srv.Client(t))
	other := newReserver(t, srv.Client(t))
	g, g2 := stockops.NewFailoverGuard(r), stockops.NewFailoverGuard(other)
	fenced, err := g.Check(ctx)
	require.NoError(t, err)
	require.False(t, fenced, "a new deployment records its baseline")

	store := memstore.New()
	require.NoError(t, r.Load(ctx, "A", 10))
	require.NoError(t, store.Load(ctx, "A", 10))
	must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1}))
	fenced, err = g2.Check(ctx)
	require.NoError(t, err)
	require.False(t, fenced)

	srv.Kill()
	srv.Start() // a new run id; the data survives (AOF, fsync always)
	require.Eventually(t, func() bool {
		fenced, err := g.Check(ctx)
		return err == nil && fenced
	}, 10e9, 50e6)
	mustFail(t, stock.ErrFailover)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", Qty: 1}))
	mustFail(t, stock.ErrFailover)(r.Hold(ctx, stock.Request{SKU: "A", ID: "h2", Qty: 1}, 60e9))
	must(t, "restores still work while fenced")(r.Restore(ctx, "A", "o1"))

	rec := newReconciler(t, r, store, nil)
	_, err = rec.Once(ctx)
	require.NoError(t, err)
	fenced, err = g.Check(ctx)
	require.NoError(t, err)
	assert.False(t, fenced, "a complete pass lifts the fence")
	must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", Qty: 1}))
	// The other process learns of the pass from Redis.
	fenced, err = g2.Check(ctx)
	require.NoError(t, err)
	assert.False(t, fenced)
}
