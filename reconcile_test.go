package stock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/protocol"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

func TestReconcileClean(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		g := newRig(t, c, map[string]int64{"A": 50})
		for i := range 10 {
			must(t)(g.r.Deduct(ctx, stock.Request{SKU: "A", ID: fmt.Sprint("o", i), Qty: 2}))
		}
		must(t)(g.r.Restore(ctx, "A", "o1"))
		// Pending events are in flight, not drift.
		rp := g.once(t)["A"]
		assert.Equal(t, stockops.Report{SKU: "A", Available: 32, StoreRemaining: 50, Pending: 11, InFlight: 18}, rp)
		drain(t, g.relay)
		rp = g.once(t)["A"]
		assert.Equal(t, stockops.Report{SKU: "A", Available: 32, StoreRemaining: 32}, rp)
		assert.Contains(t, rp.String(), "drift 0")
	})
}

func TestReconcileLostKey(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		g := newRig(t, c, map[string]int64{"A": 50})
		testkit.Sell(t, g.r, "A", "o", "", 10)
		drain(t, g.relay)
		for i := 10; i < 15; i++ { // in flight when the key goes
			must(t)(g.r.Deduct(ctx, stock.Request{SKU: "A", ID: fmt.Sprint("o", i), Qty: 1}))
		}
		del(t, c, "stock:{A}")
		require.ErrorIs(t, testkit.Err(available(g.r.Levels(ctx, "A"))), stock.ErrNotLoaded)
		mustFail(t, stock.ErrNotLoaded, "no sale on a lost item")(g.r.Deduct(ctx, stock.Request{SKU: "A", ID: "x", Qty: 1}))

		dry := newReconciler(t, g.r, g.store, &stock.ReconcileOptions{DryRun: true})
		reps, err := dry.Once(ctx)
		require.NoError(t, err)
		assert.True(t, reps[0].Missing)
		assert.False(t, reps[0].Rebuilt)
		require.ErrorIs(t, testkit.Err(available(g.r.Levels(ctx, "A"))), stock.ErrNotLoaded, "a dry run repairs nothing")

		rp := g.once(t)["A"]
		assert.True(t, rp.Missing)
		assert.True(t, rp.Rebuilt)
		assert.Equal(t, int64(5), rp.InFlight)
		assert.Equal(t, int64(35), levels(t, g.r, "A").Available, "store 40 minus 5 in flight")
		// Deducts resume, and the in-flight ones still reach the store.
		must(t)(g.r.Deduct(ctx, stock.Request{SKU: "A", ID: "after", Qty: 1}))
		g.agree(t, "A")
		assert.Zero(t, g.once(t)["A"].Drift)
	})
}

func TestReconcileRestartWithoutPersistence(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		g := newRig(t, c, map[string]int64{"A": 20, "B": 30})
		for i := range 8 {
			sku := []string{"A", "B"}[i%2]
			must(t)(g.r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprint("o", i), Qty: 1}))
		}
		drain(t, g.relay)
		for _, cl := range c.Nodes() { // every key gone, the registry too
			require.NoError(t, cl.Do(ctx, cl.B().Flushall().Build()).Error())
		}
		rec := newReconciler(t, g.r, g.store, &stock.ReconcileOptions{Items: []string{"A", "B"}})
		reps, err := rec.Once(ctx)
		require.ErrorIs(t, err, stock.ErrRegistryLost, "the registry went with the rest")
		for _, rp := range reps {
			assert.True(t, rp.Rebuilt, rp.String())
		}
		for sku, want := range map[string]int64{"A": 16, "B": 26} {
			assert.Equal(t, want, levels(t, g.r, sku).Available)
		}
		// A retried id whose ledger entry was lost is refused by the store's unique id:
		// the sale is given back rather than made twice.
		must(t)(g.r.Deduct(ctx, stock.Request{SKU: "A", ID: "o0", Qty: 1}))
		st := drain(t, g.relay)
		assert.Zero(t, st.Refused, "the store answers a repeated id as the first time")
		assert.Equal(t, 1, g.store.MaxApplications())
	})
}

func TestReconcileDrift(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		g := newRig(t, c, map[string]int64{"A": 50, "B": 50, "C": 50}, &stock.ReconcileOptions{RepairLimit: 100})
		g.store.Set("A", 40)  // Redis too high: would sell 10 the store does not have
		g.store.Set("B", 55)  // Redis too low
		g.store.Set("C", 500) // above the repair limit
		reps := g.once(t)
		assert.Equal(t, int64(10), reps["A"].Drift)
		assert.Equal(t, int64(-10), reps["A"].Adjusted)
		assert.Equal(t, int64(5), reps["B"].Adjusted)
		assert.Zero(t, reps["C"].Adjusted)
		assert.Contains(t, reps["C"].NeedsHuman, "repair limit")
		for sku, want := range map[string]int64{"A": 40, "B": 55, "C": 50} {
			l := levels(t, g.r, sku)
			assert.Equal(t, want, l.Available, sku)
		}
		// Redis sold out meanwhile: it cannot give back what it sold; that is for a human.
		must(t)(g.r.Deduct(ctx, stock.Request{SKU: "A", ID: "big", Qty: 40}))
		g.store.Set("A", 30) // the store lost 10 more before the relay ran
		rp := g.once(t)["A"]
		assert.Equal(t, int64(0), rp.Adjusted, "available cannot go below zero")
		assert.Contains(t, rp.NeedsHuman, "sold")
	})
}

