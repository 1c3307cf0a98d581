package stock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
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
)

func TestRelayDeliversOnce(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
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
		assertState(t, r, "A", "o0", stock.StateRestored)
	})
}

func TestRelayStoreRefusal(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
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
		assert.Zero(t, remaining(t, store, "A"))
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
		r, store := reserverAndStore(t, c, map[string]int64{"A": 50})
		pub := newRecorder()
		rl := newRelay(t, r, store, pub, &stock.RelayOptions{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
		pub.down.Store(true)
		testkit.Sell(t, r, "A", "o", "", 30)
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
		assert.Equal(t, int64(20), remaining(t, store, "A"))
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
		r, store := reserverAndStore(t, c, map[string]int64{"A": 200})
		rec := newRecorder()
		testkit.Sell(t, r, "A", "o", "", 100)
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
		assert.Equal(t, int64(100), remaining(t, store, "A"))
		assert.Equal(t, 100, rec.count(stock.EventDeducted))
		assert.Zero(t, outboxLen(t, c, "A"))
	})
}

func TestRelaysConcurrent(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
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
					assert.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: "A", ID: id, Qty: 1})))
					if i%5 == 0 {
						assert.NoError(t, testkit.Err(r.Restore(ctx, "A", id)))
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
		r, store := reserverAndStore(t, c, map[string]int64{"A": 5})
		store.Set("A", 3)
		var evs []stock.Event
		pub := stock.PublisherFunc(func(_ context.Context, ev stock.Event) error { evs = append(evs, ev); return nil })
		rl := newRelay(t, r, nil, pub, nil)
		testkit.Sell(t, r, "A", "o", "", 5)
		drain(t, rl)
		require.Len(t, evs, 5)
		// The consumer side: each message delivered twice, as queues do.
		for _, ev := range append(evs, evs...) {
			require.NoError(t, stock.Consume(ctx, r, store, ev))
		}
		assert.Equal(t, int64(2), levels(t, r, "A").Available, "two refusals given back once each")
		assert.Zero(t, remaining(t, store, "A"))
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
		assert.Zero(t, remaining(t, store, "A"))
		assert.Equal(t, stock.Levels{Available: 0, Sold: 1, Loaded: 1}, levels(t, r, "A"))
	})
}

// TestRelayDeadLetters: an event the store can never apply (ErrInvalid) is set aside, does not
// hold back the item's later events, is not requeued by the reconciler, and is reported.
func TestRelayDeadLetters(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
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
		r, store := reserverAndStore(t, c, map[string]int64{"A": 5})
		testkit.Sell(t, r, "A", "o", "", 3)
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

// batchRecorder is a BatchPublisher that records every call and every event it accepted, in
// order, and fails the events for which fail says so.
type batchRecorder struct {
	mu      sync.Mutex
	batches [][]stock.Event // the events of each PublishBatch call
	singles []stock.Event   // the events of each Publish call
	got     []stock.Event   // every event accepted, in order
	fail    func(ev stock.Event) bool
}

func (p *batchRecorder) one(ev stock.Event) error {
	if p.fail != nil && p.fail(ev) {
		return errors.New("broker refused " + ev.ID)
	}
	p.got = append(p.got, ev)
	return nil
}

func (p *batchRecorder) Publish(_ context.Context, ev stock.Event) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.singles = append(p.singles, ev)
	return p.one(ev)
}

// PublishBatch stops at the first failure, as the BatchPublisher doc asks.
func (p *batchRecorder) PublishBatch(_ context.Context, evs []stock.Event) []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.batches = append(p.batches, append([]stock.Event(nil), evs...))
	errs := make([]error, len(evs))
	for i, ev := range evs {
		if errs[i] = p.one(ev); errs[i] != nil {
			for j := i + 1; j < len(evs); j++ {
				errs[j] = errors.New("not sent after an earlier failure")
			}
			break
		}
	}
	return errs
}

var _ stock.BatchPublisher = (*batchRecorder)(nil)

// TestRelayUsesBatchPublisher: the relay hands an item's claimed events to PublishBatch in one
// call, in sequence, and Publish is not called.
func TestRelayUsesBatchPublisher(t *testing.T) {
	eachReserver(t, nil, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		require.NoError(t, r.Load(ctx, "A", 100))
		pub := &batchRecorder{}
		rl := newRelay(t, r, nil, pub, &stock.RelayOptions{Batch: 16})
		testkit.Sell(t, r, "A", "o", "", 40)
		st := drain(t, rl)
		assert.Equal(t, 40, st.Delivered)
		assert.Empty(t, pub.singles, "Publish is not used for batches of several events")
		require.Len(t, pub.batches, 3, "40 events in batches of 16")
		assert.Len(t, pub.batches[0], 16)
		require.Len(t, pub.got, 40)
		for i, ev := range pub.got {
			assert.Equal(t, fmt.Sprint("o", i), ev.ID)
			if i > 0 {
				assert.Greater(t, ev.Seq, pub.got[i-1].Seq)
			}
		}
		// A single event goes through Publish.
		must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "last", Qty: 1}))
		drain(t, rl)
		require.Len(t, pub.singles, 1)
		assert.Equal(t, "last", pub.singles[0].ID)
	})
}

