package systest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// queue is an in-memory message queue between a relay that only publishes and the consumers:
// Publish appends; a consumer takes messages in any order it likes and acks them or puts them
// back, as a broker's redelivery does.
type queue struct {
	mu  sync.Mutex
	msg []stock.Event
}

func (q *queue) Publish(_ context.Context, ev stock.Event) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.msg = append(q.msg, ev)
	return nil
}

// take removes and returns every message queued so far.
func (q *queue) take() []stock.Event {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.msg
	q.msg = nil
	return out
}

// consumeAll delivers msgs through Consume until every one is acked, putting a message that
// Consume did not ack at the back, as a broker redelivers it. It returns the redeliveries.
func consumeAll(t *testing.T, r *stock.Reserver, store stock.Store, msgs []stock.Event) int {
	t.Helper()
	redelivered := 0
	for i := 0; len(msgs) > 0; i++ {
		require.Less(t, i, 10000, "messages never acked: %v", msgs)
		ev := msgs[0]
		msgs = msgs[1:]
		if err := stock.Consume(context.Background(), r, store, ev); err != nil {
			msgs = append(msgs, ev)
			redelivered++
		}
	}
	return redelivered
}

// queueStores returns the stores the queue path is tested against: memstore, and the SQL
// stores of sqlStores (SQLite, and PostgreSQL when configured).
func queueStores(t *testing.T) map[string]interface {
	stock.Store
	Load(context.Context, string, int64) error
} {
	out := map[string]interface {
		stock.Store
		Load(context.Context, string, int64) error
	}{"memstore": memstore.New()}
	for name, s := range sqlStores(t) {
		out[name] = s
	}
	return out
}

// TestQueuePathReconcileConsumerDown: on the queue path (a relay with no Store), events the
// relay published and no consumer applied yet are in flight. A reconcile pass while the
// consumer is down finds no drift and adds no stock, so Redis does not sell the units again;
// once the consumer has caught up, Redis and the store agree.
func TestQueuePathReconcileConsumerDown(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		for name, store := range queueStores(t) {
			t.Run(name, func(t *testing.T) {
				ctx := context.Background()
				r := newReserver(t, c, stock.WithPrefix("q-"+name))
				sku := "sku-" + name
				require.NoError(t, r.Load(ctx, sku, 10))
				require.NoError(t, store.Load(ctx, sku, 10))
				for i := range 10 {
					_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprint("o", i), Qty: 1})
					require.NoError(t, err)
				}
				q := &queue{}
				rl, err := stockops.NewRelay(r, nil, q, nil)
				require.NoError(t, err)
				drain(t, rl)
				msgs := q.take()
				require.Len(t, msgs, 10)

				rec, err := stockops.NewReconciler(r, store, &stock.ReconcileOptions{Items: []string{sku}})
				require.NoError(t, err)
				// The consumer is down: all ten sales are in the queue.
				reps, err := rec.Once(ctx)
				require.NoError(t, err)
				require.Len(t, reps, 1)
				assert.Zero(t, reps[0].Drift, reps[0].String())
				assert.Zero(t, reps[0].Adjusted, reps[0].String())
				assert.Empty(t, reps[0].NeedsHuman)
				assert.Zero(t, levels(t, r, sku).Available, "no stock added for sales still in the queue")
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
				rem, err := store.Remaining(ctx, sku)
				require.NoError(t, err)
				assert.Zero(t, rem, "every sale applied in the store, none refused")
				assert.Zero(t, levels(t, r, sku).Available)
				for id, e := range ledger(t, r, sku) {
					assert.Equal(t, stock.StateApplied, e.State, id)
				}
			})
		}
	})
}

// TestQueuePathReconcileWhileConsuming: reconcile passes run while consumers apply the queue
// and buyers keep deducting and restoring; no pass adds or removes stock (nothing drifted),
// and at the end Redis and the store agree.
func TestQueuePathReconcileWhileConsuming(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		store := memstore.New()
		require.NoError(t, r.Load(ctx, "A", 200))
		require.NoError(t, store.Load(ctx, "A", 200))
		q := &queue{}
		rl, err := stockops.NewRelay(r, nil, q, &stock.RelayOptions{Lease: time.Second})
		require.NoError(t, err)
		rec, err := stockops.NewReconciler(r, store, &stock.ReconcileOptions{Items: []string{"A"}})
		require.NoError(t, err)

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
						_, err := r.Restore(ctx, "A", id)
						assert.NoError(t, err)
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
				if _, err := rl.Once(ctx); err != nil {
					t.Error(err)
				}
				backlog = append(backlog, q.take()...)
				keep := backlog[:0:0]
				for i, ev := range backlog {
					if n%4 == 0 && i >= len(backlog)/2 {
						keep = append(keep, backlog[i:]...) // behind: the rest waits
						break
					}
					if err := stock.Consume(ctx, r, store, ev); err != nil {
						if !errors.Is(err, stock.ErrHeldBack) {
							t.Error(err)
						}
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
			drain(t, rl)
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
		rem, err := store.Remaining(ctx, "A")
		require.NoError(t, err)
		assert.Equal(t, levels(t, r, "A").Available, rem)
		assert.Positive(t, sold.Load())
		assert.Equal(t, 1, store.MaxApplications())
		t.Logf("%d reconcile passes while consuming, %d sales", passes, sold.Load())
	})
}

