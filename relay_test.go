package stock_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
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

// recorder is a Publisher that records what it got, deduplicated, and can be made to fail.
type recorder struct {
	mu    sync.Mutex
	seen  map[string]int
	evs   []stock.Event
	down  atomic.Bool
	fails atomic.Int64
}

func newRecorder() *recorder { return &recorder{seen: map[string]int{}} }

func (p *recorder) Publish(_ context.Context, ev stock.Event) error {
	if p.down.Load() {
		p.fails.Add(1)
		return errors.New("publisher down")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	k := ev.SKU + "/" + ev.ID + "/" + string(ev.Type)
	if p.seen[k] == 0 {
		p.evs = append(p.evs, ev)
	}
	p.seen[k]++
	return nil
}

func (p *recorder) count(t stock.EventType) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, ev := range p.evs {
		if ev.Type == t {
			n++
		}
	}
	return n
}

// reserverAndStore returns a Reserver on c and a memstore, each with the items of skus loaded
// with their quantities (a test seeds drift with store.Set).
func reserverAndStore(t *testing.T, c rueidis.Client, skus map[string]int64) (*stock.Reserver, *memstore.Store) {
	t.Helper()
	r := newReserver(t, c)
	return r, loadBoth(t, r, skus)
}

// loadBoth loads the items of skus with their quantities through r and into a new memstore,
// which it returns.
func loadBoth(t *testing.T, r *stock.Reserver, skus map[string]int64) *memstore.Store {
	t.Helper()
	store := memstore.New()
	for sku, n := range skus {
		require.NoError(t, r.Load(context.Background(), sku, n))
		require.NoError(t, store.Load(context.Background(), sku, n))
	}
	return store
}

func TestRelayDeliversOnce(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r, store := reserverAndStore(t, c, map[string]int64{"A": 100, "B": 100})
		pub := newRecorder()
		for i := range 60 {
			sku := []string{"A", "B"}[i%2]
			must(t)(r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprint("o", i), Qty: 2}))
		}
		for i := 0; i < 60; i += 6 {
			must(t)(r.Restore(ctx, []string{"A", "B"}[i%2], fmt.Sprint("o", i)))
		}
		must(t)(r.Restock(ctx, "A", "r1", 7))

		rl := newRelay(t, r, store, pub, &stock.RelayOptions{Batch: 16})
		st := drain(t, rl)
		assert.Equal(t, 60+10+1, st.Delivered)
		for _, sku := range []string{"A", "B"} {
			storeAgrees(t, r, store, sku)
			assert.Zero(t, outboxLen(t, c, sku))
		}
		assert.Equal(t, 1, store.MaxApplications())
		assert.Equal(t, 60, pub.count(stock.EventDeducted))
		assert.Equal(t, 10, pub.count(stock.EventRestored))
		assert.Equal(t, 1, pub.count(stock.EventRestocked))
		e := entry(t, r, "A", "o2")
		assert.Equal(t, stock.StateApplied, e.State)
		e = entry(t, r, "A", "o0")
		assert.Equal(t, stock.StateRestored, e.State)
	})
}

func TestRelayStoreRefusal(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r, store := reserverAndStore(t, c, map[string]int64{"A": 20})
		store.Set("A", 12) // seeded drift: the database has less
		pub := newRecorder()
		for i := range 20 {
			must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: fmt.Sprint("o", i), User: "u", Qty: 1}))
		}
		rl := newRelay(t, r, store, pub, &stock.RelayOptions{Batch: 5})
		st := drain(t, rl)
		assert.Equal(t, 8, st.Refused)
		// Refused entries were given back in Redis exactly once; a second pass changes nothing.
		drain(t, rl)
		l, entries := checkLedger(t, r, "A", 20)
		assert.Equal(t, int64(8), l.Available)
		assert.Equal(t, int64(12), l.Sold)
		refused := 0
		for _, e := range entries {
			if e.State == stock.StateRefused {
				refused++
			}
		}
		assert.Equal(t, 8, refused)
		assert.Equal(t, 8, pub.count(stock.EventRefused))
		assert.Equal(t, 12, pub.count(stock.EventDeducted), "refused deducts are published as refusals only")
		rem, _ := store.Remaining(ctx, "A")
		assert.Zero(t, rem)
		assert.Equal(t, 1, store.MaxApplications())
		// A refused id is done: it cannot take stock again.
		for id, e := range entries {
			if e.State == stock.StateRefused {
				mustFail(t, stock.ErrRestored, id)(r.Deduct(ctx, stock.Request{SKU: "A", ID: id, User: "u", Qty: 1}))
				break
			}
		}
	})
}

