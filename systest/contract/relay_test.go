package contract_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
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

// Broken promise under test: Consume applies an item's events as Redis made
// them: a message that disagrees with Redis's ledger (another quantity, a
// restore Redis never made) is not applied to the store as if it were real,
// and the reconciler does not then carry it back into Redis. (A queue can hold
// such a message: a stale copy from before Redis lost data, an operator
// republishing a dead-letter dump, another producer on the subject.)
func TestConsumeTrustsMessageOverLedger(t *testing.T) {
	cases := map[string]func(ev stock.Event) stock.Event{
		"quantity":        func(ev stock.Event) stock.Event { ev.Qty = 7; return ev },
		"phantom restore": func(ev stock.Event) stock.Event { ev.Type = stock.EventRestored; return ev },
		"far seq":         func(ev stock.Event) stock.Event { ev.Seq += 1000; return ev },
	}
	for _, b := range redistest.Backends(t) {
		for name, forge := range cases {
			t.Run(b.Name+"/"+name, func(t *testing.T) {
				ctx := context.Background()
				r, st := withStore(t, b.Client(t), 10, []string{"fg"}, stock.WithCoalescing(0))
				deductEach(t, r, stock.Request{SKU: "fg", User: "u", Qty: 2}, "a")
				_, _, msgs := publishToQueue(t, r)
				require.Len(t, msgs, 1, "published %d", len(msgs))
				bad := forge(msgs[0])
				ferr := stock.Consume(ctx, r, st, bad)
				rem, _ := st.Remaining(ctx, "fg")
				t.Logf("forged %+v: %v; store remaining %d", bad, ferr, rem)
				gerr := stock.Consume(ctx, r, st, msgs[0])
				t.Logf("genuine: %v", gerr)
				rc, _ := stockops.NewReconciler(r, st, nil)
				res, perr := rc.Pass(ctx)
				for _, rp := range res.Reports {
					t.Logf("pass: %s (%v)", rp, perr)
				}
				rem, _ = st.Remaining(ctx, "fg")
				lv, _ := r.Levels(ctx, "fg")
				e, _ := r.Ledger(ctx, "fg", "a")
				assert.False(t, rem != 8 || lv.Available != 8 || !e.Taken(), "the acknowledged sale a (2 units) is undone or misapplied by a message Redis never made: store remaining %d, Redis available %d, ledger %s; want 8, 8, taken", rem, lv.Available, e.State)
			})
		}
	}
}

// NewRelay: "Either may be nil, not both." RelayOptions.Batch: "at most 10,000".
func TestNewRelayBounds(t *testing.T) {
	e := stocktest.New(t)
	st := memstore.New()
	_, err := stockops.NewRelay(e.Reserver, nil, nil, nil)
	assert.Error(t, err, "NewRelay with neither Store nor Publisher")
	_, err = stockops.NewRelay(e.Reserver, st, nil, &stock.RelayOptions{Batch: 10001})
	assert.Error(t, err, "Batch above 10,000")
	assert.NoError(t, testkit.Err(stockops.NewRelay(e.Reserver, st, nil, &stock.RelayOptions{Batch: 10000})), "Batch of 10,000")
	assert.NoError(t, testkit.Err(stockops.NewRelay(e.Reserver, st, nil, &stock.RelayOptions{})), "zero options take the defaults")
	assert.NoError(t, testkit.Err(stockops.NewReconciler(e.Reserver, st, &stock.ReconcileOptions{Retention: -1})), "a negative Retention never trims: it is valid")
	assert.NoError(t, testkit.Err(stockops.NewReconciler(e.Reserver, st, nil)))
}

// "When ctx ends, Run stops the loops, lets the relay deliver what is due (see RunOptions.Drain),
// and returns ... ctx's error": with a ctx cancelled before the call, the events already in the
// outbox are still delivered, to the Store and, on the queue path, to the Publisher.
func TestRunCancelledCtxStillDrains(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		for _, path := range []string{"store", "queue"} {
			t.Run(path, func(t *testing.T) {
				ctx := context.Background()
				r := testkit.NewReserver(t, c)
				st := memstore.New()
				sku := "cc-" + path
				loadBoth(t, r, st, sku, 10)
				deductEach(t, r, stock.Request{SKU: sku, Qty: 1}, numbered("d", 5)...)
				var published atomic.Int64
				opts := stock.RunOptions{Store: st}
				if path == "queue" {
					opts = stock.RunOptions{Publisher: stock.PublisherFunc(func(context.Context, stock.Event) error {
						published.Add(1)
						return nil
					})}
				}
				cctx, cancel := context.WithCancel(ctx)
				cancel()
				start := time.Now()
				assert.ErrorIs(t, r.Run(cctx, opts), context.Canceled)
				assert.Less(t, time.Since(start), 7*time.Second, "bounded by Drain (5s)")
				assert.Equal(t, int64(0), testkit.OutboxLen(t, c, sku), "what was due was delivered")
				pending, dead, err := stockops.Pending(ctx, r, sku)
				require.NoError(t, err)
				assert.Zero(t, pending+dead, "nothing pending or dead-lettered")
				rem := remaining(t, st, sku)
				if path == "queue" {
					assert.Equal(t, int64(5), published.Load(), "every event published")
					assert.Equal(t, int64(10), rem, "the queue path leaves the Store to Consume")
				} else {
					assert.Equal(t, int64(5), rem)
				}
			})
		}
	})
}

// Every acknowledged sale reaches the Store once. Sales made right up to the moment ctx ends are
// delivered by the drain ("Run delivers the events that are due until none is left or Drain has
// passed"), on items with ':' and '~' in their names and named like the non-item keys; and with
// two Reservers sharing one Redis, each with its own Run on one Store ("more relays and
// reconcilers, in this process or others, may run beside it"), with restores among the sales.
func TestRunDeliversEverySale(t *testing.T) {
	for _, tc := range []struct {
		name    string
		runs    int
		skus    []string
		qty     int64
		opts    stock.RunOptions
		sales   int  // per worker; 0: until 500ms have passed, the Runs stopped right after
		restore bool // every fifth sale is restored
	}{
		{
			name: "drains the last sales", runs: 1, qty: 1000, opts: stock.RunOptions{Drain: 10 * time.Second},
			skus: []string{"a:b", "a", "~", "~carts", "carts", "items", "epoch", "x:l", "x", "a:b:o"},
		},
		{
			name: "two Runs share Redis", runs: 2, skus: []string{"p1", "p2", "p3"}, qty: 300, sales: 120, restore: true,
			opts: stock.RunOptions{Reconcile: &stock.ReconcileOptions{Interval: 50 * time.Millisecond},
				Relay: &stock.RelayOptions{Poll: 5 * time.Millisecond, Batch: 3}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
				ctx := context.Background()
				c1, c2 := b.Pair(t)
				rs := []*stock.Reserver{testkit.NewReserver(t, c1), testkit.NewReserver(t, c2)}[:tc.runs]
				st := memstore.New()
				opts := tc.opts
				opts.Store = st
				// Runs first, on an empty Redis, so that their guards do not fence the sales (see
				// TestRunStartOnLiveDeploymentFenceLifts).
				var stopRuns []func()
				for _, r := range rs {
					cancel, done := runAsync(r, opts)
					stopRuns = append(stopRuns, func() { stopRunWithin(t, cancel, done, 15*time.Second) })
				}
				time.Sleep(200 * time.Millisecond)
				loadRedisAndStore(t, rs[0], st, tc.qty, tc.skus...)
				var net atomic.Int64 // units sold and not given back
				sell := func(w, i int) {
					r, sku, id := rs[w%len(rs)], tc.skus[(i+w)%len(tc.skus)], fmt.Sprintf("w%d-%d", w, i)
					if testkit.Err(r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: 1})) == nil {
						net.Add(1)
						if tc.restore && i%5 == 0 && testkit.Err(r.Restore(ctx, sku, id)) == nil {
							net.Add(-1)
						}
					}
				}
				var wg sync.WaitGroup
				stop := make(chan struct{})
				for w := range 4 {
					if tc.sales == 0 {
						untilStopped(&wg, stop, func(i int) { sell(w, i) })
					} else {
						wg.Go(func() {
							for i := range tc.sales {
								sell(w, i)
							}
						})
					}
				}
				if tc.sales == 0 {
					time.Sleep(500 * time.Millisecond)
				}
				close(stop)
				wg.Wait()
				for _, stopRun := range stopRuns {
					stopRun()
				}
				var sold int64
				for _, s := range tc.skus {
					sold += storeAgrees(t, rs[0], st, s).Sold
					assert.Equal(t, int64(0), testkit.OutboxLen(t, c1, s), "%s: outbox drained", s)
				}
				assert.Equal(t, net.Load(), sold, "Redis sold what the answers say")
				assert.LessOrEqual(t, st.MaxApplications(), 1, "no event applied twice")
				t.Logf("%d sold", sold)
			})
		})
	}
}

// sleepyStore sleeps d in Apply ignoring its context (a database call with no deadline), or with
// hang, blocks until its context ends (a hung database honouring ctx). It is a plain stock.Store
// (memstore's ApplyBatch is not promoted), so the relay calls its Apply.
type sleepyStore struct {
	onlyStore
	d      time.Duration
	hang   bool
	calls  atomic.Int64
	mu     sync.Mutex
	starts []time.Time // when each Apply call began
}

func (s *sleepyStore) Apply(ctx context.Context, ev stock.Event) error {
	s.calls.Add(1)
	s.mu.Lock()
	s.starts = append(s.starts, time.Now())
	s.mu.Unlock()
	if s.hang {
		<-ctx.Done()
		return ctx.Err()
	}
	time.Sleep(s.d)
	return s.s.Apply(ctx, ev)
}

// "Drain bounds the relay's last delivery after ctx ends: Run delivers the events that are due
// until none is left or Drain has passed." Run returns about Drain after ctx ends, with a Store
// that hangs (honouring its context: Run returns the error a loop met, and the event is not lost),
// with a slow Store and many events due (the drain stops at Drain, not when the outbox is empty;
// what is left is delivered later, once in effect), and with a Store whose calls ignore their
// context and take longer than Drain (the call in flight cannot be cut short, but no new delivery
// may begin once Drain has passed; no event is applied twice).
func TestRunDrainBoundedWithSlowStore(t *testing.T) {
	for _, tc := range []struct {
		name  string
		d     time.Duration // each Apply call sleeps d, or with hang blocks until its ctx ends
		hang  bool
		load  int64
		sold  int
		live  bool // ctx ends while Run runs, once the store was called (else before)
		opts  stock.RunOptions
		bound time.Duration // Run returns within it of ctx's end
		check func(t *testing.T, c rueidis.Client, r *stock.Reserver, st *sleepyStore, sku string, err error, ended time.Time)
	}{
		{
			name: "hung store", hang: true, load: 10, sold: 1, live: true,
			opts:  stock.RunOptions{Drain: 500 * time.Millisecond, Relay: &stock.RelayOptions{Lease: time.Hour}},
			bound: 3 * time.Second,
			check: func(t *testing.T, c rueidis.Client, r *stock.Reserver, st *sleepyStore, sku string, err error, ended time.Time) {
				assert.Error(t, err)
				assert.Equal(t, int64(1), testkit.OutboxLen(t, c, sku), "the event is still in the outbox")
			},
		},
		{
			name: "slow store, many events", d: 5 * time.Millisecond, load: 5000, sold: 1500,
			opts:  stock.RunOptions{Drain: 300 * time.Millisecond, Relay: &stock.RelayOptions{Lease: time.Second}},
			bound: 3 * time.Second,
			check: func(t *testing.T, c rueidis.Client, r *stock.Reserver, st *sleepyStore, sku string, err error, ended time.Time) {
				assert.ErrorIs(t, err, context.Canceled)
				left := testkit.OutboxLen(t, c, sku)
				assert.LessOrEqual(t, 1500-left, 5000-remaining(t, st, sku), "every event left the outbox only after the Store applied it")
				t.Logf("%d applied, %d left", st.calls.Load(), left)
				redistest.Sleep(c, 1100*time.Millisecond) // past the lease of the events Run claimed
				testkit.Drain(t, newRelay(t, r, st.s, nil, nil))
				assert.Equal(t, int64(3500), remaining(t, st.s, sku))
			},
		},
		{
			name: "store ignoring ctx", d: time.Second, load: 10, sold: 4, live: true,
			opts: stock.RunOptions{Drain: 100 * time.Millisecond}, bound: 10 * time.Second,
			check: func(t *testing.T, c rueidis.Client, r *stock.Reserver, st *sleepyStore, sku string, err error, ended time.Time) {
				st.mu.Lock()
				starts := slices.Clone(st.starts)
				st.mu.Unlock()
				for i, at := range starts {
					assert.Less(t, at.Sub(ended), 100*time.Millisecond+50*time.Millisecond, "Apply call %d began %v after ctx ended, after Drain had passed", i, at.Sub(ended))
				}
				assert.GreaterOrEqual(t, remaining(t, st.s, sku), int64(6))
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
				r := testkit.NewReserver(t, c)
				st := &sleepyStore{onlyStore: onlyStore{s: memstore.New()}, d: tc.d, hang: tc.hang}
				const sku = "slow"
				loadBoth(t, r, st.s, sku, tc.load)
				deductEach(t, r, stock.Request{SKU: sku, Qty: 1}, numbered("d", tc.sold)...)
				opts := tc.opts
				opts.Store = st
				var err error
				var ended time.Time
				if tc.live {
					cancel, done := runAsync(r, opts)
					require.True(t, eventually(3*time.Second, func() bool { return st.calls.Load() > 0 }), "the relay called Apply")
					cancel()
					ended = time.Now()
					var ok bool
					err, ok = waitRun(t, done, 10*time.Second)
					require.True(t, ok, "Run returned")
				} else {
					cctx, cancel := context.WithCancel(context.Background())
					cancel()
					ended = time.Now()
					err = r.Run(cctx, opts)
				}
				took := time.Since(ended)
				t.Logf("Run returned %v after ctx ended (Drain %v): %v", took, opts.Drain, err)
				assert.Less(t, took, tc.bound, "Drain (%v) bounds the last delivery", opts.Drain)
				tc.check(t, c, r, st, sku, err, ended)
				assert.LessOrEqual(t, st.s.MaxApplications(), 1)
			})
		})
	}
}

