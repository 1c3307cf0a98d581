package systest_test

// Attack 18: the queue path (Reserver → Relay with no Store → Publisher → queue → stock.Consume
// → Store) driven through the exported API only, with publishers that misbehave the ways real
// ones do (a batch that fails in the middle, a wrong-length answer, a panic, an answer after the
// context ended, a broker that delivers before it confirms) and consumers that race on one item.
// Every check counts outcomes against the answers the Reserver acknowledged.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockres/stock"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
	"github.com/stockres/stock/stocktest"
)

// a18Queue is an in-memory broker: what the publisher accepted, in the order it accepted it.
type a18Queue struct {
	mu   sync.Mutex
	msgs []stock.Event
	// batch, when set, decides what PublishBatch does with a batch: it returns the answer and
	// says how many of the first events the queue really takes.
	batch func(call int, evs []stock.Event) (errs []error, keep []bool)
	calls atomic.Int64
	// single, when set, decides Publish's answer (nil keeps the event).
	single func(ev stock.Event) error
}

func (q *a18Queue) Publish(ctx context.Context, ev stock.Event) error {
	if q.single != nil {
		if err := q.single(ev); err != nil {
			return err
		}
	}
	q.mu.Lock()
	q.msgs = append(q.msgs, ev)
	q.mu.Unlock()
	return nil
}

func (q *a18Queue) PublishBatch(ctx context.Context, evs []stock.Event) []error {
	call := int(q.calls.Add(1))
	if q.batch == nil {
		for _, ev := range evs {
			_ = q.Publish(ctx, ev)
		}
		return make([]error, len(evs))
	}
	errs, keep := q.batch(call, evs)
	q.mu.Lock()
	for i, ev := range evs {
		if keep[i] {
			q.msgs = append(q.msgs, ev)
		}
	}
	q.mu.Unlock()
	return errs
}

func (q *a18Queue) take() []stock.Event {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.msgs
	q.msgs = nil
	return out
}

func (q *a18Queue) snapshot() []stock.Event {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]stock.Event(nil), q.msgs...)
}

// a18OrderStore wraps a memstore and records, per item, every event that changed something, to
// find events applied out of their item's order.
type a18OrderStore struct {
	*memstore.Store
	mu      sync.Mutex
	applied map[string][]stock.Event // per sku, first applications in the order they came
	seen    map[string]bool
}

func newA18OrderStore() *a18OrderStore {
	return &a18OrderStore{Store: memstore.New(), applied: map[string][]stock.Event{}, seen: map[string]bool{}}
}

func (s *a18OrderStore) Apply(ctx context.Context, ev stock.Event) error {
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
func (s *a18OrderStore) checkOrder(t *testing.T) {
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

// a18Acks is what the Reserver acknowledged: the ids it deducted and those it gave back.
type a18Acks struct {
	deducted map[string]map[string]int64 // sku → id → qty
	restored map[string]map[string]bool
	restock  map[string]map[string]int64
	initial  map[string]int64
}

// a18Traffic loads skus (in Redis and in the store) and runs n random deducts, restores and
// restocks on them, returning what was acknowledged.
func a18Traffic(t *testing.T, ctx context.Context, r *stock.Reserver, store *memstore.Store, skus []string, n int, rng *rand.Rand) *a18Acks {
	t.Helper()
	a := &a18Acks{deducted: map[string]map[string]int64{}, restored: map[string]map[string]bool{}, restock: map[string]map[string]int64{}, initial: map[string]int64{}}
	for _, sku := range skus {
		qty := int64(20 + rng.IntN(30))
		if err := r.Load(ctx, sku, qty); err != nil {
			t.Fatalf("Load %q: %v", sku, err)
		}
		if err := store.Load(ctx, sku, qty); err != nil {
			t.Fatalf("store.Load %q: %v", sku, err)
		}
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
				if _, err := r.Restore(ctx, sku, id); err != nil {
					t.Fatalf("Restore %q %s: %v", sku, id, err)
				}
				a.restored[sku][id] = true
				break
			}
		default:
			id := fmt.Sprintf("r%d", i)
			q := int64(1 + rng.IntN(4))
			if _, err := r.Restock(ctx, sku, id, q); err != nil {
				t.Fatalf("Restock %q %s: %v", sku, id, err)
			}
			a.restock[sku][id] = q
		}
	}
	return a
}

// a18Drain runs the relay until every item's outbox is empty, moving the Redis clock past every
// backoff and lease between passes.
func a18Drain(t *testing.T, ctx context.Context, e *stocktest.Env, rl *stockops.Relay, skus []string) {
	t.Helper()
	for pass := 0; pass < 400; pass++ {
		_, _ = rl.Once(ctx)
		left := int64(0)
		for _, sku := range skus {
			p, _, err := stockops.Pending(ctx, e.Reserver, sku)
			if err != nil {
				t.Fatalf("Pending %q: %v", sku, err)
			}
			left += p
		}
		if left == 0 {
			return
		}
		e.Advance(2 * time.Minute)
	}
	t.Fatalf("the relay did not drain the outboxes in 400 passes")
}

// a18ConsumeAll hands msgs to stock.Consume in a random order, redelivering every message Consume
// did not settle (ErrHeldBack or a temporary error), until all are settled.
func a18ConsumeAll(t *testing.T, ctx context.Context, r *stock.Reserver, st stock.Store, msgs []stock.Event, rng *rand.Rand) {
	t.Helper()
	rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	var lastErr error
	for round := 0; len(msgs) > 0; round++ {
		if round > 200 {
			t.Fatalf("%d messages still unsettled after 200 rounds (last error: %v)", len(msgs), lastErr)
		}
		var again []stock.Event
		for _, ev := range msgs {
			err := stock.Consume(ctx, r, st, ev)
			switch {
			case err == nil:
			case errors.Is(err, stock.ErrInvalid):
				t.Errorf("Consume %s %s %s: %v (a valid event)", ev.SKU, ev.Type, ev.ID, err)
			default:
				lastErr = err
				again = append(again, ev)
			}
		}
		msgs = again
	}
}