// TestConsumeInOrderAfterRedelivery: one unit; deduct a, restore a, deduct b. The consumer
// applies D(a) and dies before R(a); the queue hands its successor D(b) before the redelivered
// R(a). Consume must not apply D(b) before R(a) (the store would refuse a valid sale and Consume
// give b's stock back): it applies R(a), read from Redis, first.
func TestConsumeInOrderAfterRedelivery(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		for name, store := range queueStores(t) {
			t.Run(name, func(t *testing.T) {
				ctx := context.Background()
				r := newReserver(t, c, stock.WithPrefix("order-"+name))
				sku := "one-" + name
				require.NoError(t, r.Load(ctx, sku, 1))
				require.NoError(t, store.Load(ctx, sku, 1))
				_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: "a", Qty: 1})
				require.NoError(t, err)
				_, err = r.Restore(ctx, sku, "a")
				require.NoError(t, err)
				_, err = r.Deduct(ctx, stock.Request{SKU: sku, ID: "b", Qty: 1})
				require.NoError(t, err)
				q := &queue{}
				rl, err := stockops.NewRelay(r, nil, q, nil)
				require.NoError(t, err)
				drain(t, rl)
				msgs := q.take()
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
				rem, err := store.Remaining(ctx, sku)
				require.NoError(t, err)
				assert.Zero(t, rem)
				assert.Zero(t, levels(t, r, sku).Available)
				assert.Empty(t, q.take(), "no refusal event")
			})
		}
	})
}

// TestRelayDeadLettersOrphans: the ledger key is lost (evicted) while events are pending. The
// relay cannot build those events; it must not drop them (the sales they record are stored
// nowhere else), and the reconciler must not give their units back: they go to the dead-letter
// set and the item is left for an operator.
func TestRelayDeadLettersOrphans(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		for _, path := range []string{"direct", "queue"} {
			t.Run(path, func(t *testing.T) {
				ctx := context.Background()
				prefix := "orph-" + path
				r := newReserver(t, c, stock.WithPrefix(prefix))
				store := memstore.New()
				require.NoError(t, r.Load(ctx, "A", 10))
				require.NoError(t, store.Load(ctx, "A", 10))
				for i := range 3 {
					_, err := r.Deduct(ctx, stock.Request{SKU: "A", ID: fmt.Sprint("o", i), Qty: 2})
					require.NoError(t, err)
				}
				require.NoError(t, c.Do(ctx, c.B().Del().Key(prefix+":{A}:l").Build()).Error())

				q := &queue{}
				var rl *stockops.Relay
				var err error
				if path == "direct" {
					rl, err = stockops.NewRelay(r, store, nil, nil)
				} else {
					rl, err = stockops.NewRelay(r, nil, q, nil)
				}
				require.NoError(t, err)
				st := drain(t, rl)
				assert.Equal(t, 3, st.DeadLettered, "%+v", st)
				assert.Zero(t, st.Delivered)
				pending, dead, err := stockops.Pending(ctx, r, "A")
				require.NoError(t, err)
				assert.Zero(t, pending)
				assert.EqualValues(t, 3, dead, "the events wait for an operator")

				rec, err := stockops.NewReconciler(r, store, &stock.ReconcileOptions{Items: []string{"A"}})
				require.NoError(t, err)
				reps, err := rec.Once(ctx)
				require.NoError(t, err)
				assert.Zero(t, reps[0].Adjusted, "the units of acknowledged sales are not given back: %s", reps[0])
				assert.NotEmpty(t, reps[0].NeedsHuman)
				assert.Equal(t, int64(4), levels(t, r, "A").Available)
				_, err = r.Deduct(ctx, stock.Request{SKU: "A", ID: "more", Qty: 5})
				assert.ErrorIs(t, err, stock.ErrInsufficient)
			})
		}
	})
}