// The queue path through Run: "With no Store it is the queue path: consumers apply the events
// through Consume." Every published event, applied through Consume, makes the Store agree.
func TestRunPublisherOnly(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r, st := withStore(t, c, 20, []string{"q:1"})
		pub := &queue{}
		cancel, done := runAsync(r, stock.RunOptions{Publisher: pub})
		deductEach(t, r, stock.Request{SKU: "q:1", Qty: 2}, numbered("d", 6)...)
		require.NoError(t, testkit.Err(r.Restore(ctx, "q:1", "d0")))
		stopRunWithin(t, cancel, done, 10*time.Second)
		assert.Equal(t, int64(0), testkit.OutboxLen(t, c, "q:1"))
		evs := pub.take()
		require.Len(t, evs, 7)
		// Deliver in reverse: Consume keeps the item's order.
		for i := len(evs) - 1; i >= 0; i-- {
			require.NoError(t, stock.Consume(ctx, r, st, evs[i]))
		}
		rem := remaining(t, st, "q:1")
		assert.Equal(t, testkit.Levels(t, r, "q:1").Available, rem)
		assert.Equal(t, int64(10), rem)
	})
}

// RelayOptions.Batch: Once "claims their due events, a batch at a time, until none is due": a
// Batch of 1 still delivers everything in one Once.
func TestRelayBatchOneDrainsInOnce(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := testkit.NewReserver(t, c)
		st := memstore.New()
		for _, s := range []string{"b1", "b:2"} {
			loadBoth(t, r, st, s, 100)
			deductEach(t, r, stock.Request{SKU: s, Qty: 1}, numbered("d", 40)...)
		}
		rl := newRelay(t, r, st, nil, &stock.RelayOptions{Batch: 1})
		stats, err := rl.Once(ctx)
		require.NoError(t, err)
		assert.Equal(t, 80, stats.Delivered, "%+v", stats)
		for _, s := range []string{"b1", "b:2"} {
			assert.Equal(t, int64(0), testkit.OutboxLen(t, c, s))
		}
		// RelayOptions.Items: "limits the relay to these items".
		require.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: "b1", ID: "x", Qty: 1})))
		require.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: "b:2", ID: "x", Qty: 1})))
		rl = newRelay(t, r, st, nil, &stock.RelayOptions{Items: []string{"b:2"}})
		stats, err = rl.Once(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, stats.Delivered)
		assert.Equal(t, int64(1), testkit.OutboxLen(t, c, "b1"), "b1 is not the relay's")
	})
}

// onlyStore is a stock.Store and nothing more (no BatchStore, RecordLister or ItemLister), whose
// Records and Remaining wait delay.
type onlyStore struct {
	s     *memstore.Store
	delay time.Duration
}

func (o *onlyStore) Apply(ctx context.Context, ev stock.Event) error { return o.s.Apply(ctx, ev) }

func (o *onlyStore) Remaining(ctx context.Context, sku string) (int64, error) {
	time.Sleep(o.delay)
	return o.s.Remaining(ctx, sku)
}

func (o *onlyStore) Records(ctx context.Context, sku string, ids []string) (map[string]stock.Record, error) {
	time.Sleep(o.delay)
	return o.s.Records(ctx, sku, ids)
}

// Run with a Store and a Publisher that fails: "an event is removed from the outbox only after
// the Store applied it and the Publisher accepted it"; once the Publisher recovers, each event
// reaches it and the Store applies it once in effect.
func TestRunStoreAndFailingPublisher(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		r, st := withStore(t, c, 10, []string{"sp"})
		var down atomic.Bool
		down.Store(true)
		var mu sync.Mutex
		seen := map[string]int{}
		pub := stock.PublisherFunc(func(_ context.Context, ev stock.Event) error {
			if down.Load() {
				return errors.New("queue down")
			}
			mu.Lock()
			seen[string(ev.Type)+":"+ev.ID]++
			mu.Unlock()
			return nil
		})
		deductEach(t, r, stock.Request{SKU: "sp", Qty: 1}, numbered("d", 3)...)
		relay := &stock.RelayOptions{MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}
		cancel, done := runAsync(r, stock.RunOptions{Store: st, Publisher: pub, Relay: relay, Drain: 200 * time.Millisecond})
		time.Sleep(300 * time.Millisecond)
		cancel()
		err, ok := waitRun(t, done, 5*time.Second)
		require.True(t, ok)
		assert.Error(t, err)
		assert.False(t, errors.Is(err, context.Canceled) && !strings.Contains(err.Error(), "queue down"), "the loop's error, not only ctx's: %v", err)
		assert.Equal(t, int64(3), testkit.OutboxLen(t, c, "sp"), "nothing left the outbox while the Publisher refused")

		down.Store(false)
		redistest.Sleep(c, 100*time.Millisecond)
		cancel, done = runAsync(r, stock.RunOptions{Store: st, Publisher: pub, Relay: relay})
		ok = eventually(5*time.Second, func() bool { return testkit.OutboxLen(t, c, "sp") == 0 })
		cancel()
		<-done
		assert.True(t, ok, "delivered once the Publisher is back")
		mu.Lock()
		for i := range 3 {
			assert.GreaterOrEqual(t, seen["deducted:"+fmt.Sprint("d", i)], 1)
		}
		mu.Unlock()
		assert.Equal(t, int64(7), remaining(t, st, "sp"))
		assert.LessOrEqual(t, st.MaxApplications(), 1)
	})
}

// relayQueue is a queue (what the publisher accepted, in the order it accepted it) that is also a
// BatchPublisher.
type relayQueue struct {
	queue
	// batch, when set, decides what PublishBatch does with a batch: it returns the answer and
	// says which of the events the queue really takes.
	batch func(call int, evs []stock.Event) (errs []error, keep []bool)
	calls atomic.Int64
}

func (q *relayQueue) PublishBatch(ctx context.Context, evs []stock.Event) []error {
	call := int(q.calls.Add(1))
	errs, keep := keepAll(len(evs))
	if q.batch != nil {
		errs, keep = q.batch(call, evs)
	}
	for i, ev := range evs {
		if keep[i] {
			q.put(ev)
		}
	}
	return errs
}

// orderStore wraps a memstore and records, per item, every event that changed something, to
// find events applied out of their item's order.
type orderStore struct {
	*memstore.Store
	mu      sync.Mutex
	applied map[string][]stock.Event // per sku, first applications in the order they came
	seen    map[string]bool
}

func newOrderStore() *orderStore {
	return &orderStore{Store: memstore.New(), applied: map[string][]stock.Event{}, seen: map[string]bool{}}
}

func (s *orderStore) Apply(ctx context.Context, ev stock.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock() // serialise, so the recorded order is the order of application
	err := s.Store.Apply(ctx, ev)
	k := ev.SKU + "\x00" + ev.ID + "\x00" + string(ev.Type)
	if (err == nil || errors.Is(err, stock.ErrRefused)) && !s.seen[k] {
		switch ev.Type {
		case stock.EventDeducted, stock.EventConfirmed, stock.EventRestored, stock.EventRefused, stock.EventRestocked:
			s.seen[k] = true
			s.applied[ev.SKU] = append(s.applied[ev.SKU], ev)
		}
	}
	return err
}

// checkOrder fails t for an item whose events reached the store out of sequence.
func (s *orderStore) checkOrder(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for sku, evs := range s.applied {
		for i := 1; i < len(evs); i++ {
			if evs[i].Seq != 0 && evs[i-1].Seq != 0 && evs[i].Seq < evs[i-1].Seq {
				t.Errorf("item %q: %s %s (seq %d) reached the store after %s %s (seq %d)",
					sku, evs[i].Type, evs[i].ID, evs[i].Seq, evs[i-1].Type, evs[i-1].ID, evs[i-1].Seq)
				break
			}
		}
	}
}

// acks is what the Reserver acknowledged: the ids it deducted and those it gave back.
type acks struct {
	deducted map[string]map[string]int64 // sku → id → qty
	restored map[string]map[string]bool
	restock  map[string]map[string]int64
	initial  map[string]int64
}

// traffic loads skus (in Redis and in the store) and runs n random deducts, restores and
// restocks on them, returning what was acknowledged.
func traffic(t *testing.T, ctx context.Context, r *stock.Reserver, store *memstore.Store, skus []string, n int, rng *rand.Rand) *acks {
	t.Helper()
	a := &acks{deducted: map[string]map[string]int64{}, restored: map[string]map[string]bool{}, restock: map[string]map[string]int64{}, initial: map[string]int64{}}
	for _, sku := range skus {
		qty := int64(20 + rng.IntN(30))
		require.NoError(t, r.Load(ctx, sku, qty), "Load %q", sku)
		require.NoError(t, store.Load(ctx, sku, qty), "store.Load %q", sku)
		a.initial[sku] = qty
		a.deducted[sku] = map[string]int64{}
		a.restored[sku] = map[string]bool{}
		a.restock[sku] = map[string]int64{}
	}
	for i := 0; i < n; i++ {
		sku := skus[rng.IntN(len(skus))]
		switch p := rng.IntN(10); {
		case p < 6:
			id := fmt.Sprintf("d%d", i)
			q := int64(1 + rng.IntN(3))
			_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: q})
			switch {
			case err == nil:
				a.deducted[sku][id] = q
			case errors.Is(err, stock.ErrSoldOut), errors.Is(err, stock.ErrInsufficient):
			default:
				t.Fatalf("Deduct %q %s: %v", sku, id, err)
			}
		case p < 9:
			for id := range a.deducted[sku] {
				if a.restored[sku][id] {
					continue
				}
				require.NoError(t, testkit.Err(r.Restore(ctx, sku, id)), "Restore %q %s", sku, id)
				a.restored[sku][id] = true
				break
			}
		default:
			id := fmt.Sprintf("r%d", i)
			q := int64(1 + rng.IntN(4))
			require.NoError(t, testkit.Err(r.Restock(ctx, sku, id, q)), "Restock %q %s", sku, id)
			a.restock[sku][id] = q
		}
	}
	return a
}

