package stocktest

// Each check of TestStore and TestPublisher passes on a good implementation and fails on one
// broken for it (the fakes here are exported to the external tests through BrokenStore and
// MemQueuePair).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockres/stock"
	"github.com/stockres/stock/memstore"
)

// fakeT records a check's failure instead of failing the test that runs it.
type fakeT struct {
	testing.TB
	mu      sync.Mutex
	failed  bool
	skipped bool
	msg     string
}

func (f *fakeT) Helper() {}
func (f *fakeT) fail(msg string, stop bool) {
	f.mu.Lock()
	f.failed, f.msg = true, msg
	f.mu.Unlock()
	if stop {
		runtime.Goexit()
	}
}
func (f *fakeT) Fatalf(format string, a ...any) { f.fail(fmt.Sprintf(format, a...), true) }
func (f *fakeT) Fatal(a ...any)                 { f.fail(fmt.Sprint(a...), true) }
func (f *fakeT) FailNow()                       { f.fail("FailNow", true) }
func (f *fakeT) Errorf(format string, a ...any) { f.fail(fmt.Sprintf(format, a...), false) }
func (f *fakeT) Error(a ...any)                 { f.fail(fmt.Sprint(a...), false) }
func (f *fakeT) Fail()                          { f.fail("Fail", false) }
func (f *fakeT) Skip(a ...any)                  { f.skipped = true; runtime.Goexit() }
func (f *fakeT) SkipNow()                       { f.skipped = true; runtime.Goexit() }
func (f *fakeT) Failed() bool                   { f.mu.Lock(); defer f.mu.Unlock(); return f.failed }

// RunOnFakeT runs f on a TB that records failures instead of failing t (Fatal* and Skip* end
// f's goroutine, as the testing package does; Cleanup goes to t), and reports whether f failed
// or skipped, and why. It is exported for this package's external tests.
func RunOnFakeT(t testing.TB, f func(testing.TB)) (failed, skipped bool, msg string) {
	ft := &fakeT{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(ft)
	}()
	<-done
	return ft.failed, ft.skipped, ft.msg
}

// runChecked runs the check name with RunOnFakeT and reports whether it failed, and why; a
// check must not skip.
func runChecked(t *testing.T, name string, run func(testing.TB)) (failed bool, msg string) {
	failed, skipped, msg := RunOnFakeT(t, run)
	if skipped {
		t.Fatalf("check %s skipped", name)
	}
	return failed, msg
}

// runCheck runs the Store check c on s.
func runCheck(t *testing.T, c storeCheck, s stock.Store) (failed bool, msg string) {
	return runChecked(t, c.name, func(tb testing.TB) { c.run(tb, s, s.(Loader)) })
}

// hooked is a memstore with Apply, Remaining, Records or ApplyBatch replaced.
type hooked struct {
	*memstore.Store
	apply     func(ctx context.Context, ev stock.Event) error
	remaining func(ctx context.Context, sku string) (int64, error)
	records   func(ctx context.Context, sku string, ids []string) (map[string]stock.Record, error)
}

func (h *hooked) Apply(ctx context.Context, ev stock.Event) error {
	if h.apply != nil {
		return h.apply(ctx, ev)
	}
	return h.Store.Apply(ctx, ev)
}

func (h *hooked) Remaining(ctx context.Context, sku string) (int64, error) {
	if h.remaining != nil {
		return h.remaining(ctx, sku)
	}
	return h.Store.Remaining(ctx, sku)
}

func (h *hooked) Records(ctx context.Context, sku string, ids []string) (map[string]stock.Record, error) {
	if h.records != nil {
		return h.records(ctx, sku, ids)
	}
	return h.Store.Records(ctx, sku, ids)
}

// ApplyBatch applies evs one by one with h.Apply, as memstore does, up to the first error
// that is not a refusal; the events after it get an error.
func (h *hooked) ApplyBatch(ctx context.Context, evs []stock.Event) []error {
	errs := make([]error, len(evs))
	for i, ev := range evs {
		errs[i] = h.Apply(ctx, ev)
		if errs[i] != nil && !errors.Is(errs[i], stock.ErrRefused) {
			for j := i + 1; j < len(evs); j++ {
				errs[j] = errors.New("not applied after an earlier failure")
			}
			break
		}
	}
	return errs
}

