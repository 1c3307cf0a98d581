package contract_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	"github.com/stockres/stock/stocktest"
)

// rebuildFromStore runs a repairing pass, which must rebuild each of skus (whose item hashes
// were lost) from the store, and returns its reports by item.
func rebuildFromStore(t *testing.T, r *stock.Reserver, store stock.Store, skus ...string) map[string]stockops.Report {
	t.Helper()
	rec := newReconciler(t, r, store, nil)
	reps := reports(t, rec)
	for _, sku := range skus {
		require.True(t, reps[sku].Rebuilt, "%v", reps[sku])
	}
	return reps
}

// publishToQueue makes a relay that only publishes, to a new queue, drains the outboxes through it
// and takes what it published.
func publishToQueue(t *testing.T, r *stock.Reserver) (*queue, *stockops.Relay, []stock.Event) {
	t.Helper()
	q := &queue{}
	rl := newRelay(t, r, nil, q, nil)
	testkit.Drain(t, rl)
	return q, rl, q.take()
}

// consumeRelayed runs rl once more and consumes what it published to q; a refusal event among
// it means the store refused a sale Redis made correctly.
func consumeRelayed(t *testing.T, r *stock.Reserver, st stock.Store, rl *stockops.Relay, q *queue) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, testkit.Err(rl.Once(ctx)))
	for _, ev := range q.take() {
		assert.NotEqualValues(t, stock.EventRefused, ev.Type, "store refused a valid sale: %+v", ev)
		require.NoError(t, stock.Consume(ctx, r, st, ev), "Consume late %v", ev)
	}
}

// Reconciler: "the item hash is gone (eviction, restart, DEL) → rebuilt from the Store minus
// in-flight, live holds kept". Each case sells and relays some units of its items, loses their
// item hashes (a DEL, as an eviction) and rebuilds them from the Store in a repairing pass; then
// checks what the rebuilt item must still be:
//   - sold out, with a live hold and a warm fast-path cache (fast path: never refuses an id the
//     ledger has): the ledger's ids are replays, the hold is still held and confirmable, and the
//     counters are right. Found, on every backend: the rebuilt item had Loaded = the Store's
//     remaining (1) and Sold = 0 while its surviving ledger had 4 sold entries, so Levels and the
//     ledger disagreed for good;
//   - restored (Levels: "Sold: units deducted or confirmed, net of restores"; a restore gives back
//     exactly what its id took, once). Found, on every backend: Sold went negative (-4);
//   - closed or delisted (Close: "stops selling an item"; Delist: "closed for good"): it still
//     refuses new deducts with ErrClosed, and a delisted one cannot be reopened. Found, on every
//     backend: the rebuilt item was open and sold: the marks lived only in the lost hash.
func TestRebuildAfterItemHashLost(t *testing.T) {
	for _, tc := range []struct {
		name   string
		skus   []string
		sold   int  // units sold of each item, ids o0 … before the loss
		replay bool // o0 is repeated while the item hash is lost
		// before runs after the sales, after runs once the items are rebuilt.
		before, after func(t *testing.T, r *stock.Reserver, store *memstore.Store, b redistest.Backend)
	}{
		{
			name: "sold out with a live hold", skus: []string{"lost"}, sold: 4, replay: true,
			before: func(t *testing.T, r *stock.Reserver, store *memstore.Store, b redistest.Backend) {
				require.NoError(t, testkit.Err(r.Hold(context.Background(), stock.Request{SKU: "lost", ID: "h", User: "u", Qty: 1}, time.Hour)))
				drainOfLifecycle(t, r, store)
				warmSoldOut(t, r, "lost", b.Real())
			},
			after: func(t *testing.T, r *stock.Reserver, store *memstore.Store, b redistest.Backend) {
				ctx := context.Background()
				l := testkit.Levels(t, r, "lost")
				assert.Equal(t, int64(1), l.Held, "%+v", l)
				assert.Equal(t, int64(0), l.Available, "%+v", l)
				for _, id := range numbered("o", 4) {
					rc, err := r.Deduct(ctx, stock.Request{SKU: "lost", ID: id, User: "u", Qty: 1})
					require.NoError(t, err)
					assert.True(t, rc.Replayed)
				}
				_, err := r.Confirm(ctx, "lost", "h")
				require.NoError(t, err)
				assert.Equal(t, stock.Levels{Available: 0, Held: 0, Sold: 5, Loaded: 5}, testkit.Levels(t, r, "lost"))
				check(t, r, "lost", 5)
				_, err = r.Deduct(ctx, stock.Request{SKU: "lost", ID: "more", Qty: 1})
				assert.ErrorIs(t, err, stock.ErrSoldOut)
			},
		},
		{
			name: "restored", skus: []string{"lost"}, sold: 4,
			after: func(t *testing.T, r *stock.Reserver, store *memstore.Store, b redistest.Backend) {
				for _, id := range numbered("o", 4) {
					rc, err := r.Restore(context.Background(), "lost", id)
					require.NoError(t, err)
					assert.Equal(t, int64(1), rc.Qty)
				}
				l := testkit.Levels(t, r, "lost")
				assert.GreaterOrEqual(t, l.Sold, int64(0), "sold below zero: %+v", l)
				assert.Equal(t, int64(5), l.Available)
				drainOfLifecycle(t, r, store)
				assert.Equal(t, int64(5), remaining(t, store, "lost"))
			},
		},
		{
			name: "closed and delisted", skus: []string{"cl", "dl"}, sold: 1,
			before: func(t *testing.T, r *stock.Reserver, store *memstore.Store, b redistest.Backend) {
				drainOfLifecycle(t, r, store)
				require.NoError(t, r.CloseItem(context.Background(), "cl"))
				require.NoError(t, r.Delist(context.Background(), "dl"))
			},
			after: func(t *testing.T, r *stock.Reserver, store *memstore.Store, b redistest.Backend) {
				for _, sku := range []string{"cl", "dl"} {
					l := testkit.Levels(t, r, sku)
					assert.True(t, l.Closed, "%s rebuilt open: %+v", sku, l)
					_, err := r.Deduct(context.Background(), stock.Request{SKU: sku, ID: "after", Qty: 1})
					assert.ErrorIs(t, err, stock.ErrClosed, "%s sells after the rebuild", sku)
				}
				assert.ErrorIs(t, r.ReopenItem(context.Background(), "dl"), stock.ErrClosed, "a delisted item is closed for good")
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
				ctx := context.Background()
				c := b.Client(t)
				r := testkit.NewReserver(t, c)
				store := memstore.New()
				for _, sku := range tc.skus {
					loadBoth(t, r, store, sku, 5)
					deductEach(t, r, stock.Request{SKU: sku, User: "u", Qty: 1}, numbered("o", tc.sold)...)
				}
				if tc.before != nil {
					tc.before(t, r, store, b)
				} else {
					drainOfLifecycle(t, r, store)
				}
				for _, sku := range tc.skus {
					require.NoError(t, c.Do(ctx, c.B().Del().Key("stock:{"+sku+"}").Build()).Error())
				}
				if tc.replay {
					_, err := r.Deduct(ctx, stock.Request{SKU: tc.skus[0], ID: "o0", User: "u", Qty: 1})
					t.Logf("replay while the item hash is lost: %v", err) // a replay from the ledger: fine
				}
				t.Logf("%v", rebuildFromStore(t, r, store, tc.skus...))
				tc.after(t, r, store, b)
			})
		})
	}
}

// repairQueue is queue (relay_harness_test.go), under the name other files' queue-path tests use.
type repairQueue = queue

// On the queue path, reconcile passes while the consumer is down add no stock for the sales in
// flight and repair nothing; the consumer later applies every event, redelivered in reverse order,
// without the store refusing a sale Redis made correctly: Redis and the store agree, each event is
// applied once, every sale is applied in the ledger and a pass finds nothing in flight. Cases:
//   - restores, reused units and a restock, each message delivered twice;
//   - a grouped item (WithGroups keys): deduct a, restore a, deduct b on one unit, delivered b
//     first (per-item order through Consume holds for grouped items too);
//   - a consumer killed between the store's commit and Consume's acknowledgement to Redis: the
//     sale is in the store and still published in Redis, counted once; the redelivery is answered
//     at once and changes nothing.
func TestQueuePassWhileConsumerDown(t *testing.T) {
	for _, tc := range []struct {
		name   string
		opts   []stock.Option
		skus   []string
		load   int64
		sell   func(t *testing.T, r *stock.Reserver)
		killed bool  // the consumer's first deliveries commit, then it dies
		copies int   // the redelivery hands each message over copies times
		want   int64 // each item's stock at the end
	}{
		{
			name: "restores and a restock", skus: []string{"qa"}, load: 5, copies: 2,
			sell: func(t *testing.T, r *stock.Reserver) {
				// 5 sales, restore two, two more sales that use the restored units, a restock of
				// 3 and three sales of those.
				sale := stock.Request{SKU: "qa", Qty: 1}
				deductEach(t, r, sale, numbered("d", 5)...)
				for _, id := range []string{"d1", "d3"} {
					require.NoError(t, testkit.Err(r.Restore(context.Background(), "qa", id)))
				}
				deductEach(t, r, sale, "e1", "e2")
				require.NoError(t, testkit.Err(r.Restock(context.Background(), "qa", "rs", 3)))
				deductEach(t, r, sale, "f1", "f2", "f3")
			},
		},
		{
			name: "grouped item", opts: []stock.Option{stock.WithGroups(func(string) string { return "shoe" })},
			skus: []string{"s42", "s43"}, load: 1, copies: 1,
			sell: func(t *testing.T, r *stock.Reserver) {
				ctx := context.Background()
				require.NoError(t, testkit.Err(r.DeductMany(ctx, stock.Cart{ID: "a", Lines: unitLines("s42", "s43")})))
				for _, sku := range []string{"s42", "s43"} {
					require.NoError(t, testkit.Err(r.Restore(ctx, sku, "a")))
				}
				require.NoError(t, testkit.Err(r.DeductMany(ctx, stock.Cart{ID: "b", Lines: unitLines("s42", "s43")})))
			},
		},
		{
			name: "consumer killed after commit", skus: []string{"kc"}, load: 4, killed: true, copies: 1, want: 1,
			sell: func(t *testing.T, r *stock.Reserver) {
				deductEach(t, r, stock.Request{SKU: "kc", Qty: 1}, numbered("k", 4)...)
				require.NoError(t, testkit.Err(r.Restore(context.Background(), "kc", "k0")))
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
				ctx := context.Background()
				r := testkit.NewReserver(t, b.Client(t), append([]stock.Option{stock.WithCoalescing(0)}, tc.opts...)...)
				st := &dieAfterCommit{Store: memstore.New()}
				for _, sku := range tc.skus {
					loadBoth(t, r, st, sku, tc.load)
				}
				tc.sell(t, r)
				q, rl, msgs := publishToQueue(t, r)
				require.NotEmpty(t, msgs, "relay published nothing")
				if tc.killed {
					st.die.Store(true)
					for _, ev := range msgs {
						t.Logf("consume %s %s (dies after commit): %v", ev.Type, ev.ID, stock.Consume(ctx, r, st, ev))
					}
					st.die.Store(false)
				}
				rc := newReconciler(t, r, st.Store, nil)
				for i := range 2 {
					res, err := rc.Pass(ctx)
					require.NoError(t, err, "pass %d (%+v)", i, res)
					for _, rp := range res.Reports {
						require.False(t, rp.Adjusted != 0 || rp.Drift != 0 || rp.Rebuilt || rp.Resynced != 0 || rp.Requeued != 0, "pass %d with the consumer down repaired in-flight sales: %s", i, rp)
					}
				}
				for _, sku := range tc.skus {
					assert.Equal(t, tc.want, testkit.Levels(t, r, sku).Available, "%s: available with the consumer down", sku)
				}
				// The queue redelivers everything, reversed, copies times each.
				var redeliver []stock.Event
				for i := len(msgs) - 1; i >= 0; i-- {
					for range tc.copies {
						redeliver = append(redeliver, msgs[i])
					}
				}
				if tc.killed { // what was committed is answered at once
					for _, ev := range redeliver {
						assert.NoError(t, stock.Consume(ctx, r, st, ev), "redelivery %s %s", ev.Type, ev.ID)
					}
				} else {
					repairConsumeAll(t, ctx, r, st, redeliver, rand.New(rand.NewPCG(uint64(len(tc.skus)), 0)))
				}
				// Refusal events published by Consume would show store refusals.
				consumeRelayed(t, r, st, rl, q)
				for _, sku := range tc.skus {
					assert.Equal(t, tc.want, remaining(t, st, sku), "%s: store remaining", sku)
					assert.Equal(t, tc.want, testkit.Levels(t, r, sku).Available, "%s: Redis available", sku)
					for id, e := range testkit.Ledger(t, r, sku) {
						assert.True(t, !e.Taken() || e.State == stock.StateApplied, "%s %s: %s, want applied", sku, id, e.State)
					}
				}
				assert.LessOrEqual(t, st.MaxApplications(), 1, "an event applied twice")
				res, err := rc.Pass(ctx)
				require.NoError(t, err, "pass after the redelivery")
				for _, rp := range res.Reports {
					assert.False(t, rp.Adjusted != 0 || rp.Drift != 0 || rp.Published != 0 || rp.InFlight != 0, "after the redelivery: %s", rp)
				}
			})
		})
	}
}