func TestReconcileLostEventsAndEntries(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		g := newRig(t, c, map[string]int64{"A": 50})
		for i := range 6 {
			must(t)(g.r.Deduct(ctx, stock.Request{SKU: "A", ID: fmt.Sprint("o", i), User: "u", Qty: 1}))
		}
		drain(t, g.relay)
		must(t)(g.r.Restore(ctx, "A", "o1"))
		must(t)(g.r.Deduct(ctx, stock.Request{SKU: "A", ID: "o9", Qty: 2}))
		// The outbox loses both events (a lost message).
		del(t, c, "stock:{A}:o")
		rp := g.once(t)["A"]
		assert.Equal(t, 2, rp.Requeued)
		g.agree(t, "A")

		// A failover loses a sale the store has: the ledger entry and the decrement.
		require.NoError(t, c.Do(ctx, c.B().Hdel().Key("stock:{A}:l").Field("o2").Build()).Error())
		require.NoError(t, c.Do(ctx, c.B().Hincrby().Key("stock:{A}").Field("a").Increment(1).Build()).Error())
		require.NoError(t, c.Do(ctx, c.B().Hincrby().Key("stock:{A}").Field("s").Increment(-1).Build()).Error())
		rp = g.once(t)["A"]
		assert.Equal(t, 1, rp.Rerecorded)
		assert.Equal(t, int64(-1), rp.Adjusted)
		rc := must(t)(g.r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", User: "u", Qty: 1}))
		assert.True(t, rc.Replayed, "a retry of the lost id is a replay, not a second sale")
		g.agree(t, "A")
	})
}

func TestReconcileTrims(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		g := newRig(t, c, map[string]int64{"A": 50}, &stock.ReconcileOptions{Retention: time.Millisecond})
		testkit.Sell(t, g.r, "A", "o", "", 5)
		mustFail(t, stock.ErrUnknownID)(g.r.Restore(ctx, "A", "ghost"))
		drain(t, g.relay)
		must(t)(g.r.Deduct(ctx, stock.Request{SKU: "A", ID: "pending", Qty: 1}))
		time.Sleep(20 * time.Millisecond)
		rp := g.once(t)["A"]
		assert.Equal(t, 6, rp.Trimmed, "applied entries and the tombstone; not the pending one")
		assert.Len(t, ledger(t, g.r, "A"), 1)
		g.agree(t, "A")
	})
}

// TestReconcileRace: a reconcile pass every few ms while goroutines deduct and restore and a
// relay runs. The store never refuses (Redis never sells what the store lacks), and at the end
// they agree.
func TestReconcileRace(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		g := newRig(t, c, map[string]int64{"A": 300})
		ctx2, cancel := context.WithCancel(ctx)
		var bg sync.WaitGroup
		bg.Go(func() { _ = g.relay.Run(ctx2) })
		var passes, drifting atomic.Int64
		bg.Go(func() {
			for ctx2.Err() == nil {
				reps, err := g.rec.Once(ctx2)
				if err == nil {
					passes.Add(1)
					for _, rp := range reps {
						if rp.Drift != 0 || rp.Adjusted != 0 {
							drifting.Add(1)
							t.Errorf("a pass saw drift under live traffic: %s", rp)
						}
					}
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				for i := 0; i < 2000 && (i < 25 || passes.Load() < 10); i++ { // live traffic during many passes
					id := fmt.Sprint("w", w, "-", i)
					_, err := g.r.Deduct(ctx, stock.Request{SKU: "A", ID: id, Qty: 1})
					if err != nil && !errors.Is(err, stock.ErrSoldOut) {
						t.Error(err)
					}
					if i%3 == 0 {
						_, _ = g.r.Restore(ctx, "A", id)
					}
				}
			})
		}
		wg.Wait()
		require.Eventually(t, func() bool { return outboxLen(t, c, "A") == 0 }, 10*time.Second, 5*time.Millisecond)
		cancel()
		bg.Wait()
		assert.Positive(t, passes.Load())
		g.agree(t, "A")
		assert.Zero(t, g.once(t)["A"].Drift)
	})
}