// a18Verify checks the end state: the store equals Redis for every item, nothing is applied twice,
// every acknowledged deduct and restore has its record, no outbox or published set holds anything,
// and the store saw each item's events in order.
func a18Verify(t *testing.T, ctx context.Context, r *stock.Reserver, st *a18OrderStore, a *a18Acks) {
	t.Helper()
	rec, err := stockops.NewReconciler(r, st.Store, &stock.ReconcileOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	for sku := range a.initial {
		lv, err := r.Levels(ctx, sku)
		if err != nil {
			t.Fatalf("Levels %q: %v", sku, err)
		}
		rem, err := st.Remaining(ctx, sku)
		if err != nil {
			t.Fatalf("Remaining %q: %v", sku, err)
		}
		if rem != lv.Available+lv.Held {
			t.Errorf("item %q: store remaining %d, Redis available %d held %d", sku, rem, lv.Available, lv.Held)
		}
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
		if rem != want {
			t.Errorf("item %q: store remaining %d, the acknowledged answers make %d", sku, rem, want)
		}
		ids := make([]string, 0, len(a.deducted[sku]))
		for id := range a.deducted[sku] {
			ids = append(ids, id)
		}
		recs, err := st.Records(ctx, sku, ids)
		if err != nil {
			t.Fatal(err)
		}
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
		if err != nil {
			t.Fatalf("reconcile %q: %v", sku, err)
		}
		if rp.Pending != 0 || rp.Published != 0 || rp.DeadLetters != 0 || rp.InFlight != 0 || rp.Drift != 0 {
			t.Errorf("item %q after the drain: %s", sku, rp)
		}
	}
	if m := st.MaxApplications(); m > 1 {
		t.Errorf("an event changed the store %d times", m)
	}
	st.checkOrder(t)
}

// a18Setup is a Reserver on stocktest's miniredis, a store and a seeded rng.
func a18Setup(t *testing.T, seed uint64) (context.Context, *stocktest.Env, *a18OrderStore, *rand.Rand) {
	return context.Background(), stocktest.New(t), newA18OrderStore(), rand.New(rand.NewPCG(seed, 18))
}

// A batch that fails at event k of n (the queue took the first k, the relay is told so), a
// different k every call: the relay must keep the first k and retry from k, in order, and through
// Consume the store must end exactly where the acknowledged answers put it.
func TestAttack18BatchFailsMidBatch(t *testing.T) {
	ctx, e, st, rng := a18Setup(t, 1)
	skus := []string{"a", "b", "c"}
	acks := a18Traffic(t, ctx, e.Reserver, st.Store, skus, 300, rng)
	var mu sync.Mutex
	q := &a18Queue{}
	q.batch = func(call int, evs []stock.Event) ([]error, []bool) {
		mu.Lock()
		k := rng.IntN(len(evs) + 1)
		mu.Unlock()
		errs := make([]error, len(evs))
		keep := make([]bool, len(evs))
		for i := range evs {
			if i < k {
				keep[i] = true
			} else {
				errs[i] = errors.New("broker: not appended")
			}
		}
		return errs, keep
	}
	rl, err := stockops.NewRelay(e.Reserver, nil, q, &stock.RelayOptions{Batch: 16})
	if err != nil {
		t.Fatal(err)
	}
	a18Drain(t, ctx, e, rl, skus)
	if q.calls.Load() == 0 {
		t.Fatal("the relay never called PublishBatch")
	}
	msgs := q.snapshot()
	// The queue got each item's events in sequence, each once (the relay never republished one
	// the queue had taken).
	last := map[string]int64{}
	seen := map[string]bool{}
	for _, ev := range msgs {
		k := ev.SKU + "/" + ev.ID + "/" + string(ev.Type)
		if seen[k] {
			t.Errorf("event %s was published again after the queue took it", k)
		}
		seen[k] = true
		if ev.Seq <= last[ev.SKU] {
			t.Errorf("item %q: seq %d published after %d", ev.SKU, ev.Seq, last[ev.SKU])
		}
		last[ev.SKU] = ev.Seq
	}
	a18ConsumeAll(t, ctx, e.Reserver, st, q.take(), rng)
	a18Verify(t, ctx, e.Reserver, st, acks)
}

// A batch publisher whose answer is not a prefix: nil, error, nil, nil... (the queue took every
// event answered nil). The relay must not count the events after the first failure as published
// (it retries them: duplicates), and the store must still end right.
func TestAttack18BatchHoleInAnswer(t *testing.T) {
	ctx, e, st, rng := a18Setup(t, 2)
	skus := []string{"x", "y"}
	acks := a18Traffic(t, ctx, e.Reserver, st.Store, skus, 200, rng)
	q := &a18Queue{}
	q.batch = func(call int, evs []stock.Event) ([]error, []bool) {
		errs := make([]error, len(evs))
		keep := make([]bool, len(evs))
		for i := range evs {
			keep[i] = true
		}
		if len(evs) > 1 && call%3 != 0 {
			errs[1] = errors.New("broker: lost confirm for the second")
			keep[1] = false
		}
		return errs, keep
	}
	rl, err := stockops.NewRelay(e.Reserver, nil, q, &stock.RelayOptions{Batch: 8})
	if err != nil {
		t.Fatal(err)
	}
	a18Drain(t, ctx, e, rl, skus)
	msgs := q.take()
	a18ConsumeAll(t, ctx, e.Reserver, st, msgs, rng)
	a18Verify(t, ctx, e.Reserver, st, acks)
}

// Answers of the wrong length (one error short, one nil too many, none at all) fail the whole
// batch: no event of it may leave the outbox. Then a sound publisher delivers them all.
func TestAttack18BatchWrongLength(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    func(int) int
	}{
		{"short", func(n int) int { return n - 1 }},
		{"long", func(n int) int { return n + 1 }},
		{"nil", func(int) int { return 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, e, st, rng := a18Setup(t, 3)
			skus := []string{"w"}
			acks := a18Traffic(t, ctx, e.Reserver, st.Store, skus, 40, rng)
			before, _, err := stockops.Pending(ctx, e.Reserver, "w")
			if err != nil {
				t.Fatal(err)
			}
			q := &a18Queue{}
			q.batch = func(call int, evs []stock.Event) ([]error, []bool) {
				keep := make([]bool, len(evs))
				for i := range keep {
					keep[i] = true // the queue has them all: the answer is wrong, not the queue
				}
				if n := tc.n(len(evs)); n > 0 {
					return make([]error, n), keep
				}
				return nil, keep
			}
			rl, err := stockops.NewRelay(e.Reserver, nil, q, &stock.RelayOptions{Batch: 16})
			if err != nil {
				t.Fatal(err)
			}
			st1, err := rl.Once(ctx)
			if st1.Delivered != 0 {
				t.Errorf("wrong-length answers: the relay counted %d events delivered (stats %+v, err %v)", st1.Delivered, st1, err)
			}
			after, _, err := stockops.Pending(ctx, e.Reserver, "w")
			if err != nil {
				t.Fatal(err)
			}
			if after != before {
				t.Errorf("outbox: %d events before, %d after a pass of wrong-length answers", before, after)
			}
			q.batch = nil
			a18Drain(t, ctx, e, rl, skus)
			a18ConsumeAll(t, ctx, e.Reserver, st, q.take(), rng)
			a18Verify(t, ctx, e.Reserver, st, acks)
		})
	}
}

