package contract_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// "Options that are out of range are an ErrInvalid error at once." RelayOptions.Batch is "at
// most 10,000".
func TestRunOutOfRangeOptionsInvalidAtOnce(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		r := testkit.NewReserver(t, c)
		st := memstore.New()
		for name, o := range map[string]stock.RunOptions{
			"batch 10001": {Store: st, Relay: &stock.RelayOptions{Batch: 10001}},
			"batch -1":    {Store: st, Relay: &stock.RelayOptions{Batch: -1}},
			"lease -1s":   {Store: st, Relay: &stock.RelayOptions{Lease: -time.Second}},
		} {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			start := time.Now()
			err := r.Run(ctx, o)
			cancel()
			assert.ErrorIs(t, err, stock.ErrInvalid, "%s", name)
			assert.Less(t, time.Since(start), time.Second, "%s: an ErrInvalid error at once", name)
		}
	})
}

// A Store that fails every event: Run "returns the first error a loop met" when ctx ends.
func TestRunReturnsLoopError(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r, st := withStore(t, c, 10, []string{"down"})
		st.FailWith(memstore.Down)
		require.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: "down", ID: "d1", Qty: 1})))
		cancel, done := runAsync(r, stock.RunOptions{Store: st, Drain: 200 * time.Millisecond})
		time.Sleep(700 * time.Millisecond)
		cancel()
		err, ok := waitRun(t, done, 10*time.Second)
		require.True(t, ok)
		assert.ErrorIs(t, err, memstore.ErrDown, "the first error a loop met")
		assert.Equal(t, int64(1), testkit.OutboxLen(t, c, "down"), "the failed event stays in the outbox")
	})
}

// storeAgrees asserts that the store's remaining stock of sku equals the available units in Redis,
// and returns the levels.
func storeAgrees(t *testing.T, r *stock.Reserver, st *memstore.Store, sku string) stock.Levels {
	t.Helper()
	l := testkit.Levels(t, r, sku)
	assert.Equal(t, l.Available, remaining(t, st, sku), "%s: Redis and the Store agree", sku)
	return l
}

// waitDelivered waits up to 30s, polling every tick, until none of skus has an event pending or
// dead-lettered.
func waitDelivered(t *testing.T, r *stock.Reserver, skus []string, tick time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, sku := range skus {
			p, d, err := stockops.Pending(context.Background(), r, sku)
			if err != nil || p != 0 || d != 0 {
				return false
			}
		}
		return true
	}, 30*time.Second, tick)
}

// child runs this test binary again with only TestChild, which runs the case named by
// STOCK_TEST_CHILD, so that a panic or a hang is seen from outside. It returns the combined output and
// the exit error.
func child(t *testing.T, name string, timeout time.Duration) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "STOCK_TEST_CHILD="+name)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return string(out), fmt.Errorf("child %s did not end within %v", name, timeout)
	}
	return string(out), err
}

// "A zero field takes its default; a negative interval turns its loop off", "Options that are out
// of range are an ErrInvalid error at once": whatever the options, Run neither panics nor hangs;
// it returns ErrInvalid at once or runs until ctx ends and returns ctx's error.
func TestRunOddOptionsNoPanic(t *testing.T) {
	testkit.ParallelOnMiniredis(t)
	for name := range childRunOptions {
		t.Run(name, func(t *testing.T) {
			t.Parallel() // a process of its own each, on its own miniredis
			out, err := child(t, name, 60*time.Second)
			if err != nil {
				i := strings.Index(out, "panic:")
				if i >= 0 {
					out = out[i:min(len(out), i+600)]
				} else if len(out) > 1500 {
					out = out[len(out)-1500:]
				}
			}
			assert.NoError(t, err, "Run with %s: %s", name, out)
		})
	}
}

// "Run may be called once per Reserver at a time": two, or six, concurrent Runs on the same
// Reserver. One runs; every other is refused at once with ErrRunning, whichever came first; the
// one that ran returns ctx's error, the Reserver's data stay right, and once it has returned Run
// may be called again.
func TestSecondRunSameReserver(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		for _, n := range []int{2, 6} {
			t.Run(fmt.Sprint(n, "-runs"), func(t *testing.T) {
				ctx := context.Background()
				sku := fmt.Sprint("two-", n)
				r, st := withStore(t, c, 100, []string{sku})
				runCtx, cancel := context.WithCancel(ctx)
				defer cancel()
				errs := make(chan error, n)
				for range n {
					go func() { errs <- r.Run(runCtx, stock.RunOptions{Store: st}) }()
				}
				next := func(what string) error {
					select {
					case err := <-errs:
						return err
					case <-time.After(10 * time.Second):
						t.Fatalf("%s did not return within 10s", what)
						return nil
					}
				}
				for range n - 1 {
					assert.ErrorIs(t, next("a concurrent Run"), stock.ErrRunning)
				}
				for i := range 50 {
					_, _ = r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprint("d", i), Qty: 1})
				}
				cancel()
				assert.ErrorIs(t, next("the Run that ran"), context.Canceled)
				storeAgrees(t, r, st, sku)
				assert.LessOrEqual(t, st.MaxApplications(), 1)
				// Run again once it returned.
				ctx2, cancel2 := context.WithTimeout(ctx, 300*time.Millisecond)
				defer cancel2()
				assert.ErrorIs(t, r.Run(ctx2, stock.RunOptions{Store: st, Drain: -1}), context.DeadlineExceeded, "Run after the first returned")
			})
		}
	})
}

