package stock_test

// A failover, a restart without persistence or a lost registry: the guard fences writes until a
// reconcile pass, and a fresh deployment is not fenced.

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// TestFailoverGuard: a restarted primary fences deducts until a reconcile pass, in this
// process and in another one sharing the Redis.
func TestFailoverGuard(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skip("real-server test: set STOCK_REDIS_SERVER to run it")
	}
	srv := redistest.StartServer(t, "--appendonly", "yes", "--appendfsync", "always")
	r := newReserver(t, srv.Client(t))
	other := newReserver(t, srv.Client(t))
	g, g2 := stockops.NewFailoverGuard(r), stockops.NewFailoverGuard(other)
	checkFenced(t, g, false, "a new deployment records its baseline")

	store := loadBoth(t, r, map[string]int64{"A": 10})
	must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1}))
	checkFenced(t, g2, false)

	restartFenced(t, srv, g) // a new run id; the data survives (AOF, fsync always)
	mustFail(t, stock.ErrFailover)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", Qty: 1}))
	mustFail(t, stock.ErrFailover)(r.Hold(ctx, stock.Request{SKU: "A", ID: "h2", Qty: 1}, 60e9))
	must(t, "restores still work while fenced")(r.Restore(ctx, "A", "o1"))

	rec := newReconciler(t, r, store, nil)
	require.NoError(t, testkit.Err(rec.Once(ctx)))
	checkFenced(t, g, false, "a complete pass lifts the fence")
	must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", Qty: 1}))
	// The other process learns of the pass from Redis.
	checkFenced(t, g2, false)
}

// TestFreshDeploymentIsNotFenced: items loaded on a Redis that never had an epoch, then Run
// started: the failover guard does not take the new deployment for a failover, so deducts
// right after Run starts are taken, and Ready returns at once. (miniredis answers no INFO: no
// guard runs there, and Ready returns nil.)
func TestFreshDeploymentIsNotFenced(t *testing.T) {
	eachReserver(t, nil, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		store := memstore.New()
		for _, sku := range []string{"A", "B"} {
			require.NoError(t, testkit.Err(stockops.Preheat(ctx, r, store, sku, 10)))
		}
		// The guard's first check, as Run makes it before its first reconcile pass.
		if fenced, err := stockops.NewFailoverGuard(r).Check(ctx); err == nil {
			require.False(t, fenced, "a new deployment is fenced as if it had failed over")
		}
		must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "first", Qty: 1}))

		runCtx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() {
			_ = r.Run(runCtx, stock.RunOptions{Store: store, Reconcile: &stock.ReconcileOptions{Interval: -1}})
		})
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
	srv := redistest.StartServer(t, "--appendonly", "yes", "--appendfsync", "always")
	c := srv.Client(t)
	r := newReserver(t, c)
	store := memstore.New()
	require.NoError(t, testkit.Err(stockops.Preheat(ctx, r, store, "A", 10)))
	g := stockops.NewFailoverGuard(r)
	checkFenced(t, g, false)
	require.NoError(t, r.Ready(ctx))

	restartFenced(t, srv, g) // a new run id: a failover for the guard
	mustFail(t, stock.ErrFailover)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1}))
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err := r.Ready(short)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "reconcile pass")

	rec := newReconciler(t, r, store, nil)
	require.NoError(t, testkit.Err(rec.Once(ctx)))
	require.NoError(t, r.Ready(ctx))
	must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1}))

	// Items, and the epoch gone: not a new deployment. Another Reserver (a process that
	// starts now) waits for a pass.
	require.NoError(t, c.Do(ctx, c.B().Del().Key("stock:epoch").Build()).Error())
	other := newReserver(t, srv.Client(t))
	require.NoError(t, other.Load(ctx, "B", 5))
	checkFenced(t, stockops.NewFailoverGuard(other), true, "a Load on a live deployment without an epoch does not record one")
	short, cancel = context.WithTimeout(ctx, 200*time.Millisecond)
	err = other.Ready(short)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	store.Set("B", 5)
	require.NoError(t, testkit.Err(rec.Once(ctx)))
	require.NoError(t, other.Ready(ctx))
}

// flushAll empties every node of c, as FLUSHALL on a Redis would.
func flushAll(t *testing.T, c rueidis.Client) {
	t.Helper()
	for _, n := range c.Nodes() {
		require.NoError(t, n.Do(context.Background(), n.B().Flushall().Build()).Error())
	}
}

func registry(t *testing.T, r *stock.Reserver) []string {
	t.Helper()
	var out []string
	for sku, err := range stockops.Items(context.Background(), r) {
		require.NoError(t, err)
		out = append(out, sku)
	}
	slices.Sort(out)
	return out
}

