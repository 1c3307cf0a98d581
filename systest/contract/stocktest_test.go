package contract_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
	"github.com/stockres/stock/stocktest"
)

// childRunOptions are the option sets TestChild runs through Run on miniredis.
var childRunOptions = map[string]stock.RunOptions{
	"sweep-negative":      {SweepInterval: -1},
	"guard-negative":      {GuardInterval: -1},
	"carts-negative":      {RecoverCartsAfter: -1},
	"drain-negative":      {Drain: -1},
	"reconcile-negative":  {Reconcile: &stock.ReconcileOptions{Interval: -1}},
	"all-negative":        {SweepInterval: -1, GuardInterval: -1, RecoverCartsAfter: -1, Drain: -1},
	"carts-1ns":           {RecoverCartsAfter: time.Nanosecond},
	"sweep-1ns":           {SweepInterval: time.Nanosecond},
	"reconcile-1ns":       {Reconcile: &stock.ReconcileOptions{Interval: time.Nanosecond}},
	"poll-1ns":            {Relay: &stock.RelayOptions{Poll: time.Nanosecond}},
	"huge":                {SweepInterval: math.MaxInt64, GuardInterval: math.MaxInt64, RecoverCartsAfter: math.MaxInt64, Drain: math.MaxInt64},
	"huge-reconcile":      {Reconcile: &stock.ReconcileOptions{Interval: math.MaxInt64}},
	"huge-relay":          {Relay: &stock.RelayOptions{Lease: math.MaxInt64, MinBackoff: math.MaxInt64, MaxBackoff: math.MaxInt64, Poll: math.MaxInt64}},
	"backoff-min-gt-max":  {Relay: &stock.RelayOptions{MinBackoff: time.Minute, MaxBackoff: time.Second}},
	"retention-negative":  {Reconcile: &stock.ReconcileOptions{Retention: -1}},
	"retention-1ns":       {Reconcile: &stock.ReconcileOptions{Retention: time.Nanosecond}},
	"items-unknown-relay": {Relay: &stock.RelayOptions{Items: []string{"nope", "a{b"}}},
}

// TestChild is run by child in a process of its own; it does nothing in a normal run.
func TestChild(t *testing.T) {
	name := os.Getenv("STOCK_TEST_CHILD")
	if name == "" {
		return
	}
	if strings.HasPrefix(name, "store:") {
		stocktest.TestStore(t, func(t *testing.T) stock.Store { return newMutant(strings.TrimPrefix(name, "store:")) })
		return
	}
	switch name {
	case "stocktest-bad-option":
		stocktest.New(t, stock.WithPrefix("a{b"))
		t.Log("CHILD-RESULT stocktest.New accepted a bad option")
		return
	case "panic-store":
		cctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		err := childReserver(t).Run(cctx, stock.RunOptions{Store: panicStore{}})
		t.Logf("CHILD-RESULT Run with a panicking Store returned %v", err)
		return
	}
	o, ok := childRunOptions[name]
	require.True(t, ok, name)
	for _, withStore := range []bool{false, true} {
		r := childReserver(t)
		st := memstore.New()
		require.NoError(t, st.Load(context.Background(), "k", 10))
		if withStore {
			o.Store = st
		}
		cctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		err := r.Run(cctx, o)
		cancel()
		if !errors.Is(err, stock.ErrInvalid) {
			require.ErrorIs(t, err, context.DeadlineExceeded, "Run returns ctx's error (store %v)", withStore)
		}
		t.Logf("CHILD-RESULT store=%v err=%v", withStore, err)
	}
}

// childReserver returns the Reserver of a new stocktest kit with item k of 10 units, one of them
// sold.
func childReserver(t *testing.T) *stock.Reserver {
	t.Helper()
	r := stocktest.New(t).Reserver
	require.NoError(t, r.Load(context.Background(), "k", 10))
	require.NoError(t, testkit.Err(r.Deduct(context.Background(), stock.Request{SKU: "k", ID: "d", Qty: 1})))
	return r
}