// good is memstore, answering ErrNotLoaded to a restock of an unknown item, as the stock.Store
// doc says.
func good() *hooked {
	h := &hooked{Store: memstore.New()}
	h.apply = func(ctx context.Context, ev stock.Event) error {
		if ev.Type == stock.EventRestocked {
			if _, err := h.Store.Remaining(ctx, ev.SKU); errors.Is(err, stock.ErrNotLoaded) {
				return fmt.Errorf("restock: %w", stock.ErrNotLoaded)
			}
		}
		return h.Store.Apply(ctx, ev)
	}
	return h
}

// applyFunc is the signature of Store.Apply.
type applyFunc = func(ctx context.Context, ev stock.Event) error

// broken returns, for each check, a store that breaks the rule it checks.
func broken() map[string]func() stock.Store {
	var n atomic.Int64
	fresh := func(id string) string { return fmt.Sprintf("%s#%d", id, n.Add(1)) }
	// withApply is good() with Apply replaced by f, which gets the store (its memstore below the
	// hooks) and the good Apply as next.
	withApply := func(f func(h *hooked, next applyFunc, ctx context.Context, ev stock.Event) error) func() stock.Store {
		return func() stock.Store {
			h := good()
			next := h.apply
			h.apply = func(ctx context.Context, ev stock.Event) error { return f(h, next, ctx, ev) }
			return h
		}
	}
	retype := func(from, to stock.EventType) func() stock.Store {
		return withApply(func(_ *hooked, next applyFunc, ctx context.Context, ev stock.Event) error {
			if ev.Type == from {
				ev.Type = to
			}
			return next(ctx, ev)
		})
	}
	return map[string]func() stock.Store{
		"DeductDecrements":  retype(stock.EventDeducted, stock.EventHeld),
		"ConfirmDecrements": retype(stock.EventConfirmed, stock.EventHeld),
		"DeductIdempotent": withApply(func(_ *hooked, next applyFunc, ctx context.Context, ev stock.Event) error {
			if ev.Type == stock.EventDeducted {
				if err := next(ctx, ev); err != nil {
					return err
				}
				ev.ID = fresh(ev.ID) // every repeat takes stock again
			}
			return next(ctx, ev)
		}),
		"DeductExactStock": withApply(func(h *hooked, next applyFunc, ctx context.Context, ev stock.Event) error {
			if rem, err := h.Store.Remaining(ctx, ev.SKU); err == nil && ev.Type == stock.EventDeducted && rem == ev.Qty {
				return stock.ErrRefused // off by one: refuses what the stock exactly covers
			}
			return next(ctx, ev)
		}),
		"RefusalIsFinal": withApply(func(h *hooked, next applyFunc, ctx context.Context, ev stock.Event) error {
			if ev.Type == stock.EventDeducted {
				if m, _ := h.Store.Records(ctx, ev.SKU, []string{ev.ID}); m[ev.ID].Status == stock.StateRefused {
					ev.ID = fresh(ev.ID) // retries a refused id
				}
			}
			return next(ctx, ev)
		}),
		"RepeatAppliedWhenLow": withApply(func(h *hooked, next applyFunc, ctx context.Context, ev stock.Event) error {
			if ev.Type == stock.EventDeducted || ev.Type == stock.EventConfirmed {
				// Checks the stock before it looks the id up: a repeat of an applied
				// decrement is refused once the stock no longer covers it.
				if rem, err := h.Store.Remaining(ctx, ev.SKU); err != nil || rem < ev.Qty {
					if err := next(ctx, ev); err != nil { // records a new id's refusal
						return err
					}
					return fmt.Errorf("low: %w", stock.ErrRefused)
				}
			}
			return next(ctx, ev)
		}),
		"DeductUnknownItemNotLoaded": withApply(func(h *hooked, next applyFunc, ctx context.Context, ev stock.Event) error {
			if _, err := h.Store.Remaining(ctx, ev.SKU); errors.Is(err, stock.ErrNotLoaded) {
				return stock.ErrRefused // a refusal, which would make the relay give the sale back
			}
			return next(ctx, ev)
		}),
		"RestoreGivesBackOnce": withApply(func(_ *hooked, next applyFunc, ctx context.Context, ev stock.Event) error {
			if ev.Type == stock.EventRestored {
				if err := next(ctx, ev); err != nil {
					return err
				}
				return next(ctx, stock.Event{Type: stock.EventRestocked, SKU: ev.SKU, ID: fresh(ev.ID), Qty: ev.Qty})
			}
			return next(ctx, ev)
		}),
		"RefusedEventGivesBack": retype(stock.EventRefused, stock.EventCancelled),
		"RestoreBeforeDeductTombstone": withApply(func(h *hooked, next applyFunc, ctx context.Context, ev stock.Event) error {
			if ev.Type == stock.EventRestored {
				if m, _ := h.Store.Records(ctx, ev.SKU, []string{ev.ID}); len(m) == 0 {
					return nil // no tombstone
				}
			}
			return next(ctx, ev)
		}),
		"RefusalBeforeDeductTombstone": withApply(func(h *hooked, next applyFunc, ctx context.Context, ev stock.Event) error {
			if ev.Type == stock.EventRefused {
				if m, _ := h.Store.Records(ctx, ev.SKU, []string{ev.ID}); len(m) == 0 {
					return nil // a restore leaves a tombstone, a refusal none
				}
			}
			return next(ctx, ev)
		}),
		"RestoreOfRefusedGivesNothing": withApply(func(h *hooked, next applyFunc, ctx context.Context, ev stock.Event) error {
			if ev.Type == stock.EventRestored || ev.Type == stock.EventRefused {
				m, _ := h.Store.Records(ctx, ev.SKU, []string{ev.ID})
				if r, ok := m[ev.ID]; ok && r.Status == stock.StateRefused {
					// gives back what the refused decrement would have taken
					return next(ctx, stock.Event{Type: stock.EventRestocked, SKU: ev.SKU, ID: fresh(ev.ID), Qty: r.Qty})
				}
			}
			return next(ctx, ev)
		}),
		"RestockAddsOnce": withApply(func(_ *hooked, next applyFunc, ctx context.Context, ev stock.Event) error {
			if ev.Type == stock.EventRestocked {
				ev.ID = fresh(ev.ID)
			}
			return next(ctx, ev)
		}),
		"RestockUnknownItemNotLoaded": withApply(func(_ *hooked, next applyFunc, ctx context.Context, ev stock.Event) error {
			err := next(ctx, ev)
			if errors.Is(err, stock.ErrNotLoaded) {
				return stock.ErrRefused // the wrong answer for a restock of an unknown item
			}
			return err
		}),
		"OtherEventsIgnored": retype(stock.EventHeld, stock.EventDeducted),
		"IDsScopedPerItem": func() stock.Store {
			var mu sync.Mutex
			seen := map[string]string{} // id → the first sku it was seen on
			return withApply(func(_ *hooked, next applyFunc, ctx context.Context, ev stock.Event) error {
				mu.Lock()
				sku, ok := seen[ev.ID]
				if !ok {
					seen[ev.ID], sku = ev.SKU, ev.SKU
				}
				mu.Unlock()
				ev.SKU = sku // keys records on the id alone
				return next(ctx, ev)
			})()
		},
		"RemainingUnknownItem": func() stock.Store {
			h := good()
			h.remaining = func(ctx context.Context, sku string) (int64, error) {
				n, err := h.Store.Remaining(ctx, sku)
				if errors.Is(err, stock.ErrNotLoaded) {
					return 0, nil
				}
				return n, err
			}
			return h
		},
		"RecordsUnknownIDsAbsent": func() stock.Store {
			h := good()
			h.records = func(ctx context.Context, sku string, ids []string) (map[string]stock.Record, error) {
				m, err := h.Store.Records(ctx, sku, ids)
				for _, id := range ids {
					if _, ok := m[id]; !ok && err == nil {
						m[id] = stock.Record{SKU: sku, ID: id}
					}
				}
				return m, err
			}
			return h
		},
		"ConcurrentSameID": func() stock.Store {
			h := good()
			next := h.apply
			var mu sync.Mutex
			seen := map[string]bool{}
			h.apply = func(ctx context.Context, ev stock.Event) error {
				mu.Lock()
				dup := seen[ev.ID]
				mu.Unlock()
				if dup {
					return nil
				}
				time.Sleep(5 * time.Millisecond) // check, then act: not atomic
				mu.Lock()
				seen[ev.ID] = true
				mu.Unlock()
				ev.ID = fresh(ev.ID)
				return next(ctx, ev)
			}
			return h
		},
		"ConcurrentGiveBackOnce": func() stock.Store {
			h := good()
			next := h.apply
			var mu sync.Mutex
			h.apply = func(ctx context.Context, ev stock.Event) error {
				if ev.Type != stock.EventRestored && ev.Type != stock.EventRefused {
					return next(ctx, ev)
				}
				m, _ := h.Store.Records(ctx, ev.SKU, []string{ev.ID})
				r, ok := m[ev.ID]
				if !ok || r.Status != stock.StateApplied || r.Type == stock.EventRestocked {
					return next(ctx, ev)
				}
				time.Sleep(5 * time.Millisecond) // check, then act: not one transaction
				mu.Lock()
				defer mu.Unlock()
				rem, err := h.Store.Remaining(ctx, ev.SKU)
				if err != nil {
					return err
				}
				if err := next(ctx, ev); err != nil { // flips the record (and gives back once)
					return err
				}
				h.Store.Set(ev.SKU, rem+r.Qty) // gives back what the stale read said, again
				return nil
			}
			return h
		},
		"ConcurrentNoOversell": withApply(func(h *hooked, next applyFunc, ctx context.Context, ev stock.Event) error {
			if ev.Type != stock.EventDeducted {
				return next(ctx, ev)
			}
			rem, err := h.Store.Remaining(ctx, ev.SKU)
			if err != nil || rem < ev.Qty {
				return stock.ErrRefused
			}
			time.Sleep(5 * time.Millisecond) // read, then write: not one transaction
			h.Store.Set(ev.SKU, max(rem-ev.Qty, 0))
			return nil
		}),
		"Batch":                 func() stock.Store { return &allNilBatch{good()} },
		"BatchStopsAtFailure":   func() stock.Store { return &noStopBatch{good()} },
		"BatchAnswersUnapplied": func() stock.Store { return &unappliedNilBatch{good()} },
	}
}