// Broken promise under test: reconcile interleaved with a consumer that applies
// part of the queue (a consumer behind) never adjusts stock, at every step.
func TestQueueReconcileInterleavedWithSlowConsumer(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		ctx := context.Background()
		r := testkit.NewReserver(t, b.Client(t), stock.WithCoalescing(0))
		st := memstore.New()
		const sku = "qb"
		const n = 30
		loadBoth(t, r, st, sku, n)
		rng := rand.New(rand.NewPCG(uint64(7), 0))
		q := &queue{}
		rl := newRelay(t, r, nil, q, nil)
		rc := newReconciler(t, r, st, nil)
		var backlog []stock.Event
		next := 0
		for step := 0; step < 40; step++ {
			// a few operations
			for k := 0; k < 3; k++ {
				id := fmt.Sprintf("x%d", next)
				next++
				_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: 1})
				if err != nil && !errors.Is(err, stock.ErrSoldOut) {
					t.Fatal(err)
				}
				if err == nil && rng.IntN(3) == 0 {
					require.NoError(t, testkit.Err(r.Restore(ctx, sku, id)))
				}
			}
			require.NoError(t, testkit.Err(rl.Once(ctx)))
			backlog = append(backlog, q.take()...)
			// consumer applies a random part, in random order, with duplicates
			rng.Shuffle(len(backlog), func(i, j int) { backlog[i], backlog[j] = backlog[j], backlog[i] })
			k := rng.IntN(len(backlog) + 1)
			var kept []stock.Event
			for i, ev := range backlog {
				if i >= k {
					kept = append(kept, ev)
					continue
				}
				err := stock.Consume(ctx, r, st, ev)
				if errors.Is(err, stock.ErrHeldBack) {
					kept = append(kept, ev)
					continue
				}
				require.NoError(t, err, "Consume")
				if rng.IntN(4) == 0 {
					kept = append(kept, ev) // duplicate redelivery later
				}
			}
			backlog = kept
			res, err := rc.Pass(ctx)
			require.NoError(t, err, "step %d Pass", step)
			for _, rp := range res.Reports {
				require.False(t, rp.Adjusted != 0 || rp.Drift != 0 || rp.Resynced != 0 || rp.Requeued != 0 || rp.Rebuilt, "step %d: pass repaired with events in flight: %s", step, rp)
			}
		}
		repairConsumeAll(t, ctx, r, st, backlog, rng)
		for i := 0; i < 3; i++ {
			consumeRelayed(t, r, st, rl, q)
		}
		lv, err := r.Levels(ctx, sku)
		require.NoError(t, err)
		rem := remaining(t, st, sku)
		assert.EqualValues(t, rem, lv.Available+lv.Held, "redis available %d != store remaining %d", lv.Available, rem)
		assert.LessOrEqual(t, st.MaxApplications(), 1, "double application")
	})
}

// Promise under test: FLUSHALL with sales in flight on
// the queue path: Pass says so loudly (ErrRegistryLost), and rebuilds from the
// Store; the consumer's late events do not make the store refuse sales.
func TestFlushallWithQueueBacklogRebuildOversells(t *testing.T) {
	t.Skip("open, documented in the README's non-guarantees: a rebuild after Redis lost its data cannot see sales still in the queue")
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		r, st := withStore(t, c, 4, []string{"fl"}, stock.WithCoalescing(0))
		deductEach(t, r, stock.Request{SKU: "fl", Qty: 1}, numbered("s", 3)...)
		q, rl, msgs := publishToQueue(t, r)
		// apply one
		require.NoError(t, stock.Consume(ctx, r, st, msgs[0]))
		for addr, n := range c.Nodes() {
			if err := n.Do(ctx, n.B().Flushall().Build()).Error(); err != nil && !rueidis.IsRedisNil(err) {
				// replicas refuse; masters are what matter
				t.Logf("flushall %s: %v", addr, err)
			}
		}
		rc, _ := stockops.NewReconciler(r, st, nil)
		_, err := rc.Once(ctx)
		require.ErrorIs(t, err, stock.ErrRegistryLost, "Once after FLUSHALL: %v, want ErrRegistryLost", err)
		res, err := rc.Pass(ctx)
		t.Logf("second pass: %v %+v", err, res)
		lv, err := r.Levels(ctx, "fl")
		require.NoError(t, err, "item not rebuilt")
		// store remaining 3 (one applied); two sales were lost with Redis.
		t.Logf("levels after rebuild: %+v", lv)
		// late consumer delivers the rest: held back, applied, or invalid — never panics, and
		// the store never goes below what Redis thinks.
		for _, ev := range msgs[1:] {
			err := stock.Consume(ctx, r, st, ev)
			t.Logf("late consume %s: %v", ev.ID, err)
		}
		rem, _ := st.Remaining(ctx, "fl")
		lv, _ = r.Levels(ctx, "fl")
		assert.LessOrEqual(t, lv.Available, rem, "after the rebuild and the consumer's late events, Redis would sell %d units, store has %d", lv.Available, rem)
		// What that costs buyers: sell what Redis offers, deliver through the queue.
		sold := 0
		for i := 0; ; i++ {
			_, err := r.Deduct(ctx, stock.Request{SKU: "fl", ID: fmt.Sprint("n", i), Qty: 1})
			if errors.Is(err, stock.ErrSoldOut) {
				break
			}
			require.NoError(t, err)
			sold++
		}
		refused := 0
		for round := 0; round < 3; round++ {
			require.NoError(t, testkit.Err(rl.Once(ctx)))
			for _, ev := range q.take() {
				if ev.Type == stock.EventRefused {
					refused++
				}
				if err := stock.Consume(ctx, r, st, ev); err != nil {
					t.Logf("consume %v: %v", ev, err)
				}
			}
		}
		assert.Zero(t, refused, "buyers told yes then no: the store refused %d of %d sales Redis made after its rebuild", refused, sold)
		// the registry is back: relays see the item again
		found := false
		for sku, err := range stockops.Items(ctx, r) {
			require.NoError(t, err)
			found = found || sku == "fl"
		}
		assert.True(t, found, "item not registered again after the repairing pass")
	})
}

// A ledger entry lost (its key deleted, as an eviction) while its event is pending or published:
// the event cannot be built from Redis any more, yet it records an acknowledged sale stored
// nowhere else. A relay delivering to a Store ("direct") or publishing ("queue") must not drop it:
// it goes to the dead-letter set and the item is left for an operator; no reconcile pass may give
// its units back. When the events were published before the loss ("published"), a consumer that
// gets them late never makes Redis offer more than the store has.
func TestOrphanedEventsNotGivenBack(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		for _, path := range []string{"direct", "queue", "published"} {
			t.Run(path, func(t *testing.T) {
				ctx := context.Background()
				prefix := "orph-" + path
				r, store := withStore(t, c, 10, []string{"A"}, stock.WithPrefix(prefix), stock.WithCoalescing(0))
				deductEach(t, r, stock.Request{SKU: "A", Qty: 2}, numbered("o", 3)...)
				var msgs []stock.Event
				if path == "published" {
					_, _, msgs = publishToQueue(t, r)
				}
				require.NoError(t, c.Do(ctx, c.B().Del().Key(prefix+":{A}:l").Build()).Error())
				passes := func(what string) {
					t.Helper()
					rec := newReconciler(t, r, store, &stock.ReconcileOptions{Items: []string{"A"}})
					reps, err := rec.Once(ctx)
					t.Logf("%s pass: %v", what, err)
					for _, rp := range reps {
						assert.LessOrEqual(t, rp.Adjusted, int64(0), "%s pass gave back units of acknowledged sales: %s", what, rp)
						if path != "published" {
							assert.NoError(t, err)
							assert.Zero(t, rp.Adjusted, "%s", rp)
							assert.NotEmpty(t, rp.NeedsHuman)
						}
					}
				}
				if path == "published" { // a second consumer gets o2 first: earlier events lost their ledger
					t.Logf("Consume o2 (earlier entries gone): %v", stock.Consume(ctx, r, store, msgs[2]))
				} else {
					var pub stock.Publisher
					var st stock.Store = store
					if path == "queue" {
						pub, st = &queue{}, nil
					}
					rl := newRelay(t, r, st, pub, nil)
					stats, err := rl.Once(ctx)
					require.NoError(t, err)
					assert.Equal(t, 3, stats.Orphaned, "%+v", stats)
					assert.Equal(t, 3, stats.DeadLettered, "%+v", stats)
					assert.Zero(t, stats.Delivered+testkit.Drain(t, rl).Claimed)
					pending, dead, err := stockops.Pending(ctx, r, "A")
					require.NoError(t, err)
					assert.Zero(t, pending)
					assert.EqualValues(t, 3, dead, "the events wait for an operator")
				}
				passes("first")
				passes("second")
				assert.Equal(t, int64(4), testkit.Levels(t, r, "A").Available, "no units of the orphaned sales given back")
				_, err := r.Deduct(ctx, stock.Request{SKU: "A", ID: "more", Qty: 5})
				assert.ErrorIs(t, err, stock.ErrInsufficient)
				if path == "published" {
					for _, ev := range msgs {
						t.Logf("late consume %s: %v", ev.ID, stock.Consume(ctx, r, store, ev))
					}
					rem, _ := store.Remaining(ctx, "A")
					assert.LessOrEqual(t, testkit.Levels(t, r, "A").Available, rem, "Redis would sell more than the store has")
					passes("final")
				}
			})
		}
	})
}