// TestRelayBatchFailureRetriesFromIt: an event of a batch fails once; the events before it
// are published once and not again, it is retried after the backoff, and the item's events
// reach the publisher in order. With a store, the store applied each event once.
func TestRelayBatchFailureRetriesFromIt(t *testing.T) {
	eachReserver(t, nil, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		store := loadBoth(t, r, map[string]int64{"A": 100})
		failed := false
		pub := &batchRecorder{fail: func(ev stock.Event) bool {
			if ev.ID == "o3" && !failed {
				failed = true
				return true
			}
			return false
		}}
		rl := newRelay(t, r, store, pub, &stock.RelayOptions{MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond})
		testkit.Sell(t, r, "A", "o", "", 6)
		st, err := rl.Once(ctx)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "broker refused o3")
		assert.Equal(t, 3, st.Delivered)
		assert.Equal(t, 3, st.Retried)
		assert.Equal(t, int64(3), outboxLen(t, c, "A"), "o3, o4, o5 wait")
		redistest.Sleep(c, 10*time.Millisecond)
		drain(t, rl)
		require.Len(t, pub.batches, 2)
		ids := func(evs []stock.Event) []string {
			var out []string
			for _, ev := range evs {
				out = append(out, ev.ID)
			}
			return out
		}
		assert.Equal(t, []string{"o0", "o1", "o2", "o3", "o4", "o5"}, ids(pub.batches[0]))
		assert.Equal(t, []string{"o3", "o4", "o5"}, ids(pub.batches[1]), "the retry starts at the failed event")
		assert.Equal(t, []string{"o0", "o1", "o2", "o3", "o4", "o5"}, ids(pub.got), "each event accepted once, in order")
		assert.Equal(t, 1, store.MaxApplications())
		assert.Equal(t, int64(94), remaining(t, store, "A"))
		assert.Zero(t, outboxLen(t, c, "A"))
	})
}

// TestRelayBatchPublisherWrongLength: a result of the wrong length fails the whole batch,
// which is delivered again.
func TestRelayBatchPublisherWrongLength(t *testing.T) {
	eachReserver(t, nil, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		require.NoError(t, r.Load(ctx, "A", 10))
		short := true
		bad := &shortBatch{batchRecorder: &batchRecorder{}, short: &short}
		rl := newRelay(t, r, nil, bad, &stock.RelayOptions{MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond})
		testkit.Sell(t, r, "A", "o", "", 3)
		_, err := rl.Once(ctx)
		require.ErrorContains(t, err, "2 results for 3 events")
		assert.Equal(t, int64(3), outboxLen(t, c, "A"))
		short = false
		redistest.Sleep(c, 10*time.Millisecond)
		st := drain(t, rl)
		assert.Equal(t, 3, st.Delivered)
	})
}

type shortBatch struct {
	*batchRecorder
	short *bool
}

func (s *shortBatch) PublishBatch(ctx context.Context, evs []stock.Event) []error {
	errs := s.batchRecorder.PublishBatch(ctx, evs)
	if *s.short {
		return errs[:len(errs)-1]
	}
	return errs
}

const notLoadedLog = "the store does not know the item"