// mutant is a Store written against the stock.Store contract, with one rule broken on purpose
// (named by its knob; "correct" breaks none): the conformance suite stocktest.TestStore must fail
// every mutant but "correct".
type mutant struct {
	knob  string
	mu    sync.Mutex
	items map[string]int64
	recs  map[string]*stock.Record // key: sku + "\x00" + id ("scope-by-id": id only)
}

func newMutant(knob string) stock.Store {
	m := &mutant{knob: knob, items: map[string]int64{}, recs: map[string]*stock.Record{}}
	if strings.HasPrefix(knob, "batch-") {
		return &batchMutant{m}
	}
	return m
}

// pause lets other calls in for a millisecond (m.mu is held around it), as a Store that does not
// hold one lock from its check to its write would.
func (m *mutant) pause() {
	m.mu.Unlock()
	time.Sleep(time.Millisecond)
	m.mu.Lock()
}

func (m *mutant) key(sku, id string) string {
	if m.knob == "scope-by-id" {
		return id
	}
	return sku + "\x00" + id
}

func (m *mutant) Load(_ context.Context, sku string, qty int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.items[sku]; ok {
		return stock.ErrLoaded
	}
	m.items[sku] = qty
	return nil
}

func (m *mutant) Apply(_ context.Context, ev stock.Event) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := m.key(ev.SKU, ev.ID)
	rec := m.recs[k]
	newRec := func(st stock.State) {
		m.recs[k] = &stock.Record{SKU: ev.SKU, ID: ev.ID, User: ev.User, Type: ev.Type, Qty: ev.Qty, Status: st, At: time.Now()}
	}
	switch ev.Type {
	case stock.EventDeducted, stock.EventConfirmed:
		if ev.Type == stock.EventConfirmed && m.knob == "confirm-ignored" {
			return nil
		}
		if rec != nil && !(m.knob == "restock-twice" && rec.Type == stock.EventRestocked) {
			if m.knob == "repeat-applied-error" && rec.Status == stock.StateApplied {
				return errors.New("mutant: duplicate key")
			}
			switch rec.Status {
			case stock.StateRefused:
				if m.knob == "repeat-refusal-nil" {
					return nil
				}
				return fmt.Errorf("mutant: %w", stock.ErrRefused)
			default:
				return nil
			}
		}
		rem, known := m.items[ev.SKU]
		if !known {
			if m.knob == "unknown-item-deduct-ok" {
				newRec(stock.StateApplied)
				return nil
			}
			return fmt.Errorf("mutant: unknown item: %w", stock.ErrNotLoaded) // nothing recorded
		}
		covers := rem >= ev.Qty
		if m.knob == "off-by-one" {
			covers = rem > ev.Qty
		}
		switch m.knob {
		case "racy":
			m.pause()
			rem = m.items[ev.SKU]
		case "racy-same-id": // rechecks the stock after the pause, not the id
			m.pause()
			rem = m.items[ev.SKU]
			covers = rem >= ev.Qty
		case "racy-oversell": // rechecks the id after the pause, not the stock
			m.pause()
			if m.recs[k] != nil {
				return nil
			}
			rem = m.items[ev.SKU]
		}
		if !covers {
			if m.knob != "refusal-not-recorded" {
				newRec(stock.StateRefused)
			}
			return fmt.Errorf("mutant: %w", stock.ErrRefused)
		}
		m.items[ev.SKU] = rem - ev.Qty
		st := stock.StateApplied
		newRec(st)
		return nil
	case stock.EventRestored, stock.EventRefused:
		if rec == nil {
			if m.knob == "no-tombstone" || (m.knob == "refused-no-tombstone" && ev.Type == stock.EventRefused) {
				return nil
			}
			newRec(stock.StateRestored)
			return nil
		}
		if m.knob == "restore-refused-gives" && rec.Status == stock.StateRefused {
			m.items[ev.SKU] += rec.Qty
			rec.Status = stock.StateRestored
			return nil
		}
		if m.knob == "restore-repeat-error" && (rec.Type == stock.EventRestored || rec.Type == stock.EventRefused || rec.Status == stock.StateRestored) {
			return errors.New("mutant: already restored")
		}
		if rec.Status == stock.StateApplied && (rec.Type == stock.EventDeducted || rec.Type == stock.EventConfirmed) {
			back := rec.Qty
			if m.knob == "restore-one" {
				back = 1
			}
			m.items[ev.SKU] += back
			if m.knob != "restore-twice" {
				rec.Status = stock.StateRestored
			}
		}
		return nil
	case stock.EventRestocked:
		if _, known := m.items[ev.SKU]; !known {
			if m.knob == "restock-unknown-nil" {
				return nil
			}
			return fmt.Errorf("mutant: %w", stock.ErrNotLoaded)
		}
		if rec != nil && m.knob == "restock-repeat-error" {
			return errors.New("mutant: duplicate restock")
		}
		if rec != nil && m.knob != "restock-twice" {
			return nil
		}
		m.items[ev.SKU] += ev.Qty
		newRec(stock.StateApplied)
		return nil
	case stock.EventCancelled, stock.EventExpired:
		if m.knob == "cancelled-increments" {
			m.items[ev.SKU] += ev.Qty
		}
		if m.knob == "other-types-error" {
			return fmt.Errorf("mutant: %w", stock.ErrInvalid)
		}
		return nil
	case stock.EventHeld:
		if m.knob == "other-types-error" {
			return fmt.Errorf("mutant: %w", stock.ErrInvalid)
		}
		if m.knob == "held-decrements" {
			if m.items[ev.SKU] >= ev.Qty {
				m.items[ev.SKU] -= ev.Qty
			}
		}
		return nil
	}
	return nil
}