// dieAfterCommit applies the event, then answers an error: a consumer killed
// between the database commit and its acknowledgement to Redis.
type dieAfterCommit struct {
	*memstore.Store
	die atomic.Bool
}

func (s *dieAfterCommit) Apply(ctx context.Context, ev stock.Event) error {
	err := s.Store.Apply(ctx, ev)
	if err == nil && s.die.Load() {
		return errors.New("consumer killed after commit")
	}
	return err
}

// "the first pass runs at once": Run's reconciler repairs drift right away, even with a long
// Interval.
func TestRunFirstReconcilePassAtOnce(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		r, st := withStore(t, c, 10, []string{"drift"})
		st.Set("drift", 7) // the database of record has 3 fewer
		cancel, done := runAsync(r, stock.RunOptions{Store: st, Reconcile: &stock.ReconcileOptions{Interval: time.Hour}})
		defer func() { cancel(); <-done }()
		ok := eventually(5*time.Second, func() bool { return testkit.Levels(t, r, "drift").Available == 7 })
		assert.True(t, ok, "the first reconcile pass ran at once: %+v", testkit.Levels(t, r, "drift"))
	})
}

// Levels "returns ErrNotLoaded, never zero counters, for an item Redis does not know", also when
// the item's hash was lost (a deleted key); CloseItem then answers ErrNotLoaded too.
func TestLevelsLostHash(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := testkit.NewReserver(t, c)
		require.NoError(t, r.Load(ctx, "lost", 10))
		require.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: "lost", ID: "d", Qty: 1})))
		require.NoError(t, c.Do(ctx, c.B().Del().Key("stock:{lost}").Build()).Error())
		l, err := r.Levels(ctx, "lost")
		assert.ErrorIs(t, err, stock.ErrNotLoaded, "%+v", l)
		assert.ErrorIs(t, r.CloseItem(ctx, "lost"), stock.ErrNotLoaded)
		_, err = r.Deduct(ctx, stock.Request{SKU: "lost", ID: "d2", Qty: 1})
		assert.ErrorIs(t, err, stock.ErrNotLoaded)
		n, err := stockops.Sweep(ctx, r, "lost")
		t.Logf("Sweep of a lost item: %d, %v", n, err)
		assert.Equal(t, int64(0), n)
	})
}

// A repairing Reconciler runs pass after pass while the relay publishes and consumers apply, with
// duplicates. There is no drift to repair: no pass may adjust Redis, and the store must end equal
// to Redis and to the acknowledged answers.
func TestReconcilerDuringConsume(t *testing.T) {
	ctx, e, st, rng := setup(t, 12)
	skus := []string{"c:1", "c:2", "c:3", "c:4"}
	acks := traffic(t, ctx, e.Reserver, st.Store, skus, 300, rng)
	q := &relayQueue{}
	rl := newRelay(t, e.Reserver, nil, q, &stock.RelayOptions{Batch: 4})
	rec := newReconciler(t, e.Reserver, st, nil)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var adjusted, passes atomic.Int64
	var repairs sync.Map
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			reps, err := rec.Once(ctx)
			if err != nil {
				t.Errorf("reconcile pass: %v", err)
				return
			}
			passes.Add(1)
			for _, rp := range reps {
				if rp.Adjusted != 0 || rp.Requeued != 0 || rp.Resynced != 0 || rp.Rebuilt {
					adjusted.Add(1)
					repairs.Store(rp.SKU, rp.String())
				}
			}
		}
	})
	var held []stock.Event
	for pass := 0; pass < 400; pass++ {
		_, _ = rl.Once(ctx)
		msgs := append(held, q.take()...)
		held = nil
		dup := append([]stock.Event(nil), msgs...)
		msgs = append(msgs, dup[:len(dup)/2]...)
		rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
		var cwg sync.WaitGroup
		var mu sync.Mutex
		for w := 0; w < 4; w++ {
			cwg.Go(func() {
				for i := w; i < len(msgs); i += 4 {
					if err := stock.Consume(ctx, e.Reserver, st, msgs[i]); err != nil && !errors.Is(err, stock.ErrInvalid) {
						mu.Lock()
						held = append(held, msgs[i])
						mu.Unlock()
					}
				}
			})
		}
		cwg.Wait()
		var pending int64
		for _, sku := range skus {
			p, _, _ := stockops.Pending(ctx, e.Reserver, sku)
			pending += p
		}
		if pending == 0 && len(held) == 0 && len(q.snapshot()) == 0 && pass > 5 {
			break
		}
		e.Advance(2 * time.Minute)
	}
	close(stop)
	wg.Wait()
	relayConsumeAll(t, ctx, e.Reserver, st, held, rng)
	require.NotZero(t, passes.Load(), "no reconcile pass ran")
	if n := adjusted.Load(); n > 0 {
		repairs.Range(func(k, v any) bool { t.Errorf("item %v repaired with no drift: %v", k, v); return true })
	}
	t.Logf("%d reconcile passes ran during the drain", passes.Load())
	verify(t, ctx, e.Reserver, st, acks)
}

// Redis no longer has ledger entries the store has, after every event of an item went through the
// queue and was applied, and a repairing pass writes them back from the store's records
// ("rerecorded"). Found while testing the retention: the rewritten entry of a restock did not
// pass the scripts' own checks, so from then on every pass over the item failed with ErrInvalid
// ("restock of more than is available after it") and Ledger could not read that id: the item
// was never reconciled again. Two roads lead there:
//   - a pass trims the settled entries (a short Retention), then a Reconciler with the default
//     Retention (an operator raised it, or a second service runs with its own) takes the store's
//     records of the trimmed ids for entries Redis lost;
//   - the documented one: Redis loses the item's ledger hash (an evicted key).
//
// Three passes with the default Retention then succeed, every restock id reads in the Ledger,
// Redis's available equals the store's remaining, and the books match the acknowledged answers.
func TestRerecordedRestockKeepsItemReconciled(t *testing.T) {
	for _, tc := range []struct {
		name string
		sku  string
		// lose makes Redis lose the item's settled entries.
		lose func(t *testing.T, ctx context.Context, e *stocktest.Env, st *orderStore)
		// rerecords: the passes must report rewritten entries.
		rerecords bool
	}{
		{
			name: "retention raised after a trim",
			sku:  "ret:1",
			lose: func(t *testing.T, ctx context.Context, e *stocktest.Env, st *orderStore) {
				e.Advance(time.Second)
				short := newReconciler(t, e.Reserver, st.Store, &stock.ReconcileOptions{Retention: time.Millisecond})
				require.NoError(t, testkit.Err(short.Once(ctx)), "pass with the short retention")
			},
		},
		{
			name: "ledger hash evicted",
			sku:  "ev:1",
			lose: func(t *testing.T, ctx context.Context, e *stocktest.Env, st *orderStore) {
				lost := 0
				for _, k := range e.Redis.Keys() { // the item's ledger: the hash whose key ends in ":l"
					if strings.HasSuffix(k, ":l") && strings.Contains(k, "{ev:1}") {
						e.Redis.Del(k)
						lost++
					}
				}
				require.EqualValues(t, 1, lost, "found %d ledger keys of the item to evict", lost)
			},
			rerecords: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, e, st, rng := setup(t, 14)
			acks, _ := consumedTraffic(t, ctx, e, st, rng, []string{tc.sku}, 60)
			require.NotEmpty(t, acks.restock[tc.sku], "the traffic made no restock")
			tc.lose(t, ctx, e, st)
			rec := newReconciler(t, e.Reserver, st.Store, nil)
			rerecorded := 0
			for i := 0; i < 3; i++ {
				reps, err := rec.Once(ctx)
				assert.NoError(t, err, "pass %d with the default retention after the loss: %v (reports %v)", i, err, reps)
				for _, rp := range reps {
					rerecorded += rp.Rerecorded
				}
			}
			assert.False(t, tc.rerecords && rerecorded == 0, "no pass re-recorded the lost entries")
			for id := range acks.restock[tc.sku] {
				assert.NoError(t, testkit.Err(e.Reserver.Ledger(ctx, tc.sku, id)), "Ledger of re-recorded restock %s", id)
			}
			lv, _ := e.Reserver.Levels(ctx, tc.sku)
			rem, _ := st.Remaining(ctx, tc.sku)
			assert.EqualValues(t, rem, lv.Available, "Redis %d, store %d", lv.Available, rem)
			verify(t, ctx, e.Reserver, st, acks)
		})
	}
}

// consumedTraffic runs n calls of traffic on skus, publishes every event to a queue and
// consumes them all, and checks the books against the acknowledged answers. It returns those
// answers and the messages consumed.
func consumedTraffic(t *testing.T, ctx context.Context, e *stocktest.Env, st *orderStore, rng *rand.Rand, skus []string, n int) (*acks, []stock.Event) {
	t.Helper()
	acks := traffic(t, ctx, e.Reserver, st.Store, skus, n, rng)
	q := &relayQueue{}
	rl := newRelay(t, e.Reserver, nil, q, nil)
	drain(t, ctx, e, rl, skus)
	msgs := q.take()
	relayConsumeAll(t, ctx, e.Reserver, st, append([]stock.Event(nil), msgs...), rng)
	verify(t, ctx, e.Reserver, st, acks)
	return acks, msgs
}