func TestDelistRetires(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		g := newRig(t, c, map[string]int64{"A": 1000, "B": 5}, &stock.ReconcileOptions{Retention: time.Millisecond})
		testkit.Sell(t, g.r, "A", "o", "", 600) // more than one retire step of the ledger
		// Sold out, and a refusal: the item gets its sold-out filter, which must go too.
		must(t)(g.r.Deduct(ctx, stock.Request{SKU: "A", ID: "rest", Qty: 400}))
		mustFail(t, stock.ErrSoldOut)(g.r.Deduct(ctx, stock.Request{SKU: "A", ID: "one-more", Qty: 1}))
		n, err := c.Do(ctx, c.B().Exists().Key("stock:{A}:b").Build()).AsInt64()
		require.NoError(t, err)
		require.Equal(t, int64(1), n, "the filter exists")
		require.ErrorIs(t, g.r.Delist(ctx, "ghost"), stock.ErrNotLoaded)
		require.NoError(t, g.r.Delist(ctx, "A"))
		require.NoError(t, g.r.Delist(ctx, "A"))
		mustFail(t, stock.ErrClosed)(g.r.Deduct(ctx, stock.Request{SKU: "A", ID: "late", Qty: 1}))
		must(t)(g.r.Restore(ctx, "A", "o0")) // the pipeline still works
		time.Sleep(10 * time.Millisecond)
		rp := g.once(t)["A"]
		assert.False(t, rp.Retired, "events are still pending")
		drain(t, g.relay)
		time.Sleep(10 * time.Millisecond)
		reps := g.once(t)
		assert.True(t, reps["A"].Retired, reps["A"].String())
		assert.Zero(t, reps["A"].Drift)
		assert.False(t, reps["B"].Retired)
		assertGone(t, c, "stock:{A}", ":l", ":u", ":o", ":h", ":r", ":rl", ":dl", ":b")
		assert.ErrorIs(t, testkit.Err(available(g.r.Levels(ctx, "A"))), stock.ErrNotLoaded)
		reps = g.once(t)
		_, listed := reps["A"]
		assert.False(t, listed, "a retired item leaves the registry")
		rec := newReconciler(t, g.r, g.store, &stock.ReconcileOptions{Items: []string{"A"}})
		rr, err := rec.Once(ctx)
		require.NoError(t, err)
		assert.True(t, rr[0].Retired)
		assert.Contains(t, rr[0].String(), "retired")
		require.NoError(t, g.r.Load(ctx, "A", 3), "a retired item may be listed again")
	})
}

// TestReconcileHoldConfirmedInStore: a failover lost the confirm of holds after the relay had
// delivered it, so the holds are live in Redis and sold in the store. A pass makes them final
// in Redis (even past their deadline, which would otherwise give the units back and sell them
// twice); a hold the store confirmed and then gave back is released.
func TestReconcileHoldConfirmedInStore(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		g := newRig(t, c, map[string]int64{"A": 3})
		for _, id := range []string{"h1", "h2", "h3"} {
			must(t)(g.r.Hold(ctx, stock.Request{SKU: "A", ID: id, User: "u", Qty: 1}, 2*time.Second))
		}
		drain(t, g.relay)
		// What the relay delivered before the failover: the confirms of h1 and h2, and a
		// restore of h2 after it; Redis lost all of it.
		at := time.Now()
		for _, ev := range []stock.Event{
			{Type: stock.EventConfirmed, SKU: "A", ID: "h1", User: "u", Qty: 1, At: at},
			{Type: stock.EventConfirmed, SKU: "A", ID: "h2", User: "u", Qty: 1, At: at},
			{Type: stock.EventRestored, SKU: "A", ID: "h2", User: "u", Qty: 1, At: at},
		} {
			require.NoError(t, g.store.Apply(ctx, ev))
		}
		redistest.Sleep(c, 2100*time.Millisecond) // past the holds' deadline

		rp := g.once(t)["A"]
		assert.Equal(t, 2, rp.Resynced, "h1 made final, h2 released")
		assert.Zero(t, rp.Drift, "%+v", rp)
		assertState(t, g.r, "A", "h1", stock.StateApplied)
		l := levels(t, g.r, "A")
		assert.Equal(t, stock.Levels{Available: 1, Held: 1, Sold: 1, Loaded: 3}, l, "h2 released, h1 sold, h3 due")
		require.NoError(t, testkit.Err(stockops.Sweep(ctx, g.r, "A")))
		l = levels(t, g.r, "A")
		assert.Equal(t, stock.Levels{Available: 2, Held: 0, Sold: 1, Loaded: 3}, l, "h3 expired")
		g.agree(t, "A")
		must(t, "a confirm of h1 now is a replay")(g.r.Confirm(ctx, "A", "h1"))
		must(t)(g.r.Deduct(ctx, stock.Request{SKU: "A", ID: "n1", Qty: 2}))
		mustFail(t, stock.ErrSoldOut, "the unit h1 took is not sold again")(g.r.Deduct(ctx, stock.Request{SKU: "A", ID: "n2", Qty: 1}))
		g.agree(t, "A")
	})
}