func TestRelayPublisherDown(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r, store := reserverAndStore(t, c, map[string]int64{"A": 50})
		pub := newRecorder()
		rl := newRelay(t, r, store, pub, &stock.RelayOptions{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
		pub.down.Store(true)
		deductEach(t, r, "A", 30)
		for range 3 {
			st, err := rl.Once(ctx)
			assert.Error(t, err)
			assert.Zero(t, st.Delivered)
			redistest.Sleep(c, 15*time.Millisecond)
		}
		assert.Positive(t, pub.fails.Load())
		assert.Equal(t, int64(30), outboxLen(t, c, "A"), "nothing is lost while the publisher is down")
		pub.down.Store(false)
		redistest.Sleep(c, 15*time.Millisecond)
		st := drain(t, rl)
		assert.Equal(t, 30, st.Delivered)
		assert.Positive(t, st.Redelive)
		assert.Equal(t, 30, pub.count(stock.EventDeducted))
		assert.Equal(t, 1, store.MaxApplications(), "the store saw retries but applied each id once")
		rem, _ := store.Remaining(ctx, "A")
		assert.Equal(t, int64(20), rem)
	})
}

// crashingPublisher ends the relay's goroutine (runtime.Goexit) at its n-th call, after the
// store applied the batch and before the ack: the relay "dies" holding its lease.
type crashingPublisher struct {
	inner *recorder
	n     atomic.Int64
	at    int64
}

func (p *crashingPublisher) Publish(ctx context.Context, ev stock.Event) error {
	if p.n.Add(1) == p.at {
		runtime.Goexit()
	}
	return p.inner.Publish(ctx, ev)
}

func TestRelayCrashRedelivers(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r, store := reserverAndStore(t, c, map[string]int64{"A": 200})
		rec := newRecorder()
		deductEach(t, r, "A", 100)
		// Crash points: mid-batch after the store applied, at several positions.
		for _, at := range []int64{1, 7, 16} {
			pub := &crashingPublisher{inner: rec, at: at}
			crashy := newRelay(t, r, store, pub, &stock.RelayOptions{Batch: 16, Lease: 50 * time.Millisecond})
			done := make(chan struct{})
			go func() { defer close(done); _, _ = crashy.Once(ctx) }()
			<-done
		}
		redistest.Sleep(c, 60*time.Millisecond) // the dead relays' leases run out
		rl := newRelay(t, r, store, rec, &stock.RelayOptions{Batch: 16})
		st := drain(t, rl)
		assert.Positive(t, st.Redelive, "leased events of the dead relays were delivered again")
		assert.Equal(t, 1, store.MaxApplications())
		rem, _ := store.Remaining(ctx, "A")
		assert.Equal(t, int64(100), rem)
		assert.Equal(t, 100, rec.count(stock.EventDeducted))
		assert.Zero(t, outboxLen(t, c, "A"))
	})
}

func TestRelaysConcurrent(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r, store := reserverAndStore(t, c, map[string]int64{"A": 300})
		pub := newRecorder()
		ctx2, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for range 3 {
			rl := newRelay(t, r, store, pub, &stock.RelayOptions{Batch: 8, Poll: time.Millisecond})
			wg.Go(func() { _ = rl.Run(ctx2) })
		}
		var dw sync.WaitGroup
		for g := range 8 {
			dw.Go(func() {
				for i := range 40 {
					id := fmt.Sprint("g", g, "-", i)
					_, err := r.Deduct(ctx, stock.Request{SKU: "A", ID: id, Qty: 1})
					assert.NoError(t, err)
					if i%5 == 0 {
						_, err = r.Restore(ctx, "A", id)
						assert.NoError(t, err)
					}
				}
			})
		}
		dw.Wait()
		require.Eventually(t, func() bool { return outboxLen(t, c, "A") == 0 }, 10*time.Second, 5*time.Millisecond)
		cancel()
		wg.Wait()
		avail, _ := available(r.Levels(ctx, "A"))
		rem, _ := store.Remaining(ctx, "A")
		assert.Equal(t, avail, rem)
		assert.Equal(t, int64(300-320+64), rem)
		assert.Equal(t, 1, store.MaxApplications())
	})
}