// drift collects the reconcile observations that report drift.
type drift struct {
	mu    sync.Mutex
	seen  []string
	count atomic.Int64
}

func (d *drift) Observe(_ context.Context, o stock.Observation) {
	if o.Op != "reconcile" {
		return
	}
	d.count.Add(1)
	if o.Units != 0 {
		d.mu.Lock()
		d.seen = append(d.seen, fmt.Sprintf("%s drift %d (%s)", o.SKU, o.Units, o.Outcome))
		d.mu.Unlock()
	}
}

func (d *drift) check(t *testing.T) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	assert.Empty(t, d.seen, "reconcile passes reported drift")
}

// checkReports fails t on a report that found drift or repaired anything while the sale was
// consistent. Settled (a consumer's acknowledgement taken for it) and Busy are allowed; with
// rerecords, so are rewritten ledger entries (see TestTrimThenRerecord).
func checkReports(t *testing.T, res stockops.PassResult, err error, rerecords bool) {
	t.Helper()
	assert.False(t, err != nil && !errors.Is(err, context.Canceled), "reconcile pass: %v", err)
	for _, rp := range res.Reports {
		if rp.Busy {
			continue
		}
		assert.False(t, rp.Drift != 0 || rp.Adjusted != 0 || rp.NeedsHuman != "" || rp.Requeued != 0 || rp.Resynced != 0 || (rp.Rerecorded != 0 && !rerecords) || rp.Rebuilt, "reconcile pass touched a consistent item: %+v", rp)
	}
}

// queueOfReconcile is an in-memory queue with several consumers that take messages in random order,
// redeliver some twice, and retry held-back ones later.
type queueOfReconcile struct {
	mu       sync.Mutex
	msgs     []stock.Event
	busy     int
	consumed atomic.Int64
	heldBack atomic.Int64
}

func (q *queueOfReconcile) push(ev stock.Event) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.msgs = append(q.msgs, ev)
	if rand.IntN(4) == 0 { // the queue delivers this one twice
		q.msgs = append(q.msgs, ev)
	}
}

func (q *queueOfReconcile) take() (stock.Event, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.msgs) == 0 {
		return stock.Event{}, false
	}
	i := rand.IntN(len(q.msgs))
	if rand.IntN(2) == 0 {
		i = len(q.msgs) - 1 // newest first: later events before earlier ones
	}
	ev := q.msgs[i]
	q.msgs[i] = q.msgs[len(q.msgs)-1]
	q.msgs = q.msgs[:len(q.msgs)-1]
	q.busy++
	return ev, true
}

func (q *queueOfReconcile) done(ev stock.Event, again bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.busy--
	if again {
		q.msgs = append(q.msgs, ev)
	}
}

func (q *queueOfReconcile) idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.msgs) == 0 && q.busy == 0
}

func (q *queueOfReconcile) consumers(ctx context.Context, t *testing.T, n int, r *stock.Reserver, store stock.Store) *sync.WaitGroup {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for ctx.Err() == nil {
				ev, ok := q.take()
				if !ok {
					time.Sleep(time.Millisecond)
					continue
				}
				if rand.IntN(3) == 0 {
					time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
				}
				err := stock.Consume(ctx, r, store, ev)
				switch {
				case err == nil:
					q.consumed.Add(1)
					q.done(ev, false)
				case errors.Is(err, stock.ErrHeldBack):
					q.heldBack.Add(1)
					time.Sleep(time.Duration(1+rand.IntN(5)) * time.Millisecond)
					q.done(ev, true)
				case errors.Is(err, stock.ErrInvalid):
					t.Errorf("Consume refused a genuine event as invalid: %+v: %v", ev, err)
					q.done(ev, false)
				default:
					if ctx.Err() == nil {
						t.Logf("Consume: temporary error: %v", err)
					}
					q.done(ev, true)
				}
			}
		})
	}
	return &wg
}

// repairTraffic runs deducts then restores of the same ids on the items from several goroutines:
// ids are reused across items, some restores come first (tombstones), and the small item sells
// out so that restores free the units later deducts take.
func repairTraffic(t *testing.T, r *stock.Reserver, sale *sale, skus []string, workers, per int) {
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range per {
				id := fmt.Sprintf("ord:%d~%d", w, i) // the same id on several items
				a := skus[(w+i)%len(skus)]
				b := skus[(w+i+1)%len(skus)]
				switch i % 5 {
				case 0, 1, 2:
					okA := sale.deduct(t, ctx, r, a, id, int64(1+rand.IntN(3)))
					okB := sale.deduct(t, ctx, r, b, id, 1)
					if okA && rand.IntN(2) == 0 {
						sale.restore(t, ctx, r, a, id)
					}
					if okB && rand.IntN(3) == 0 {
						sale.restore(t, ctx, r, b, id)
					}
				case 3: // a restore that overtakes its deduct
					sale.restore(t, ctx, r, a, id)
					sale.deduct(t, ctx, r, a, id, 1)
				case 4: // deduct, restore, and a retry of both
					if sale.deduct(t, ctx, r, a, id, 2) {
						sale.restore(t, ctx, r, a, id)
						sale.restore(t, ctx, r, a, id)
					}
					sale.deduct(t, ctx, r, a, id, 2)
				}
			}
		})
	}
	wg.Wait()
}

// reconciling runs passes of rc back to back until ctx ends, checking each (checkReports).
func reconciling(ctx context.Context, t *testing.T, rc *stockops.Reconciler, passes *atomic.Int64, rerecords bool) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			res, err := rc.Pass(ctx)
			if ctx.Err() != nil {
				return
			}
			passes.Add(1)
			checkReports(t, res, err, rerecords)
			time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
		}
	})
	return &wg
}

var items = map[string]int64{"q:1": 400, "sku:with:colons": 400, "tilde~sku": 400, "x:~:y": 400, "small~1": 12}

// Deducts and restores of the same ids run while a reconciler runs passes back to back; no pass
// may report drift or repair anything, and at the end (every event delivered) a pass finds no
// drift, nothing busy or published, and the levels and the store match the acknowledged answers.
//
// On the queue path, Run publishes only and several consumers apply the events through Consume,
// out of order and some twice. Variants: a store that takes a few milliseconds (a consumer's Apply
// and its acknowledgement in Redis far apart) with two reconcilers of two processes; a short
// retention, so that passes trim settled entries while late copies of their events are still
// consumed. On the Store path, Run applies the events to a slowish store and runs its own
// reconcile passes every few milliseconds, while another process's Run relays too; no pass (Run's,
// observed, or the reconciler's) may find drift.
func TestReconcileConcurrentRestores(t *testing.T) {
	testkit.ParallelOnMiniredis(t)
	for _, v := range []restoresCase{
		{name: "queue-path", queue: true, reconcilers: 1},
		{name: "queue-path/slow-store-two-reconcilers", queue: true, slow: true, reconcilers: 2},
		{name: "queue-path/short-retention", queue: true, reconcilers: 1, retention: 200 * time.Millisecond},
		{name: "store-path/two-runs", reconcilers: 1},
	} {
		t.Run(v.name, func(t *testing.T) {
			relayEach(t, nil, func(t *testing.T, e *relayEnv) { concurrentRestores(t, e, v) })
		})
	}
}

// restoresCase is a variant of TestReconcileConcurrentRestores.
type restoresCase struct {
	name        string
	queue, slow bool // the queue path; its consumers' store is slow
	reconcilers int
	retention   time.Duration
}

// slowly is a delay of a few milliseconds now and then, for requestStore.
func slowly() time.Duration {
	if rand.IntN(4) == 0 {
		return time.Duration(rand.IntN(3)) * time.Millisecond
	}
	return 0
}