// BrokenStore is, for this package's external tests, the store broken() holds for the check
// name, good() for "good", or for "Oversells" one that takes a deduct whenever some stock is
// left, however little, and goes negative.
func BrokenStore(name string) stock.Store {
	switch name {
	case "good":
		return good()
	case "Oversells":
		h := good()
		next := h.apply
		h.apply = func(ctx context.Context, ev stock.Event) error {
			rem, err := h.Store.Remaining(ctx, ev.SKU)
			if err != nil || ev.Type != stock.EventDeducted || rem <= 0 || rem >= ev.Qty {
				return next(ctx, ev)
			}
			if m, _ := h.Store.Records(ctx, ev.SKU, []string{ev.ID}); len(m) > 0 {
				return next(ctx, ev) // a repeat
			}
			h.Store.Set(ev.SKU, ev.Qty) // covers it, then takes it from what was there
			if err := next(ctx, ev); err != nil {
				return err
			}
			h.Store.Set(ev.SKU, rem-ev.Qty)
			return nil
		}
		return h
	}
	return broken()[name]()
}

// noStopBatch applies every event of a batch, past an error that is not a refusal.
type noStopBatch struct{ *hooked }

func (b *noStopBatch) ApplyBatch(ctx context.Context, evs []stock.Event) []error {
	errs := make([]error, len(evs))
	for i, ev := range evs {
		errs[i] = b.Apply(ctx, ev)
	}
	return errs
}