// Two Reservers with different prefixes on one Redis, each with its own Run and Store: "WithPrefix
// sets the prefix of every key the Reserver writes": neither sees the other's items.
func TestRunTwoPrefixes(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		ra := testkit.NewReserver(t, c)
		rb := testkit.NewReserver(t, c, stock.WithPrefix("stock:carts"))
		sa, sb := memstore.New(), memstore.New()
		// Runs first, on an empty Redis, so that their guards do not fence (see
		// TestRunStartOnLiveDeploymentFenceLifts).
		ca, da := runAsync(ra, stock.RunOptions{Store: sa})
		cb, db := runAsync(rb, stock.RunOptions{Store: sb})
		time.Sleep(200 * time.Millisecond)
		loadRedisAndStore(t, ra, sa, 10, "~")
		loadRedisAndStore(t, rb, sb, 20, "~")
		require.NoError(t, testkit.Err(ra.DeductMany(ctx, stock.Cart{ID: "c1", Lines: []stock.Line{{SKU: "~", Qty: 2}}})))
		require.NoError(t, testkit.Err(rb.DeductMany(ctx, stock.Cart{ID: "c1", Lines: []stock.Line{{SKU: "~", Qty: 5}}})), "the same cart id under another prefix is another cart")
		ok := eventually(5*time.Second, func() bool {
			a, _ := sa.Remaining(ctx, "~")
			b, _ := sb.Remaining(ctx, "~")
			return a == 8 && b == 15
		})
		ca()
		cb()
		<-da
		<-db
		assert.True(t, ok, "each Run delivered its own prefix's sale")
		assert.Equal(t, int64(8), testkit.Levels(t, ra, "~").Available)
		assert.Equal(t, int64(15), testkit.Levels(t, rb, "~").Available)
		assert.Equal(t, []string{"~"}, itemsOf(t, rb))
	})
}

// TestRunMemstore: Run with a memstore while the library is flushed in a loop: every
// acknowledged deduct reaches the store exactly once.
func TestRunMemstore(t *testing.T) {
	admin, r := serverReserver(t, nil, stock.WithTimeout(3*time.Second))
	ctx := context.Background()
	store := memstore.New()
	loadRedisAndStore(t, r, store, 300, "rm")
	cancel, done := runAsync(r, stock.RunOptions{Store: store, Relay: &stock.RelayOptions{Poll: 20 * time.Millisecond}})
	st := newStats()
	stop := make(chan struct{})
	rounds := chaos(stop, func(i int) {
		if i%2 == 0 {
			faultDo(t, admin, "FUNCTION", "FLUSH", "ASYNC")
		} else {
			faultDo(t, admin, "SCRIPT", "FLUSH")
		}
		time.Sleep(2 * time.Millisecond)
	})
	faultTraffic([]*stock.Reserver{r}, st, "rm", []string{"rm"}, 4, 100, 3)
	// Some restores too.
	var restored int
	st.mu.Lock()
	ids := slices.Collect(maps.Keys(st.acked))
	st.mu.Unlock()
	for _, id := range ids[:min(20, len(ids))] {
		if _, err := r.Restore(ctx, "rm", id); err == nil {
			restored++
		} else {
			t.Logf("restore %s: %v", id, err)
		}
	}
	close(stop)
	<-rounds
	eventually(15*time.Second, func() bool { return testkit.OutboxLen(t, admin, "rm") == 0 })
	cancel()
	err, ok := waitRun(t, done, 20*time.Second)
	require.True(t, ok, "Run did not return")
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Logf("Run: %v", err)
	}
	t.Logf("raw %v fenced %d", st.raw, st.fenced.Load())
	assert.Empty(t, st.raw)
	l := storeAgrees(t, r, store, "rm")
	assert.LessOrEqual(t, store.MaxApplications(), 1, "each event applied at most once")
	assert.Equal(t, int64(0), testkit.OutboxLen(t, admin, "rm"))
	// Restores count back.
	st.mu.Lock()
	acked := int64(len(st.acked))
	st.mu.Unlock()
	assert.Equal(t, acked-int64(restored), l.Sold)
}