func concurrentRestores(t *testing.T, e *relayEnv, v restoresCase) {
	drift := &drift{}
	r := e.another(stock.WithObserver(drift))
	mem := memstore.New()
	load(t, r, mem, items)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	q := &queueOfReconcile{}
	cons := &sync.WaitGroup{}
	var runs []<-chan result
	if v.queue {
		runs = append(runs, run(ctx, r, stock.RunOptions{Publisher: batchPub{&relayPub{push: q.push}}, Drain: 2 * time.Second,
			Relay: &stock.RelayOptions{Poll: 5 * time.Millisecond, Batch: 8}}))
		var consStore stock.Store = mem
		if v.slow {
			consStore = &requestStore{base: mem, delay: func() time.Duration { return time.Duration(rand.IntN(4)) * time.Millisecond }}
		}
		cons = q.consumers(ctx, t, 6, r, consStore)
	} else {
		st := &requestStore{base: mem, delay: slowly}
		runs = append(runs, run(ctx, r, stock.RunOptions{Store: st, Drain: 2 * time.Second,
			Relay:     &stock.RelayOptions{Poll: 5 * time.Millisecond, Batch: 4},
			Reconcile: &stock.ReconcileOptions{Interval: 15 * time.Millisecond}}))
		runs = append(runs, run(ctx, e.another(stock.WithObserver(drift)), stock.RunOptions{Store: batchStore{st}, Drain: 2 * time.Second,
			Relay:     &stock.RelayOptions{Poll: 5 * time.Millisecond, Batch: 16},
			Reconcile: &stock.ReconcileOptions{Interval: 25 * time.Millisecond}}))
	}
	var passes atomic.Int64
	recDone := &sync.WaitGroup{}
	for i := range v.reconcilers {
		rr := r
		if i > 0 {
			rr = e.another(stock.WithObserver(drift))
		}
		rc := newReconciler(t, rr, mem, &stock.ReconcileOptions{Retention: v.retention})
		// A short retention trims entries that the store's records then write back:
		// TestTrimThenRerecord; here only drift and stock repairs count.
		w := reconciling(ctx, t, rc, &passes, v.retention > 0)
		recDone.Go(w.Wait)
	}
	if v.retention > 0 && !e.real {
		// The miniredis clock stands still: move it as a real one would.
		recDone.Go(func() {
			for ctx.Err() == nil {
				e.advance(10 * time.Millisecond)
				time.Sleep(5 * time.Millisecond)
			}
		})
	}

	sale := newSale()
	repairTraffic(t, r, sale, keys(items), 8, 60)

	// Wait until every event is delivered (on the queue path, published and consumed).
	deadline := time.Now().Add(90 * time.Second)
	for {
		quiet := q.idle()
		for sku := range items {
			p, d, err := stockops.Pending(context.Background(), r, sku)
			require.NoError(t, err)
			quiet = quiet && p == 0 && d == 0
		}
		if quiet {
			dry := newReconciler(t, r, mem, &stock.ReconcileOptions{DryRun: true})
			res, err := dry.Pass(context.Background())
			require.NoError(t, err)
			for _, rp := range res.Reports {
				quiet = quiet && rp.Published == 0 && rp.Pending == 0
			}
		}
		if quiet && q.idle() {
			break
		}
		require.False(t, time.Now().After(deadline), "events still in flight after 90s")
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // a few more passes (Run's too) on the settled items
	stop()
	now := time.Now()
	for _, ch := range runs {
		res := wait(t, ch, now, 2*time.Second+3*time.Second)
		assert.ErrorIs(t, res.err, context.Canceled)
	}
	cons.Wait()
	recDone.Wait()
	t.Logf("%s: %d passes, %d reconcile observations, %d consumed, %d held back", e.name, passes.Load(), drift.count.Load(), q.consumed.Load(), q.heldBack.Load())
	assert.Positive(t, passes.Load())

	final := newReconciler(t, r, mem, &stock.ReconcileOptions{Retention: v.retention})
	fres, err := final.Pass(context.Background())
	checkReports(t, fres, err, v.retention > 0)
	for _, rp := range fres.Reports {
		assert.False(t, rp.Busy, "%s busy at the end", rp.SKU)
		assert.Zero(t, rp.Published, "%s: published set empty", rp.SKU)
	}
	drift.check(t)
	sale.checkStore(t, r, mem, items)
}

// TestTrimThenRerecord: a reconcile pass with a retention trims a settled ledger entry
// (judged by the Redis time of the entry), and the next pass writes it back from the store's
// record (judged by the store's time of the record, which is later: the relay applied it later),
// reporting it as Rerecorded: "ledger entries the Store has and Redis lost, written back". Redis
// lost nothing, the pass's own trim removed them; an operator is told Redis lost data. Steps:
// deduct 5 units; 2s later the relay applies them to a memstore; 0.5s later two passes with
// Retention 1s, back to back. Expected: the first trims 5, the second rerecords nothing.
func TestTrimThenRerecord(t *testing.T) {
	testkit.ParallelOnMiniredis(t)
	relayEach(t, nil, func(t *testing.T, e *relayEnv) {
		ctx := context.Background()
		pass := func(d time.Duration) { // let d pass on both clocks: the store's and Redis's
			time.Sleep(d)
			if !e.real {
				e.advance(d)
			}
		}
		mem := memstore.New()
		sku := "trim:re~1"
		require.NoError(t, e.r.Load(ctx, sku, 10))
		require.NoError(t, mem.Load(ctx, sku, 10))
		sale := newSale()
		for i := range 5 {
			sale.deduct(t, ctx, e.r, sku, fmt.Sprint("t:", i), 1)
		}
		pass(2 * time.Second)
		rl := newRelay(t, e.r, mem, nil, nil)
		st, err := rl.Once(ctx)
		require.NoError(t, err)
		require.Equal(t, 5, st.Delivered)
		pass(500 * time.Millisecond)
		rc := newReconciler(t, e.r, mem, &stock.ReconcileOptions{Retention: time.Second})
		rp, err := rc.Item(ctx, sku)
		require.NoError(t, err)
		t.Logf("%s: first pass: %s", e.name, rp.String())
		assert.Zero(t, rp.Drift)
		assert.Zero(t, rp.Rerecorded)
		// The next pass, at once: Redis lost nothing since.
		rp2, err := rc.Item(ctx, sku)
		require.NoError(t, err)
		t.Logf("%s: second pass: %s", e.name, rp2.String())
		assert.Zero(t, rp2.Drift)
		assert.Zero(t, rp2.Rerecorded, "the next pass rewrote the entries the first had trimmed (%d), reporting them as lost by Redis", rp.Trimmed)
		pass(1500 * time.Millisecond)
		rp3, err := rc.Item(ctx, sku)
		require.NoError(t, err)
		t.Logf("%s: third pass: %s", e.name, rp3.String())
		sale.checkStore(t, e.r, mem, map[string]int64{sku: 10})
	})
}

// die is a rueidis client of a process that dies right after its first script call
// (EVAL*, FCALL*) that touches a bucket's in-flight transfers set (xout: the first half of a
// transfer): every later command fails as on a dead connection, never sent.
type die struct {
	rueidis.Client
	mu   sync.Mutex
	dead bool
}

func (c *die) check(cmds ...rueidis.Completed) (dead, dieAfter bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return true, false
	}
	for _, cmd := range cmds {
		cs := cmd.Commands()
		if len(cs) == 0 || !strings.HasPrefix(strings.ToUpper(cs[0]), "EVAL") && !strings.HasPrefix(strings.ToUpper(cs[0]), "FCALL") {
			continue
		}
		for _, a := range cs {
			if strings.HasSuffix(a, ":xf") {
				c.dead = true
				return false, true
			}
		}
	}
	return false, false
}

func (c *die) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if dead, _ := c.check(cmd); dead {
		return c.Client.Do(lifecycleDead(), cmd)
	}
	return c.Client.Do(ctx, cmd)
}

func (c *die) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	if dead, _ := c.check(cmds...); dead {
		return c.Client.DoMulti(lifecycleDead(), cmds...)
	}
	return c.Client.DoMulti(ctx, cmds...)
}

func (c *die) died() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dead
}

// TestHalfTransferRecovered: a restore gives a unit back in one bucket; a buyer of another
// bucket pulls it over and its process dies right after the transfer's first half. The sweeper
// completes the transfer (5 s later); another buyer of that bucket buys the unit; the relay
// must still deliver the restore before that sale (the recovered transfer keeps its barrier).
func TestHalfTransferRecovered(t *testing.T) {
	splitEach(t, []stock.Option{split(4)}, func(t *testing.T, e *requestEnv) {
		ctx := context.Background()
		halves := 0
		for v := range 24 {
			sku := fmt.Sprintf("half-%d", v)
			store := memstore.New()
			loadBoth(t, e.r, store, sku, 4)
			// buy sells a unit to each of the buyers prefix<v>-0, prefix<v>-1, … until the
			// item is sold out.
			buy := func(prefix string) {
				for i := range 50 {
					id := fmt.Sprintf("%s%d-%d", prefix, v, i)
					_, err := e.r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: id, Qty: 1})
					if errors.Is(err, stock.ErrSoldOut) {
						return
					}
					require.NoError(t, err)
				}
			}
			buy("a")
			require.NoError(t, testkit.Err(e.r.Restore(ctx, sku, fmt.Sprintf("a%d-0", v))))
			dc := &die{Client: e.c}
			dr, err := stock.New(dc, split(4))
			require.NoError(t, err)
			xid := fmt.Sprintf("x%d", v)
			_, xerr := dr.Deduct(ctx, stock.Request{SKU: sku, ID: xid, User: xid, Qty: 1})
			if !dc.died() {
				require.NoError(t, xerr) // the buyer was in the restore's bucket: no transfer
			} else {
				inFlight := 0
				for _, k := range keysOf(t, e, sku) {
					if strings.HasSuffix(k, ":xf") {
						m, err := e.c.Do(ctx, e.c.B().Zcard().Key(k).Build()).AsInt64()
						require.NoError(t, err)
						inFlight += int(m)
					}
				}
				// (a script of the dying call may touch the in-flight set without moving units)
				halves += inFlight
				e.advance(6 * time.Second)
				require.NoError(t, testkit.Err(stockops.Sweep(ctx, e.r, sku)))
				buy("b") // buyers of every bucket, until the recovered unit is sold
			}
			sold := map[string]int64{} // the sales the ledger has
			for id, ent := range testkit.Ledger(t, e.r, sku) {
				if ent.Kind == stock.KindDeduct && ent.Taken() {
					sold[id] = ent.Qty
				}
			}
			assert.Zero(t, levels(t, e.r, sku).Available, "v%d: units stranded", v)
			rl := splitRelay(t, e, store, &stock.RelayOptions{Batch: 1})
			_, refused := splitDrain(t, e, sku, 200, rl)
			assert.Zero(t, refused, "v%d: the relay counted refusals", v)
			splitCheck(t, e, store, sku, sold)
		}
		t.Logf("%d transfers cut after their first half", halves)
		require.Positive(t, halves)
	})
}

// TestQueuePathReconcileConsumerDown: on the queue path (a relay with no Store), events the
// relay published and no consumer applied yet are in flight. A reconcile pass while the
// consumer is down finds no drift and adds no stock, so Redis does not sell the units again;
// once the consumer has caught up, Redis and the store agree.
func TestQueuePathReconcileConsumerDown(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		eachStore(t, c, "q-", false, func(t *testing.T, r *stock.Reserver, store loadingStore, sku string) {
			ctx := context.Background()
			loadBoth(t, r, store, sku, 10)
			deductEach(t, r, stock.Request{SKU: sku, Qty: 1}, numbered("o", 10)...)
			_, _, msgs := publishToQueue(t, r)
			require.Len(t, msgs, 10)

			rec := newReconciler(t, r, store, &stock.ReconcileOptions{Items: []string{sku}})
			// The consumer is down: all ten sales are in the queue.
			reps, err := rec.Once(ctx)
			require.NoError(t, err)
			require.Len(t, reps, 1)
			assert.Zero(t, reps[0].Drift, reps[0].String())
			assert.Zero(t, reps[0].Adjusted, reps[0].String())
			assert.Empty(t, reps[0].NeedsHuman)
			assert.Zero(t, testkit.Levels(t, r, sku).Available, "no stock added for sales still in the queue")
			_, err = r.Deduct(ctx, stock.Request{SKU: sku, ID: "late", Qty: 1})
			require.ErrorIs(t, err, stock.ErrSoldOut, "Redis must not sell the queued units again")

			// The consumer applies four, then a pass: still nothing to repair.
			require.Zero(t, consumeAll(t, r, store, msgs[:4]))
			reps, err = rec.Once(ctx)
			require.NoError(t, err)
			assert.Zero(t, reps[0].Drift, reps[0].String())
			assert.Zero(t, reps[0].Adjusted, reps[0].String())

			// It catches up; every message delivered twice, as queues do.
			require.Zero(t, consumeAll(t, r, store, append(msgs[4:], msgs...)))
			reps, err = rec.Once(ctx)
			require.NoError(t, err)
			assert.Zero(t, reps[0].Drift, reps[0].String())
			assert.Zero(t, reps[0].Adjusted, reps[0].String())
			assert.Zero(t, reps[0].InFlight, reps[0].String())
			assert.Zero(t, remaining(t, store, sku), "every sale applied in the store, none refused")
			assert.Zero(t, testkit.Levels(t, r, sku).Available)
			for id, e := range testkit.Ledger(t, r, sku) {
				assert.Equal(t, stock.StateApplied, e.State, id)
			}
		})
	})
}