// drain runs the relay until every item's outbox is empty, moving the Redis clock past every
// backoff and lease between passes.
func drain(t *testing.T, ctx context.Context, e *stocktest.Env, rl *stockops.Relay, skus []string) {
	t.Helper()
	for pass := 0; pass < 400; pass++ {
		_, _ = rl.Once(ctx)
		if pendingOf(t, e.Reserver, skus...) == 0 {
			return
		}
		e.Advance(2 * time.Minute)
	}
	t.Fatalf("the relay did not drain the outboxes in 400 passes")
}

// relayConsumeAll hands msgs to stock.Consume in a random order, redelivering every message Consume
// did not settle (ErrHeldBack or a temporary error), until all are settled.
func relayConsumeAll(t *testing.T, ctx context.Context, r *stock.Reserver, st stock.Store, msgs []stock.Event, rng *rand.Rand) {
	t.Helper()
	rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	consumeRounds(t, ctx, r, st, msgs, rng, true)
}

// verify checks the end state: the store equals Redis for every item, nothing is applied twice,
// every acknowledged deduct and restore has its record, no outbox or published set holds anything,
// and the store saw each item's events in order.
func verify(t *testing.T, ctx context.Context, r *stock.Reserver, st *orderStore, a *acks) {
	t.Helper()
	rec := newReconciler(t, r, st.Store, &stock.ReconcileOptions{DryRun: true})
	for sku := range a.initial {
		lv, err := r.Levels(ctx, sku)
		require.NoError(t, err, "Levels %q", sku)
		rem, err := st.Remaining(ctx, sku)
		require.NoError(t, err, "Remaining %q", sku)
		assert.EqualValues(t, lv.Available+lv.Held, rem, "item %q: store remaining %d, Redis available %d held %d", sku, rem, lv.Available, lv.Held)
		// The expected figure from the acknowledged answers alone.
		want := a.initial[sku]
		for id, q := range a.deducted[sku] {
			if !a.restored[sku][id] {
				want -= q
			}
		}
		for _, q := range a.restock[sku] {
			want += q
		}
		assert.EqualValues(t, want, rem, "item %q: store remaining %d, the acknowledged answers make %d", sku, rem, want)
		ids := slices.Collect(maps.Keys(a.deducted[sku]))
		recs, err := st.Records(ctx, sku, ids)
		require.NoError(t, err)
		for _, id := range ids {
			want := stock.StateApplied
			if a.restored[sku][id] {
				want = stock.StateRestored
			}
			if got := recs[id]; got.Status != want {
				t.Errorf("item %q id %s: store record %q, want %q (acknowledged)", sku, id, got.Status, want)
			}
		}
		rp, err := rec.Item(ctx, sku)
		require.NoError(t, err, "reconcile %q", sku)
		assert.False(t, rp.Pending != 0 || rp.Published != 0 || rp.DeadLetters != 0 || rp.InFlight != 0 || rp.Drift != 0, "item %q after the drain: %s", sku, rp)
	}
	assert.LessOrEqual(t, st.MaxApplications(), 1, "an event changed the store more than once")
	st.checkOrder(t)
}

// queueRelay is a relay with no Store that publishes to q.
func queueRelay(t *testing.T, e *stocktest.Env, q *relayQueue, o *stock.RelayOptions) *stockops.Relay {
	t.Helper()
	return newRelay(t, e.Reserver, nil, q, o)
}

// consumeVerify hands what q took to Consume (relayConsumeAll) and checks the end state (verify).
func consumeVerify(t *testing.T, ctx context.Context, e *stocktest.Env, st *orderStore, q *relayQueue, rng *rand.Rand, a *acks) {
	t.Helper()
	relayConsumeAll(t, ctx, e.Reserver, st, q.take(), rng)
	verify(t, ctx, e.Reserver, st, a)
}

// keepFirst is the answer to a batch of n events of which the queue took the first k: nil for
// those, err for the rest.
func keepFirst(n, k int, err error) ([]error, []bool) {
	errs := make([]error, n)
	keep := make([]bool, n)
	for i := range n {
		if i < k {
			keep[i] = true
		} else {
			errs[i] = err
		}
	}
	return errs, keep
}

// keepAll is the answer to a batch of n events that the queue took whole: nil for each.
func keepAll(n int) ([]error, []bool) { return keepFirst(n, n, nil) }

// setup is a Reserver on stocktest's miniredis, a store and a seeded rng.
func setup(t *testing.T, seed uint64) (context.Context, *stocktest.Env, *orderStore, *rand.Rand) {
	return context.Background(), stocktest.New(t), newOrderStore(), rand.New(rand.NewPCG(seed, 18))
}

// queueCase is what a queue-path test of the relay starts from: setup's kit, store and rng, the
// answers of n calls of traffic on skus, and a queue to publish them to.
type queueCase struct {
	ctx  context.Context
	e    *stocktest.Env
	st   *orderStore
	rng  *rand.Rand
	acks *acks
	q    *relayQueue
	skus []string
}

func newQueueCase(t *testing.T, seed uint64, n int, skus ...string) *queueCase {
	t.Helper()
	ctx, e, st, rng := setup(t, seed)
	acks := traffic(t, ctx, e.Reserver, st.Store, skus, n, rng)
	return &queueCase{ctx: ctx, e: e, st: st, rng: rng, acks: acks, q: &relayQueue{}, skus: skus}
}

// deliver drains the outboxes through rl, then consumes what the queue took and checks the end
// state (consumeVerify).
func (c *queueCase) deliver(t *testing.T, rl *stockops.Relay) {
	t.Helper()
	drain(t, c.ctx, c.e, rl, c.skus)
	consumeVerify(t, c.ctx, c.e, c.st, c.q, c.rng, c.acks)
}

// A batch that fails at event k of n (the queue took the first k, the relay is told so), a
// different k every call: the relay must keep the first k and retry from k, in order, and through
// Consume the store must end exactly where the acknowledged answers put it.
func TestBatchFailsMidBatch(t *testing.T) {
	c := newQueueCase(t, 1, 300, "a", "b", "c")
	var mu sync.Mutex
	c.q.batch = func(call int, evs []stock.Event) ([]error, []bool) {
		mu.Lock()
		k := c.rng.IntN(len(evs) + 1)
		mu.Unlock()
		return keepFirst(len(evs), k, errors.New("broker: not appended"))
	}
	rl := queueRelay(t, c.e, c.q, &stock.RelayOptions{Batch: 16})
	drain(t, c.ctx, c.e, rl, c.skus)
	require.NotZero(t, c.q.calls.Load(), "the relay never called PublishBatch")
	// The queue got each item's events in sequence, each once (the relay never republished one
	// the queue had taken).
	last := map[string]int64{}
	seen := map[string]bool{}
	for _, ev := range c.q.snapshot() {
		k := ev.SKU + "/" + ev.ID + "/" + string(ev.Type)
		assert.False(t, seen[k], "event %s was published again after the queue took it", k)
		seen[k] = true
		assert.Greater(t, ev.Seq, last[ev.SKU], "item %q: seq %d published after %d", ev.SKU, ev.Seq, last[ev.SKU])
		last[ev.SKU] = ev.Seq
	}
	c.deliver(t, rl)
}

// A batch publisher whose answer is not a prefix: nil, error, nil, nil... (the queue took every
// event answered nil). The relay must not count the events after the first failure as published
// (it retries them: duplicates), and the store must still end right.
func TestBatchHoleInAnswer(t *testing.T) {
	c := newQueueCase(t, 2, 200, "x", "y")
	c.q.batch = func(call int, evs []stock.Event) ([]error, []bool) {
		errs, keep := keepAll(len(evs))
		if len(evs) > 1 && call%3 != 0 {
			errs[1] = errors.New("broker: lost confirm for the second")
			keep[1] = false
		}
		return errs, keep
	}
	c.deliver(t, queueRelay(t, c.e, c.q, &stock.RelayOptions{Batch: 8}))
}

// Answers of the wrong length (one error short, one nil too many, none at all) fail the whole
// batch: no event of it may leave the outbox. Then a sound publisher delivers them all.
func TestBatchWrongLength(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    func(int) int
	}{
		{"short", func(n int) int { return n - 1 }},
		{"long", func(n int) int { return n + 1 }},
		{"nil", func(int) int { return 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newQueueCase(t, 3, 40, "w")
			before := pendingOf(t, c.e.Reserver, c.skus...)
			c.q.batch = func(call int, evs []stock.Event) ([]error, []bool) {
				_, keep := keepAll(len(evs)) // the queue has them all: the answer is wrong, not the queue
				if n := tc.n(len(evs)); n > 0 {
					return make([]error, n), keep
				}
				return nil, keep
			}
			rl := queueRelay(t, c.e, c.q, &stock.RelayOptions{Batch: 16})
			st1, err := rl.Once(c.ctx)
			assert.Zero(t, st1.Delivered, "wrong-length answers: the relay counted %d events delivered (stats %+v, err %v)", st1.Delivered, st1, err)
			assert.Equal(t, before, pendingOf(t, c.e.Reserver, c.skus...), "events in the outbox after a pass of wrong-length answers")
			c.q.batch = nil
			c.deliver(t, rl)
		})
	}
}

// A PublishBatch that panics (after the queue took half the batch). Whatever the relay does with
// the panic, nothing may be lost: the events come back after the lease and are delivered.
func TestBatchPanics(t *testing.T) {
	c := newQueueCase(t, 4, 40, "p")
	c.q.batch = func(call int, evs []stock.Event) ([]error, []bool) {
		if call == 1 {
			c.q.put(evs[:len(evs)/2]...)
			panic("publisher bug")
		}
		return keepAll(len(evs))
	}
	rl := queueRelay(t, c.e, c.q, &stock.RelayOptions{Batch: 16, Lease: 5 * time.Second})
	func() {
		defer func() { _ = recover() }()
		_, _ = rl.Once(c.ctx)
	}()
	c.e.Advance(10 * time.Second)
	c.deliver(t, rl)
}

// A broker that delivers a message to a consumer before it confirms it to the publisher (as every
// real broker may): the consumer runs stock.Consume on the event while the relay still holds it
// claimed in the outbox, then the relay hears the confirm and moves it to the published set.
// Nothing may be left in flight afterwards: the event is applied, and Redis must not count it
// as published-and-unapplied forever.
func TestConsumedBeforeConfirm(t *testing.T) {
	for _, batch := range []bool{true, false} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			c := newQueueCase(t, 5, 80, "fast", "quick")
			var mu sync.Mutex
			var consumeErrs []error
			var redeliver []stock.Event // what the broker must hand over again
			deliver := func(ev stock.Event) {
				if err := stock.Consume(c.ctx, c.e.Reserver, c.st, ev); err != nil {
					mu.Lock()
					consumeErrs = append(consumeErrs, err)
					redeliver = append(redeliver, ev)
					mu.Unlock()
				}
			}
			var pub stock.Publisher = stock.PublisherFunc(func(_ context.Context, ev stock.Event) error {
				deliver(ev)
				return nil
			})
			if batch {
				c.q.batch = func(_ int, evs []stock.Event) ([]error, []bool) {
					for _, ev := range evs {
						deliver(ev)
					}
					return make([]error, len(evs)), make([]bool, len(evs))
				}
				pub = c.q
			}
			rl := newRelay(t, c.e.Reserver, nil, pub, nil)
			drain(t, c.ctx, c.e, rl, c.skus)
			if len(consumeErrs) > 0 {
				t.Logf("Consume answered %d errors during delivery, first: %v", len(consumeErrs), consumeErrs[0])
			}
			relayConsumeAll(t, c.ctx, c.e.Reserver, c.st, redeliver, c.rng)
			verify(t, c.ctx, c.e.Reserver, c.st, c.acks)
		})
	}
}

// Every event delivered three times, to eight consumers at once, in a random order: concurrent
// Consume calls of one event and of neighbouring events of one item.
func TestConcurrentConsumers(t *testing.T) {
	c := newQueueCase(t, 6, 400, "k1", "k2", "k3", "k4")
	drain(t, c.ctx, c.e, queueRelay(t, c.e, c.q, nil), c.skus)
	concurrentConsume(t, c.ctx, c.e.Reserver, c.st, c.q.take(), 3, 8, c.rng)
	verify(t, c.ctx, c.e.Reserver, c.st, c.acks)
}