// TestRunTwiceConcurrently: two Runs of one Reserver at once (the docs allow one at a
// time; a mistake a user can make), with deducts and restores under way; then both stop.
// One of them is refused with ErrRunning, the other runs; both return in bounds, and nothing
// is lost or doubled (-race finds shared-state races).
func TestRunTwiceConcurrently(t *testing.T) {
	relayEach(t, nil, func(t *testing.T, e *relayEnv) {
		ctx := context.Background()
		loaded := map[string]int64{"two:a": 300, "two:b~b": 300}
		mem := memstore.New()
		load(t, e.r, mem, loaded)
		sale := newSale()
		runCtx, cancel := context.WithCancel(ctx)
		opts := stock.RunOptions{Store: mem, Drain: time.Second, Relay: relay(), Reconcile: &stock.ReconcileOptions{Interval: 30 * time.Millisecond}}
		ch1 := run(runCtx, e.r, opts)
		ch2 := run(runCtx, e.r, opts)
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				for i := range 50 {
					sku := "two:a"
					if i%2 == 1 {
						sku = "two:b~b"
					}
					id := fmt.Sprintf("w%d-%d", w, i)
					if sale.deduct(t, ctx, e.r, sku, id, 1) && i%4 == 0 {
						sale.restore(t, ctx, e.r, sku, id)
					}
				}
			})
		}
		wg.Wait()
		time.Sleep(300 * time.Millisecond)
		cancel()
		ended := time.Now()
		r1 := wait(t, ch1, ended, time.Second+3*time.Second)
		r2 := wait(t, ch2, ended, time.Second+3*time.Second)
		if errors.Is(r1.err, stock.ErrRunning) {
			r1, r2 = r2, r1
		}
		assert.ErrorIs(t, r1.err, context.Canceled, "the Run that ran")
		assert.ErrorIs(t, r2.err, stock.ErrRunning, "the other was refused")
		e.settle()
		finish(t, e, e.r, stock.RunOptions{Store: mem, Drain: time.Second, Relay: relay(), Reconcile: &stock.ReconcileOptions{Interval: -1}}, keys(loaded))
		sale.checkStore(t, e.r, mem, loaded)
	})
}

// runTraffic runs mixed concurrent traffic on sku and returns the ids whose sale was
// acknowledged and not given back (by the answers the callers got), with their quantities.
func runTraffic(t *testing.T, r *stock.Reserver, sku string, workers, each int) map[string]int64 {
	ctx := context.Background()
	var mu sync.Mutex
	sold := map[string]int64{}
	// lacksStock tells whether a take was refused, which it may be only for lack of stock.
	lacksStock := func(what string, err error) bool {
		if err == nil {
			return false
		}
		assert.True(t, errors.Is(err, stock.ErrSoldOut) || errors.Is(err, stock.ErrInsufficient), "%s: %v", what, err)
		return true
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 99))
			for k := range each {
				id := fmt.Sprintf("%s-w%d-%d", sku, w, k)
				q := int64(1 + rng.IntN(3))
				req := stock.Request{SKU: sku, ID: id, User: fmt.Sprintf("u%d", rng.IntN(7)), Qty: q}
				switch rng.IntN(4) {
				case 0, 1:
					if _, err := r.Deduct(ctx, req); lacksStock("deduct", err) {
						continue
					}
					if rng.IntN(3) == 0 {
						require.NoError(t, testkit.Err(r.Restore(ctx, sku, id)))
						continue
					}
				case 2:
					if _, err := r.Hold(ctx, req, time.Hour); lacksStock("hold", err) {
						continue
					}
					if rng.IntN(2) == 0 {
						require.NoError(t, testkit.Err(r.Cancel(ctx, sku, id)))
						continue
					}
					require.NoError(t, testkit.Err(r.Confirm(ctx, sku, id)))
				default:
					if _, err := r.Hold(ctx, req, time.Hour); err != nil {
						continue
					}
					mu.Lock()
					sold[id] = -q // a live hold: not sold
					mu.Unlock()
					continue
				}
				mu.Lock()
				sold[id] = q
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return sold
}