// TestQueuePathReconcileWhileConsuming: reconcile passes run while consumers apply the queue
// and buyers keep deducting and restoring; no pass adds or removes stock (nothing drifted),
// and at the end Redis and the store agree.
func TestQueuePathReconcileWhileConsuming(t *testing.T) {
	testkit.ParallelOnMiniredis(t)
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r, store := withStore(t, c, 200, []string{"A"})
		q := &queue{}
		rl := newRelay(t, r, nil, q, &stock.RelayOptions{Lease: time.Second})
		rec := newReconciler(t, r, store, &stock.ReconcileOptions{Items: []string{"A"}})

		var sold atomic.Int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() { // buyers
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprint("o", i)
				if _, err := r.Deduct(ctx, stock.Request{SKU: "A", ID: id, Qty: 1}); err == nil {
					sold.Add(1)
					if i%3 == 0 {
						assert.NoError(t, testkit.Err(r.Restore(ctx, "A", id)))
					}
				} else if !errors.Is(err, stock.ErrSoldOut) {
					t.Error(err)
				}
			}
		})
		var backlog []stock.Event // what the consumer has not applied; read after wg.Wait
		wg.Go(func() {            // the relay and a consumer that is sometimes behind
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				assert.NoError(t, testkit.Err(rl.Once(ctx)))
				backlog = append(backlog, q.take()...)
				keep := backlog[:0:0]
				for i, ev := range backlog {
					if n%4 == 0 && i >= len(backlog)/2 {
						keep = append(keep, backlog[i:]...) // behind: the rest waits
						break
					}
					if err := stock.Consume(ctx, r, store, ev); err != nil {
						assert.ErrorIs(t, err, stock.ErrHeldBack)
						keep = append(keep, ev)
					}
				}
				backlog = keep
			}
		})
		passes := 0
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			reps, err := rec.Once(ctx)
			require.NoError(t, err)
			if reps[0].Busy {
				continue
			}
			passes++
			assert.Zero(t, reps[0].Adjusted, reps[0].String())
			assert.Zero(t, reps[0].Drift, reps[0].String())
			assert.False(t, reps[0].Rebuilt)
		}
		close(stop)
		wg.Wait()
		assert.Positive(t, passes)
		// Drain what is left and compare.
		consumeAll(t, r, store, backlog)
		for range 100 {
			testkit.Drain(t, rl)
			msgs := q.take()
			if len(msgs) == 0 {
				break
			}
			consumeAll(t, r, store, msgs)
		}
		reps, err := rec.Once(ctx)
		require.NoError(t, err)
		assert.Zero(t, reps[0].Drift, reps[0].String())
		assert.Zero(t, reps[0].Adjusted)
		assert.Equal(t, testkit.Levels(t, r, "A").Available, remaining(t, store, "A"))
		assert.Positive(t, sold.Load())
		assert.Equal(t, 1, store.MaxApplications())
		t.Logf("%d reconcile passes while consuming, %d sales", passes, sold.Load())
	})
}

// TestReconcileSettlesPublished: Redis lost a consumer's acknowledgement of an item's last
// event (it is back in the published set, and the queue has nothing left to deliver). The
// reconciler finds the event in the store and settles it.
func TestReconcileSettlesPublished(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r, store, _, _, msgs := queuedSalesOfA(t, c, 5, 2)
		require.NoError(t, stock.Consume(ctx, r, store, msgs[0]))
		require.NoError(t, stock.Consume(ctx, r, store, msgs[1]))
		// Lost acknowledgement: the member is back.
		require.NoError(t, c.Do(ctx, c.B().Zadd().Key("stock:{A}:p").ScoreMember().ScoreMember(float64(msgs[1].Seq), "D:o1").Build()).Error())

		reps, err := mustReconciler(t, r, store).Once(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, reps[0].Settled, reps[0].String())
		assert.Equal(t, 1, reps[0].Published, reps[0].String())
		assert.Zero(t, reps[0].Drift, reps[0].String())
		reps, err = mustReconciler(t, r, store).Once(ctx)
		require.NoError(t, err)
		assert.Zero(t, reps[0].Published)
		assert.Zero(t, reps[0].Drift, reps[0].String())
	})
}

// outsideEnv is a Reserver on a Redis, with a memstore as the database of record and, on
// miniredis (a stocktest kit), one clock shared by Redis's TIME, its TTLs and WithClock.
type outsideEnv struct {
	t     *testing.T
	name  string
	c     rueidis.Client
	kit   *stocktest.Env // nil on a real server
	r     *stock.Reserver
	store *memstore.Store
	ctx   context.Context
}

// advance moves Redis's clock and the Reserver's clock by d (miniredis only).
func (e *outsideEnv) advance(d time.Duration) {
	e.t.Helper()
	require.NotNil(e.t, e.kit, "advance on a real server")
	e.kit.Advance(d)
}

// outsideMini makes a Reserver on a private stocktest miniredis, with a clock the test moves.
func outsideMini(t *testing.T, opts ...stock.Option) *outsideEnv {
	t.Helper()
	kit := stocktest.New(t, opts...)
	return &outsideEnv{t: t, name: "miniredis", c: kit.Client, kit: kit, r: kit.Reserver, store: memstore.New(), ctx: context.Background()}
}

// outsideEach runs f on miniredis and, with STOCK_REDIS_SERVER, a real standalone server.
func outsideEach(t *testing.T, f func(t *testing.T, e *outsideEnv), opts ...stock.Option) {
	t.Run("miniredis", func(t *testing.T) { f(t, outsideMini(t, opts...)) })
	for _, b := range redistest.Backends(t) {
		if b.Name != "standalone" {
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			c := b.Client(t)
			r := testkit.NewReserver(t, c, opts...)
			t.Cleanup(func() { _ = r.Close(context.Background()) })
			f(t, &outsideEnv{t: t, name: b.Name, c: c, r: r, store: memstore.New(), ctx: context.Background()})
		})
	}
}

func (e *outsideEnv) load(sku string, qty int64) {
	e.t.Helper()
	require.NoError(e.t, e.r.Load(e.ctx, sku, qty), "Load %s", sku)
	require.NoError(e.t, e.store.Load(e.ctx, sku, qty), "store Load %s", sku)
}

// relay delivers every due event to the store.
func (e *outsideEnv) relay() stockops.RelayStats {
	e.t.Helper()
	rl := newRelay(e.t, e.r, e.store, nil, nil)
	st, err := rl.Once(e.ctx)
	require.NoError(e.t, err, "relay")
	return st
}

func (e *outsideEnv) pass(opts *stock.ReconcileOptions) stockops.PassResult {
	e.t.Helper()
	rec := newReconciler(e.t, e.r, e.store, opts)
	res, err := rec.Pass(e.ctx)
	if err != nil {
		e.t.Logf("pass error: %v", err)
	}
	for i, rep := range res.Reports {
		e.t.Logf("report: %s (err %v)", rep.String(), res.Errors[i])
	}
	return res
}

// levels checks the invariants and returns the counters.
func (e *outsideEnv) levels(sku string) stock.Levels {
	e.t.Helper()
	lv, err := e.r.Levels(e.ctx, sku)
	require.NoError(e.t, err, "Levels %s", sku)
	assert.False(e.t, lv.Available < 0 || lv.Held < 0 || lv.Sold < 0 || lv.Loaded < 0, "%s: a counter below zero: %+v", sku, lv)
	assert.EqualValues(e.t, lv.Available+lv.Held+lv.Sold, lv.Loaded, "%s: Loaded != Available+Held+Sold: %+v", sku, lv)
	return lv
}

// want checks Loaded and Sold and that the store agrees with Redis (nothing in flight).
func (e *outsideEnv) want(sku string, loaded, sold, held int64) {
	e.t.Helper()
	lv := e.levels(sku)
	assert.False(e.t, lv.Loaded != loaded || lv.Sold != sold || lv.Held != held, "%s: levels %+v, want Loaded %d Sold %d Held %d", sku, lv, loaded, sold, held)
	rem, err := e.store.Remaining(e.ctx, sku)
	require.NoError(e.t, err, "store Remaining %s", sku)
	assert.EqualValues(e.t, lv.Available+lv.Held, rem, "%s: store remaining %d, Redis available+held %d (%+v)", sku, rem, lv.Available+lv.Held, lv)
}

// outsideKey is one Redis key's copy.
type outsideKey struct {
	typ   string
	str   string
	hash  map[string]string
	zset  []rueidis.ZScore
	set   []string
	pttl  int64
	found bool
}

// scan calls f with every key matching pattern (a single-node Redis).
func (e *outsideEnv) scan(pattern string, f func(k string)) {
	e.t.Helper()
	var cur uint64
	for {
		se, err := e.c.Do(e.ctx, e.c.B().Scan().Cursor(cur).Match(pattern).Count(1000).Build()).AsScanEntry()
		require.NoError(e.t, err, "scan")
		for _, k := range se.Elements {
			f(k)
		}
		cur = se.Cursor
		if cur == 0 {
			return
		}
	}
}

// snapshot copies every key matching pattern (a single-node Redis).
func (e *outsideEnv) snapshot(pattern string) map[string]outsideKey {
	e.t.Helper()
	ctx, c := e.ctx, e.c
	out := map[string]outsideKey{}
	e.scan(pattern, func(k string) {
		typ, err := c.Do(ctx, c.B().Type().Key(k).Build()).ToString()
		require.NoError(e.t, err)
		v := outsideKey{typ: typ, found: true}
		switch typ {
		case "string":
			v.str, err = c.Do(ctx, c.B().Get().Key(k).Build()).ToString()
		case "hash":
			v.hash, err = c.Do(ctx, c.B().Hgetall().Key(k).Build()).AsStrMap()
		case "zset":
			v.zset, err = c.Do(ctx, c.B().Zrange().Key(k).Min("0").Max("-1").Withscores().Build()).AsZScores()
		case "set":
			v.set, err = c.Do(ctx, c.B().Smembers().Key(k).Build()).AsStrSlice()
		case "none":
			return
		default:
			e.t.Fatalf("key %s of type %s", k, typ)
		}
		require.NoError(e.t, err, "read %s", k)
		v.pttl, _ = c.Do(ctx, c.B().Pttl().Key(k).Build()).AsInt64()
		out[k] = v
	})
	require.NotEmpty(e.t, out, "snapshot of %s: no keys", pattern)
	return out
}