// A PublishBatch that panics (after the queue took half the batch). Whatever the relay does with
// the panic, nothing may be lost: the events come back after the lease and are delivered.
func TestAttack18BatchPanics(t *testing.T) {
	ctx, e, st, rng := a18Setup(t, 4)
	skus := []string{"p"}
	acks := a18Traffic(t, ctx, e.Reserver, st.Store, skus, 40, rng)
	q := &a18Queue{}
	q.batch = func(call int, evs []stock.Event) ([]error, []bool) {
		if call == 1 {
			q.mu.Lock()
			q.msgs = append(q.msgs, evs[:len(evs)/2]...)
			q.mu.Unlock()
			panic("publisher bug")
		}
		keep := make([]bool, len(evs))
		for i := range keep {
			keep[i] = true
		}
		return make([]error, len(evs)), keep
	}
	rl, err := stockops.NewRelay(e.Reserver, nil, q, &stock.RelayOptions{Batch: 16, Lease: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() { _ = recover() }()
		_, _ = rl.Once(ctx)
	}()
	e.Advance(10 * time.Second)
	a18Drain(t, ctx, e, rl, skus)
	a18ConsumeAll(t, ctx, e.Reserver, st, q.take(), rng)
	a18Verify(t, ctx, e.Reserver, st, acks)
}

// A broker that delivers a message to a consumer before it confirms it to the publisher (as every
// real broker may): the consumer runs stock.Consume on the event while the relay still holds it
// claimed in the outbox, then the relay hears the confirm and moves it to the published set.
// Nothing may be left in flight afterwards: the event is applied, and Redis must not count it
// as published-and-unapplied forever.
func TestAttack18ConsumedBeforeConfirm(t *testing.T) {
	for _, batch := range []bool{true, false} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			ctx, e, st, rng := a18Setup(t, 5)
			skus := []string{"fast", "quick"}
			acks := a18Traffic(t, ctx, e.Reserver, st.Store, skus, 80, rng)
			var mu sync.Mutex
			var consumeErrs []error
			var redeliver []stock.Event // what the broker must hand over again
			deliver := func(ev stock.Event) {
				if err := stock.Consume(ctx, e.Reserver, st, ev); err != nil {
					mu.Lock()
					consumeErrs = append(consumeErrs, err)
					redeliver = append(redeliver, ev)
					mu.Unlock()
				}
			}
			var pub stock.Publisher
			if batch {
				q := &a18Queue{}
				q.batch = func(_ int, evs []stock.Event) ([]error, []bool) {
					for _, ev := range evs {
						deliver(ev)
					}
					return make([]error, len(evs)), make([]bool, len(evs))
				}
				pub = q
			} else {
				pub = stock.PublisherFunc(func(_ context.Context, ev stock.Event) error {
					deliver(ev)
					return nil
				})
			}
			rl, err := stockops.NewRelay(e.Reserver, nil, pub, nil)
			if err != nil {
				t.Fatal(err)
			}
			a18Drain(t, ctx, e, rl, skus)
			if len(consumeErrs) > 0 {
				t.Logf("Consume answered %d errors during delivery, first: %v", len(consumeErrs), consumeErrs[0])
			}
			a18ConsumeAll(t, ctx, e.Reserver, st, redeliver, rng)
			a18Verify(t, ctx, e.Reserver, st, acks)
		})
	}
}