// lateConsumerStore is a memstore whose first Records call that names id lets a queue consumer
// apply and settle ev first (a consumer that checked the item's turn before the pass took the
// item), and answers what the store held before it did.
type lateConsumerStore struct {
	*memstore.Store
	r     *stock.Reserver
	id    string
	ev    stock.Event
	fired atomic.Bool
}

func (s *lateConsumerStore) Records(ctx context.Context, sku string, ids []string) (map[string]stock.Record, error) {
	recs, err := s.Store.Records(ctx, sku, ids)
	if err == nil && slices.Contains(ids, s.id) && s.fired.CompareAndSwap(false, true) {
		ev := s.ev
		ev.Seq = 0 // its turn was checked before the pass: no order check now
		if cerr := stock.Consume(ctx, s.r, s.Store, ev); cerr != nil {
			return nil, cerr
		}
	}
	return recs, err
}

// TestReconcileRestoreSettledDuringPass: on the queue path, a consumer that settles a restore
// while a pass looks at the item (it checked the item's turn before) does not make the pass
// queue that restore again: the pass reads Redis before the store.
func TestReconcileRestoreSettledDuringPass(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		r, db := reserverAndStore(t, c, map[string]int64{"A": 10})
		var mu sync.Mutex
		var queue []stock.Event
		pub := stock.PublisherFunc(func(_ context.Context, ev stock.Event) error {
			mu.Lock()
			defer mu.Unlock()
			queue = append(queue, ev)
			return nil
		})
		relay := newRelay(t, r, nil, pub, nil)

		must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 2}))
		require.NoError(t, testkit.Err(relay.Once(ctx)))
		require.Len(t, queue, 1)
		require.NoError(t, stock.Consume(ctx, r, db, queue[0])) // the deduct is in the store
		must(t)(r.Restore(ctx, "A", "o1"))
		require.NoError(t, testkit.Err(relay.Once(ctx)))
		require.Len(t, queue, 2) // the restore is published, not applied yet

		store := &lateConsumerStore{Store: db, r: r, id: "o1", ev: queue[1]}
		rec := newReconciler(t, r, store, nil)
		rp, err := rec.Item(ctx, "A")
		require.NoError(t, err)
		assert.True(t, store.fired.Load(), "the consumer settled the restore during the pass")
		assert.Zero(t, rp.Requeued, "the restore was not lost: %s", rp)
		pending, _, err := stockops.Pending(ctx, r, "A")
		require.NoError(t, err)
		assert.Zero(t, pending, "no restore queued again")
		assert.Equal(t, int64(10), remaining(t, db, "A"))
	})
}