// checkStore checks the store against Redis and the acknowledged answers: remaining =
// available + held, each sale applied once, each given-back id not counted.
func checkStore(t *testing.T, r *stock.Reserver, store *memstore.Store, sku string, acked map[string]int64) {
	t.Helper()
	ctx := context.Background()
	l := levels(t, r, sku)
	assert.Equal(t, l.Available+l.Held, remaining(t, store, sku), "store remaining vs Redis available+held (%+v)", l)
	assert.LessOrEqual(t, store.MaxApplications(), 1, "an event applied twice")
	var ids []string
	var soldAcked int64
	for id, q := range acked {
		if q > 0 {
			ids = append(ids, id)
			soldAcked += q
		}
	}
	assert.Equal(t, soldAcked, l.Sold, "Redis sold vs acknowledged sales")
	recs, err := store.Records(ctx, sku, ids)
	require.NoError(t, err)
	for _, id := range ids {
		rec, ok := recs[id]
		if assert.True(t, ok, "acknowledged sale %s missing from the store", id) {
			assert.Equal(t, stock.StateApplied, rec.Status, id)
			assert.Equal(t, acked[id], rec.Qty, id)
		}
		typ := stock.EventDeducted
		if recs[id].Type == stock.EventConfirmed {
			typ = stock.EventConfirmed
		}
		assert.Equal(t, 1, store.Applications(sku, id, typ), "applications of %s", id)
	}
}

// reconcile runs a reconcile pass and checks one report for the item with no drift.
func reconcile(t *testing.T, r *stock.Reserver, store stock.Store, sku string) {
	t.Helper()
	rec := newReconciler(t, r, store, &stock.ReconcileOptions{Retention: -1})
	reports, err := rec.Once(context.Background())
	require.NoError(t, err)
	var mine []stockops.Report
	for _, rp := range reports {
		assert.NotContains(t, rp.SKU, "|", "a report names a bucket, not the item: %+v", rp)
		if rp.SKU == sku {
			mine = append(mine, rp)
		}
	}
	require.Len(t, mine, 1, "one report per item: %+v", reports)
	rp := mine[0]
	assert.Equal(t, int64(0), rp.Drift, "%+v", rp)
	assert.Equal(t, int64(0), rp.Adjusted, "%+v", rp)
	assert.Empty(t, rp.NeedsHuman, "%+v", rp)
	assert.False(t, rp.Missing)
	l := levels(t, r, sku)
	assert.Equal(t, l.Available, rp.Available, "%+v", rp)
	assert.Equal(t, l.Held, rp.Held, "%+v", rp)
}

// TestRunIntoStore: traffic on split items (and a plain one) while Run relays into a
// memstore; once drained, the store equals Redis, every acknowledged sale is applied once, and a
// reconcile pass finds no drift, with one report per item.
func TestRunIntoStore(t *testing.T) {
	each(t, []stock.Option{split(4)}, func(t *testing.T, e *requestEnv) {
		store := memstore.New()
		skus := []string{"dur-a", "dur:b~ü", "plain-dur"}
		loadRedisAndStore(t, e.r, store, 60, skus...)
		cancel, done := runAsync(e.r, stock.RunOptions{Store: store, Relay: &stock.RelayOptions{Poll: 20 * time.Millisecond}})
		acked := map[string]map[string]int64{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, sku := range skus {
			wg.Go(func() {
				a := runTraffic(t, e.r, sku, 6, 20)
				mu.Lock()
				acked[sku] = a
				mu.Unlock()
			})
		}
		wg.Wait()
		waitDelivered(t, e.r, skus, 50*time.Millisecond)
		cancel()
		<-done
		for _, sku := range skus {
			checkStore(t, e.r, store, sku, acked[sku])
			reconcile(t, e.r, store, sku)
		}
		items, err := store.ListItems(context.Background(), "", 100)
		require.NoError(t, err)
		assert.ElementsMatch(t, skus, items, "the store knows the items, not their buckets")
	})
}

// TestRunConcurrent: Run relays into the store while buyers, restores, restocks and holds
// run concurrently on several items; once activity stops, everything is delivered within a
// bounded time and no acknowledged sale is refused.
func TestRunConcurrent(t *testing.T) {
	splitEach(t, []stock.Option{split(4)}, func(t *testing.T, e *requestEnv) {
		store := memstore.New()
		skus := []string{"run-a", "run-b"}
		loadRedisAndStore(t, e.r, store, 5, skus...)
		cancel, done := runAsync(e.r, stock.RunOptions{Store: store, Relay: &stock.RelayOptions{Batch: 2, Poll: 10 * time.Millisecond}})
		defer cancel()
		solds := make([]map[string]int64, len(skus))
		var wg sync.WaitGroup
		for i, sku := range skus {
			wg.Go(func() { solds[i] = salesQ(t, e, sku, uint64(80+i), 6, 3, nil) })
		}
		wg.Wait()
		start := time.Now()
		waitDelivered(t, e.r, skus, 20*time.Millisecond)
		t.Logf("drained %v after activity stopped", time.Since(start))
		cancel()
		<-done
		for i, sku := range skus {
			splitCheck(t, e, store, sku, solds[i])
		}
	})
}