func TestConsumeGivesBackRefusals(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r, store := reserverAndStore(t, c, map[string]int64{"A": 5})
		store.Set("A", 3)
		var evs []stock.Event
		pub := stock.PublisherFunc(func(_ context.Context, ev stock.Event) error { evs = append(evs, ev); return nil })
		rl := newRelay(t, r, nil, pub, nil)
		deductEach(t, r, "A", 5)
		drain(t, rl)
		require.Len(t, evs, 5)
		// The consumer side: each message delivered twice, as queues do.
		for _, ev := range append(evs, evs...) {
			require.NoError(t, stock.Consume(ctx, r, store, ev))
		}
		avail, _ := available(r.Levels(ctx, "A"))
		assert.Equal(t, int64(2), avail, "two refusals given back once each")
		rem, _ := store.Remaining(ctx, "A")
		assert.Zero(t, rem)
		evs = nil
		drain(t, rl)
		assert.Len(t, evs, 2)
		for _, ev := range evs {
			assert.Equal(t, stock.EventRefused, ev.Type)
			require.NoError(t, stock.Consume(ctx, r, store, ev))
		}
		assert.Equal(t, 1, store.MaxApplications())
	})
}

// TestRelayKeepsOrder: at the edge of the stock, a restore must reach the store before the
// deduct that bought the unit it gave back, or the store refuses a sale Redis made correctly.
func TestRelayKeepsOrder(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r, store := reserverAndStore(t, c, map[string]int64{"A": 1})
		// Ids chosen so that sorting by name would put each deduct before the restore it follows.
		for i := range 50 {
			id := fmt.Sprintf("z%03d", 50-i)
			must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: id, Qty: 1}))
			if i < 49 {
				must(t)(r.Restore(ctx, "A", id))
			}
		}
		rl := newRelay(t, r, store, nil, &stock.RelayOptions{Batch: 7})
		st := drain(t, rl)
		assert.Zero(t, st.Refused, "no false refusal")
		rem, _ := store.Remaining(ctx, "A")
		assert.Zero(t, rem)
		assert.Equal(t, stock.Levels{Available: 0, Sold: 1, Loaded: 1}, levels(t, r, "A"))
	})
}

// TestRelayDeadLetters: an event the store can never apply (ErrInvalid) is set aside, does not
// hold back the item's later events, is not requeued by the reconciler, and is reported.
func TestRelayDeadLetters(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r, store := reserverAndStore(t, c, map[string]int64{"A": 10})
		store.FailWith(func(ev stock.Event) error {
			if ev.ID == "bad" {
				return fmt.Errorf("%w: the store cannot take this one", stock.ErrInvalid)
			}
			return nil
		})
		for _, id := range []string{"o1", "bad", "o2"} {
			must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: id, Qty: 1}))
		}
		rl := newRelay(t, r, store, nil, nil)
		st := drain(t, rl)
		assert.Equal(t, 1, st.DeadLettered)
		assert.Equal(t, 2, st.Delivered)
		assert.Zero(t, outboxLen(t, c, "A"))
		rec := newReconciler(t, r, store, nil)
		reps, err := rec.Once(ctx)
		require.NoError(t, err)
		rp := reps[0]
		assert.Equal(t, 1, rp.DeadLetters)
		assert.Zero(t, rp.Drift, "a dead letter is in flight, not drift")
		assert.Zero(t, rp.Requeued)
		assert.Contains(t, rp.NeedsHuman, "dead-letter")
		assert.Zero(t, outboxLen(t, c, "A"))
	})
}

func TestPending(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r, store := reserverAndStore(t, c, map[string]int64{"A": 5})
		deductEach(t, r, "A", 3)
		p, d, err := stockops.Pending(ctx, r, "A")
		require.NoError(t, err)
		assert.Equal(t, [2]int64{3, 0}, [2]int64{p, d})
		rl := newRelay(t, r, store, nil, nil)
		drain(t, rl)
		p, d, err = stockops.Pending(ctx, r, "A")
		require.NoError(t, err)
		assert.Equal(t, [2]int64{0, 0}, [2]int64{p, d})
	})
}
