package stock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// TestFreshDeploymentIsNotFenced: items loaded on a Redis that never had an epoch, then Run
// started: the failover guard does not take the new deployment for a failover, so deducts
// right after Run starts are taken, and Ready returns at once. (miniredis answers no INFO: no
// guard runs there, and Ready returns nil.)
func TestFreshDeploymentIsNotFenced(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		store := memstore.New()
		for _, sku := range []string{"A", "B"} {
			_, err := stockops.Preheat(ctx, r, store, sku, 10)
			require.NoError(t, err)
		}
		// The guard's first check, as Run makes it before its first reconcile pass.
		if fenced, err := stockops.NewFailoverGuard(r).Check(ctx); err == nil {
			require.False(t, fenced, "a new deployment is fenced as if it had failed over")
		}
		must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "first", Qty: 1}))

		runCtx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = r.Run(runCtx, stock.RunOptions{Store: store, Reconcile: &stock.ReconcileOptions{Interval: -1}})
		}()
		defer func() { stop(); wg.Wait() }()
		readyCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		require.NoError(t, r.Ready(readyCtx))
		// No reconcile pass runs (Interval -1): nothing but the baseline can lift a fence.
		for i := range 10 {
			must(t)(r.Deduct(ctx, stock.Request{SKU: "B", ID: "o" + string(rune('a'+i)), Qty: 1}))
		}
	})
}

// TestReadyWaitsForThePassAfterAFailover: a restarted primary still fences (Ready waits and
// says why when its context ends), and Ready returns once a reconcile pass ran; a deployment
// with items and no epoch (its epoch lost) waits as well.
func TestReadyWaitsForThePassAfterAFailover(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skip("real-server test: set STOCK_REDIS_SERVER to run it")
	}
	ctx := context.Background()
	srv := redistest.StartServer(t, "--appendonly", "yes", "--appendfsync", "always")
	c := srv.Client(t)
	r := newReserver(t, c)
	store := memstore.New()
	_, err := stockops.Preheat(ctx, r, store, "A", 10)
	require.NoError(t, err)
	g := stockops.NewFailoverGuard(r)
	fenced, err := g.Check(ctx)
	require.NoError(t, err)
	require.False(t, fenced)
	require.NoError(t, r.Ready(ctx))

	srv.Kill()
	srv.Start() // a new run id: a failover for the guard
	require.Eventually(t, func() bool {
		fenced, err := g.Check(ctx)
		return err == nil && fenced
	}, 10*time.Second, 50*time.Millisecond)
	mustFail(t, stock.ErrFailover)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1}))
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err = r.Ready(short)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "reconcile pass")

	rec := newReconciler(t, r, store, nil)
	_, err = rec.Once(ctx)
	require.NoError(t, err)
	require.NoError(t, r.Ready(ctx))
	must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1}))

	// Items, and the epoch gone: not a new deployment. Another Reserver (a process that
	// starts now) waits for a pass.
	require.NoError(t, c.Do(ctx, c.B().Del().Key("stock:epoch").Build()).Error())
	other := newReserver(t, srv.Client(t))
	require.NoError(t, other.Load(ctx, "B", 5))
	fenced, err = stockops.NewFailoverGuard(other).Check(ctx)
	require.NoError(t, err)
	require.True(t, fenced, "a Load on a live deployment without an epoch does not record one")
	short, cancel = context.WithTimeout(ctx, 200*time.Millisecond)
	err = other.Ready(short)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	store.Set("B", 5)
	_, err = rec.Once(ctx)
	require.NoError(t, err)
	require.NoError(t, other.Ready(ctx))
}