// lostRegistryScenario sells through Redis to the store, then loses Redis's data with lose,
// and checks that a pass says so loudly and recovers from the store's items. Before, the pass
// returned 0 reports and no error, and the items were never sold or relayed again.
func lostRegistryScenario(t *testing.T, c rueidis.Client, lose func()) {
	r := newReserver(t, c)
	store := memstore.New()
	for sku, n := range map[string]int64{"A": 10, "B": 4} {
		require.NoError(t, r.Load(ctx, sku, n))
		require.NoError(t, store.Load(ctx, sku, n))
	}
	require.NoError(t, store.Load(ctx, "C", 7)) // in the store only: loaded in Redis at its sale
	for i := range 3 {
		must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: fmt.Sprint("a", i), Qty: 1}))
	}
	must(t)(r.Deduct(ctx, stock.Request{SKU: "B", ID: "b0", Qty: 4}))
	rl := newRelay(t, r, store, nil, nil)
	drain(t, rl)

	lose()
	require.Empty(t, registry(t, r), "Redis lost everything")

	// A dry run reports the loss and repairs nothing.
	dry := newReconciler(t, r, store, &stock.ReconcileOptions{DryRun: true})
	res, err := dry.Pass(ctx)
	require.ErrorIs(t, err, stock.ErrRegistryLost)
	assert.Equal(t, []string{"A", "B"}, res.Unregistered)
	assert.Equal(t, []string{"C"}, res.StoreOnly)
	require.Empty(t, registry(t, r))

	rec := newReconciler(t, r, store, nil)
	reps, err := rec.Once(ctx)
	require.ErrorIs(t, err, stock.ErrRegistryLost, "the pass says loudly that Redis lost its registry")
	require.Len(t, reps, 2)
	for _, rp := range reps {
		assert.True(t, rp.Unregistered, "%s", rp)
		assert.True(t, rp.Missing, "%s", rp)
		assert.True(t, rp.Rebuilt, "%s", rp)
		assert.Contains(t, rp.NeedsHuman, "Redis lost the item", "%s", rp)
		assert.Contains(t, rp.String(), "NOT IN THE REGISTRY")
	}
	assert.Equal(t, []string{"A", "B"}, registry(t, r), "registered again")
	assert.Equal(t, int64(7), levels(t, r, "A").Available, "rebuilt from the store")
	require.ErrorIs(t, testkit.Err(available(r.Levels(ctx, "C"))), stock.ErrNotLoaded, "an item Redis never had is left alone")

	// Sold and relayed again; the next pass finds nothing.
	must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "a-after", Qty: 2}))
	require.Equal(t, 1, drain(t, rl).Delivered, "the relay drains the item again")
	assert.Equal(t, int64(5), remaining(t, store, "A"))
	reps, err = rec.Once(ctx)
	require.NoError(t, err)
	for _, rp := range reps {
		assert.False(t, rp.Unregistered || rp.Drift != 0 || rp.Missing, "%s", rp)
	}
}

// TestRegistryLost: FLUSHALL, on every backend.
func TestRegistryLost(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		lostRegistryScenario(t, c, func() { flushAll(t, c) })
	})
}

// TestRegistryLostRestart: a restart of a redis-server without persistence.
func TestRegistryLostRestart(t *testing.T) {
	if os.Getenv(redistest.EnvServer) == "" {
		t.Skip("needs a real redis-server to restart: set " + redistest.EnvServer)
	}
	srv := redistest.StartServer(t) // no AOF, no RDB
	c := srv.Client(t)
	lostRegistryScenario(t, c, func() {
		srv.Kill()
		srv.Start()
	})
}

// TestRegistryEntryLost: an item whose keys are intact but whose registry entry is gone (a
// deleted key, a partial loss) is registered again by a pass over every item and by a pass
// over that item alone, and reported.
func TestRegistryEntryLost(t *testing.T) {
	eachReserver(t, nil, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		store := memstore.New()
		for _, sku := range []string{"A", "B"} {
			require.NoError(t, r.Load(ctx, sku, 5))
			require.NoError(t, store.Load(ctx, sku, 5))
		}
		must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1}))
		require.NoError(t, c.Do(ctx, c.B().Srem().Key("stock:items").Member("A").Build()).Error())

		rec := newReconciler(t, r, store, nil)
		res, err := rec.Pass(ctx)
		require.ErrorIs(t, err, stock.ErrRegistryLost)
		assert.Equal(t, []string{"A"}, res.Unregistered)
		assert.Equal(t, []string{"A", "B"}, registry(t, r))
		rp := res.Reports[len(res.Reports)-1]
		assert.Equal(t, "A", rp.SKU)
		assert.False(t, rp.Missing)
		assert.Empty(t, rp.NeedsHuman, "keys intact: registering it again was the whole repair")

		// One item, as `stockctl reconcile -apply A` does.
		require.NoError(t, c.Do(ctx, c.B().Srem().Key("stock:items").Member("A").Build()).Error())
		one := newReconciler(t, r, store, &stock.ReconcileOptions{Items: []string{"A"}})
		rp, err = one.Item(ctx, "A")
		require.NoError(t, err)
		assert.True(t, rp.Unregistered)
		assert.Equal(t, []string{"A", "B"}, registry(t, r))
	})
}

// checkFenced checks that g answers whether writes are fenced, and that it says want.
func checkFenced(t *testing.T, g *stockops.FailoverGuard, want bool, msgAndArgs ...any) {
	t.Helper()
	fenced, err := g.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, want, fenced, msgAndArgs...)
}

// restartFenced kills srv and starts it again, with a new run id and its data kept (AOF,
// fsync always), and waits until g takes it for a failover and fences writes.
func restartFenced(t *testing.T, srv *redistest.Server, g *stockops.FailoverGuard) {
	t.Helper()
	srv.Kill()
	srv.Start()
	require.Eventually(t, func() bool {
		fenced, err := g.Check(ctx)
		return err == nil && fenced
	}, 10*time.Second, 50*time.Millisecond)
}