func (m *mutant) Remaining(_ context.Context, sku string) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rem, ok := m.items[sku]
	if !ok && m.knob == "unknown-remaining-plain" {
		return 0, errors.New("mutant: no such item")
	}
	if !ok && m.knob != "unknown-remaining-zero" {
		return 0, fmt.Errorf("mutant: %w", stock.ErrNotLoaded)
	}
	if ok && rem == 0 && m.knob == "zero-remaining-notloaded" {
		return 0, fmt.Errorf("mutant: %w", stock.ErrNotLoaded)
	}
	return rem, nil
}

func (m *mutant) Records(_ context.Context, sku string, ids []string) (map[string]stock.Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]stock.Record{}
	for _, id := range ids {
		rec := m.recs[m.key(sku, id)]
		if rec == nil {
			if m.knob == "records-extra" {
				out[id] = stock.Record{SKU: sku, ID: id}
			}
			continue
		}
		r := *rec
		switch m.knob {
		case "records-refused-as-applied":
			if r.Status == stock.StateRefused {
				r.Status = stock.StateApplied
			}
		case "records-qty-zero":
			r.Qty = 0
		case "records-user-dropped":
			r.User = ""
		case "records-type-deducted":
			r.Type = stock.EventDeducted
		case "records-sku-empty":
			r.SKU = ""
		}
		out[id] = r
	}
	return out, nil
}

// batchMutant adds ApplyBatch: "batch-correct" stops at the first error that is not a refusal;
// "batch-no-stop" applies the events after it; "batch-nil-errors" answers nil for every event.
type batchMutant struct{ *mutant }

func (b *batchMutant) ApplyBatch(ctx context.Context, evs []stock.Event) []error {
	errs := make([]error, len(evs))
	stopped := false
	for i, ev := range evs {
		if stopped {
			if b.knob != "batch-unapplied-nil" {
				errs[i] = errors.New("mutant: not applied")
			}
			continue
		}
		errs[i] = b.Apply(ctx, ev)
		if errs[i] != nil && !errors.Is(errs[i], stock.ErrRefused) && b.knob != "batch-no-stop" {
			stopped = true
		}
		if b.knob == "batch-nil-errors" {
			errs[i] = nil
		}
	}
	return errs
}