// TestStoreWithoutTheItemKeepsTheSale follows the README's Run path literally: the item is
// loaded in Redis and not in the store. The acknowledged sales are never given back (no
// refusal, no dead letter): they wait in the outbox, counted as NotLoaded, said once at Error
// level however many passes retry them, and reach the store once the item is loaded there.
func TestStoreWithoutTheItemKeepsTheSale(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		logs := &logRecords{}
		r := newReserver(t, c, stock.WithLogger(slog.New(logs)))
		require.NoError(t, r.Load(ctx, "A", 5))
		for _, id := range []string{"o1", "o2"} {
			must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: id, User: "u", Qty: 1}))
		}
		store := memstore.New() // sqlstore.New + Migrate: no row for A
		rl := newRelay(t, r, store, nil, &stock.RelayOptions{MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond})

		var all stockops.RelayStats
		for tries := 0; tries < 3; {
			st, err := rl.Once(ctx)
			if st.Claimed == 0 {
				require.NoError(t, err)
				redistest.Sleep(c, 5*time.Millisecond) // the item's backoff
				continue
			}
			require.ErrorIs(t, err, stock.ErrNotLoaded) // a pass says what holds the item back
			tries++
			all.Refused += st.Refused
			all.DeadLettered += st.DeadLettered
			all.NotLoaded += st.NotLoaded
			all.Delivered += st.Delivered
		}
		assert.Zero(t, all.Refused, "a sale of an item the store does not know is not a refusal")
		assert.Zero(t, all.DeadLettered)
		assert.Zero(t, all.Delivered)
		assert.Equal(t, 6, all.NotLoaded, "both events, on each of 3 tries")
		assert.Equal(t, 1, logs.count(notLoadedLog), "said once per item per interval, not per event or pass:\n%s", logs.String())
		assert.Equal(t, 1, logs.count("level=ERROR"), "and nothing else at Error:\n%s", logs.String())

		l := levels(t, r, "A")
		assert.EqualValues(t, 2, l.Sold, "the acknowledged sales stay sold: %+v", l)
		for id, e := range ledger(t, r, "A") {
			assert.NotEqual(t, stock.StateRefused, e.State, "%s given back", id)
		}
		pending, dead, err := stockops.Pending(ctx, r, "A")
		require.NoError(t, err)
		assert.EqualValues(t, 2, pending, "the sales wait in the outbox")
		assert.Zero(t, dead)

		require.NoError(t, store.Load(ctx, "A", 5)) // the setup is fixed
		redistest.Sleep(c, 5*time.Millisecond)      // the item's backoff
		st := drain(t, rl)
		assert.Equal(t, 2, st.Delivered, "%+v", st)
		assert.EqualValues(t, 3, remaining(t, store, "A"))
		for _, id := range []string{"o1", "o2"} {
			assert.Equal(t, 1, store.Applications("A", id, stock.EventDeducted))
		}
		pending, _, err = stockops.Pending(ctx, r, "A")
		require.NoError(t, err)
		assert.Zero(t, pending)
	})
}

// TestConsumeOfAnItemTheStoreDoesNotKnow: on the queue path too, an item the store does not
// know is not a refusal: Consume answers a temporary error (the queue delivers it again),
// gives nothing back, and applies the event once the item is loaded.
func TestConsumeOfAnItemTheStoreDoesNotKnow(t *testing.T) {
	opts := []stock.Option{stock.WithLogger(slog.New(slog.DiscardHandler))}
	eachReserver(t, opts, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		require.NoError(t, r.Load(ctx, "A", 5))
		must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 2}))
		var msgs []stock.Event
		q := stock.PublisherFunc(func(_ context.Context, ev stock.Event) error { msgs = append(msgs, ev); return nil })
		rl := newRelay(t, r, nil, q, nil)
		drain(t, rl)
		require.Len(t, msgs, 1)

		store := memstore.New()
		err := stock.Consume(ctx, r, store, msgs[0])
		require.ErrorIs(t, err, stock.ErrNotLoaded)
		require.False(t, errors.Is(err, stock.ErrInvalid) || errors.Is(err, stock.ErrRefused), "%v", err)
		l := levels(t, r, "A")
		assert.EqualValues(t, 2, l.Sold, "nothing given back: %+v", l)

		require.NoError(t, store.Load(ctx, "A", 5))
		require.NoError(t, stock.Consume(ctx, r, store, msgs[0]))
		assert.EqualValues(t, 3, remaining(t, store, "A"))
		assert.EqualValues(t, 2, levels(t, r, "A").Sold)
	})
}

// TestDefaultLoggerIsSlogDefault: a Reserver made without WithLogger logs to slog.Default(),
// so the call for a human is seen by a default setup.
func TestDefaultLoggerIsSlogDefault(t *testing.T) {
	logs := &logRecords{}
	prev := slog.Default()
	slog.SetDefault(slog.New(logs))
	defer slog.SetDefault(prev)
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			r := newReserver(t, b.Client(t)) // no WithLogger
			require.NoError(t, r.Load(ctx, "A", 5))
			must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1}))
			rl := newRelay(t, r, memstore.New(), nil, nil)
			require.ErrorIs(t, testkit.Err(rl.Once(ctx)), stock.ErrNotLoaded)
			assert.Contains(t, logs.String(), notLoadedLog)
			assert.Contains(t, logs.String(), "level=ERROR")
		})
	}
}