// unappliedNilBatch stops at the first error that is not a refusal, but answers nil for the
// events it left unapplied.
type unappliedNilBatch struct{ *hooked }

func (b *unappliedNilBatch) ApplyBatch(ctx context.Context, evs []stock.Event) []error {
	errs := b.hooked.ApplyBatch(ctx, evs)
	for i, err := range errs {
		if err != nil && !errors.Is(err, stock.ErrRefused) {
			clear(errs[i+1:])
			break
		}
	}
	return errs
}

// allNilBatch answers nil to every event of a batch, refused or not.
type allNilBatch struct{ *hooked }

func (b *allNilBatch) ApplyBatch(ctx context.Context, evs []stock.Event) []error {
	b.hooked.ApplyBatch(ctx, evs)
	return make([]error, len(evs))
}

// checksCanFail runs each check, by runOn(t, i, good or broken), on a good implementation,
// which it must pass, and on the broken one made for it, which it must fail, so that no check
// is vacuous; broken names the checks that have a broken implementation, all of them.
func checksCanFail(t *testing.T, names []string, broken func(name string) bool, runOn func(t *testing.T, i int, broken bool) (failed bool, msg string)) {
	for i, name := range names {
		t.Run(name, func(t *testing.T) {
			if failed, msg := runOn(t, i, false); failed {
				t.Fatalf("fails on a good implementation: %s", msg)
			}
			if !broken(name) {
				t.Fatalf("no broken implementation for check %s", name)
			}
			failed, msg := runOn(t, i, true)
			if !failed {
				t.Fatalf("passes on an implementation that breaks it")
			}
			t.Logf("broken implementation: %.300s", msg)
		})
	}
}