// Every event delivered three times, to eight consumers at once, in a random order: concurrent
// Consume calls of one event and of neighbouring events of one item.
func TestAttack18ConcurrentConsumers(t *testing.T) {
	ctx, e, st, rng := a18Setup(t, 6)
	skus := []string{"k1", "k2", "k3", "k4"}
	acks := a18Traffic(t, ctx, e.Reserver, st.Store, skus, 400, rng)
	q := &a18Queue{}
	rl, err := stockops.NewRelay(e.Reserver, nil, q, nil)
	if err != nil {
		t.Fatal(err)
	}
	a18Drain(t, ctx, e, rl, skus)
	one := q.take()
	var all []stock.Event
	for i := 0; i < 3; i++ {
		all = append(all, one...)
	}
	rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	work := make(chan stock.Event, len(all))
	for _, ev := range all {
		work <- ev
	}
	var pending atomic.Int64
	pending.Store(int64(len(all)))
	var wg sync.WaitGroup
	var bad atomic.Int64
	deadline := time.Now().Add(15 * time.Second)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for pending.Load() > 0 && time.Now().Before(deadline) {
				select {
				case ev := <-work:
					err := stock.Consume(ctx, e.Reserver, st, ev)
					switch {
					case err == nil:
						pending.Add(-1)
					case errors.Is(err, stock.ErrInvalid):
						bad.Add(1)
						pending.Add(-1)
					default:
						work <- ev
					}
				default:
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	if n := pending.Load(); n > 0 {
		t.Fatalf("%d deliveries never settled", n)
	}
	if n := bad.Load(); n > 0 {
		t.Errorf("%d valid deliveries answered ErrInvalid", n)
	}
	a18Verify(t, ctx, e.Reserver, st, acks)
}

// The old events of an item delivered again after its later ones were applied (a redelivery of a
// dead consumer's messages, or a relay's republish): repeats, answered nil, changing nothing.
func TestAttack18StaleRedelivery(t *testing.T) {
	ctx, e, st, rng := a18Setup(t, 7)
	skus := []string{"old"}
	acks := a18Traffic(t, ctx, e.Reserver, st.Store, skus, 60, rng)
	q := &a18Queue{}
	rl, err := stockops.NewRelay(e.Reserver, nil, q, nil)
	if err != nil {
		t.Fatal(err)
	}
	a18Drain(t, ctx, e, rl, skus)
	msgs := q.take()
	sort.Slice(msgs, func(i, j int) bool { return msgs[i].Seq < msgs[j].Seq })
	// Apply only the last: Consume must apply all earlier ones first, from Redis.
	if err := stock.Consume(ctx, e.Reserver, st, msgs[len(msgs)-1]); err != nil {
		t.Fatalf("Consume of the last event: %v", err)
	}
	a18Verify(t, ctx, e.Reserver, st, acks)
	rem, _ := st.Remaining(ctx, "old")
	for i := len(msgs) - 1; i >= 0; i-- {
		if err := stock.Consume(ctx, e.Reserver, st, msgs[i]); err != nil {
			t.Errorf("stale redelivery of %s %s (seq %d): %v", msgs[i].Type, msgs[i].ID, msgs[i].Seq, err)
		}
	}
	if got, _ := st.Remaining(ctx, "old"); got != rem {
		t.Errorf("stale redeliveries moved the store from %d to %d", rem, got)
	}
	a18Verify(t, ctx, e.Reserver, st, acks)
}

// Run with only a Publisher, a slow one, and the context cancelled in the middle of a batch; the
// publisher's last answers come after the context ended (it accepted them anyway). Then a second
// Run drains the rest. Every acknowledged operation must reach the store once.
func TestAttack18RunCancelMidBatch(t *testing.T) {
	ctx, e, st, rng := a18Setup(t, 8)
	skus := []string{"s:1", "s%7B2%7D", "s~3", "сток-4", "s/5", "😀:6"}
	acks := a18Traffic(t, ctx, e.Reserver, st.Store, skus, 400, rng)
	q := &a18Queue{}
	q.batch = func(_ int, evs []stock.Event) ([]error, []bool) {
		time.Sleep(30 * time.Millisecond) // the broker is slow; ctx may end meanwhile
		keep := make([]bool, len(evs))
		for i := range keep {
			keep[i] = true
		}
		return make([]error, len(evs)), keep
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- e.Reserver.Run(runCtx, stock.RunOptions{Publisher: q, Relay: &stock.RelayOptions{Batch: 8, Poll: time.Millisecond}, Drain: time.Millisecond})
	}()
	for len(q.snapshot()) < 20 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return 10s after its context ended")
	}
	firstRun := len(q.snapshot())
	// Everything the Reserver acknowledged is in the queue or still in an outbox.
	inQueue := map[string]bool{}
	for _, ev := range q.snapshot() {
		inQueue[ev.SKU+"/"+ev.ID+"/"+string(ev.Type)] = true
	}
	var pending int64
	for _, sku := range skus {
		p, _, err := stockops.Pending(ctx, e.Reserver, sku)
		if err != nil {
			t.Fatal(err)
		}
		pending += p
	}
	t.Logf("first Run: %d published, %d left in the outboxes", firstRun, pending)
	e.Advance(2 * time.Minute) // past any lease the first Run held
	rl, err := stockops.NewRelay(e.Reserver, nil, q, nil)
	if err != nil {
		t.Fatal(err)
	}
	q.batch = nil
	a18Drain(t, ctx, e, rl, skus)
	a18ConsumeAll(t, ctx, e.Reserver, st, q.take(), rng)
	a18Verify(t, ctx, e.Reserver, st, acks)
}

// A publisher that accepts every event after the relay's context ended (a confirm that arrives
// late): the relay cannot know whether it may trust the answer, but nothing may be lost either
// way, and nothing applied twice.
func TestAttack18AcceptAfterContextEnd(t *testing.T) {
	ctx, e, st, rng := a18Setup(t, 9)
	skus := []string{"late"}
	acks := a18Traffic(t, ctx, e.Reserver, st.Store, skus, 60, rng)
	q := &a18Queue{}
	var cancel context.CancelFunc
	q.batch = func(_ int, evs []stock.Event) ([]error, []bool) {
		cancel() // the context ends while the broker works on the batch
		keep := make([]bool, len(evs))
		for i := range keep {
			keep[i] = true
		}
		return make([]error, len(evs)), keep
	}
	rl, err := stockops.NewRelay(e.Reserver, nil, q, &stock.RelayOptions{Batch: 8})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		var c context.Context
		c, cancel = context.WithCancel(ctx)
		_, _ = rl.Once(c)
		cancel()
	}
	e.Advance(2 * time.Minute)
	q.batch = nil
	a18Drain(t, ctx, e, rl, skus)
	a18ConsumeAll(t, ctx, e.Reserver, st, q.take(), rng)
	a18Verify(t, ctx, e.Reserver, st, acks)
}