// The old events of an item delivered again after its later ones were applied (a redelivery of a
// dead consumer's messages, or a relay's republish): repeats, answered nil, changing nothing.
func TestStaleRedelivery(t *testing.T) {
	c := newQueueCase(t, 7, 60, "old")
	ctx, r, st := c.ctx, c.e.Reserver, c.st
	drain(t, ctx, c.e, queueRelay(t, c.e, c.q, nil), c.skus)
	msgs := c.q.take()
	sort.Slice(msgs, func(i, j int) bool { return msgs[i].Seq < msgs[j].Seq })
	// Apply only the last: Consume must apply all earlier ones first, from Redis.
	require.NoError(t, stock.Consume(ctx, r, st, msgs[len(msgs)-1]), "Consume of the last event")
	verify(t, ctx, r, st, c.acks)
	rem, _ := st.Remaining(ctx, "old")
	for i := len(msgs) - 1; i >= 0; i-- {
		assert.NoError(t, stock.Consume(ctx, r, st, msgs[i]), "stale redelivery of %s %s (seq %d)", msgs[i].Type, msgs[i].ID, msgs[i].Seq)
	}
	assert.Equal(t, rem, remaining(t, st, "old"), "stale redeliveries moved the store")
	verify(t, ctx, r, st, c.acks)
}

// runQueuePath runs Run with c's queue as its only Publisher until ready, then cancels its
// context and fails t unless Run returns within bound; release (when set) runs once Run has
// returned or bound has passed.
func (c *queueCase) runQueuePath(t *testing.T, opts stock.RunOptions, ready func() bool, bound time.Duration, release func()) {
	t.Helper()
	runCtx, cancel := context.WithCancel(c.ctx)
	opts.Publisher = c.q
	ch := run(runCtx, c.e.Reserver, opts)
	for !ready() {
		time.Sleep(time.Millisecond)
	}
	cancel()
	returned := false
	select {
	case <-ch:
		returned = true
	case <-time.After(bound):
	}
	if release != nil {
		release()
	}
	if !returned {
		t.Errorf("Run did not return within %v of the cancel (Drain %v)", bound, opts.Drain)
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal("Run never returned")
		}
	}
}

// Run with only a Publisher, a slow one, and the context cancelled in the middle of a batch; the
// publisher's last answers come after the context ended (it accepted them anyway). Then a second
// relay drains the rest. Every acknowledged operation must reach the store once.
func TestRunCancelMidBatch(t *testing.T) {
	c := newQueueCase(t, 8, 400, "s:1", "s%7B2%7D", "s~3", "сток-4", "s/5", "😀:6")
	c.q.batch = func(_ int, evs []stock.Event) ([]error, []bool) {
		time.Sleep(30 * time.Millisecond) // the broker is slow; ctx may end meanwhile
		return keepAll(len(evs))
	}
	c.runQueuePath(t, stock.RunOptions{Relay: &stock.RelayOptions{Batch: 8, Poll: time.Millisecond}, Drain: time.Millisecond},
		func() bool { return len(c.q.snapshot()) >= 20 }, 10*time.Second, nil)
	// Everything the Reserver acknowledged is in the queue or still in an outbox.
	t.Logf("first Run: %d published, %d left in the outboxes", len(c.q.snapshot()), pendingOf(t, c.e.Reserver, c.skus...))
	c.e.Advance(2 * time.Minute) // past any lease the first Run held
	c.q.batch = nil
	c.deliver(t, queueRelay(t, c.e, c.q, nil))
}

// A publisher whose call hangs past the context (a broker client that ignores ctx) while Run's
// context ends: Run promises to stop after its Drain bound; when the call finally returns, nothing
// is lost, and the next relay delivers everything once.
func TestRunPublisherIgnoresContext(t *testing.T) {
	c := newQueueCase(t, 16, 40, "hang:1")
	release := make(chan struct{})
	var entered atomic.Bool
	c.q.batch = func(_ int, evs []stock.Event) ([]error, []bool) {
		entered.Store(true)
		<-release // ignores ctx
		return keepAll(len(evs))
	}
	c.runQueuePath(t, stock.RunOptions{Drain: 200 * time.Millisecond, Relay: &stock.RelayOptions{Poll: time.Millisecond}},
		entered.Load, 3*time.Second, func() { close(release) })
	c.e.Advance(2 * time.Minute)
	c.q.batch = nil
	c.deliver(t, queueRelay(t, c.e, c.q, nil))
}

// A publisher that accepts every event after the relay's context ended (a confirm that arrives
// late): the relay cannot know whether it may trust the answer, but nothing may be lost either
// way, and nothing applied twice.
func TestAcceptAfterContextEnd(t *testing.T) {
	c := newQueueCase(t, 9, 60, "late")
	var cancel context.CancelFunc
	c.q.batch = func(_ int, evs []stock.Event) ([]error, []bool) {
		cancel() // the context ends while the broker works on the batch
		return keepAll(len(evs))
	}
	rl := queueRelay(t, c.e, c.q, &stock.RelayOptions{Batch: 8})
	for i := 0; i < 5; i++ {
		var ctx context.Context
		ctx, cancel = context.WithCancel(c.ctx)
		_, _ = rl.Once(ctx)
		cancel()
	}
	c.e.Advance(2 * time.Minute)
	c.q.batch = nil
	c.deliver(t, rl)
}

// Many items with awkward SKUs, through Run's queue path with a flaky batch publisher (every
// third batch fails in the middle), consumed concurrently while the relay still publishes.
func TestManyItemsLiveConsume(t *testing.T) {
	var skus []string
	for i := 0; i < 24; i++ {
		skus = append(skus, fmt.Sprintf("it:%d:%d~ü%d", i, i%3, i))
	}
	c := newQueueCase(t, 10, 600, skus...)
	var mu sync.Mutex
	c.q.batch = func(call int, evs []stock.Event) ([]error, []bool) {
		mu.Lock()
		k := len(evs)
		if call%3 == 0 {
			k = c.rng.IntN(len(evs) + 1)
		}
		mu.Unlock()
		return keepFirst(len(evs), k, errors.New("broker busy"))
	}
	rl := queueRelay(t, c.e, c.q, &stock.RelayOptions{Batch: 4})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // a live consumer, racing with the relay
		var held []stock.Event
		for {
			select {
			case <-stop:
				c.q.put(held...)
				return
			default:
			}
			msgs := append(held, c.q.take()...)
			held = nil
			for _, ev := range msgs {
				if err := stock.Consume(c.ctx, c.e.Reserver, c.st, ev); err != nil && !errors.Is(err, stock.ErrInvalid) {
					held = append(held, ev)
				}
			}
			time.Sleep(time.Millisecond)
		}
	})
	drain(t, c.ctx, c.e, rl, c.skus)
	close(stop)
	wg.Wait()
	consumeVerify(t, c.ctx, c.e, c.st, c.q, c.rng, c.acks)
}

// concurrentConsume consumes msgs with w goroutines, each message delivered dup times, until
// every delivery is settled (ErrHeldBack and temporary errors are redelivered).
func concurrentConsume(t *testing.T, ctx context.Context, r *stock.Reserver, st stock.Store, msgs []stock.Event, dup, w int, rng *rand.Rand) {
	t.Helper()
	consumeCut(t, ctx, r, st, msgs, dup, w, rng, nil)
}

// consumeCut is concurrentConsume whose consumer i cuts the context of its n-th delivery short
// (a consumer shutting down mid-call) when cut(i, n) says so.
func consumeCut(t *testing.T, ctx context.Context, r *stock.Reserver, st stock.Store, msgs []stock.Event, dup, w int, rng *rand.Rand, cut func(i, n int) bool) {
	t.Helper()
	var all []stock.Event
	for i := 0; i < dup; i++ {
		all = append(all, msgs...)
	}
	rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	work := make(chan stock.Event, len(all))
	for _, ev := range all {
		work <- ev
	}
	var left atomic.Int64
	left.Store(int64(len(all)))
	var wg sync.WaitGroup
	deadline := time.Now().Add(15 * time.Second)
	for i := 0; i < w; i++ {
		wg.Go(func() {
			n := 0
			for left.Load() > 0 && time.Now().Before(deadline) {
				select {
				case ev := <-work:
					n++
					c, cancel := context.WithCancel(ctx)
					if cut != nil && cut(i, n) {
						cancel()
					}
					err := stock.Consume(c, r, st, ev)
					cancel()
					switch {
					case err == nil:
						left.Add(-1)
					case errors.Is(err, stock.ErrInvalid):
						t.Errorf("Consume %s %s %s: %v", ev.SKU, ev.Type, ev.ID, err)
						left.Add(-1)
					default:
						work <- ev
					}
				default:
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	if n := left.Load(); n > 0 {
		t.Fatalf("%d deliveries never settled", n)
	}
}

// ledgerMatchesStore checks every ledger entry of sku against the store's record of its id:
// applied in Redis ↔ applied in the store, refused ↔ refused, restored ↔ restored (or refused: a
// deduct the store refused, then restored in Redis before the refusal reached it).
func ledgerMatchesStore(t *testing.T, ctx context.Context, r *stock.Reserver, st stock.Store, sku string) (refused int) {
	t.Helper()
	var ids []string
	entries := map[string]stock.Entry{}
	for e, err := range stockops.Entries(ctx, r, sku) {
		require.NoError(t, err, "Entries %q", sku)
		if e.Kind != stock.KindDeduct {
			continue
		}
		entries[e.ID] = e
		ids = append(ids, e.ID)
	}
	recs, err := st.Records(ctx, sku, ids)
	require.NoError(t, err)
	for id, e := range entries {
		got := recs[id].Status
		want := e.State
		if want == stock.StateReserved {
			want = stock.StateApplied // on the queue path Redis may not have heard the ack; the store has it
		}
		if want == stock.StateRestored && got == stock.StateRefused {
			continue // the store refused the deduct, and the restore that followed gave nothing back
		}
		assert.EqualValues(t, want, got, "item %q id %s: Redis says %q, the store %q", sku, id, e.State, got)
		if e.State == stock.StateRefused {
			refused++
		}
	}
	return refused
}

// The store has fewer units than Redis: Consume refuses deducts and gives them back in Redis; the
// EventRefused events follow through the queue. Every delivery is duplicated and handed to eight
// consumers at once. Each refusal must be given back exactly once (Redis available == store
// remaining), and Redis's ledger and the store must agree on every id.
func TestRefusalsConcurrentConsumers(t *testing.T) {
	ctx, e, st, rng := setup(t, 11)
	skus := []string{"r:1", "r:2", "r~3"}
	for _, sku := range skus {
		require.NoError(t, e.Reserver.Load(ctx, sku, 80))
		require.NoError(t, st.Load(ctx, sku, 40)) // the database has half
	}
	taken := map[string]int64{}
	for i := 0; i < 150; i++ {
		sku := skus[rng.IntN(len(skus))]
		id := fmt.Sprintf("d%d", i)
		q := int64(1 + rng.IntN(3))
		if _, err := e.Reserver.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: q}); err == nil {
			taken[sku] += q
			if i%5 == 4 {
				require.NoError(t, testkit.Err(e.Reserver.Restore(ctx, sku, id)))
				taken[sku] -= q
			}
		}
	}
	q := &relayQueue{}
	rl := queueRelay(t, e, q, &stock.RelayOptions{Batch: 8})
	for round := 0; round < 20; round++ {
		drain(t, ctx, e, rl, skus)
		msgs := q.take()
		if len(msgs) == 0 {
			break
		}
		concurrentConsume(t, ctx, e.Reserver, st, msgs, 2, 8, rng)
	}
	refusedAll := 0
	for _, sku := range skus {
		lv, err := e.Reserver.Levels(ctx, sku)
		require.NoError(t, err)
		rem := remaining(t, st, sku)
		// Redis had 40 more; every refusal gave its units back in Redis, not in the store.
		assert.Equal(t, rem+40, lv.Available, "item %q: Redis should have exactly 40 more than the store", sku)
		refusedAll += ledgerMatchesStore(t, ctx, e.Reserver, st, sku)
		assert.EqualValues(t, lv.Sold, lv.Loaded-lv.Available-lv.Held, "item %q: levels do not add up: %+v", sku, lv)
	}
	assert.NotZero(t, refusedAll, "the store refused nothing: the scenario did not happen")
	assert.LessOrEqual(t, st.MaxApplications(), 1, "an event changed the store more than once")
	st.checkOrder(t)
}

// relayEnv is requestEnv (a Reserver on one backend, with a way to let time pass for that
// backend's Redis) under the name of the relay's tests.
type relayEnv = requestEnv

// relayEach runs f on a stocktest miniredis (mini) and, with STOCK_REDIS_SERVER set, on a private
// redis-server.
func relayEach(t *testing.T, opts []stock.Option, f func(t *testing.T, e *relayEnv)) {
	t.Helper()
	mini(t, opts, f)
	if redistest.ServerBinary(t) == "" {
		return
	}
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		c := redistest.StartServer(t).Client(t)
		// A new deployment: record the primaries before any item is loaded, so that the failover
		// guard of a Run (which fences a Redis with items and no recorded epoch, as for a guard
		// added to a live deployment) does not refuse the tests' deducts.
		fenced, err := stockops.NewFailoverGuard(testkit.NewReserver(t, c)).Check(context.Background())
		require.NoError(t, err)
		require.False(t, fenced)
		f(t, &relayEnv{
			name: "redis", real: true, r: testkit.NewReserver(t, c, opts...), c: c, advance: time.Sleep,
			another: func(o ...stock.Option) *stock.Reserver { return testkit.NewReserver(t, c, o...) },
		})
	})
}

// run runs r.Run in a goroutine and returns a channel with its result and when it returned.
type result struct {
	err error
	at  time.Time
}

func run(ctx context.Context, r *stock.Reserver, opts stock.RunOptions) <-chan result {
	ch := make(chan result, 1)
	go func() {
		err := r.Run(ctx, opts)
		ch <- result{err: err, at: time.Now()}
	}()
	return ch
}

// wait waits for Run's result, failing t if it has not come within bound of ended.
func wait(t *testing.T, ch <-chan result, ended time.Time, bound time.Duration) result {
	t.Helper()
	select {
	case res := <-ch:
		assert.LessOrEqual(t, res.at.Sub(ended), bound, "Run returned %v after ctx ended", res.at.Sub(ended))
		return res
	case <-time.After(time.Until(ended.Add(bound + 30*time.Second))):
		t.Fatalf("Run did not return within %v (and 30s more) after ctx ended", bound)
		return result{}
	}
}

// sale is the acknowledged outcome of the sales of a test.
type sale struct {
	mu       sync.Mutex
	deducted map[[2]string]int64 // acknowledged deducts: (sku, id) -> qty
	restored map[[2]string]int64 // acknowledged restores of acknowledged deducts
}

func newSale() *sale {
	return &sale{deducted: map[[2]string]int64{}, restored: map[[2]string]int64{}}
}

func (s *sale) deduct(t *testing.T, ctx context.Context, r *stock.Reserver, sku, id string, qty int64) bool {
	rc, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: qty})
	switch {
	case err == nil:
		s.mu.Lock()
		defer s.mu.Unlock()
		if old, ok := s.deducted[[2]string{sku, id}]; ok && !rc.Replayed {
			t.Errorf("deduct %s/%s answered not replayed a second time (first qty %d)", sku, id, old)
		}
		s.deducted[[2]string{sku, id}] = qty
		return true
	case errors.Is(err, stock.ErrSoldOut), errors.Is(err, stock.ErrInsufficient), errors.Is(err, stock.ErrRestored):
		return false
	default:
		t.Errorf("deduct %s/%s: unexpected error %v", sku, id, err)
		return false
	}
}