// TestChecksCanFail: each check passes on a store that keeps the contract and fails on one
// that breaks the rule it checks, so no check is vacuous.
func TestChecksCanFail(t *testing.T) {
	bad := broken()
	var names []string
	for _, c := range storeChecks {
		names = append(names, c.name)
	}
	checksCanFail(t, names, func(n string) bool { return bad[n] != nil }, func(t *testing.T, i int, broken bool) (bool, string) {
		s := stock.Store(good())
		if broken {
			s = bad[names[i]]()
		}
		return runCheck(t, storeChecks[i], s)
	})
	if len(bad) != len(storeChecks) {
		t.Fatalf("%d broken stores for %d checks", len(bad), len(storeChecks))
	}
}

// TestStoreOnGoodStore runs TestStore itself on a store that keeps the contract.
func TestStoreOnGoodStore(t *testing.T) {
	TestStore(t, func(*testing.T) stock.Store { return good() })
}

// refusedUnappliedBatch stops at the first error that is not a refusal, but answers the events
// it left unapplied as refused.
type refusedUnappliedBatch struct{ *hooked }

func (b *refusedUnappliedBatch) ApplyBatch(ctx context.Context, evs []stock.Event) []error {
	errs := b.hooked.ApplyBatch(ctx, evs)
	for i, err := range errs {
		if err != nil && !errors.Is(err, stock.ErrRefused) {
			for j := i + 1; j < len(errs); j++ {
				errs[j] = fmt.Errorf("not applied: %w", stock.ErrRefused)
			}
			break
		}
	}
	return errs
}

// TestBatchAnswersUnappliedNotRefused: an unapplied event answered as refused fails the check
// too, since a refusal says the store recorded it for good.
func TestBatchAnswersUnappliedNotRefused(t *testing.T) {
	for _, c := range storeChecks {
		if c.name != "BatchAnswersUnapplied" {
			continue
		}
		failed, msg := runCheck(t, c, &refusedUnappliedBatch{good()})
		if !failed {
			t.Fatalf("passes on a store that answers its unapplied events as refused")
		}
		t.Logf("broken store: %s", msg)
		return
	}
	t.Fatal("no check BatchAnswersUnapplied")
}

// ---------------------------------------------------------------------------------------------
// The checks of TestPublisher against an in-memory queue, correct and broken.

// memQueue is an in-memory queue with one consumer group: a message goes to one member at a
// time; one that was not acknowledged (retried, or held by a crashed member) goes to the back
// of the queue, after the messages published since. Its knobs break it on purpose.
type memQueue struct {
	mu       sync.Mutex
	ready    [][]byte
	inflight map[*memDelivery]*memConsumer
	n        int

	dropEvery  int                              // Publish drops every n-th event and answers nil
	mangle     func(ev stock.Event) stock.Event // applied to each event published
	crashLoses bool                             // a crashed member's messages are lost
	ackKeeps   bool                             // Ack puts the message back, as Retry does
}

func newMemQueue() *memQueue { return &memQueue{inflight: map[*memDelivery]*memConsumer{}} }

func (q *memQueue) Publish(_ context.Context, ev stock.Event) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.n++
	if q.dropEvery > 0 && q.n%q.dropEvery == 0 {
		return nil
	}
	if q.mangle != nil {
		ev = q.mangle(ev)
	}
	data, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	q.ready = append(q.ready, data)
	return nil
}

func (q *memQueue) pair(*testing.T) PublisherPair {
	return PublisherPair{
		Publisher:   q,
		NewConsumer: func(testing.TB) Consumer { return &memConsumer{q: q} },
		Redelivery:  50 * time.Millisecond,
	}
}