// TestReconcileRepairKeepsCountersExact: a repair moves the counter its cause moved. Sales a
// failover lost after the store applied them count as sold again (Loaded stays what was loaded),
// a restock it lost as loaded, and a sale Redis counted twice (an id sold again after its entry
// was trimmed, which the store took once) comes back from sold; every later restore gives back
// exactly what its sale took.
func TestReconcileRepairKeepsCountersExact(t *testing.T) {
	hincr := func(t *testing.T, c rueidis.Client, field string, by int64) {
		t.Helper()
		require.NoError(t, c.Do(context.Background(), c.B().Hincrby().Key("stock:{x}").Field(field).Increment(by).Build()).Error())
	}
	hdel := func(t *testing.T, c rueidis.Client, ids ...string) {
		t.Helper()
		require.NoError(t, c.Do(context.Background(), c.B().Hdel().Key("stock:{x}:l").Field(ids...).Build()).Error())
	}
	want := func(t *testing.T, r *stock.Reserver, a, s, l int64) {
		t.Helper()
		got := levels(t, r, "x")
		assert.Equal(t, stock.Levels{Available: a, Sold: s, Loaded: l}, got)
	}
	// The same failover on an item split over three buckets: each lost sale goes back in the
	// bucket that made it, and its claim (in the id's home bucket) is lost with it.
	loseSplit := func(t *testing.T, g rig, _ *testClock) []string {
		for _, id := range []string{"b", "c"} {
			for i := range 3 {
				base := protocol.BucketBase("stock", "x", i, 3)
				require.NoError(t, g.c.Do(ctx, g.c.B().Hdel().Key(base+":i").Field(id).Build()).Error())
				n, err := g.c.Do(ctx, g.c.B().Hdel().Key(base+":l").Field(id).Build()).AsInt64()
				require.NoError(t, err)
				if n == 1 {
					require.NoError(t, g.c.Do(ctx, g.c.B().Hincrby().Key(base).Field("a").Increment(1).Build()).Error())
					require.NoError(t, g.c.Do(ctx, g.c.B().Hincrby().Key(base).Field("s").Increment(-1).Build()).Error())
				}
			}
		}
		return []string{"a", "b", "c"}
	}
	cases := []struct {
		name string
		// fault runs after a, b and c (1 unit each) are delivered; it returns the ids to restore
		// at the end and the levels the repair must leave: available, sold, loaded.
		fault   func(t *testing.T, g rig, clock *testClock) []string
		a, s, l int64
	}{
		{"a failover lost two delivered sales", func(t *testing.T, g rig, _ *testClock) []string {
			hdel(t, g.c, "b", "c") // the promoted replica never had them: no entries, their units back
			hincr(t, g.c, "a", 2)
			hincr(t, g.c, "s", -2)
			return []string{"a", "b", "c"}
		}, 97, 3, 100},
		{"a failover lost a delivered restock", func(t *testing.T, g rig, _ *testClock) []string {
			must(t)(g.r.Restock(context.Background(), "x", "more", 10))
			drain(t, g.relay)
			hdel(t, g.c, "more")
			hincr(t, g.c, "a", -10)
			hincr(t, g.c, "l", -10)
			return []string{"a", "b", "c"}
		}, 107, 3, 110},
		{"a failover lost a restock and a sale of the same size", func(t *testing.T, g rig, _ *testClock) []string {
			must(t)(g.r.Restock(context.Background(), "x", "more", 5))
			must(t)(g.r.Deduct(context.Background(), stock.Request{SKU: "x", ID: "big", Qty: 5}))
			drain(t, g.relay)
			hdel(t, g.c, "more", "big") // no drift: only what was written back tells
			hincr(t, g.c, "l", -5)
			hincr(t, g.c, "s", -5)
			return []string{"a", "b", "c"}
		}, 97, 8, 105},
		{"an id sold again after its entry was trimmed", func(t *testing.T, g rig, clock *testClock) []string {
			clock.advance(25 * time.Hour) // past the default retention of 24h
			rp := g.once(t)["x"]
			require.Equal(t, 3, rp.Trimmed)
			rc := must(t)(g.r.Deduct(context.Background(), stock.Request{SKU: "x", ID: "b", Qty: 1}))
			require.False(t, rc.Replayed, "its entry is gone: Redis sells it again")
			drain(t, g.relay) // the store has b already: it takes nothing
			return nil        // (the clock runs a day ahead of Redis's: every settled entry is trimmable now)
		}, 97, 3, 100},
		{"a failover lost two delivered sales of a split item", loseSplit, 97, 3, 100},
		{"the ledger key lost alone (the counters kept)", func(t *testing.T, g rig, _ *testClock) []string {
			del(t, g.c, "stock:{x}:l")
			return []string{"a", "b", "c"}
		}, 97, 3, 100},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, c rueidis.Client) {
				clock := newTestClock()
				opts := []stock.Option{stock.WithClock(clock.now)}
				if strings.HasSuffix(tc.name, "split item") {
					opts = append(opts, stock.WithBuckets(func(string) int { return 3 }))
				}
				r := newReserver(t, c, opts...)
				g := newRigWith(t, c, r, map[string]int64{"x": 100})
				for _, id := range []string{"a", "b", "c"} {
					must(t)(g.r.Deduct(ctx, stock.Request{SKU: "x", ID: id, Qty: 1}))
				}
				drain(t, g.relay)
				restore := tc.fault(t, g, clock)
				rp := g.once(t)["x"]
				assert.Empty(t, rp.NeedsHuman)
				want(t, g.r, tc.a, tc.s, tc.l)
				assert.Zero(t, g.once(t)["x"].Drift, "a second pass finds nothing")
				g.agree(t, "x")
				for _, id := range restore {
					rc := must(t, id)(g.r.Restore(ctx, "x", id))
					assert.Equal(t, int64(1), rc.Qty, id)
				}
				g.agree(t, "x")
				n := int64(len(restore))
				want(t, g.r, tc.a+n, tc.s-n, tc.l)
			})
		})
	}
}