// TestConsumeCatchesUp: handed an event whose item has earlier events not applied yet, Consume
// applies those first, in sequence, from Redis; it answers ErrHeldBack, changing nothing,
// while a reconcile pass holds the item, or when an earlier event cannot be read from Redis.
// Events carry increasing sequences.
func TestConsumeCatchesUp(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		store := memstore.New()
		require.NoError(t, r.Load(ctx, "A", 7))
		require.NoError(t, store.Load(ctx, "A", 7))
		for i := range 3 {
			_, err := r.Deduct(ctx, stock.Request{SKU: "A", ID: fmt.Sprint("o", i), Qty: 1})
			require.NoError(t, err)
		}
		q := &queue{}
		rl, err := stockops.NewRelay(r, nil, q, nil)
		require.NoError(t, err)
		drain(t, rl)
		msgs := q.take()
		require.Len(t, msgs, 3)
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
			_, err := r.Deduct(ctx, stock.Request{SKU: "A", ID: fmt.Sprint("o", i), Qty: 1})
			require.NoError(t, err)
		}
		drain(t, rl)
		more := q.take()
		require.Len(t, more, 2)
		require.NoError(t, c.Do(ctx, c.B().Hdel().Key("stock:{A}:l").Field("o3").Build()).Error())
		require.ErrorIs(t, stock.Consume(ctx, r, store, more[1]), stock.ErrHeldBack)
		require.NoError(t, stock.Consume(ctx, r, store, more[0]), "its own message carries it")
		require.NoError(t, stock.Consume(ctx, r, store, more[1]))

		// Held, cancelled and expired events are not kept after publishing and hold nothing back.
		_, err = r.Hold(ctx, stock.Request{SKU: "A", ID: "h", Qty: 1}, time.Minute)
		require.NoError(t, err)
		_, err = r.Cancel(ctx, "A", "h")
		require.NoError(t, err)
		drain(t, rl)
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

// TestConsumeInOrderBehindManyPublished: an item has more earlier events not applied yet than
// Consume reads at once (256 from each set): 300 published (the consumers are behind) and a
// few more still in the outbox, because the relay is publishing their batch when a consumer
// gets its last event. That Consume applies the item's first 256 events and holds its own back;
// it never applies the batch's events ahead of the published ones it did not read. Redelivered,
// every event reaches the store once, in sequence.
func TestConsumeInOrderBehindManyPublished(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		store := &orderStore{Store: memstore.New(), seen: map[string]bool{}}
		const published, batch = 300, 10
		require.NoError(t, r.Load(ctx, "A", 1000))
		require.NoError(t, store.Load(ctx, "A", 1000))
		id := func(i int) string { return fmt.Sprintf("o%04d", i) }
		for i := range published {
			_, err := r.Deduct(ctx, stock.Request{SKU: "A", ID: id(i), Qty: 1})
			require.NoError(t, err)
		}
		q := &hookQueue{on: id(published + batch - 1)}
		rl, err := stockops.NewRelay(r, nil, q, nil)
		require.NoError(t, err)
		drain(t, rl)
		for i := published; i < published+batch; i++ {
			_, err := r.Deduct(ctx, stock.Request{SKU: "A", ID: id(i), Qty: 1})
			require.NoError(t, err)
		}
		var consumeErr error
		q.hook = func(ev stock.Event) { consumeErr = stock.Consume(ctx, r, store, ev) }
		drain(t, rl)
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

// orderStore records the ids of an item's events in the order they first reach the store.
type orderStore struct {
	*memstore.Store
	mu    sync.Mutex
	seen  map[string]bool
	order []string
}

func (s *orderStore) Apply(ctx context.Context, ev stock.Event) error {
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

func mustReconciler(t *testing.T, r *stock.Reserver, store stock.Store) *stockops.Reconciler {
	t.Helper()
	rec, err := stockops.NewReconciler(r, store, &stock.ReconcileOptions{Items: []string{"A"}})
	require.NoError(t, err)
	return rec
}

// TestConsumeDeadLettersInvalid: an event the store rejects as invalid is set aside in the
// dead-letter set by Consume, so it no longer holds back the item's later events.
func TestConsumeDeadLettersInvalid(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		store := memstore.New()
		require.NoError(t, r.Load(ctx, "A", 5))
		require.NoError(t, store.Load(ctx, "A", 5))
		for i := range 2 {
			_, err := r.Deduct(ctx, stock.Request{SKU: "A", ID: fmt.Sprint("o", i), Qty: 1})
			require.NoError(t, err)
		}
		q := &queue{}
		rl, err := stockops.NewRelay(r, nil, q, nil)
		require.NoError(t, err)
		drain(t, rl)
		msgs := q.take()
		require.Len(t, msgs, 2)
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

// TestReconcileSettlesPublished: Redis lost a consumer's acknowledgement of an item's last
// event (it is back in the published set, and the queue has nothing left to deliver). The
// reconciler finds the event in the store and settles it.
func TestReconcileSettlesPublished(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		store := memstore.New()
		require.NoError(t, r.Load(ctx, "A", 5))
		require.NoError(t, store.Load(ctx, "A", 5))
		for i := range 2 {
			_, err := r.Deduct(ctx, stock.Request{SKU: "A", ID: fmt.Sprint("o", i), Qty: 1})
			require.NoError(t, err)
		}
		q := &queue{}
		rl, err := stockops.NewRelay(r, nil, q, nil)
		require.NoError(t, err)
		drain(t, rl)
		msgs := q.take()
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