// "TestStore checks that the stores newStore returns keep the contract of stock.Store (and of
// stock.BatchStore, when they implement it)". The control, a Store that keeps every rule ("correct",
// "batch-correct"), passes the suite; each mutant breaks one rule the suite's doc lists, and the
// suite must fail it.
func TestStoreCatchesMutants(t *testing.T) {
	for _, knob := range []string{
		"correct",                    // the control
		"batch-correct",              // the control, a BatchStore
		"repeat-refusal-nil",         // "then and on every repeat"
		"unknown-remaining-zero",     // "Remaining of an unknown item wraps stock.ErrNotLoaded"
		"no-tombstone",               // "before any deduct leaves a tombstone"
		"refused-no-tombstone",       // "a restore or refusal ... leaves a tombstone"
		"racy",                       // "concurrent deducts of distinct ids never oversell"
		"records-extra",              // "leaves out unknown ids"
		"held-decrements",            // "held, cancelled and expired events change nothing"
		"restock-twice",              // "a restock adds once"
		"scope-by-id",                // "ids are scoped per item"
		"unknown-item-deduct-ok",     // "a deduct or confirm of an item the store does not know is not refused but answered stock.ErrNotLoaded"
		"restore-twice",              // "gives back what its id took, once"
		"restore-one",                // "gives back what its id took"
		"refusal-not-recorded",       // "then and on every repeat"
		"restock-unknown-nil",        // "refused with stock.ErrNotLoaded for an unknown item"
		"confirm-ignored",            // "a deduct or confirm decrements"
		"off-by-one",                 // "decrements only when the remaining stock covers it"
		"records-refused-as-applied", // "Records lists what was recorded"
		"records-qty-zero",           // "Records lists what was recorded"
		"racy-same-id",               // "concurrent applies of one id apply it once"
		"racy-oversell",              // "concurrent deducts of distinct ids never oversell"
		"repeat-applied-error",       // "a repeat answers as the first application did"
		"restore-refused-gives",      // "give back what the id's decrement took, if it was applied"
		"cancelled-increments",       // "held, cancelled and expired events change nothing"
		"other-types-error",          // "Other event types are accepted and ignored"
		"unknown-remaining-plain",    // "Remaining of an unknown item wraps stock.ErrNotLoaded"
		"records-user-dropped",       // "Records lists what was recorded"
		"records-type-deducted",      // "Records lists what was recorded"
		"records-sku-empty",          // "Records lists what was recorded"
		"restore-repeat-error",       // "a repeat answers as the first application did"
		"restock-repeat-error",       // "a repeat answers as the first application did"
		"zero-remaining-notloaded",   // Remaining: "ErrNotLoaded if it has no row", not when it is 0
		"batch-unapplied-nil",        // BatchStore: "unapplied events get an error"
		"batch-no-stop",              // BatchStore: "stops at the first error that is not a refusal"
		"batch-nil-errors",           // BatchStore: "one error (or nil) per event ... same meaning as Store.Apply's"
	} {
		t.Run(knob, func(t *testing.T) {
			out, err := child(t, "store:"+knob, 2*time.Minute)
			if strings.HasSuffix(knob, "correct") {
				assert.NoError(t, err, "the correct store %s fails the suite:\n%s", knob, out)
				return
			}
			assert.Error(t, err, "stocktest.TestStore passed a Store that breaks a rule (%s)", knob)
			if err != nil {
				assert.Contains(t, out, "--- FAIL", "the suite failed it (not a crash)")
			}
		})
	}
}