// TestRetentionCountsFromSettling: the retention of an entry counts from when it settled, not
// from when it was made: a hold that lives longer than the retention, a hold that expired and a
// sale given back late all keep answering their id (a replay or their refusal, never
// ErrUnknownID or a second take) for the retention after they settled, and are trimmed after it.
func TestRetentionCountsFromSettling(t *testing.T) {
	type step func(t *testing.T, g rig, move func(time.Duration))
	cases := []struct {
		name      string
		retention time.Duration
		settle    step          // makes the entry of id "e" and settles it
		age       time.Duration // how long after settle the first pass runs: within the retention since it settled
		repeat    step          // what a repeat of "e" must answer while the entry is kept
		past      time.Duration // how much later it is trimmed
	}{
		{"a 48h hold cancelled after 30h", 24 * time.Hour,
			func(t *testing.T, g rig, move func(time.Duration)) {
				must(t)(g.r.Hold(context.Background(), stock.Request{SKU: "x", ID: "e", Qty: 2}, 48*time.Hour))
				move(30 * time.Hour)
				must(t)(g.r.Cancel(context.Background(), "x", "e"))
			}, time.Minute,
			func(t *testing.T, g rig, _ func(time.Duration)) {
				rc := must(t, "a repeated cancel is a replay")(g.r.Cancel(context.Background(), "x", "e"))
				assert.True(t, rc.Replayed)
				mustFail(t, stock.ErrRestored, "a repeated hold takes nothing")(
					g.r.Hold(context.Background(), stock.Request{SKU: "x", ID: "e", Qty: 2}, time.Hour))
			}, 48 * time.Hour},
		{"a hold that expired", 200 * time.Millisecond,
			func(t *testing.T, g rig, move func(time.Duration)) {
				must(t)(g.r.Hold(context.Background(), stock.Request{SKU: "x", ID: "e", Qty: 2}, 400*time.Millisecond))
				move(500 * time.Millisecond)
				mustFail(t, stock.ErrExpired)(g.r.Confirm(context.Background(), "x", "e"))
			}, 0,
			func(t *testing.T, g rig, _ func(time.Duration)) {
				mustFail(t, stock.ErrExpired)(g.r.Confirm(context.Background(), "x", "e"))
				_, err := g.r.Hold(context.Background(), stock.Request{SKU: "x", ID: "e", Qty: 2}, time.Hour)
				assert.Error(t, err, "a repeated hold takes nothing")
			}, 500 * time.Millisecond},
		{"a sale given back late", 200 * time.Millisecond,
			func(t *testing.T, g rig, move func(time.Duration)) {
				must(t)(g.r.Deduct(context.Background(), stock.Request{SKU: "x", ID: "e", Qty: 2}))
				drain(t, g.relay)
				move(400 * time.Millisecond)
				must(t)(g.r.Restore(context.Background(), "x", "e"))
				drain(t, g.relay)
			}, 0,
			func(t *testing.T, g rig, _ func(time.Duration)) {
				rc := must(t, "a repeated restore is a replay")(g.r.Restore(context.Background(), "x", "e"))
				assert.True(t, rc.Replayed)
				mustFail(t, stock.ErrRestored, "a repeated deduct takes nothing")(
					g.r.Deduct(context.Background(), stock.Request{SKU: "x", ID: "e", Qty: 2}))
			}, 500 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, c rueidis.Client) {
				// The reconciler's clock: miniredis's time moves only when the test says so, and
				// the reconciler's with it; a real server's clock runs on its own, so on one the
				// reconciler's follows real time (the time a loaded machine takes between two
				// steps passes for both), plus the long spans the server cannot be moved by.
				clock := newTestClock()
				now, advance := clock.now, clock.advance
				if !redistest.IsMiniredis(c) {
					var ahead atomic.Int64
					now = func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
					advance = func(d time.Duration) { ahead.Add(int64(d)) }
				}
				r := newReserver(t, c, stock.WithClock(now))
				g := newRigWith(t, c, r, map[string]int64{"x": 10}, &stock.ReconcileOptions{Retention: tc.retention})
				// move lets d pass for the reconciler's clock and, as far as it can, for Redis's:
				// a real server's clock runs on its own, so long spans move the reconciler's only.
				move := func(d time.Duration) {
					switch {
					case redistest.IsMiniredis(c):
						redistest.Sleep(c, d)
						advance(d)
					case d < time.Second:
						time.Sleep(d) // both clocks
					default:
						advance(d)
					}
				}
				tc.settle(t, g, move)
				drain(t, g.relay) // no event pending: only the retention keeps the entry
				move(tc.age)
				g.once(t)
				_, err := g.r.Ledger(context.Background(), "x", "e")
				require.NoError(t, err, "the entry is kept for the retention after it settled")
				tc.repeat(t, g, move)
				want := levels(t, g.r, "x")
				assert.Equal(t, int64(10), want.Available, "the repeats took nothing")
				drain(t, g.relay)
				move(tc.past)
				assert.Equal(t, 1, g.once(t)["x"].Trimmed, "trimmed once the retention after it settled has passed")
				assert.ErrorIs(t, testkit.Err(g.r.Ledger(context.Background(), "x", "e")), stock.ErrUnknownID)
			})
		})
	}
}