func (s *sale) restore(t *testing.T, ctx context.Context, r *stock.Reserver, sku, id string) {
	rc, err := r.Restore(ctx, sku, id)
	switch {
	case err == nil && !rc.Replayed:
		s.mu.Lock()
		defer s.mu.Unlock()
		q, ok := s.deducted[[2]string{sku, id}]
		if !ok {
			t.Errorf("restore %s/%s gave back %d units of an id with no acknowledged deduct", sku, id, rc.Qty)
			return
		}
		assert.EqualValues(t, rc.Qty, q, "restore %s/%s gave back %d units, the deduct took %d", sku, id, rc.Qty, q)
		if _, dup := s.restored[[2]string{sku, id}]; dup {
			t.Errorf("restore %s/%s gave back twice", sku, id)
		}
		s.restored[[2]string{sku, id}] = rc.Qty
	case err == nil, errors.Is(err, stock.ErrUnknownID):
	default:
		t.Errorf("restore %s/%s: unexpected error %v", sku, id, err)
	}
}

// sold returns the units the acknowledged answers imply are sold of sku.
func (s *sale) sold(sku string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for k, q := range s.deducted {
		if k[0] == sku {
			n += q
		}
	}
	for k, q := range s.restored {
		if k[0] == sku {
			n -= q
		}
	}
	return n
}

// checkStore asserts that every acknowledged deduct (and restore) of the sale was applied to the
// store exactly once, and that the store, Redis's levels and the outboxes agree with the answers.
func (s *sale) checkStore(t *testing.T, r *stock.Reserver, store *memstore.Store, loaded map[string]int64) {
	t.Helper()
	ctx := context.Background()
	s.mu.Lock()
	for k := range s.deducted {
		assert.Equal(t, 1, store.Applications(k[0], k[1], stock.EventDeducted), "deduct %s/%s applied once", k[0], k[1])
	}
	for k := range s.restored {
		assert.Equal(t, 1, store.Applications(k[0], k[1], stock.EventRestored), "restore %s/%s applied once", k[0], k[1])
	}
	s.mu.Unlock()
	assert.LessOrEqual(t, store.MaxApplications(), 1, "no event applied twice")
	for sku, l := range loaded {
		sold := s.sold(sku)
		assert.Equal(t, l-sold, remaining(t, store, sku), "%s: store remaining = loaded - net sold", sku)
		lv, err := r.Levels(ctx, sku)
		require.NoError(t, err)
		assert.Equal(t, sold, lv.Sold, "%s: Redis sold", sku)
		assert.Equal(t, l-sold, lv.Available, "%s: Redis available", sku)
		assert.Equal(t, lv.Loaded, lv.Available+lv.Held+lv.Sold, "%s: loaded = available + held + sold", sku)
		pending, dead, err := stockops.Pending(ctx, r, sku)
		require.NoError(t, err)
		assert.Zero(t, pending, "%s: outbox empty", sku)
		assert.Zero(t, dead, "%s: no dead letters", sku)
	}
}

// gate blocks the calls that enter it, ignoring their context, until it is opened.
type gate struct {
	once    sync.Once
	open    chan struct{}
	entered chan struct{}
	n       atomic.Int64
}

func newGate() *gate {
	return &gate{open: make(chan struct{}), entered: make(chan struct{}, 1000)}
}

func (g *gate) wait() {
	g.n.Add(1)
	select {
	case g.entered <- struct{}{}:
	default:
	}
	<-g.open
}

func (g *gate) release() { g.once.Do(func() { close(g.open) }) }

// relayPub is a Publisher (and, with batch, a BatchPublisher) that records what it accepted, and
// that blocks, ignoring its context, while stuck says so for the call's context.
type relayPub struct {
	mu    sync.Mutex
	got   map[string]int // "sku/id/type" -> times accepted
	stuck func(ctx context.Context) bool
	gate  *gate
	after error // what a blocked call answers once released (nil: the queue took it)
	push  func(stock.Event)
}

func (p *relayPub) accept(ev stock.Event) {
	p.mu.Lock()
	if p.got == nil {
		p.got = map[string]int{}
	}
	p.got[ev.SKU+"/"+ev.ID+"/"+string(ev.Type)]++
	p.mu.Unlock()
	if p.push != nil {
		p.push(ev)
	}
}

func (p *relayPub) count(sku, id string, t stock.EventType) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.got[sku+"/"+id+"/"+string(t)]
}

func (p *relayPub) Publish(ctx context.Context, ev stock.Event) error {
	if p.stuck != nil && p.stuck(ctx) {
		p.gate.wait()
		if p.after != nil {
			return p.after
		}
	}
	p.accept(ev)
	return nil
}

type batchPub struct{ *relayPub }

func (p batchPub) PublishBatch(ctx context.Context, evs []stock.Event) []error {
	errs := make([]error, len(evs))
	if p.stuck != nil && p.stuck(ctx) {
		p.gate.wait()
		if p.after != nil {
			for i := range errs {
				errs[i] = p.after
			}
			return errs
		}
	}
	for _, ev := range evs {
		p.accept(ev)
	}
	return errs
}

// hasDeadline says whether a call runs under Run's drain (whose context has a deadline) rather
// than the main loop (whose ctx, in these tests, has none).
func hasDeadline(ctx context.Context) bool { _, ok := ctx.Deadline(); return ok }

// relay is the relay configuration of the drain tests: a lease and backoffs short enough
// for a real server, which a miniredis test passes by advancing its clock.
func relay() *stock.RelayOptions {
	return &stock.RelayOptions{Lease: 2 * time.Second, MinBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond, Poll: 10 * time.Millisecond}
}

// settle lets the leases and backoffs of relay run out.
func (e *relayEnv) settle() { e.advance(3 * time.Second) }

// finish runs a second Run with a store that never blocks until every item's outbox is empty
// (or 60s pass), then stops it and checks that it returned in bounds.
func finish(t *testing.T, e *relayEnv, r *stock.Reserver, opts stock.RunOptions, skus []string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := run(ctx, r, opts)
	deadline := time.Now().Add(60 * time.Second)
	for {
		left := pendingOf(t, r, skus...)
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the second Run left %d events in the outboxes after 60s", left)
			break
		}
		time.Sleep(20 * time.Millisecond)
		if !e.real {
			e.advance(20 * time.Millisecond) // let leases and backoffs run out as on a real server
		}
	}
	cancel()
	res := wait(t, ch, time.Now(), opts.Drain+5*time.Second+3*time.Second)
	assert.ErrorIs(t, res.err, context.Canceled)
}

func load(t *testing.T, r *stock.Reserver, store *memstore.Store, loaded map[string]int64) {
	t.Helper()
	for sku, n := range loaded {
		require.NoError(t, r.Load(context.Background(), sku, n))
		if store != nil {
			require.NoError(t, store.Load(context.Background(), sku, n))
		}
	}
}

// keys are m's keys.
func keys(m map[string]int64) []string { return slices.Collect(maps.Keys(m)) }

// soldOne loads sku with qty units in Redis and in a new memstore, and sells n units of it, one
// under each of the ids prefix0 … prefix(n-1), recording the answers in the sale it returns.
func soldOne(t *testing.T, e *relayEnv, sku string, qty int64, prefix string, n int) (loaded map[string]int64, mem *memstore.Store, s *sale) {
	t.Helper()
	loaded = map[string]int64{sku: qty}
	mem = memstore.New()
	load(t, e.r, mem, loaded)
	s = newSale()
	for _, id := range numbered(prefix, n) {
		s.deduct(t, context.Background(), e.r, sku, id, 1)
	}
	return loaded, mem, s
}

// runEnded runs r.Run with opts on a context that ended before the call, so that only the drain
// can deliver, and returns Run's result channel and when the context ended.
func runEnded(r *stock.Reserver, opts stock.RunOptions) (<-chan result, time.Time) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ended := time.Now()
	return run(ctx, r, opts), ended
}

// finishInto lets the leases and backoffs run out, then has a second Run deliver every event of
// the loaded items to st (finish).
func finishInto(t *testing.T, e *relayEnv, st stock.Store, loaded map[string]int64) {
	t.Helper()
	e.settle()
	finish(t, e, e.r, stock.RunOptions{Store: st, Drain: time.Second, Relay: relay(), Reconcile: &stock.ReconcileOptions{Interval: -1}}, keys(loaded))
}

// stuckStore is a requestStore on mem whose calls block, ignoring their context, until the gate
// it returns is released (at the latest when t ends).
func stuckStore(t *testing.T, mem *memstore.Store) (*requestStore, *gate) {
	g := newGate()
	t.Cleanup(g.release)
	return &requestStore{base: mem, gate: g, stuck: func(context.Context, stock.Event) bool { return true }}, g
}