// stocktest: "Advance moves ... the TIME command the scripts read (hold deadlines) and every
// key's TTL (relay leases, backoff) move by d", "and stand still otherwise"; "A negative d is a
// test bug and panics."
func TestStocktestClock(t *testing.T) {
	e := stocktest.New(t)
	ctx := context.Background()
	r := e.Reserver
	t0 := e.Now()
	time.Sleep(20 * time.Millisecond)
	assert.Equal(t, t0, e.Now(), "the clock stands still")
	require.NoError(t, r.Load(ctx, "clk", 5))
	require.NoError(t, testkit.Err(r.Hold(ctx, stock.Request{SKU: "clk", ID: "h", Qty: 1}, 10*time.Minute)))
	e.Advance(10*time.Minute - time.Millisecond)
	assert.Equal(t, t0.Add(10*time.Minute-time.Millisecond), e.Now())
	_, err := r.Extend(ctx, "clk", "h", time.Minute)
	require.NoError(t, err, "the hold is live 1ms before its deadline")
	e.Advance(time.Minute)
	_, err = r.Confirm(ctx, "clk", "h")
	assert.ErrorIs(t, err, stock.ErrExpired)
	assert.Panics(t, func() { e.Advance(-time.Nanosecond) })

	// Backoff moves with Advance: a failed event waits MinBackoff (and no more than its jitter).
	st := memstore.New()
	require.NoError(t, st.Load(ctx, "clk", 5))
	require.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: "clk", ID: "d", Qty: 1})))
	rl := newRelay(t, r, st, nil, &stock.RelayOptions{MinBackoff: time.Hour, MaxBackoff: 2 * time.Hour})
	st.FailWith(memstore.Down)
	_, err = rl.Once(ctx)
	assert.Error(t, err)
	st.FailWith(nil)
	assert.Equal(t, 0, onceDelivered(t, rl), "backing off for an hour")
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, 0, onceDelivered(t, rl), "still backing off: the clock stands still")
	e.Advance(2 * time.Hour)
	assert.Equal(t, 1, onceDelivered(t, rl), "due after Advance")
}

// onceDelivered runs one relay pass and returns how many events it delivered.
func onceDelivered(t *testing.T, rl *stockops.Relay) int {
	t.Helper()
	st, err := rl.Once(context.Background())
	require.NoError(t, err)
	return st.Delivered
}

// panicStore panics in every call.
type panicStore struct{}

func (panicStore) Apply(context.Context, stock.Event) error { panic("store bug") }

func (panicStore) Remaining(context.Context, string) (int64, error) {
	panic("store bug")
}

func (panicStore) Records(context.Context, string, []string) (map[string]stock.Record, error) {
	panic("store bug")
}

// stocktest.New "fails t if stock.New refuses opts".
func TestStocktestNewBadOption(t *testing.T) {
	out, err := child(t, "stocktest-bad-option", time.Minute)
	assert.Error(t, err, "the child test failed")
	assert.NotContains(t, out, "CHILD-RESULT", "New stopped the test")
	assert.Contains(t, out, "--- FAIL")
}