// TestDelistThenRetireRemovesAnItem: the documented way to remove an item's keys (tests,
// operators): Delist, deliver its events, and a reconcile pass with a retention shorter than the
// time since the delisting retires it. Only the retired mark stays (a hash of two fields), the
// item leaves the registry, and it may be loaded again. On an item split over buckets too.
func TestDelistThenRetireRemovesAnItem(t *testing.T) {
	for _, buckets := range []int{0, 3} {
		t.Run(fmt.Sprint("buckets=", buckets), func(t *testing.T) {
			eachBackend(t, func(t *testing.T, c rueidis.Client) {
				var opts []stock.Option
				if buckets > 0 {
					opts = append(opts, stock.WithBuckets(func(string) int { return buckets }))
				}
				clock := newTestClock()
				opts = append(opts, stock.WithClock(clock.now))
				g := newRigWith(t, c, newReserver(t, c, opts...), map[string]int64{"x": 50}, &stock.ReconcileOptions{Retention: time.Millisecond})
				for i := range 20 {
					must(t)(g.r.Deduct(ctx, stock.Request{SKU: "x", ID: fmt.Sprint("o", i), User: fmt.Sprint("u", i%3), Qty: 1}))
				}
				must(t)(g.r.Hold(ctx, stock.Request{SKU: "x", ID: "h", Qty: 1}, time.Hour))
				require.NoError(t, g.r.Delist(ctx, "x"))
				drain(t, g.relay)
				clock.advance(time.Second)
				assert.False(t, g.once(t)["x"].Retired, "a live hold keeps the item")
				must(t)(g.r.Cancel(ctx, "x", "h"))
				drain(t, g.relay)
				rp := g.once(t)["x"]
				require.True(t, rp.Retired, rp.String())

				bases := []string{"stock:{x}"}
				if buckets > 0 {
					bases = nil
					for i := range buckets {
						bases = append(bases, protocol.BucketBase("stock", "x", i, buckets))
					}
				}
				for _, base := range bases {
					assertGone(t, c, base, ":l", ":u", ":o", ":h", ":b", ":r", ":rl", ":dl", ":p", ":x", ":xf", ":i", ":xb")
					fields, err := c.Do(ctx, c.B().Hkeys().Key(base).Build()).AsStrSlice()
					require.NoError(t, err)
					assert.LessOrEqual(t, len(fields), 2, "%s keeps only its retired mark: %v", base, fields)
				}
				assert.ErrorIs(t, testkit.Err(g.r.Levels(ctx, "x")), stock.ErrNotLoaded)
				require.NoError(t, g.r.Load(ctx, "x", 3), "a retired item may be loaded again")
				assert.Equal(t, stock.Levels{Available: 3, Loaded: 3}, levels(t, g.r, "x"))
			})
		})
	}
}

// TestReconcileIDReusedAfterTrimAcrossKinds: an id trimmed after its retention may come back as
// another kind of request: a restock's id reused by a sale, a sale's id reused by a restock. The
// store keeps its record of the first use and ignores the second use's events, so a pass neither
// requeues them nor counts them as in flight: a pass run while they are undelivered, and passes
// after their delivery, leave the counters where a pass after the delivery alone leaves them,
// with Redis's available stock on the store's books and Loaded at what was loaded and restocked.
func TestReconcileIDReusedAfterTrimAcrossKinds(t *testing.T) {
	cases := []struct {
		name         string
		first, again func(t *testing.T, r *stock.Reserver)
	}{
		{"a restock's id reused by a sale given back",
			func(t *testing.T, r *stock.Reserver) {
				must(t)(r.Restock(ctx, "x", "e", 1))
			},
			func(t *testing.T, r *stock.Reserver) {
				must(t, "the id is free again after its trim")(r.Deduct(ctx, stock.Request{SKU: "x", ID: "e", Qty: 1}))
				must(t)(r.Restore(ctx, "x", "e"))
			}},
		{"a sale's id reused by a restock",
			func(t *testing.T, r *stock.Reserver) {
				must(t)(r.Deduct(ctx, stock.Request{SKU: "x", ID: "e", Qty: 2}))
			},
			func(t *testing.T, r *stock.Reserver) {
				must(t, "the id is free again after its trim")(r.Restock(ctx, "x", "e", 1))
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, c rueidis.Client) {
				var ends []stock.Levels
				// On miniredis, one clock for both runs that moves with miniredis's, by far more
				// than the retention (it costs no time); a real server's clock runs on its own,
				// and the test waits for it.
				clock, age := newTestClock(), 5*time.Second
				mini := redistest.IsMiniredis(c)
				if !mini {
					age = 400 * time.Millisecond
				}
				for _, early := range []bool{false, true} {
					opts := []stock.Option{stock.WithPrefix(fmt.Sprintf("reuse%v:", early))}
					if mini {
						opts = append(opts, stock.WithClock(clock.now))
					}
					r := newReserver(t, c, opts...)
					g := newRigWith(t, c, r, map[string]int64{"x": 10}, &stock.ReconcileOptions{Retention: 200 * time.Millisecond})
					tc.first(t, r)
					drain(t, g.relay)
					clock.advance(age)
					redistest.Sleep(c, age)
					for i := 0; ; i++ { // the first pass settles the delivered event, a later one trims it
						g.once(t)
						if _, err := r.Ledger(ctx, "x", "e"); errors.Is(err, stock.ErrUnknownID) {
							break
						}
						require.Less(t, i, 3, "the entry of e is not trimmed")
					}
					tc.again(t, r)
					if early {
						rp := g.once(t)["x"]
						assert.Zero(t, rp.Requeued, "nothing to requeue: %v", rp)
						assert.Empty(t, rp.NeedsHuman)
						lv := levels(t, r, "x")
						assert.Equal(t, remaining(t, g.store, "x"), lv.Available+lv.Held, "the store will apply none of the events in flight: %v", rp)
					}
					drain(t, g.relay)
					for range 2 {
						rp := g.once(t)["x"]
						assert.Zero(t, rp.Requeued, "the store ignored the second use's events: nothing to requeue: %v", rp)
						assert.Empty(t, rp.NeedsHuman)
						drain(t, g.relay)
					}
					lv := levels(t, r, "x")
					assert.Equal(t, remaining(t, g.store, "x"), lv.Available+lv.Held, "Redis's stock is on the store's books")
					assert.Equal(t, int64(11), lv.Loaded, "loaded and restocked")
					assert.GreaterOrEqual(t, lv.Sold, int64(0))
					ends = append(ends, lv)
				}
				assert.Equal(t, ends[0], ends[1], "a pass while the second use's events were in flight changed the outcome")
			})
		})
	}
}