// stillRunning fails t unless Run's error is more than ctx's: it says a call is still running.
func stillRunning(t *testing.T, res result) {
	t.Helper()
	require.Error(t, res.err)
	assert.NotEqual(t, context.Canceled.Error(), res.err.Error(), "the error must say a call is still running")
}

// releaseThenFinish releases the blocked store calls (their events are repeats by then, or are
// applied now), lets them return, has a second Run deliver the rest (finishInto) and checks the
// store against the sale.
func releaseThenFinish(t *testing.T, e *relayEnv, g *gate, mem *memstore.Store, loaded map[string]int64, sale *sale) {
	t.Helper()
	g.release()
	time.Sleep(300 * time.Millisecond)
	finishInto(t, e, mem, loaded)
	sale.checkStore(t, e.r, mem, loaded)
}

// ctx ends before Run starts, so every event is delivered by the drain, and the Publisher blocks
// in the drain ignoring its context (PublishBatch, or Publish for a plain Publisher). Run must
// return within Drain (+ slack) with an error that says a call is still running; the events stay
// for a later Run, which delivers each one, and the store applies each acknowledged deduct exactly
// once. Variants: the blocked call ends with an error, or with success after Run returned (during
// the second Run); and the queue path (Run with only a Publisher), where the second Run publishes
// to a queue whose consumers apply the events through Consume, in reverse order and twice: every
// acknowledged deduct reaches the store once and the published sets empty.
func TestDrainStuckPublisher(t *testing.T) {
	testkit.ParallelOnMiniredis(t)
	for _, v := range []struct {
		name         string
		batch, queue bool
		after        error // what the blocked call answers once released
	}{
		{"batch/fails-late", true, false, errors.New("queue timed out")},
		{"batch/succeeds-late", true, false, nil},
		{"single/fails-late", false, false, errors.New("queue timed out")},
		{"single/succeeds-late", false, false, nil},
		{"queue-path/batch/fails-late", true, true, errors.New("queue timed out")},
	} {
		t.Run(v.name, func(t *testing.T) {
			relayEach(t, nil, func(t *testing.T, e *relayEnv) {
				ctx := context.Background()
				loaded := map[string]int64{"drain:pub~1": 50, "drain:pub~2": 50}
				store := memstore.New()
				load(t, e.r, store, loaded)
				sale := newSale()
				for i := range 30 {
					for sku := range loaded {
						sale.deduct(t, ctx, e.r, sku, fmt.Sprintf("o:%d~x", i), 1)
					}
				}
				gate := newGate()
				defer gate.release()
				// On the queue path only the drain's calls (whose context has a deadline) block.
				p := &relayPub{stuck: func(context.Context) bool { return true }, gate: gate, after: v.after}
				var runStore stock.Store = store
				if v.queue {
					p.stuck, runStore = hasDeadline, nil
				}
				publisher := func(p *relayPub) stock.Publisher {
					if v.batch {
						return batchPub{p}
					}
					return p
				}
				drain := 800 * time.Millisecond
				ch, ended := runEnded(e.r, stock.RunOptions{Store: runStore, Publisher: publisher(p), Drain: drain, Relay: relay(), Reconcile: &stock.ReconcileOptions{Interval: -1}})
				res := wait(t, ch, ended, drain+3*time.Second)
				stillRunning(t, res)
				assert.ErrorIs(t, res.err, context.Canceled)
				assert.Positive(t, gate.n.Load(), "the drain called the publisher")

				// The second Run; the blocked call ends while it runs (on the queue path, before:
				// the released call backs the item off).
				q := &queue{}
				p2 := &relayPub{}
				if v.queue {
					gate.release()
					time.Sleep(300 * time.Millisecond)
					p2.push = func(ev stock.Event) { q.put(ev) }
				}
				e.settle()
				go func() { time.Sleep(200 * time.Millisecond); gate.release() }()
				finish(t, e, e.r, stock.RunOptions{Store: runStore, Publisher: publisher(p2), Drain: time.Second, Relay: relay(), Reconcile: &stock.ReconcileOptions{Interval: -1}}, keys(loaded))
				// Consume in reverse order (the queue redelivers out of order), each twice.
				evs := q.take()
				for range 2 {
					for i := len(evs) - 1; i >= 0; i-- {
						assert.NoError(t, stock.Consume(ctx, e.r, store, evs[i]))
					}
				}
				sale.checkStore(t, e.r, store, loaded)
				for k := range sale.deducted {
					assert.GreaterOrEqual(t, p.count(k[0], k[1], stock.EventDeducted)+p2.count(k[0], k[1], stock.EventDeducted), 1, "deduct %s/%s published", k[0], k[1])
				}
				for sku := range loaded {
					rep, err := newReconciler(t, e.r, store, nil).Item(ctx, sku)
					require.NoError(t, err)
					assert.Zero(t, rep.Drift, "%s", rep)
					assert.Zero(t, rep.Published, "published set empty after every event was consumed: %s", rep)
				}
			})
		})
	}
}

// TestStoreBlocksOnlyInDrain: deducts run from several goroutines while Run delivers
// them; ctx ends in the middle; the store blocks only for calls made under the drain (their
// context has a deadline). Run returns within Drain; a second Run delivers the rest; every
// acknowledged deduct and restore is applied exactly once.
func TestStoreBlocksOnlyInDrain(t *testing.T) {
	testkit.ParallelOnMiniredis(t)
	relayEach(t, nil, func(t *testing.T, e *relayEnv) {
		ctx := context.Background()
		loaded := map[string]int64{"dr:a": 200, "dr:b~": 200, "dr::c": 200}
		mem := memstore.New()
		load(t, e.r, mem, loaded)
		gate := newGate()
		defer gate.release()
		st := &requestStore{base: mem, gate: gate,
			stuck: func(ctx context.Context, _ stock.Event) bool { return hasDeadline(ctx) },
			delay: func() time.Duration { return time.Duration(rand.IntN(2)) * time.Millisecond }}
		sale := newSale()
		runCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		drain := time.Second
		ch := run(runCtx, e.r, stock.RunOptions{Store: st, Drain: drain, Relay: relay(), Reconcile: &stock.ReconcileOptions{Interval: -1}})
		var wg sync.WaitGroup
		var ended atomic.Int64
		for w := range 6 {
			wg.Go(func() {
				for i := range 40 {
					sku := keys(loaded)[(w+i)%len(loaded)]
					id := fmt.Sprintf("w%d:%d", w, i)
					if sale.deduct(t, ctx, e.r, sku, id, int64(1+i%2)) && i%3 == 0 {
						sale.restore(t, ctx, e.r, sku, id)
					}
					if w == 0 && i == 20 {
						cancel()
						ended.Store(time.Now().UnixNano())
					}
				}
			})
		}
		wg.Wait()
		res := wait(t, ch, time.Unix(0, ended.Load()), drain+3*time.Second)
		assert.ErrorIs(t, res.err, context.Canceled)

		finishInto(t, e, &requestStore{base: mem}, loaded)
		releaseThenFinish(t, e, gate, mem, loaded, sale)
	})
}

// TestDrainValues: Drain negative delivers nothing more and returns within WithTimeout's
// bound even with a store that blocks; Drain zero is the default (5s): the drain delivers what
// is due; a tiny Drain returns at once. ctx ends before Run starts in each case, so only the
// drain can deliver.
func TestDrainValues(t *testing.T) {
	testkit.ParallelOnMiniredis(t)
	t.Run("negative", func(t *testing.T) {
		relayEach(t, []stock.Option{stock.WithTimeout(2 * time.Second)}, func(t *testing.T, e *relayEnv) {
			ctx := context.Background()
			loaded, mem, sale := soldOne(t, e, "neg:1", 10, "n", 5)
			ch, ended := runEnded(e.r, stock.RunOptions{Store: mem, Drain: -1, Relay: relay()})
			res := wait(t, ch, ended, 2*time.Second+3*time.Second)
			assert.ErrorIs(t, res.err, context.Canceled)
			pending, _, err := stockops.Pending(ctx, e.r, "neg:1")
			require.NoError(t, err)
			assert.EqualValues(t, 5, pending, "a negative Drain delivers nothing more")
			assert.Zero(t, mem.MaxApplications())
			finishInto(t, e, mem, loaded)
			sale.checkStore(t, e.r, mem, loaded)
		})
	})
	t.Run("negative-stuck-main-loop", func(t *testing.T) {
		relayEach(t, []stock.Option{stock.WithTimeout(2 * time.Second)}, func(t *testing.T, e *relayEnv) {
			ctx := context.Background()
			loaded, mem, sale := soldOne(t, e, "neg:2", 10, "", 0)
			st, gate := stuckStore(t, mem)
			runCtx, cancel := context.WithCancel(ctx)
			ch := run(runCtx, e.r, stock.RunOptions{Store: st, Drain: -time.Second, Relay: relay(), Reconcile: &stock.ReconcileOptions{Interval: -1}})
			sale.deduct(t, ctx, e.r, "neg:2", "only", 2)
			select {
			case <-gate.entered:
			case <-time.After(20 * time.Second):
				t.Fatal("the relay never called the store")
			}
			cancel()
			ended := time.Now()
			stillRunning(t, wait(t, ch, ended, 2*time.Second+3*time.Second))
			releaseThenFinish(t, e, gate, mem, loaded, sale)
		})
	})
	t.Run("zero-is-default", func(t *testing.T) {
		relayEach(t, nil, func(t *testing.T, e *relayEnv) {
			loaded, mem, sale := soldOne(t, e, "zero:1", 100, "z", 40)
			st := &requestStore{base: mem, delay: func() time.Duration { return 5 * time.Millisecond }}
			ch, ended := runEnded(e.r, stock.RunOptions{Store: st, Relay: &stock.RelayOptions{Batch: 4}})
			res := wait(t, ch, ended, 5*time.Second+3*time.Second)
			assert.ErrorIs(t, res.err, context.Canceled)
			// 40 events of 5ms each fit well in the default 5s drain.
			sale.checkStore(t, e.r, mem, loaded)
		})
	})
	t.Run("zero-stuck-waits-default", func(t *testing.T) {
		relayEach(t, nil, func(t *testing.T, e *relayEnv) {
			_, mem, _ := soldOne(t, e, "zero:2", 10, "z", 1)
			st, _ := stuckStore(t, mem)
			ch, ended := runEnded(e.r, stock.RunOptions{Store: st, Relay: relay()})
			res := wait(t, ch, ended, 5*time.Second+3*time.Second)
			stillRunning(t, res)
			assert.GreaterOrEqual(t, res.at.Sub(ended), 3*time.Second, "Drain 0 is the default 5s, not no drain")
		})
	})
	for _, d := range []time.Duration{time.Nanosecond, time.Millisecond} {
		t.Run(fmt.Sprintf("tiny-%v", d), func(t *testing.T) {
			relayEach(t, nil, func(t *testing.T, e *relayEnv) {
				loaded, mem, sale := soldOne(t, e, "tiny:1", 10, "t", 5)
				st, gate := stuckStore(t, mem)
				ch, ended := runEnded(e.r, stock.RunOptions{Store: st, Drain: d, Relay: relay()})
				wait(t, ch, ended, 3*time.Second)
				releaseThenFinish(t, e, gate, mem, loaded, sale)
			})
		})
	}
}