// Many items with awkward SKUs, through Run's queue path with a flaky batch publisher (every
// third batch fails in the middle), consumed concurrently while the relay still publishes.
func TestAttack18ManyItemsLiveConsume(t *testing.T) {
	ctx, e, st, rng := a18Setup(t, 10)
	var skus []string
	for i := 0; i < 24; i++ {
		skus = append(skus, fmt.Sprintf("it:%d:%d~ü%d", i, i%3, i))
	}
	acks := a18Traffic(t, ctx, e.Reserver, st.Store, skus, 600, rng)
	q := &a18Queue{}
	var mu sync.Mutex
	q.batch = func(call int, evs []stock.Event) ([]error, []bool) {
		mu.Lock()
		k := len(evs)
		if call%3 == 0 {
			k = rng.IntN(len(evs) + 1)
		}
		mu.Unlock()
		errs := make([]error, len(evs))
		keep := make([]bool, len(evs))
		for i := range evs {
			if i < k {
				keep[i] = true
			} else {
				errs[i] = errors.New("broker busy")
			}
		}
		return errs, keep
	}
	rl, err := stockops.NewRelay(e.Reserver, nil, q, &stock.RelayOptions{Batch: 4})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // a live consumer, racing with the relay
		defer wg.Done()
		var held []stock.Event
		for {
			select {
			case <-stop:
				q.mu.Lock()
				q.msgs = append(q.msgs, held...)
				q.mu.Unlock()
				return
			default:
			}
			msgs := append(held, q.take()...)
			held = nil
			for _, ev := range msgs {
				if err := stock.Consume(ctx, e.Reserver, st, ev); err != nil && !errors.Is(err, stock.ErrInvalid) {
					held = append(held, ev)
				}
			}
			time.Sleep(time.Millisecond)
		}
	}()
	a18Drain(t, ctx, e, rl, skus)
	close(stop)
	wg.Wait()
	a18ConsumeAll(t, ctx, e.Reserver, st, q.take(), rng)
	a18Verify(t, ctx, e.Reserver, st, acks)
}

// a18ConcurrentConsume consumes msgs with w goroutines, each message delivered dup times, until
// every delivery is settled (ErrHeldBack and temporary errors are redelivered).
func a18ConcurrentConsume(t *testing.T, ctx context.Context, r *stock.Reserver, st stock.Store, msgs []stock.Event, dup, w int, rng *rand.Rand) {
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
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Load() > 0 && time.Now().Before(deadline) {
				select {
				case ev := <-work:
					err := stock.Consume(ctx, r, st, ev)
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
		}()
	}
	wg.Wait()
	if n := left.Load(); n > 0 {
		t.Fatalf("%d deliveries never settled", n)
	}
}