// rollback makes the keys matching pattern what snap holds: a replica that is behind was
// promoted.
func (e *outsideEnv) rollback(pattern string, snap map[string]outsideKey) {
	e.t.Helper()
	ctx, c := e.ctx, e.c
	e.scan(pattern, func(k string) { e.do(c.B().Del().Key(k).Build()) })
	for k, v := range snap {
		var err error
		switch v.typ {
		case "string":
			err = c.Do(ctx, c.B().Set().Key(k).Value(v.str).Build()).Error()
		case "hash":
			cmd := c.B().Hset().Key(k).FieldValue()
			for f, x := range v.hash {
				cmd = cmd.FieldValue(f, x)
			}
			err = c.Do(ctx, cmd.Build()).Error()
		case "zset":
			cmd := c.B().Zadd().Key(k).ScoreMember()
			for _, z := range v.zset {
				cmd = cmd.ScoreMember(z.Score, z.Member)
			}
			err = c.Do(ctx, cmd.Build()).Error()
		case "set":
			err = c.Do(ctx, c.B().Sadd().Key(k).Member(v.set...).Build()).Error()
		}
		require.NoError(e.t, err, "write %s", k)
		if v.pttl > 0 {
			require.NoError(e.t, c.Do(ctx, c.B().Pexpire().Key(k).Milliseconds(v.pttl).Build()).Error())
		}
	}
}

func outsideItemKeys(sku string) string { return "stock:{" + sku + "}*" }

// mustRestore restores id and fails the test on an error.
func (e *outsideEnv) mustRestore(sku, id string) { e.must(e.r.Restore(e.ctx, sku, id)) }

func (e *outsideEnv) must(_ stock.Receipt, err error) {
	e.t.Helper()
	require.NoError(e.t, err)
}

func (e *outsideEnv) deduct(sku, id string, qty int64) stock.Receipt {
	e.t.Helper()
	rc, err := e.r.Deduct(e.ctx, stock.Request{SKU: sku, ID: id, User: "u-" + id, Qty: qty})
	require.NoError(e.t, err, "Deduct %s %s", sku, id)
	return rc
}

func outsideNoNeedsHuman(t *testing.T, res stockops.PassResult) {
	t.Helper()
	for _, rep := range res.Reports {
		assert.Zero(t, rep.NeedsHuman, "%s needs a human: %s", rep.SKU, rep.NeedsHuman)
	}
}

func outsideTwoBuckets(string) int { return 2 }

func outsideGroup(sku string) string { return "g" }

// outsideLevels is what want checks of one item: Loaded, Sold and Held.
type outsideLevels struct {
	sku                string
	loaded, sold, held int64
}

func (e *outsideEnv) wantAll(lvs []outsideLevels) {
	e.t.Helper()
	for _, lv := range lvs {
		e.want(lv.sku, lv.loaded, lv.sold, lv.held)
	}
}

func (e *outsideEnv) mustCart(_ stock.CartReceipt, err error) {
	e.t.Helper()
	require.NoError(e.t, err)
}

func (e *outsideEnv) do(cmd rueidis.Completed) {
	e.t.Helper()
	require.NoError(e.t, e.c.Do(e.ctx, cmd).Error())
}

var outsideCart = stock.Cart{ID: "c1", User: "u", Lines: []stock.Line{{SKU: "a", Qty: 2}, {SKU: "b", Qty: 3}}}

// call makes the call of one step of run and returns whether it was answered as a replay, and its
// error.
func (e *outsideEnv) call(step string) (replayed bool, err error) {
	e.t.Helper()
	f := strings.Fields(step)
	num := func(i int) int64 {
		e.t.Helper()
		n, err := strconv.ParseInt(f[i], 10, 64)
		require.NoError(e.t, err, "step %q", step)
		return n
	}
	dur := func(i int) time.Duration {
		e.t.Helper()
		d, err := time.ParseDuration(f[i])
		require.NoError(e.t, err, "step %q", step)
		return d
	}
	rc := func(rc stock.Receipt, err error) (bool, error) { return rc.Replayed, err }
	cart := func(rc stock.CartReceipt, err error) (bool, error) { return rc.Replayed, err }
	switch verb := strings.Join(f[:min(len(f), 2)], " "); {
	case verb == "deduct cart":
		return cart(e.r.DeductMany(e.ctx, outsideCart))
	case verb == "hold cart":
		return cart(e.r.HoldMany(e.ctx, outsideCart, time.Hour))
	case verb == "confirm cart":
		_, err := e.r.ConfirmMany(e.ctx, outsideCart.ID, "a", "b")
		return false, err
	case f[0] == "relay" && len(f) == 1:
		e.relay()
	case f[0] == "sweep" && len(f) == 1:
		_, err := stockops.Sweep(e.ctx, e.r)
		return false, err
	case f[0] == "advance" && len(f) == 2:
		e.advance(dur(1))
	case f[0] == "load" && len(f) == 3:
		e.load(f[1], num(2))
	case f[0] == "levels" && len(f) == 5:
		e.want(f[1], num(2), num(3), num(4))
	case f[0] == "deduct" && (len(f) == 4 || len(f) == 5):
		user := "u-" + f[2]
		if len(f) == 5 {
			user = f[4]
		}
		return rc(e.r.Deduct(e.ctx, stock.Request{SKU: f[1], ID: f[2], User: user, Qty: num(3)}))
	case f[0] == "restock" && len(f) == 4:
		return rc(e.r.Restock(e.ctx, f[1], f[2], num(3)))
	case f[0] == "hold" && (len(f) == 4 || len(f) == 5):
		ttl := time.Hour
		if len(f) == 5 {
			ttl = dur(4)
		}
		return rc(e.r.Hold(e.ctx, stock.Request{SKU: f[1], ID: f[2], User: "u", Qty: num(3)}, ttl))
	case f[0] == "confirm" && len(f) == 3:
		return rc(e.r.Confirm(e.ctx, f[1], f[2]))
	case f[0] == "extend" && len(f) == 4:
		return rc(e.r.Extend(e.ctx, f[1], f[2], dur(3)))
	case f[0] == "cancel" && len(f) == 3:
		return rc(e.r.Cancel(e.ctx, f[1], f[2]))
	case f[0] == "restore" && len(f) == 3:
		return rc(e.r.Restore(e.ctx, f[1], f[2]))
	default:
		e.t.Fatalf("unknown step %q", step)
	}
	return false, nil
}

// run makes the calls of steps, separated by ";": "load SKU QTY" (Redis and the store),
// "deduct SKU ID QTY [USER]" (user u-ID by default), "restock SKU ID QTY", "hold SKU ID QTY [TTL]"
// (user u, an hour by default), "extend SKU ID TTL", "confirm SKU ID", "cancel SKU ID", "restore
// SKU ID", "relay", "sweep", "advance DURATION" (miniredis), "levels SKU LOADED SOLD HELD" (want),
// and on outsideCart "deduct cart", "hold cart", "confirm cart". A call that fails fails the test.
func (e *outsideEnv) run(steps string) {
	e.t.Helper()
	for _, step := range strings.Split(steps, ";") {
		if strings.TrimSpace(step) != "" {
			require.NoError(e.t, testkit.Err(e.call(step)), "step %q", step)
		}
	}
}

// outsideAnswers are the errors expect knows by name.
var outsideAnswers = map[string]error{"restored": stock.ErrRestored, "expired": stock.ErrExpired,
	"confirmed": stock.ErrConfirmed, "soldout": stock.ErrSoldOut}

// expect makes the calls of steps as run does, each step led by the answer it must get: "replay"
// (a replay), "ok" (no error) or the name of an error of outsideAnswers; "levels" steps check.
func (e *outsideEnv) expect(steps string) {
	e.t.Helper()
	for _, step := range strings.Split(steps, ";") {
		step = strings.TrimSpace(step)
		want, call, _ := strings.Cut(step, " ")
		if step == "" || want == "levels" {
			e.run(step)
			continue
		}
		replayed, err := e.call(call)
		switch w, named := outsideAnswers[want]; {
		case named:
			assert.ErrorIs(e.t, err, w, "%s", call)
		case want == "replay":
			assert.True(e.t, err == nil && replayed, "%s: replayed %v, %v; want a replay", call, replayed, err)
		case want == "ok":
			assert.NoError(e.t, err, "%s", call)
		default:
			e.t.Fatalf("step %q: unknown answer %q", step, want)
		}
	}
}