// TestReopenDelisted: a delisted item cannot be reopened (it would sell again and then be
// retired, its ledger deleted), and the retire script removes only a closed, delisted item,
// whatever the caller checked before.
func TestReopenDelisted(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		g := newRig(t, c, map[string]int64{"A": 10, "B": 10}, &stock.ReconcileOptions{Retention: time.Millisecond})
		must(t)(g.r.Deduct(ctx, stock.Request{SKU: "A", ID: "a1", Qty: 1}))
		require.NoError(t, g.r.Delist(ctx, "A"))
		err := g.r.ReopenItem(ctx, "A")
		require.ErrorIs(t, err, stock.ErrClosed)
		assert.Contains(t, err.Error(), "delisted")
		mustFail(t, stock.ErrClosed, "a delisted item stays closed")(g.r.Deduct(ctx, stock.Request{SKU: "A", ID: "a2", Qty: 1}))
		l := levels(t, g.r, "A")
		assert.True(t, l.Closed)

		// An item delisted and then reopened (as the code before this fix allowed: the
		// delisting stamp stays, the closed flag is gone) is live: retiring must refuse it.
		must(t)(g.r.Deduct(ctx, stock.Request{SKU: "B", ID: "b1", Qty: 1}))
		require.NoError(t, g.r.Delist(ctx, "B"))
		reopenBypassingCheck(t, c, "B")
		must(t, "the item sells")(g.r.Deduct(ctx, stock.Request{SKU: "B", ID: "b2", Qty: 1}))
		drain(t, g.relay)
		time.Sleep(5 * time.Millisecond)
		reps := g.once(t)
		assert.True(t, reps["A"].Retired, "a closed, delisted item is retired: %s", reps["A"])
		assert.False(t, reps["B"].Retired, "a live item is never retired: %s", reps["B"])
		assert.Contains(t, reps["B"].NeedsHuman, "delisted but open", "the pass says why it does not retire it")
		assert.Equal(t, stock.Levels{Available: 8, Sold: 2, Loaded: 10}, levels(t, g.r, "B"), "the live item is kept")
		must(t, "and sells")(g.r.Deduct(ctx, stock.Request{SKU: "B", ID: "b3", Qty: 1}))
	})
}

// reopenBypassingCheck removes the closed flag of sku's item hash directly, as a Reopen of a
// delisted item did before it was refused. It finds the item hash by its fields, so it does not
// depend on the key layout.
func reopenBypassingCheck(t *testing.T, c rueidis.Client, sku string) {
	t.Helper()
	k := findKey(t, c, sku, func(ctx context.Context, n rueidis.Client, key string) bool {
		vs, err := n.Do(ctx, n.B().Hmget().Key(key).Field("a", "d").Build()).ToArray()
		return err == nil && len(vs) == 2 && !vs[0].IsNil() && !vs[1].IsNil()
	})
	require.NoError(t, c.Do(context.Background(), c.B().Hdel().Key(k).Field("c").Build()).Error())
}