// a18LedgerMatchesStore checks every ledger entry of sku against the store's record of its id:
// applied in Redis ↔ applied in the store, refused ↔ refused, restored ↔ restored (or refused: a
// deduct the store refused, then restored in Redis before the refusal reached it).
func a18LedgerMatchesStore(t *testing.T, ctx context.Context, r *stock.Reserver, st stock.Store, sku string) (refused int) {
	t.Helper()
	var ids []string
	entries := map[string]stock.Entry{}
	for e, err := range stockops.Entries(ctx, r, sku) {
		if err != nil {
			t.Fatalf("Entries %q: %v", sku, err)
		}
		if e.Kind != stock.KindDeduct {
			continue
		}
		entries[e.ID] = e
		ids = append(ids, e.ID)
	}
	recs, err := st.Records(ctx, sku, ids)
	if err != nil {
		t.Fatal(err)
	}
	for id, e := range entries {
		got := recs[id].Status
		want := e.State
		if want == stock.StateReserved {
			want = stock.StateApplied // on the queue path Redis may not have heard the ack; the store has it
		}
		if want == stock.StateRestored && got == stock.StateRefused {
			continue // the store refused the deduct, and the restore that followed gave nothing back
		}
		if got != want {
			t.Errorf("item %q id %s: Redis says %q, the store %q", sku, id, e.State, got)
		}
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
func TestAttack18RefusalsConcurrentConsumers(t *testing.T) {
	ctx, e, st, rng := a18Setup(t, 11)
	skus := []string{"r:1", "r:2", "r~3"}
	for _, sku := range skus {
		if err := e.Reserver.Load(ctx, sku, 80); err != nil {
			t.Fatal(err)
		}
		if err := st.Load(ctx, sku, 40); err != nil { // the database has half
			t.Fatal(err)
		}
	}
	taken := map[string]int64{}
	for i := 0; i < 150; i++ {
		sku := skus[rng.IntN(len(skus))]
		id := fmt.Sprintf("d%d", i)
		q := int64(1 + rng.IntN(3))
		if _, err := e.Reserver.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: q}); err == nil {
			taken[sku] += q
			if i%5 == 4 {
				if _, err := e.Reserver.Restore(ctx, sku, id); err != nil {
					t.Fatal(err)
				}
				taken[sku] -= q
			}
		}
	}
	q := &a18Queue{}
	rl, err := stockops.NewRelay(e.Reserver, nil, q, &stock.RelayOptions{Batch: 8})
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 20; round++ {
		a18Drain(t, ctx, e, rl, skus)
		msgs := q.take()
		if len(msgs) == 0 {
			break
		}
		a18ConcurrentConsume(t, ctx, e.Reserver, st, msgs, 2, 8, rng)
	}
	refusedAll := 0
	for _, sku := range skus {
		lv, err := e.Reserver.Levels(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		rem, err := st.Remaining(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		if lv.Available != rem+40 {
			// Redis had 40 more; every refusal gave its units back in Redis, not in the store.
			t.Errorf("item %q: Redis available %d, store remaining %d: Redis should have exactly 40 more", sku, lv.Available, rem)
		}
		refusedAll += a18LedgerMatchesStore(t, ctx, e.Reserver, st, sku)
		if lv.Loaded-lv.Available-lv.Held != lv.Sold {
			t.Errorf("item %q: levels do not add up: %+v", sku, lv)
		}
	}
	if refusedAll == 0 {
		t.Error("the store refused nothing: the attack did not happen")
	}
	if m := st.MaxApplications(); m > 1 {
		t.Errorf("an event changed the store %d times", m)
	}
	st.checkOrder(t)
}

// A repairing Reconciler runs pass after pass while the relay publishes and consumers apply, with
// duplicates. There is no drift to repair: no pass may adjust Redis, and the store must end equal
// to Redis and to the acknowledged answers.
func TestAttack18ReconcilerDuringConsume(t *testing.T) {
	ctx, e, st, rng := a18Setup(t, 12)
	skus := []string{"c:1", "c:2", "c:3", "c:4"}
	acks := a18Traffic(t, ctx, e.Reserver, st.Store, skus, 300, rng)
	q := &a18Queue{}
	rl, err := stockops.NewRelay(e.Reserver, nil, q, &stock.RelayOptions{Batch: 4})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := stockops.NewReconciler(e.Reserver, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var adjusted, passes atomic.Int64
	var repairs sync.Map
	wg.Add(1)
	go func() {
		defer wg.Done()
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
	}()
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
			cwg.Add(1)
			go func(w int) {
				defer cwg.Done()
				for i := w; i < len(msgs); i += 4 {
					if err := stock.Consume(ctx, e.Reserver, st, msgs[i]); err != nil && !errors.Is(err, stock.ErrInvalid) {
						mu.Lock()
						held = append(held, msgs[i])
						mu.Unlock()
					}
				}
			}(w)
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
	a18ConsumeAll(t, ctx, e.Reserver, st, held, rng)
	if passes.Load() == 0 {
		t.Fatal("no reconcile pass ran")
	}
	if n := adjusted.Load(); n > 0 {
		repairs.Range(func(k, v any) bool { t.Errorf("item %v repaired with no drift: %v", k, v); return true })
	}
	t.Logf("%d reconcile passes ran during the drain", passes.Load())
	a18Verify(t, ctx, e.Reserver, st, acks)
}

// Holds on the queue path: holds confirmed, cancelled and expired (by Sweep), mixed with deducts
// and restores, published through a batch publisher and consumed with duplicates by concurrent
// consumers. The store must count confirmed holds as sold and nothing else of a hold.
func TestAttack18HoldsOnQueuePath(t *testing.T) {
	ctx, e, st, rng := a18Setup(t, 13)
	skus := []string{"h:1", "h:2"}
	initial := map[string]int64{}
	for _, sku := range skus {
		initial[sku] = 200
		if err := e.Reserver.Load(ctx, sku, 200); err != nil {
			t.Fatal(err)
		}
		if err := st.Load(ctx, sku, 200); err != nil {
			t.Fatal(err)
		}
	}
	sold := map[string]int64{}
	var expiring []struct{ sku, id string }
	for i := 0; i < 200; i++ {
		sku := skus[rng.IntN(len(skus))]
		id := fmt.Sprintf("h%d", i)
		q := int64(1 + rng.IntN(3))
		switch p := rng.IntN(5); p {
		case 0: // a deduct
			if _, err := e.Reserver.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: q}); err != nil {
				t.Fatal(err)
			}
			sold[sku] += q
		case 1, 2: // a hold, confirmed
			if _, err := e.Reserver.Hold(ctx, stock.Request{SKU: sku, ID: id, Qty: q}, time.Hour); err != nil {
				t.Fatal(err)
			}
			if _, err := e.Reserver.Confirm(ctx, sku, id); err != nil {
				t.Fatal(err)
			}
			sold[sku] += q
			if p == 2 { // then given back
				if _, err := e.Reserver.Restore(ctx, sku, id); err != nil {
					t.Fatal(err)
				}
				sold[sku] -= q
			}
		case 3: // a hold, cancelled
			if _, err := e.Reserver.Hold(ctx, stock.Request{SKU: sku, ID: id, Qty: q}, time.Hour); err != nil {
				t.Fatal(err)
			}
			if _, err := e.Reserver.Cancel(ctx, sku, id); err != nil {
				t.Fatal(err)
			}
		case 4: // a hold left to expire
			if _, err := e.Reserver.Hold(ctx, stock.Request{SKU: sku, ID: id, Qty: q}, time.Minute); err != nil {
				t.Fatal(err)
			}
			expiring = append(expiring, struct{ sku, id string }{sku, id})
		}
	}
	e.Advance(2 * time.Minute)
	if _, err := stockops.Sweep(ctx, e.Reserver); err != nil {
		t.Fatal(err)
	}
	for _, x := range expiring { // a late confirm of an expired hold changes nothing
		if _, err := e.Reserver.Confirm(ctx, x.sku, x.id); err == nil {
			t.Errorf("Confirm of expired hold %s/%s succeeded", x.sku, x.id)
		}
	}
	q := &a18Queue{}
	rl, err := stockops.NewRelay(e.Reserver, nil, q, &stock.RelayOptions{Batch: 8})
	if err != nil {
		t.Fatal(err)
	}
	a18Drain(t, ctx, e, rl, skus)
	a18ConcurrentConsume(t, ctx, e.Reserver, st, q.take(), 2, 6, rng)
	rec, err := stockops.NewReconciler(e.Reserver, st.Store, &stock.ReconcileOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, sku := range skus {
		lv, _ := e.Reserver.Levels(ctx, sku)
		rem, _ := st.Remaining(ctx, sku)
		if want := initial[sku] - sold[sku]; rem != want || lv.Available != want || lv.Held != 0 {
			t.Errorf("item %q: store %d, Redis available %d held %d, acknowledged answers %d", sku, rem, lv.Available, lv.Held, want)
		}
		rp, err := rec.Item(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		if rp.Pending != 0 || rp.Published != 0 || rp.InFlight != 0 || rp.Drift != 0 {
			t.Errorf("item %q: %s", sku, rp)
		}
	}
	if m := st.MaxApplications(); m > 1 {
		t.Errorf("an event changed the store %d times", m)
	}
	st.checkOrder(t)
}

// Old messages come back after their ledger entries were trimmed (a queue that redelivers a dead
// consumer's messages a day late, after the reconciler's retention): they are repeats of events the
// store applied. Consume must answer them without changing anything: no store change, nothing
// dead-lettered or held back forever, and no item left for an operator.
func TestAttack18RedeliveryAfterRetention(t *testing.T) {
	ctx, e, st, rng := a18Setup(t, 14)
	skus := []string{"ret:1", "ret:2"}
	acks := a18Traffic(t, ctx, e.Reserver, st.Store, skus, 120, rng)
	q := &a18Queue{}
	rl, err := stockops.NewRelay(e.Reserver, nil, q, nil)
	if err != nil {
		t.Fatal(err)
	}
	a18Drain(t, ctx, e, rl, skus)
	msgs := q.take()
	a18ConsumeAll(t, ctx, e.Reserver, st, append([]stock.Event(nil), msgs...), rng)
	a18Verify(t, ctx, e.Reserver, st, acks)
	// The retention is measured on a clock Advance does not move (30h of Advance with a 1h
	// Retention trims nothing), so a tiny Retention and a few real milliseconds stand for a day.
	rec, err := stockops.NewReconciler(e.Reserver, st.Store, &stock.ReconcileOptions{Retention: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	e.Advance(time.Second)
	time.Sleep(5 * time.Millisecond)
	trimmed := 0
	for i := 0; i < 3; i++ {
		reps, err := rec.Once(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, rp := range reps {
			trimmed += rp.Trimmed
		}
	}
	if trimmed == 0 {
		t.Fatal("the reconciler trimmed no ledger entry: the attack did not happen")
	}
	before := map[string]int64{}
	for _, sku := range skus {
		before[sku], _ = st.Remaining(ctx, sku)
	}
	rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	answers := map[string]int{}
	for _, ev := range msgs {
		err := stock.Consume(ctx, e.Reserver, st, ev)
		switch {
		case err == nil:
			answers["nil"]++
		case errors.Is(err, stock.ErrHeldBack):
			answers["held back"]++
		case errors.Is(err, stock.ErrInvalid):
			answers["invalid"]++
		default:
			answers[err.Error()]++
		}
	}
	if answers["nil"] != len(msgs) {
		t.Errorf("redeliveries of %d applied events after the retention answered %v; want nil for every one", len(msgs), answers)
	}
	dry, err := stockops.NewReconciler(e.Reserver, st.Store, &stock.ReconcileOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, sku := range skus {
		rem, _ := st.Remaining(ctx, sku)
		if rem != before[sku] {
			t.Errorf("item %q: stale redeliveries moved the store from %d to %d", sku, before[sku], rem)
		}
		lv, _ := e.Reserver.Levels(ctx, sku)
		if lv.Available != rem {
			t.Errorf("item %q: Redis %d, store %d", sku, lv.Available, rem)
		}
		rp, err := dry.Item(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		if rp.Pending != 0 || rp.Published != 0 || rp.DeadLetters != 0 || rp.InFlight != 0 || rp.Drift != 0 || rp.NeedsHuman != "" {
			t.Errorf("item %q after the stale redeliveries: %s", sku, rp)
		}
	}
	if m := st.MaxApplications(); m > 1 {
		t.Errorf("an event changed the store %d times", m)
	}
}

// Found while attacking the retention above: a pass trims the settled ledger entries of an item
// whose events all went through the queue (a short Retention), then a Reconciler with the default
// Retention (an operator raised it, or a second service runs with its own) takes the store's
// records of the trimmed ids for entries Redis lost and writes them back ("rerecorded"). The
// rewritten entry of a restock does not pass the scripts' own checks, so from then on every pass
// over the item fails with ErrInvalid ("restock of more than is available after it"): the item is
// never reconciled again.
func TestAttack18RetentionRaisedRerecordBreaksItem(t *testing.T) {
	ctx, e, st, rng := a18Setup(t, 14)
	skus := []string{"ret:1"}
	acks := a18Traffic(t, ctx, e.Reserver, st.Store, skus, 60, rng)
	if len(acks.restock["ret:1"]) == 0 {
		t.Fatal("the traffic made no restock")
	}
	q := &a18Queue{}
	rl, err := stockops.NewRelay(e.Reserver, nil, q, nil)
	if err != nil {
		t.Fatal(err)
	}
	a18Drain(t, ctx, e, rl, skus)
	a18ConsumeAll(t, ctx, e.Reserver, st, q.take(), rng)
	a18Verify(t, ctx, e.Reserver, st, acks)
	e.Advance(time.Second)
	short, err := stockops.NewReconciler(e.Reserver, st.Store, &stock.ReconcileOptions{Retention: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := short.Once(ctx); err != nil {
		t.Fatalf("pass with the short retention: %v", err)
	}
	long, err := stockops.NewReconciler(e.Reserver, st.Store, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		reps, err := long.Once(ctx)
		if err != nil {
			t.Errorf("pass %d with the default retention after the trim: %v (reports %v)", i, err, reps)
		}
	}
	lv, _ := e.Reserver.Levels(ctx, "ret:1")
	rem, _ := st.Remaining(ctx, "ret:1")
	if lv.Available != rem {
		t.Errorf("Redis %d, store %d", lv.Available, rem)
	}
	a18Verify(t, ctx, e.Reserver, st, acks)
}

// The same flaw by the documented road: Redis loses an item's ledger hash (an evicted key) after
// every event went through the queue and was applied. A repairing pass re-records the entries
// from the store; the re-recorded entry of a restock fails the scripts' own checks, so every later
// pass over the item fails with ErrInvalid, and Ledger cannot read that id.
func TestAttack18LedgerLostRerecordedRestockBreaksItem(t *testing.T) {
	ctx, e, st, rng := a18Setup(t, 14)
	skus := []string{"ev:1"}
	acks := a18Traffic(t, ctx, e.Reserver, st.Store, skus, 60, rng)
	if len(acks.restock["ev:1"]) == 0 {
		t.Fatal("the traffic made no restock")
	}
	q := &a18Queue{}
	rl, err := stockops.NewRelay(e.Reserver, nil, q, nil)
	if err != nil {
		t.Fatal(err)
	}
	a18Drain(t, ctx, e, rl, skus)
	a18ConsumeAll(t, ctx, e.Reserver, st, q.take(), rng)
	a18Verify(t, ctx, e.Reserver, st, acks)
	lost := 0
	for _, k := range e.Redis.Keys() { // the item's ledger: the hash whose key ends in ":l"
		if strings.HasSuffix(k, ":l") && strings.Contains(k, "{ev:1}") {
			e.Redis.Del(k)
			lost++
		}
	}
	if lost != 1 {
		t.Fatalf("found %d ledger keys of the item to evict", lost)
	}
	rec, err := stockops.NewReconciler(e.Reserver, st.Store, nil)
	if err != nil {
		t.Fatal(err)
	}
	rerecorded := 0
	for i := 0; i < 3; i++ {
		reps, err := rec.Once(ctx)
		if err != nil {
			t.Errorf("pass %d after the ledger was lost: %v", i, err)
		}
		for _, rp := range reps {
			rerecorded += rp.Rerecorded
		}
	}
	if rerecorded == 0 {
		t.Error("no pass re-recorded the lost entries")
	}
	for id := range acks.restock["ev:1"] {
		if _, err := e.Reserver.Ledger(ctx, "ev:1", id); err != nil {
			t.Errorf("Ledger of re-recorded restock %s: %v", id, err)
		}
	}
	lv, _ := e.Reserver.Levels(ctx, "ev:1")
	rem, _ := st.Remaining(ctx, "ev:1")
	if lv.Available != rem {
		t.Errorf("Redis %d, store %d", lv.Available, rem)
	}
}

// a18FlakyStore applies and then, now and then, answers an error anyway (the commit went through,
// its answer was lost), or fails before applying.
type a18FlakyStore struct {
	*a18OrderStore
	mu  sync.Mutex
	rng *rand.Rand
}

func (s *a18FlakyStore) Apply(ctx context.Context, ev stock.Event) error {
	s.mu.Lock()
	p := s.rng.IntN(10)
	s.mu.Unlock()
	if p == 0 {
		return errors.New("store: connection reset before the commit")
	}
	err := s.a18OrderStore.Apply(ctx, ev)
	if p <= 2 && err == nil {
		return errors.New("store: connection reset after the commit")
	}
	return err
}

// Consumers whose store loses one answer in three (before or after the commit) and whose contexts
// are sometimes cut short, with duplicated deliveries handed to six consumers at once: every
// failed delivery is redelivered until Consume answers nil. The store must end exactly where the
// acknowledged answers put it, each event applied once.
func TestAttack18FlakyStoreAndContexts(t *testing.T) {
	ctx, e, st, rng := a18Setup(t, 15)
	skus := []string{"f:1", "f:2", "f:3"}
	acks := a18Traffic(t, ctx, e.Reserver, st.Store, skus, 300, rng)
	q := &a18Queue{}
	rl, err := stockops.NewRelay(e.Reserver, nil, q, nil)
	if err != nil {
		t.Fatal(err)
	}
	a18Drain(t, ctx, e, rl, skus)
	flaky := &a18FlakyStore{a18OrderStore: st, rng: rand.New(rand.NewPCG(15, 15))}
	msgs := q.take()
	all := append(append([]stock.Event(nil), msgs...), msgs...)
	rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	work := make(chan stock.Event, len(all))
	for _, ev := range all {
		work <- ev
	}
	var left atomic.Int64
	left.Store(int64(len(all)))
	var wg sync.WaitGroup
	deadline := time.Now().Add(15 * time.Second)
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			n := 0
			for left.Load() > 0 && time.Now().Before(deadline) {
				select {
				case ev := <-work:
					n++
					c, cancel := context.WithCancel(ctx)
					if n%7 == w {
						cancel() // a consumer shutting down mid-call
					}
					err := stock.Consume(c, e.Reserver, flaky, ev)
					cancel()
					switch {
					case err == nil:
						left.Add(-1)
					case errors.Is(err, stock.ErrInvalid):
						t.Errorf("Consume %s %s: %v", ev.SKU, ev.ID, err)
						left.Add(-1)
					default:
						work <- ev
					}
				default:
					time.Sleep(time.Millisecond)
				}
			}
		}(w)
	}
	wg.Wait()
	if n := left.Load(); n > 0 {
		t.Fatalf("%d deliveries never settled", n)
	}
	a18Verify(t, ctx, e.Reserver, st, acks)
}

// A publisher whose call hangs past the context (a broker client that ignores ctx) while Run's
// context ends: Run promises to stop after its Drain bound; when the call finally returns, nothing
// is lost, and the next relay delivers everything once.
func TestAttack18RunPublisherIgnoresContext(t *testing.T) {
	ctx, e, st, rng := a18Setup(t, 16)
	skus := []string{"hang:1"}
	acks := a18Traffic(t, ctx, e.Reserver, st.Store, skus, 40, rng)
	release := make(chan struct{})
	var entered atomic.Bool
	q := &a18Queue{}
	q.batch = func(_ int, evs []stock.Event) ([]error, []bool) {
		entered.Store(true)
		<-release // ignores ctx
		keep := make([]bool, len(evs))
		for i := range keep {
			keep[i] = true
		}
		return make([]error, len(evs)), keep
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- e.Reserver.Run(runCtx, stock.RunOptions{Publisher: q, Drain: 200 * time.Millisecond, Relay: &stock.RelayOptions{Poll: time.Millisecond}})
	}()
	for !entered.Load() {
		time.Sleep(time.Millisecond)
	}
	cancel()
	var returned bool
	select {
	case <-done:
		returned = true
	case <-time.After(3 * time.Second):
	}
	close(release)
	if !returned {
		<-done
		t.Errorf("Run returned only once the hung publisher call returned (not within 3s of the cancel, Drain 200ms)")
	}
	e.Advance(2 * time.Minute)
	q.batch = nil
	rl, err := stockops.NewRelay(e.Reserver, nil, q, nil)
	if err != nil {
		t.Fatal(err)
	}
	a18Drain(t, ctx, e, rl, skus)
	a18ConsumeAll(t, ctx, e.Reserver, st, q.take(), rng)
	a18Verify(t, ctx, e.Reserver, st, acks)
}