func TestStocktestOneClock(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t)
	r := e.Reserver
	store := memstore.New()
	var down atomic.Bool
	down.Store(true)
	store.FailWith(func(ev stock.Event) error {
		if down.Load() {
			return memstore.ErrDown
		}
		return nil
	})
	skus := []string{"kit:a", "kit:b~ü"}
	loadRedisAndStore(t, r, store, 10, skus...)
	stop := requestRun(t, r, stock.RunOptions{Store: store, SweepInterval: 20 * time.Millisecond,
		Relay:     &stock.RelayOptions{Poll: 10 * time.Millisecond, MinBackoff: 10 * time.Minute, MaxBackoff: 20 * time.Minute},
		Reconcile: &stock.ReconcileOptions{Interval: time.Hour}, RecoverCartsAfter: 5 * time.Minute}, 30*time.Second)

	// Holds: not released by wall-clock time; released by Advance, with no call but Run's.
	require.NoError(t, testkit.Err(r.HoldMany(ctx, stock.Cart{ID: "cart1", User: "u", Lines: []stock.Line{{SKU: skus[0], Qty: 2}, {SKU: skus[1], Qty: 1}}}, 10*time.Minute)))
	require.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: skus[0], ID: "sale", Qty: 1})))
	time.Sleep(400 * time.Millisecond)
	assert.Equal(t, int64(2), testkit.Levels(t, r, skus[0]).Held, "the clock stands still: the hold is live")
	// The store is down: the relay backs off for 10-20 minutes of the kit's clock.
	n := remaining(t, store, skus[0])
	assert.Equal(t, int64(10), n)

	// Cart age: a completed cart is never undone, however old.
	e.Advance(6 * time.Minute)
	undone, err := stockops.RecoverCarts(ctx, r, 5*time.Minute)
	require.NoError(t, err)
	assert.Zero(t, undone, "a completed cart is not undone")
	assert.Equal(t, int64(2), testkit.Levels(t, r, skus[0]).Held, "6 minutes of 10: still held")

	// The store comes back; the backoff passes only with Advance.
	down.Store(false)
	time.Sleep(300 * time.Millisecond)
	e.Advance(5 * time.Minute) // 11 minutes: the holds are due
	require.Eventually(t, func() bool {
		l, err := r.Levels(ctx, skus[0])
		return err == nil && l.Held == 0
	}, 10*time.Second, 20*time.Millisecond, "Run's sweeper releases the holds after Advance")
	_, err = r.ConfirmMany(ctx, "cart1", skus...)
	require.ErrorIs(t, err, stock.ErrExpired)
	e.Advance(21 * time.Minute) // past any backoff
	require.Eventually(t, func() bool {
		n, err := store.Remaining(ctx, skus[0])
		return err == nil && n == 9
	}, 10*time.Second, 20*time.Millisecond, "the relay delivers once the backoff passed on the kit's clock")
	err = stop() // the store was down: Run returns that first error, logged and retried
	assert.True(t, err == nil || errors.Is(err, context.Canceled) || errors.Is(err, memstore.ErrDown), "Run: %v", err)
	assert.LessOrEqual(t, store.MaxApplications(), 1)
	for _, s := range skus {
		p, _, err := stockops.Pending(ctx, r, s)
		require.NoError(t, err)
		assert.Zero(t, p)
	}
}

// stocktest with a lease: a relay that died holding an item's lease (a Store call that never
// returns) hands it over once the lease passes on the kit's clock, and not before.
func TestStocktestLease(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t)
	r := e.Reserver
	require.NoError(t, r.Load(ctx, "lease:x", 5))
	require.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: "lease:x", ID: "a", Qty: 1})))

	stuck := make(chan struct{})
	hung := memstore.New()
	require.NoError(t, hung.Load(ctx, "lease:x", 5))
	entered := make(chan struct{}, 1)
	hung.FailWith(func(stock.Event) error {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-stuck
		return memstore.ErrDown
	})
	defer close(stuck)
	dead := newRelay(t, r, hung, nil, &stock.RelayOptions{Lease: time.Minute})
	go func() { _, _ = dead.Once(context.Background()) }()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first relay never reached the store")
	}
	good := memstore.New()
	require.NoError(t, good.Load(ctx, "lease:x", 5))
	rl := newRelay(t, r, good, nil, &stock.RelayOptions{Lease: time.Minute})
	time.Sleep(200 * time.Millisecond)
	assert.Zero(t, onceDelivered(t, rl), "the lease of the first relay still holds")
	e.Advance(61 * time.Second)
	assert.Equal(t, 1, onceDelivered(t, rl), "after the lease, on the kit's clock, the event is delivered again")
	assert.Equal(t, int64(4), remaining(t, good, "lease:x"))
}