type memConsumer struct {
	q    *memQueue
	dead bool
}

type memDelivery struct {
	q    *memQueue
	data []byte
}

func (d *memDelivery) Event() (stock.Event, error) {
	var ev stock.Event
	err := json.Unmarshal(d.data, &ev)
	return ev, err
}

func (d *memDelivery) settle(back bool) {
	d.q.mu.Lock()
	defer d.q.mu.Unlock()
	if _, ok := d.q.inflight[d]; !ok {
		return
	}
	delete(d.q.inflight, d)
	if back {
		d.q.ready = append(d.q.ready, d.data)
	}
}

func (d *memDelivery) Ack(context.Context) error   { d.settle(d.q.ackKeeps); return nil }
func (d *memDelivery) Retry(context.Context) error { d.settle(true); return nil }

func (c *memConsumer) Receive(_ context.Context, max int, wait time.Duration) ([]Delivery, error) {
	deadline := time.Now().Add(wait)
	for {
		c.q.mu.Lock()
		if c.dead {
			c.q.mu.Unlock()
			return nil, nil
		}
		n := min(max, len(c.q.ready))
		if n > 0 {
			out := make([]Delivery, n)
			for i := range n {
				d := &memDelivery{q: c.q, data: c.q.ready[i]}
				c.q.inflight[d] = c
				out[i] = d
			}
			c.q.ready = c.q.ready[n:]
			c.q.mu.Unlock()
			return out, nil
		}
		c.q.mu.Unlock()
		if time.Now().After(deadline) {
			return nil, nil
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (c *memConsumer) Crash() {
	c.q.mu.Lock()
	defer c.q.mu.Unlock()
	c.dead = true
	for d, owner := range c.q.inflight {
		if owner == c {
			delete(c.q.inflight, d)
			if !c.q.crashLoses {
				c.q.ready = append(c.q.ready, d.data)
			}
		}
	}
}

// brokenQueues holds, for each check of TestPublisher, a queue that breaks what it checks.
var brokenQueues = map[string]func() *memQueue{
	"AtLeastOnce": func() *memQueue { q := newMemQueue(); q.dropEvery = 5; return q },
	"OrderAfterCrash": func() *memQueue {
		q := newMemQueue()
		q.crashLoses = true
		return q
	},
	"CrashesKeepOrder": func() *memQueue {
		q := newMemQueue()
		q.mangle = func(ev stock.Event) stock.Event { ev.Seq = 0; return ev } // loses the sequence
		return q
	},
	"ExactlyOnceInEffect": func() *memQueue { q := newMemQueue(); q.ackKeeps = true; return q },
}

// MemQueuePair is, for this package's external tests, the pair of a correct memQueue (mode
// "correct") or of the queue brokenQueues holds for the check mode names.
func MemQueuePair(t *testing.T, mode string) PublisherPair {
	if mode == "correct" {
		return newMemQueue().pair(t)
	}
	return brokenQueues[mode]().pair(t)
}

// runPubCheck runs the Publisher check c on q.
func runPubCheck(t *testing.T, c publisherCheck, q *memQueue) (failed bool, msg string) {
	return runChecked(t, c.name, func(tb testing.TB) { c.run(tb, newPubRig(tb, q.pair(t))) })
}

// TestPublisherChecksCanFail: each check of TestPublisher passes on a queue that keeps the
// rules and fails on one that breaks the rule it checks.
func TestPublisherChecksCanFail(t *testing.T) {
	var names []string
	for _, c := range publisherChecks {
		names = append(names, c.name)
	}
	checksCanFail(t, names, func(n string) bool { return brokenQueues[n] != nil }, func(t *testing.T, i int, broken bool) (bool, string) {
		q := newMemQueue()
		if broken {
			q = brokenQueues[names[i]]()
		}
		return runPubCheck(t, publisherChecks[i], q)
	})
	if len(brokenQueues) != len(publisherChecks) {
		t.Fatalf("%d broken queues for %d checks", len(brokenQueues), len(publisherChecks))
	}
}

// TestPublisherOnMemQueue runs TestPublisher itself on a queue that keeps the rules.
func TestPublisherOnMemQueue(t *testing.T) {
	TestPublisher(t, func(t *testing.T) PublisherPair { return newMemQueue().pair(t) })
}