// TestPreheatLoadsStoreAndRedis: stockops.Preheat puts an item on sale on both sides from the
// database of record's stock, and a sale reaches the store.
func TestPreheatLoadsStoreAndRedis(t *testing.T) {
	eachReserver(t, nil, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		store := memstore.New()
		n, err := stockops.Preheat(ctx, r, store, "A", 10)
		require.NoError(t, err)
		assert.EqualValues(t, 10, n)
		assert.EqualValues(t, 10, levels(t, r, "A").Available)

		// The store's row wins over qty: the database of record had 7 left.
		store.Set("B", 7)
		n, err = stockops.Preheat(ctx, r, store, "B", 10)
		require.NoError(t, err)
		assert.EqualValues(t, 7, n)
		assert.EqualValues(t, 7, levels(t, r, "B").Available)

		// Again: a live sale is not clobbered.
		must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1}))
		require.ErrorIs(t, testkit.Err(stockops.Preheat(ctx, r, store, "A", 10)), stock.ErrLoaded)
		assert.EqualValues(t, 9, levels(t, r, "A").Available)

		// Bad input changes nothing.
		require.ErrorIs(t, testkit.Err(stockops.Preheat(ctx, r, store, "C", -1)), stock.ErrInvalid)
		require.ErrorIs(t, testkit.Err(stockops.Preheat(ctx, r, store, "bad{name", 1)), stock.ErrInvalid)
		require.ErrorIs(t, testkit.Err(store.Remaining(ctx, "bad{name")), stock.ErrNotLoaded)

		rl := newRelay(t, r, store, nil, nil)
		assert.Equal(t, 1, drain(t, rl).Delivered)
		assert.EqualValues(t, 9, remaining(t, store, "A"))
	})
}

// runThenCancel is a client that, once armed, sends the first command match accepts, then
// cancels the caller's context and answers as a cancelled call does: the command ran in Redis,
// the caller cannot know.
type runThenCancel struct {
	rueidis.Client
	mu     sync.Mutex
	match  func(cmd []string) bool
	cancel context.CancelFunc
}

func (c *runThenCancel) arm(match func([]string) bool, cancel context.CancelFunc) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.match, c.cancel = match, cancel
}

func (c *runThenCancel) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	c.mu.Lock()
	hit := c.match != nil && c.match(cmd.Commands())
	if hit {
		c.match = nil
	}
	c.mu.Unlock()
	if !hit {
		return c.Client.Do(ctx, cmd)
	}
	_ = c.Client.Do(context.WithoutCancel(ctx), cmd).Error()
	c.cancel()
	return c.Client.Do(ctx, c.Client.B().Ping().Build()) // ctx is done: the cancelled call's answer
}

// A relay or a reconciler stopped while the command that takes an item's lease was on its way
// gives the lease back: the command may have run, and its lease would keep every other relay
// and reconcile pass off the item until it ran out (a reconcile pass right after a Run stopped
// reported the item busy).
func TestStoppedWhileTakingTheLeaseGivesItBack(t *testing.T) {
	const lease = "stock:{A}:rl"
	for _, who := range []string{"relay", "reconciler"} {
		t.Run(who, func(t *testing.T) {
			m, c := redistest.Miniredis(t)
			rc := &runThenCancel{Client: c}
			r := newReserver(t, rc)
			store := memstore.New()
			for _, sku := range []string{"A", "B"} {
				require.NoError(t, r.Load(ctx, sku, 5))
				require.NoError(t, store.Load(ctx, sku, 5))
			}
			relay := newRelay(t, r, store, nil, nil)
			rec := newReconciler(t, r, store, nil)
			// Every script is loaded: the armed command runs, it is not refused as NOSCRIPT.
			must(t)(r.Deduct(ctx, stock.Request{SKU: "B", ID: "b1", Qty: 1}))
			require.NoError(t, testkit.Err(relay.Once(ctx)))
			_, err := rec.Pass(ctx)
			require.NoError(t, err)

			must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "a1", Qty: 1}))
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			if who == "relay" {
				rc.arm(func(cmd []string) bool { // the claim script, which takes the lease
					return (cmd[0] == "EVALSHA" || cmd[0] == "FCALL") && slices.Contains(cmd, lease)
				}, cancel)
				_, err = relay.Once(cctx)
			} else {
				rc.arm(func(cmd []string) bool {
					return cmd[0] == "SET" && len(cmd) > 1 && cmd[1] == lease && slices.Contains(cmd, "NX")
				}, cancel)
				_, err = rec.Pass(cctx)
			}
			require.ErrorIs(t, err, context.Canceled)
			require.False(t, m.Exists(lease), "the lease taken by the cancelled call is left: %q", m.Keys())
		})
	}
}