// Reconciler: Redis lost writes the Store has (a failover to a replica that was behind, an
// eviction, a restart without persistence), and a repairing pass brings them back. Every case:
// before the loss, the relay delivered everything and the levels are the case's; the keys are
// rolled back (or deleted); a pass, which needs no human, brings back those very levels
// (Loaded counts the lost restocks, Sold the lost sales, net of the lost restores, Held the live
// holds); the lost ids answer as before the loss (a replay, ErrRestored, ErrConfirmed); and after
// the case's settling calls (restores) and a relay, Redis and the Store agree on the final
// levels, before and after one more pass.
func TestRepairAfterLostWritesKeepsBooks(t *testing.T) {
	type lv = outsideLevels
	buckets := []stock.Option{stock.WithBuckets(outsideTwoBuckets)}
	groups := []stock.Option{stock.WithGroups(outsideGroup)}
	for _, tc := range []struct {
		name string
		opts []stock.Option
		// before (steps for run) runs before the loss; its effects survive it.
		before string
		// keys are the patterns snapshotted after before and rolled back after lost: a promoted
		// replica that was behind (item "a"'s keys when there are no keys and no wipe). With
		// wipe, wipe is the loss.
		keys []string
		wipe func(e *outsideEnv)
		// lost runs, and is relayed to the Store, between the snapshot and the loss.
		lost string
		want []outsideLevels
		// check makes the repeated calls after the repair (see outsideEnv.expect).
		check string
		// settle runs after check; then a relay, and final is checked before and after a pass.
		settle string
		final  []outsideLevels
		// needsHuman: the pass may leave the item for an operator.
		needsHuman bool
	}{
		{
			name: "lost deduct keeps Loaded", before: "load a 10; deduct a d1 2; relay",
			lost: "deduct a d2 3", want: []lv{{"a", 10, 5, 0}},
			check:  "replay deduct a d2 3", // its entry is written back
			settle: "restore a d2; restore a d1", final: []lv{{"a", 10, 0, 0}},
		},
		{
			name: "lost first deduct then restore keeps Sold non-negative", before: "load a 10",
			lost: "deduct a d1 4", want: []lv{{"a", 10, 4, 0}},
			settle: "restore a d1", final: []lv{{"a", 10, 0, 0}},
		},
		{
			name: "lost restock keeps Loaded", before: "load a 10; deduct a d1 2; relay",
			lost: "restock a r1 5", want: []lv{{"a", 15, 2, 0}},
			check:  "replay restock a r1 5; levels a 15 2 0",
			settle: "restore a d1", final: []lv{{"a", 15, 0, 0}},
		},
		{
			name: "lost restock and deduct keep Loaded", before: "load a 10",
			lost: "restock a r1 5; deduct a d1 12", want: []lv{{"a", 15, 12, 0}},
			settle: "restore a d1", final: []lv{{"a", 15, 0, 0}},
		},
		{
			name: "lost restore gives back", before: "load a 10; deduct a d1 3; relay",
			lost: "restore a d1", want: []lv{{"a", 10, 0, 0}},
			check: "restored deduct a d1 3; replay restore a d1",
			final: []lv{{"a", 10, 0, 0}},
		},
		{
			name: "lost confirm makes the hold final", before: "load a 10; hold a h1 2; relay",
			lost: "confirm a h1", want: []lv{{"a", 10, 2, 0}},
			check:  "replay confirm a h1; confirmed cancel a h1",
			settle: "restore a h1", final: []lv{{"a", 10, 0, 0}},
		},
		{
			name: "lost confirm and restore release the hold", before: "load a 10; hold a h1 2; relay",
			lost: "confirm a h1; restore a h1", want: []lv{{"a", 10, 0, 0}},
			check: "restored confirm a h1",
			final: []lv{{"a", 10, 0, 0}},
		},
		{
			// A lost restock, a lost deduct and a lost restore at once.
			name: "lost restock, deduct and restore at once", before: "load a 5; deduct a d0 1; relay",
			lost:   "restock a r1 7; deduct a d1 6; deduct a d2 2; restore a d0; restore a d2",
			want:   []lv{{"a", 12, 6, 0}},
			check:  "restored deduct a d0 1; restored deduct a d2 2",
			settle: "restore a d1", final: []lv{{"a", 12, 0, 0}},
		},
		{
			// The item hash itself lost with everything else (a restart without persistence of
			// the item's keys) after restocks: the rebuild must count the restocks as loaded.
			name: "rebuild after the whole item lost keeps Loaded and Sold", before: "load a 10",
			lost: "restock a r1 5; deduct a d1 4", want: []lv{{"a", 15, 4, 0}},
			wipe:   func(e *outsideEnv) { e.rollback(outsideItemKeys("a"), map[string]outsideKey{}) },
			settle: "restore a d1", final: []lv{{"a", 15, 0, 0}},
		},
		{
			// The item hash alone lost (an eviction of one key) with a live hold and a restock.
			name: "rebuild of the item hash keeps Loaded, Sold and Held", before: "load a 10",
			lost: "restock a r1 5; deduct a d1 4; hold a h1 2", want: []lv{{"a", 15, 4, 2}},
			wipe:   func(e *outsideEnv) { e.do(e.c.B().Del().Key("stock:{a}").Build()) },
			settle: "confirm a h1; restore a d1", final: []lv{{"a", 15, 2, 0}},
		},
		{
			// Every key lost (FLUSHALL) on a plain item.
			name: "plain item recovered after FLUSHALL", before: "load a 10",
			lost: "deduct a d1 4", want: []lv{{"a", 10, 4, 0}},
			wipe:       func(e *outsideEnv) { e.do(e.c.B().Flushall().Build()) },
			needsHuman: true,
		},
		{
			// A lost restock and a lost sale of the same size: Redis's available equals the
			// Store's remaining (no drift), yet Redis lacks both entries' effects on Loaded and
			// Sold.
			name: "lost restock and equal sale keep Loaded", before: "load a 10",
			lost: "restock a r1 5; deduct a d1 5", want: []lv{{"a", 15, 5, 0}},
			settle: "restore a d1", final: []lv{{"a", 15, 0, 0}},
		},
		{
			// A lost restore of an old sale and a lost new sale.
			name: "lost restore and lost sale", before: "load a 10; deduct a d1 3; relay",
			lost: "restore a d1; deduct a d2 4", want: []lv{{"a", 10, 4, 0}},
			settle: "restore a d2", final: []lv{{"a", 10, 0, 0}},
		},
		{
			// A lost restock and a lost restore.
			name: "lost restock and lost restore", before: "load a 10; deduct a d1 3; relay",
			lost: "restore a d1; restock a r1 5", want: []lv{{"a", 15, 0, 0}},
		},
		{
			// A lost restore of an old sale and a lost new sale of the same size (no drift).
			name: "lost restore and equal lost sale", before: "load a 10; deduct a d1 3; relay",
			lost: "restore a d1; deduct a d2 3", want: []lv{{"a", 10, 3, 0}},
			settle: "restore a d2", final: []lv{{"a", 10, 0, 0}},
		},
		{
			// A lost confirm of a hold and a lost restock.
			name: "lost confirm and lost restock", before: "load a 10; hold a h1 2; relay",
			lost: "confirm a h1; restock a r1 4", want: []lv{{"a", 14, 2, 0}},
			settle: "restore a h1", final: []lv{{"a", 14, 0, 0}},
		},
		{
			name: "buckets: lost deducts keep Loaded", opts: buckets, keys: []string{"stock:{a|*"},
			before: "load a 10; deduct a d1 2; relay",
			lost:   "deduct a d2 3; deduct a d3 1", want: []lv{{"a", 10, 6, 0}},
			check:  "replay deduct a d2 3; replay deduct a d3 1",
			settle: "restore a d1; restore a d2; restore a d3", final: []lv{{"a", 10, 0, 0}},
		},
		{
			name: "buckets: lost restocks keep Loaded", opts: buckets, keys: []string{"stock:{a|*"},
			before: "load a 10", lost: "restock a r1 6; restock a r2 4", want: []lv{{"a", 20, 0, 0}},
			check: "replay restock a r1 6",
			final: []lv{{"a", 20, 0, 0}},
		},
		{
			name: "buckets: lost restores give back", opts: buckets, keys: []string{"stock:{a|*"},
			before: "load a 10; deduct a d1 3; deduct a d2 2; relay",
			lost:   "restore a d1; restore a d2", want: []lv{{"a", 10, 0, 0}},
			check: "restored deduct a d1 3",
		},
		{
			// Only one bucket's shard failed over (a cluster with one master behind).
			name: "buckets: one bucket lost a restock and deducts", opts: buckets, keys: []string{"stock:{a|0|*"},
			before: "load a 10",
			lost:   "deduct a d0 1; deduct a d1 1; deduct a d2 1; deduct a d3 1; deduct a d4 1; deduct a d5 1; restock a r1 3",
			want:   []lv{{"a", 13, 6, 0}},
			settle: "restore a d0; restore a d1; restore a d2; restore a d3; restore a d4; restore a d5",
			final:  []lv{{"a", 13, 0, 0}},
		},
		{
			name: "groups: lost deduct keeps Loaded", opts: groups, keys: []string{"stock:{g}:{a}*"},
			before: "load a 10; load b 10; deduct a d1 2; relay",
			lost:   "deduct a d2 3", want: []lv{{"a", 10, 5, 0}, {"b", 10, 0, 0}},
			settle: "restore a d2", final: []lv{{"a", 10, 2, 0}},
		},
		{
			name: "groups: lost restock and deduct keep Loaded", opts: groups, keys: []string{"stock:{g}:{a}*"},
			before: "load a 10; load b 10; deduct a d1 2; relay",
			lost:   "deduct a d2 3; restock a r1 2", want: []lv{{"a", 12, 5, 0}, {"b", 10, 0, 0}},
			settle: "restore a d2", final: []lv{{"a", 12, 2, 0}},
		},
		{
			name: "groups: lost cart", opts: groups, keys: []string{"stock:{g}:{a}*", "stock:{g}:{b}*"},
			before: "load a 10; load b 10",
			lost:   "deduct cart", want: []lv{{"a", 10, 2, 0}, {"b", 10, 3, 0}},
			check: "replay deduct cart; levels a 10 2 0; levels b 10 3 0",
		},
		{
			name: "cart with one line lost", keys: []string{outsideItemKeys("b")},
			before: "load a 10; load b 10",
			lost:   "deduct cart", want: []lv{{"a", 10, 2, 0}, {"b", 10, 3, 0}},
			check:  "replay deduct cart; levels b 10 3 0",
			settle: "restore b c1", final: []lv{{"b", 10, 0, 0}},
		},
		{
			name: "hold cart with a lost confirm", keys: []string{outsideItemKeys("b")},
			before: "load a 10; load b 10; hold cart; relay",
			lost:   "confirm cart", want: []lv{{"a", 10, 2, 0}, {"b", 10, 3, 0}},
			check: "ok confirm cart; levels b 10 3 0",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outsideEach(t, func(t *testing.T, e *outsideEnv) {
				keys := tc.keys
				if keys == nil && tc.wipe == nil {
					keys = []string{outsideItemKeys("a")}
				}
				e.run(tc.before)
				snaps := make([]map[string]outsideKey, len(keys))
				for i, k := range keys {
					snaps[i] = e.snapshot(k)
				}
				e.run(tc.lost + "; relay")
				e.wantAll(tc.want)
				for i, k := range keys {
					e.rollback(k, snaps[i])
				}
				if tc.wipe != nil {
					tc.wipe(e)
				}
				res := e.pass(nil)
				if tc.needsHuman {
					t.Logf("unregistered %v, store only %v, needs human %q", res.Unregistered, res.StoreOnly, res.NeedsHuman)
				} else {
					outsideNoNeedsHuman(t, res)
				}
				e.wantAll(tc.want)
				e.expect(tc.check)
				if tc.final == nil {
					return
				}
				e.run(tc.settle + "; relay")
				e.wantAll(tc.final)
				outsideNoNeedsHuman(t, e.pass(nil))
				e.wantAll(tc.final)
			}, tc.opts...)
		})
	}
}

func (e *outsideEnv) trimmed(sku, id string) bool {
	e.t.Helper()
	_, err := e.r.Ledger(e.ctx, sku, id)
	if errors.Is(err, stock.ErrUnknownID) {
		return true
	}
	require.NoError(e.t, err, "Ledger %s %s", sku, id)
	return false
}

// An id sold again after its entry was trimmed: the Store took it once, Redis twice.
func TestRepairOfSaleCountedTwiceAfterTrim(t *testing.T) {
	e := outsideMini(t)
	e.load("a", 10)
	e.deduct("a", "d1", 2)
	e.relay()
	e.advance(25 * time.Hour)
	e.pass(outsideRet)
	require.True(t, e.trimmed("a", "d1"), "not trimmed")
	rc := e.deduct("a", "d1", 2)
	require.False(t, rc.Replayed, "a trimmed id replayed")
	e.relay()
	res := e.pass(outsideRet)
	outsideNoNeedsHuman(t, res)
	e.want("a", 10, 2, 0)
	e.mustRestore("a", "d1")
	e.relay()
	e.pass(outsideRet)
	e.want("a", 10, 0, 0)
}