// TestQueuePath: Run with only a Publisher; the events are consumed through
// stock.Consume in a shuffled order, each twice, by concurrent consumers: the store ends equal
// to Redis, each event applied once; a pass sees no drift.
func TestQueuePath(t *testing.T) {
	each(t, []stock.Option{split(3)}, func(t *testing.T, e *requestEnv) {
		ctx, cancel := context.WithCancel(context.Background())
		store := memstore.New()
		const sku = "queue"
		require.NoError(t, store.Load(ctx, sku, 40))
		require.NoError(t, e.r.Load(ctx, sku, 40))
		pub := &queue{}
		done := make(chan error, 1)
		go func() {
			done <- e.r.Run(ctx, stock.RunOptions{Publisher: pub, Relay: &stock.RelayOptions{Poll: 20 * time.Millisecond}})
		}()
		acked := runTraffic(t, e.r, sku, 5, 16)
		require.Eventually(t, func() bool {
			p, _, err := stockops.Pending(context.Background(), e.r, sku)
			return err == nil && p == 0
		}, 30*time.Second, 50*time.Millisecond)
		cancel()
		<-done
		evs := pub.take()
		for _, ev := range evs {
			assert.Equal(t, sku, ev.SKU, "events name the item, not its bucket")
		}
		// A pass while nothing is consumed yet sees the sales in flight: no drift.
		reconcile(t, e.r, store, sku)

		queue := append(slices.Clone(evs), evs...)
		rand.New(rand.NewPCG(7, 7)).Shuffle(len(queue), func(i, j int) { queue[i], queue[j] = queue[j], queue[i] })
		_, heldBack := consumeRedelivering(t, e, store, queue, 4)
		t.Logf("%d events, %d held back once", len(evs), heldBack)
		checkStore(t, e.r, store, sku, acked)
		reconcile(t, e.r, store, sku)
	})
}

// TestClientKillMidBatch: connections killed while claims and takes are in flight, then
// every unanswered request retried with Retry: exactly once, and the counters agree.
func TestClientKillMidBatch(t *testing.T) {
	lifecycleEach(t, []stock.Option{lifecycleSplit(3), stock.WithCoalescing(1)}, func(t *testing.T, e *env) {
		if !e.real {
			t.Skip("CLIENT KILL needs a real server")
		}
		ctx := context.Background()
		sku := sku("ck")
		const S, ids = 120, 240
		require.NoError(t, e.r.Load(ctx, sku, S))
		killer := func() {
			for _, node := range e.c.Nodes() {
				node.Do(ctx, node.B().Arbitrary("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Build())
			}
		}
		res := make([]error, ids)
		var wg sync.WaitGroup
		stop := make(chan struct{})
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(3 * time.Millisecond):
					killer()
				}
			}
		}()
		for i := range ids {
			wg.Go(func() {
				_, res[i] = e.r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprint("k", i), User: fmt.Sprint("u", i), Qty: 1})
			})
		}
		wg.Wait()
		close(stop)
		taken := 0
		unknown := 0
		for i := range ids {
			err := res[i]
			for try := 0; err != nil && !errors.Is(err, stock.ErrSoldOut); try++ {
				unknown++
				require.Less(t, try, 20, "%v", err)
				_, err = e.r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprint("k", i), User: fmt.Sprint("u", i), Qty: 1, Retry: true})
				res[i] = err
			}
			if err == nil {
				taken++
			}
		}
		t.Logf("%d retries", unknown)
		l := testkit.Levels(t, e.r, sku)
		require.Equal(t, int64(taken), l.Sold)
		require.Equal(t, int64(S), l.Sold)
		for i := range ids {
			rc, err := e.r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprint("k", i), User: fmt.Sprint("u", i), Qty: 1, Retry: true})
			if res[i] == nil {
				require.NoError(t, err)
				require.True(t, rc.Replayed)
			} else {
				require.Error(t, err)
			}
		}
	})
}

// TestRelayInterleaved: a relay pass (Batch 1) after every round of activity, and a new
// relay (a restart) every other round; then drained.
func TestRelayInterleaved(t *testing.T) {
	splitEach(t, []stock.Option{split(4)}, func(t *testing.T, e *requestEnv) {
		ctx := context.Background()
		splitSeeds(t, e, "inter", 3, 5, func(seed uint64, sku string, store *memstore.Store) {
			rl := splitRelay(t, e, store, &stock.RelayOptions{Batch: 1, Lease: time.Second})
			refused := 0
			sold := sales(t, e, sku, seed+10, 5, func(round int) {
				if round%2 == 1 {
					rl = splitRelay(t, e, store, &stock.RelayOptions{Batch: 1, Lease: time.Second})
				}
				for range 1 + round {
					st, err := rl.Once(ctx)
					require.NoError(t, err)
					refused += st.Refused
				}
			})
			_, r2 := splitDrain(t, e, sku, 400, rl)
			assert.Zero(t, refused+r2, "the relay counted refusals")
			splitCheck(t, e, store, sku, sold)
		})
	})
}

// TestQueueRedelivered: the queue path. A relay with no Store publishes; the events are
// consumed through Consume in a shuffled order, redelivered while held back: never refused.
// Once by one consumer; once duplicated (every event delivered twice) to four consumers
// applying the queue concurrently.
func TestQueueRedelivered(t *testing.T) {
	testkit.ParallelOnMiniredis(t)
	for _, tc := range []struct {
		name      string
		buckets   int
		prefix    string
		seeds     uint64
		load      int64
		salesSeed uint64 // added to the seed
		maxQty    int
		batch     int
		twice     bool // every event queued twice
		shuffle   uint64
		consumers int
	}{
		{"shuffled_one_consumer", 3, "q", 4, 6, 20, 2, 2, false, 3, 1},
		{"shuffled_twice_four_concurrent_consumers", 4, "qc", 3, 8, 90, 4, 1, true, 9, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			splitEach(t, []stock.Option{split(tc.buckets)}, func(t *testing.T, e *requestEnv) {
				splitSeeds(t, e, tc.prefix, tc.seeds, tc.load, func(seed uint64, sku string, store *memstore.Store) {
					sold := salesQ(t, e, sku, seed+tc.salesSeed, 4, tc.maxQty, nil)
					evs, passes := publishAll(t, e, sku, tc.batch)
					queue := slices.Clone(evs)
					if tc.twice {
						queue = append(queue, evs...)
					}
					rand.New(rand.NewPCG(seed, tc.shuffle)).Shuffle(len(queue), func(i, j int) { queue[i], queue[j] = queue[j], queue[i] })
					rounds, held := consumeRedelivering(t, e, store, queue, tc.consumers)
					t.Logf("%s: %d events, %d relay passes, %d consume rounds, %d held back", sku, len(evs), passes, rounds, held)
					splitCheck(t, e, store, sku, sold)
				})
			})
		})
	}
}

// TestPassThrough: large sales, often refused after their bucket pulled units from its
// siblings, so units pass on through buckets that write no event of their own; several relays
// with Batch 1. No acknowledged sale refused.
func TestPassThrough(t *testing.T) {
	testkit.ParallelOnMiniredis(t)
	splitEach(t, []stock.Option{split(5)}, func(t *testing.T, e *requestEnv) {
		splitSeeds(t, e, "pass", 6, 10, func(seed uint64, sku string, store *memstore.Store) {
			sold := salesQ(t, e, sku, seed+70, 5, 6, nil)
			rls := []*stockops.Relay{
				splitRelay(t, e, store, &stock.RelayOptions{Batch: 1}),
				splitRelay(t, e, store, &stock.RelayOptions{Batch: 1, Items: []string{sku}}),
			}
			passes, refused := splitDrain(t, e, sku, 400, rls...)
			t.Logf("%s: %d sales, %d passes", sku, len(sold), passes)
			assert.Zero(t, refused, "the relay counted refusals")
			splitCheck(t, e, store, sku, sold)
		})
	})
}

// splitSeeds runs f for the seeds 0 to n-1, each on its own item prefix-seed, loaded with load
// units in the Reserver and in a new memstore.
func splitSeeds(t *testing.T, e *requestEnv, prefix string, n uint64, load int64, f func(seed uint64, sku string, store *memstore.Store)) {
	t.Helper()
	ctx := context.Background()
	for seed := range n {
		sku := fmt.Sprintf("%s-%d", prefix, seed)
		store := memstore.New()
		require.NoError(t, store.Load(ctx, sku, load))
		require.NoError(t, e.r.Load(ctx, sku, load))
		f(seed, sku, store)
	}
}

// publishAll drains sku through a relay with no Store (Batch batch) whose publisher keeps
// every event: it returns the events in the order published and the relay's passes.
func publishAll(t *testing.T, e *requestEnv, sku string, batch int) (evs []stock.Event, passes int) {
	t.Helper()
	q := &queue{}
	rl := newRelay(t, e.r, nil, q, &stock.RelayOptions{Batch: batch})
	passes, _ = splitDrain(t, e, sku, 400, rl)
	return q.take(), passes
}

// consumeRedelivering applies queue through Consume with consumers concurrent consumers,
// round after round, redelivering in the next round what was held back: every other error
// fails, and so does a queue not applied within 200 rounds. It returns the rounds and the
// deliveries held back.
func consumeRedelivering(t *testing.T, e *requestEnv, store stock.Store, queue []stock.Event, consumers int) (rounds, held int) {
	t.Helper()
	ctx := context.Background()
	for ; len(queue) > 0; rounds++ {
		require.Less(t, rounds, 200, "events held back for ever: %d", len(queue))
		var next atomic.Int64
		var failed atomic.Bool
		var mu sync.Mutex
		var again []stock.Event
		var wg sync.WaitGroup
		for range consumers {
			wg.Go(func() {
				for {
					i := int(next.Add(1)) - 1
					if i >= len(queue) {
						return
					}
					err := stock.Consume(ctx, e.r, store, queue[i])
					if errors.Is(err, stock.ErrHeldBack) {
						mu.Lock()
						again = append(again, queue[i])
						mu.Unlock()
						continue
					}
					if !assert.NoError(t, err, "%+v", queue[i]) {
						failed.Store(true)
					}
				}
			})
		}
		wg.Wait()
		if failed.Load() {
			t.FailNow()
		}
		held += len(again)
		queue = again
	}
	return rounds, held
}

// dyingStore is a Store whose relay dies on its k-th Apply: the call's context is
// cancelled (the relay's Run stops) and the event is not applied.
type dyingStore struct {
	*memstore.Store
	n      atomic.Int64
	k      int64
	cancel context.CancelFunc
}

func (s *dyingStore) Apply(ctx context.Context, ev stock.Event) error {
	if s.n.Add(1) == s.k {
		s.cancel()
		return context.Canceled
	}
	return s.Store.Apply(ctx, ev)
}

// TestRelayDiesMidway: a relay (Run) dies on its k-th Store call, for k in turn, leaving
// its lease; a new relay takes over after the lease: everything is delivered, nothing refused.
func TestRelayDiesMidway(t *testing.T) {
	testkit.ParallelOnMiniredis(t)
	splitEach(t, []stock.Option{split(3)}, func(t *testing.T, e *requestEnv) {
		ctx := context.Background()
		splitSeeds(t, e, "dies", 12, 6, func(seed uint64, sku string, mem *memstore.Store) {
			k := int64(seed) + 1
			sold := sales(t, e, sku, uint64(100+k), 3, nil)
			rctx, cancel := context.WithCancel(ctx)
			ds := &dyingStore{Store: mem, k: k, cancel: cancel}
			rl := newRelay(t, e.r, ds, nil, &stock.RelayOptions{Batch: 2, Lease: 200 * time.Millisecond, Items: []string{sku}})
			for rctx.Err() == nil {
				if drained(t, e, sku) {
					break
				}
				_, _ = rl.Once(rctx)
			}
			cancel()
			e.advance(300 * time.Millisecond)
			rl2 := splitRelay(t, e, mem, &stock.RelayOptions{Batch: 2, Lease: 200 * time.Millisecond})
			passes := 0
			for ; passes < 200 && !drained(t, e, sku); passes++ {
				st, err := rl2.Once(ctx)
				require.NoError(t, err)
				assert.Zero(t, st.Refused, "k=%d: the relay counted refusals", k)
				e.advance(50 * time.Millisecond)
			}
			require.True(t, drained(t, e, sku), "k=%d: not drained", k)
			splitCheck(t, e, mem, sku, sold)
		})
	})
}

// TestDurablePathSQL: deducts, restores and a restock go through the relay into a real SQL
// store; the store ends equal to Redis, each id applied once, refusals given back.
func TestDurablePathSQL(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		eachStore(t, c, "dur-", true, func(t *testing.T, r *stock.Reserver, store loadingStore, sku string) {
			ctx := context.Background()
			require.NoError(t, r.Load(ctx, sku, 100))
			require.NoError(t, store.Load(ctx, sku, 95)) // 5 units of drift: refusals
			for i := range 100 {
				require.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprint("o", i), Qty: 1})))
				if i%10 == 0 {
					require.NoError(t, testkit.Err(r.Restore(ctx, sku, fmt.Sprint("o", i))))
				}
			}
			rl := newRelay(t, r, store, nil, &stock.RelayOptions{Batch: 32})
			st := testkit.Drain(t, rl)
			assert.Zero(t, st.Retried)
			// 90 sold in Redis, the store had 95: no refusal. Now drift the other way.
			avail, err := testkit.Available(r.Levels(ctx, sku))
			require.NoError(t, err)
			rem := remaining(t, store, sku)
			assert.Equal(t, int64(10), avail)
			assert.Equal(t, int64(5), rem)
			for i := 100; i < 110; i++ {
				require.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprint("o", i), Qty: 1})))
			}
			st = testkit.Drain(t, rl)
			assert.Equal(t, 5, st.Refused)
			rem, _ = store.Remaining(ctx, sku)
			assert.Zero(t, rem)
			avail, _ = testkit.Available(r.Levels(ctx, sku))
			assert.Equal(t, int64(5), avail, "refused units given back once")
			// The reconciler closes the remaining drift.
			rec := newReconciler(t, r, store, &stock.ReconcileOptions{Items: []string{sku}})
			reps, err := rec.Once(ctx)
			require.NoError(t, err)
			assert.Equal(t, int64(-5), reps[0].Adjusted)
			avail, _ = testkit.Available(r.Levels(ctx, sku))
			assert.Equal(t, rem, avail)
			recs, err := store.Records(ctx, sku, []string{"o0", "o1", "o105"})
			require.NoError(t, err)
			assert.Equal(t, stock.StateRestored, recs["o0"].Status)
			assert.Equal(t, stock.StateApplied, recs["o1"].Status)
		})
	})
}

// TestConsumeInOrderAfterRedelivery: one unit; deduct a, restore a, deduct b. The consumer
// applies D(a) and dies before R(a); the queue hands its successor D(b) before the redelivered
// R(a). Consume must not apply D(b) before R(a) (the store would refuse a valid sale and Consume
// give b's stock back): it applies R(a), read from Redis, first.
func TestConsumeInOrderAfterRedelivery(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		eachStore(t, c, "order-", false, func(t *testing.T, r *stock.Reserver, store loadingStore, sku string) {
			ctx := context.Background()
			loadBoth(t, r, store, sku, 1)
			require.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: sku, ID: "a", Qty: 1})))
			require.NoError(t, testkit.Err(r.Restore(ctx, sku, "a")))
			require.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: sku, ID: "b", Qty: 1})))
			q, _, msgs := publishToQueue(t, r)
			require.Len(t, msgs, 3)
			da, ra, db := msgs[0], msgs[1], msgs[2]
			require.Equal(t, stock.EventDeducted, da.Type)
			require.Equal(t, stock.EventRestored, ra.Type)
			require.Equal(t, "b", db.ID)

			require.NoError(t, stock.Consume(ctx, r, store, da)) // acked; the consumer dies
			consumeAll(t, r, store, []stock.Event{db, ra, da})

			recs, err := store.Records(ctx, sku, []string{"a", "b"})
			require.NoError(t, err)
			assert.Equal(t, stock.StateRestored, recs["a"].Status)
			assert.Equal(t, stock.StateApplied, recs["b"].Status, "b's valid sale is applied, not refused")
			e, err := r.Ledger(ctx, sku, "b")
			require.NoError(t, err)
			assert.Equal(t, stock.StateApplied, e.State, "b's stock is not given back")
			assert.Zero(t, remaining(t, store, sku))
			assert.Zero(t, testkit.Levels(t, r, sku).Available)
			assert.Empty(t, q.take(), "no refusal event")
		})
	})
}

// TestConsumeCatchesUp: handed an event whose item has earlier events not applied yet, Consume
// applies those first, in sequence, from Redis; it answers ErrHeldBack, changing nothing,
// while a reconcile pass holds the item, or when an earlier event cannot be read from Redis.
// Events carry increasing sequences.
func TestConsumeCatchesUp(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r, store, q, rl, msgs := queuedSalesOfA(t, c, 7, 3)
		var err error
		for i := 1; i < len(msgs); i++ {
			assert.Greater(t, msgs[i].Seq, msgs[i-1].Seq)
		}
		// A reconcile pass holds the item: even the first event waits, and nothing changes.
		require.NoError(t, c.Do(ctx, c.B().Set().Key("stock:{A}:rl").Value("reconcile-test").Build()).Error())
		require.ErrorIs(t, stock.Consume(ctx, r, store, msgs[0]), stock.ErrHeldBack)
		require.ErrorIs(t, stock.Consume(ctx, r, store, msgs[2]), stock.ErrHeldBack)
		rem, _ := store.Remaining(ctx, "A")
		assert.Equal(t, int64(7), rem, "nothing applied")
		// A relay's lease does not hold consumers back.
		require.NoError(t, c.Do(ctx, c.B().Set().Key("stock:{A}:rl").Value("relay-test").Build()).Error())
		require.NoError(t, stock.Consume(ctx, r, store, msgs[0]))
		require.NoError(t, c.Do(ctx, c.B().Del().Key("stock:{A}:rl").Build()).Error())

		// The third before the second: the second is applied first, from Redis.
		require.NoError(t, stock.Consume(ctx, r, store, msgs[2]))
		recs, err := store.Records(ctx, "A", []string{"o1", "o2"})
		require.NoError(t, err)
		assert.Len(t, recs, 2)
		require.NoError(t, stock.Consume(ctx, r, store, msgs[1]), "a repeat is harmless")
		require.NoError(t, stock.Consume(ctx, r, store, msgs[0]), "a repeat is harmless")
		rem, _ = store.Remaining(ctx, "A")
		assert.Equal(t, int64(4), rem)
		assert.Equal(t, 1, store.MaxApplications())

		// An earlier event whose entry Redis lost cannot be applied from Redis: wait for it.
		for i := 3; i < 5; i++ {
			require.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: "A", ID: fmt.Sprint("o", i), Qty: 1})))
		}
		testkit.Drain(t, rl)
		more := q.take()
		require.Len(t, more, 2)
		require.NoError(t, c.Do(ctx, c.B().Hdel().Key("stock:{A}:l").Field("o3").Build()).Error())
		require.ErrorIs(t, stock.Consume(ctx, r, store, more[1]), stock.ErrHeldBack)
		require.NoError(t, stock.Consume(ctx, r, store, more[0]), "its own message carries it")
		require.NoError(t, stock.Consume(ctx, r, store, more[1]))

		// Held, cancelled and expired events are not kept after publishing and hold nothing back.
		require.NoError(t, testkit.Err(r.Hold(ctx, stock.Request{SKU: "A", ID: "h", Qty: 1}, time.Minute)))
		require.NoError(t, testkit.Err(r.Cancel(ctx, "A", "h")))
		testkit.Drain(t, rl)
		held := q.take()
		require.Len(t, held, 2)
		for _, ev := range held {
			require.NoError(t, stock.Consume(ctx, r, store, ev))
		}
		reps, err := mustReconciler(t, r, store).Once(ctx)
		require.NoError(t, err)
		assert.Zero(t, reps[0].Published, reps[0].String())
		assert.Zero(t, reps[0].Drift, reps[0].String())
	})
}

// queuedSalesOfA loads the item "A" with load units in a new Reserver on c and in a new
// memstore, sells n units (ids o0 to o<n-1>) and drains them through a relay with no Store into a
// queue. It returns those and the n events published.
func queuedSalesOfA(t *testing.T, c rueidis.Client, load int64, n int) (*stock.Reserver, *memstore.Store, *queue, *stockops.Relay, []stock.Event) {
	t.Helper()
	r, store := withStore(t, c, load, []string{"A"})
	deductEach(t, r, stock.Request{SKU: "A", Qty: 1}, numbered("o", n)...)
	q, rl, msgs := publishToQueue(t, r)
	require.Len(t, msgs, n)
	return r, store, q, rl, msgs
}

// mustReconciler is a reconciler of the item "A" (queuedSalesOfA's).
func mustReconciler(t *testing.T, r *stock.Reserver, store stock.Store) *stockops.Reconciler {
	t.Helper()
	return newReconciler(t, r, store, &stock.ReconcileOptions{Items: []string{"A"}})
}

// TestConsumeInOrderBehindManyPublished: an item has more earlier events not applied yet than
// Consume reads at once (256 from each set): 300 published (the consumers are behind) and a
// few more still in the outbox, because the relay is publishing their batch when a consumer
// gets its last event. That Consume applies the item's first 256 events and holds its own back;
// it never applies the batch's events ahead of the published ones it did not read. Redelivered,
// every event reaches the store once, in sequence.
func TestConsumeInOrderBehindManyPublished(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := testkit.NewReserver(t, c)
		store := &firstOrderStore{Store: memstore.New(), seen: map[string]bool{}}
		const published, batch = 300, 10
		loadBoth(t, r, store, "A", 1000)
		id := func(i int) string { return fmt.Sprintf("o%04d", i) }
		for i := range published {
			require.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: "A", ID: id(i), Qty: 1})))
		}
		q := &hookQueue{on: id(published + batch - 1)}
		rl := newRelay(t, r, nil, q, nil)
		testkit.Drain(t, rl)
		for i := published; i < published+batch; i++ {
			require.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: "A", ID: id(i), Qty: 1})))
		}
		var consumeErr error
		q.hook = func(ev stock.Event) { consumeErr = stock.Consume(ctx, r, store, ev) }
		testkit.Drain(t, rl)
		require.ErrorIs(t, consumeErr, stock.ErrHeldBack)
		inOrder := func(want int) {
			t.Helper()
			for i, got := range store.order {
				require.Equal(t, id(i), got, "the store's event %d (of %d applied; then %v)", i, len(store.order),
					store.order[i:min(len(store.order), i+4)])
			}
			require.Len(t, store.order, want)
		}
		inOrder(256)
		consumeAll(t, r, store, q.take())
		inOrder(published + batch)
		assert.Equal(t, 1, store.MaxApplications())
	})
}

// firstOrderStore records the ids of an item's events in the order they first reach the store.
type firstOrderStore struct {
	*memstore.Store
	mu    sync.Mutex
	seen  map[string]bool
	order []string
}

func (s *firstOrderStore) Apply(ctx context.Context, ev stock.Event) error {
	err := s.Store.Apply(ctx, ev)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && !s.seen[ev.ID] {
		s.seen[ev.ID] = true
		s.order = append(s.order, ev.ID)
	}
	return err
}

// hookQueue is a queue that runs hook on the message of id on as it is published: a waiting
// consumer gets it while the relay is still publishing its batch (the batch's events are in
// the outbox until the relay has published them all).
type hookQueue struct {
	queue
	on   string
	hook func(ev stock.Event)
}

func (q *hookQueue) Publish(ctx context.Context, ev stock.Event) error {
	if err := q.queue.Publish(ctx, ev); err != nil {
		return err
	}
	if ev.ID == q.on && q.hook != nil {
		q.hook(ev)
	}
	return nil
}

// TestConsumeDeadLettersInvalid: an event the store rejects as invalid is set aside in the
// dead-letter set by Consume, so it no longer holds back the item's later events.
func TestConsumeDeadLettersInvalid(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r, store, _, _, msgs := queuedSalesOfA(t, c, 5, 2)
		store.FailWith(func(ev stock.Event) error {
			if ev.ID == "o0" {
				return fmt.Errorf("bad row: %w", stock.ErrInvalid)
			}
			return nil
		})
		require.ErrorIs(t, stock.Consume(ctx, r, store, msgs[0]), stock.ErrInvalid)
		require.NoError(t, stock.Consume(ctx, r, store, msgs[1]), "not held back by a dead letter")
		_, dead, err := stockops.Pending(ctx, r, "A")
		require.NoError(t, err)
		assert.EqualValues(t, 1, dead)
		reps, err := mustReconciler(t, r, store).Once(ctx)
		require.NoError(t, err)
		assert.Zero(t, reps[0].Drift, "the dead letter is in flight: %s", reps[0])
		assert.Zero(t, reps[0].Adjusted)
		assert.NotEmpty(t, reps[0].NeedsHuman)
	})
}
