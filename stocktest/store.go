package stocktest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stockres/stock"
)

// Loader is what TestStore needs besides stock.Store to set a test up: Load
// creates the item sku with qty units remaining, as memstore.Store.Load and
// sqlstore.Store.Load do. A Store under test must implement it.
type Loader interface {
	Load(ctx context.Context, sku string, qty int64) error
}

// TestStore checks that the stores newStore returns keep the contract of
// stock.Store (and of stock.BatchStore, when they implement it), in one
// subtest per rule. newStore is called once per subtest and must return an
// empty store that also implements Loader; it should register any clean-up
// with t.Cleanup. Subtests run one after the other.
//
// The rules checked: Apply is idempotent per (SKU, ID), and a repeat answers
// as the first application did (a repeat of an applied deduct or confirm
// answers nil, changes nothing and keeps the record applied, also once the
// remaining stock no longer covers it); a deduct or confirm decrements only when the
// remaining stock covers it, and otherwise is refused with an error wrapping
// stock.ErrRefused, then and on every repeat; a deduct or confirm of an item
// the store does not know is not refused but answered stock.ErrNotLoaded,
// recording nothing, and applies once the item is loaded; a restore or refusal gives back what its id took,
// once, gives back nothing for a deduct or confirm the store refused, and
// before any deduct (a restore as well as a refusal) leaves a tombstone that
// makes a late deduct change nothing; a restock adds once, and is refused with
// stock.ErrNotLoaded for an unknown item; held, cancelled and expired events
// change nothing; ids are scoped per item; Remaining of an unknown item wraps
// stock.ErrNotLoaded; Records lists what was recorded and leaves out unknown
// ids; concurrent applies of one id apply it once (concurrent deducts, and
// concurrent restores and refusals, each answered nil, give back exactly what
// the id took), and concurrent deducts of distinct ids never oversell. For a stock.BatchStore: ApplyBatch answers
// once per event, as Apply would; a refusal does not stop the batch; the
// first other error does, leaving the events after it unapplied (no stock
// moved, nothing recorded, applied in full when sent again), each answered
// with an error that wraps neither stock.ErrRefused nor stock.ErrInvalid.
func TestStore(t *testing.T, newStore func(t *testing.T) stock.Store) {
	t.Helper()
	for _, c := range storeChecks {
		t.Run(c.name, func(t *testing.T) {
			s := newStore(t)
			l, ok := s.(Loader)
			if !ok {
				t.Fatalf("stocktest: %T does not implement stocktest.Loader (Load(ctx, sku, qty) error)", s)
			}
			c.run(t, s, l)
		})
	}
}

// storeCheck is one rule of the Store contract.
type storeCheck struct {
	name string
	run  func(t testing.TB, s stock.Store, l Loader)
}

func ev(typ stock.EventType, sku, id string, qty int64) stock.Event {
	return stock.Event{Type: typ, SKU: sku, ID: id, User: "u-" + id, Qty: qty}
}

func load(t testing.TB, l Loader, sku string, qty int64) {
	t.Helper()
	if err := l.Load(context.Background(), sku, qty); err != nil {
		t.Fatalf("Load(%q, %d): %v", sku, qty, err)
	}
}

func apply(t testing.TB, s stock.Store, e stock.Event, want error) {
	t.Helper()
	err := s.Apply(context.Background(), e)
	switch {
	case want == nil && err != nil:
		t.Fatalf("Apply(%s %s/%s qty %d) = %v, want nil", e.Type, e.SKU, e.ID, e.Qty, err)
	case want != nil && !errors.Is(err, want):
		t.Fatalf("Apply(%s %s/%s qty %d) = %v, want an error wrapping %v", e.Type, e.SKU, e.ID, e.Qty, err, want)
	}
}

func remaining(t testing.TB, s stock.Store, sku string, want int64) {
	t.Helper()
	n, err := s.Remaining(context.Background(), sku)
	if err != nil {
		t.Fatalf("Remaining(%q): %v", sku, err)
	}
	if n != want {
		t.Fatalf("Remaining(%q) = %d, want %d", sku, n, want)
	}
}

func record(t testing.TB, s stock.Store, sku, id string) (stock.Record, bool) {
	t.Helper()
	m, err := s.Records(context.Background(), sku, []string{id})
	if err != nil {
		t.Fatalf("Records(%q, [%q]): %v", sku, id, err)
	}
	r, ok := m[id]
	return r, ok
}

func wantRecord(t testing.TB, s stock.Store, sku, id string, typ stock.EventType, qty int64, status stock.State) {
	t.Helper()
	r, ok := record(t, s, sku, id)
	if !ok {
		t.Fatalf("Records(%q, [%q]): no record, want one", sku, id)
	}
	if r.SKU != sku || r.ID != id || r.Type != typ || r.Qty != qty || r.Status != status {
		t.Fatalf("record of %s/%s = %+v, want type %s, qty %d, status %s", sku, id, r, typ, qty, status)
	}
}

// wantRestored checks that the record of sku/id has the status StateRestored; what names the
// record in the failure ("tombstone", "record after restore").
func wantRestored(t testing.TB, s stock.Store, sku, id, what string) {
	t.Helper()
	if r, ok := record(t, s, sku, id); !ok || r.Status != stock.StateRestored {
		t.Fatalf("%s/%s: %s = %+v (found %v), want status %s", sku, id, what, r, ok, stock.StateRestored)
	}
}

var storeChecks = []storeCheck{
	{"DeductDecrements", func(t testing.TB, s stock.Store, l Loader) {
		load(t, l, "a", 10)
		apply(t, s, ev(stock.EventDeducted, "a", "o1", 3), nil)
		remaining(t, s, "a", 7)
		wantRecord(t, s, "a", "o1", stock.EventDeducted, 3, stock.StateApplied)
		if r, _ := record(t, s, "a", "o1"); r.User != "u-o1" {
			t.Fatalf("record user = %q, want %q", r.User, "u-o1")
		}
	}},
	{"ConfirmDecrements", func(t testing.TB, s stock.Store, l Loader) {
		load(t, l, "a", 10)
		apply(t, s, ev(stock.EventConfirmed, "a", "h1", 4), nil)
		remaining(t, s, "a", 6)
		wantRecord(t, s, "a", "h1", stock.EventConfirmed, 4, stock.StateApplied)
	}},
	{"DeductIdempotent", func(t testing.TB, s stock.Store, l Loader) {
		load(t, l, "a", 10)
		for range 3 {
			apply(t, s, ev(stock.EventDeducted, "a", "o1", 3), nil)
		}
		remaining(t, s, "a", 7)
	}},
	{"DeductExactStock", func(t testing.TB, s stock.Store, l Loader) {
		load(t, l, "a", 3)
		apply(t, s, ev(stock.EventDeducted, "a", "o1", 3), nil)
		remaining(t, s, "a", 0)
		apply(t, s, ev(stock.EventDeducted, "a", "o2", 1), stock.ErrRefused)
		remaining(t, s, "a", 0)
	}},
	{"RefusalIsFinal", func(t testing.TB, s stock.Store, l Loader) {
		load(t, l, "a", 2)
		apply(t, s, ev(stock.EventDeducted, "a", "o1", 3), stock.ErrRefused)
		remaining(t, s, "a", 2)
		wantRecord(t, s, "a", "o1", stock.EventDeducted, 3, stock.StateRefused)
		// A repeat answers as the first application did, even once the stock covers it.
		apply(t, s, ev(stock.EventRestocked, "a", "r1", 5), nil)
		apply(t, s, ev(stock.EventDeducted, "a", "o1", 3), stock.ErrRefused)
		remaining(t, s, "a", 7)
	}},
	{"RepeatAppliedWhenLow", func(t testing.TB, s stock.Store, l Loader) {
		// A repeat of an applied decrement answers as the first application did (nil), even
		// once the stock no longer covers it: a store that checks the stock before it looks
		// the id up would refuse it, and the relay would give back in Redis a sale the store
		// keeps.
		load(t, l, "a", 3)
		load(t, l, "b", 5)
		deduct, confirm := ev(stock.EventDeducted, "a", "o1", 3), ev(stock.EventConfirmed, "b", "h1", 4)
		apply(t, s, deduct, nil)
		apply(t, s, confirm, nil)
		remaining(t, s, "a", 0) // none left
		remaining(t, s, "b", 1) // less than the confirm's 4
		for range 2 {
			apply(t, s, deduct, nil)
			apply(t, s, confirm, nil)
		}
		if b, ok := s.(stock.BatchStore); ok {
			errs := applyBatch(t, b, []stock.Event{deduct, confirm})
			for i, err := range errs {
				if err != nil {
					t.Fatalf("ApplyBatch of the repeats: error %d = %v, want nil (as the first application answered)", i, err)
				}
			}
		}
		remaining(t, s, "a", 0)
		remaining(t, s, "b", 1)
		wantRecord(t, s, "a", "o1", stock.EventDeducted, 3, stock.StateApplied)
		wantRecord(t, s, "b", "h1", stock.EventConfirmed, 4, stock.StateApplied)
	}},
	{"DeductUnknownItemNotLoaded", func(t testing.TB, s stock.Store, l Loader) {
		// A setup error, not a refusal: nothing recorded, and the sale applies once the item is
		// loaded (the relay keeps it until then).
		for _, typ := range []stock.EventType{stock.EventDeducted, stock.EventConfirmed} {
			id := "o-" + string(typ)
			apply(t, s, ev(typ, "nosuch", id, 1), stock.ErrNotLoaded)
			apply(t, s, ev(typ, "nosuch", id, 1), stock.ErrNotLoaded)
			if r, ok := record(t, s, "nosuch", id); ok {
				t.Fatalf("record of %s %s of an unknown item = %+v, want none", typ, id, r)
			}
		}
		load(t, l, "nosuch", 5)
		apply(t, s, ev(stock.EventDeducted, "nosuch", "o-"+string(stock.EventDeducted), 1), nil)
		apply(t, s, ev(stock.EventConfirmed, "nosuch", "o-"+string(stock.EventConfirmed), 1), nil)
		remaining(t, s, "nosuch", 3)
		wantRecord(t, s, "nosuch", "o-"+string(stock.EventDeducted), stock.EventDeducted, 1, stock.StateApplied)
	}},
	{"RestoreGivesBackOnce", func(t testing.TB, s stock.Store, l Loader) {
		load(t, l, "a", 10)
		apply(t, s, ev(stock.EventDeducted, "a", "o1", 3), nil)
		apply(t, s, ev(stock.EventRestored, "a", "o1", 3), nil)
		remaining(t, s, "a", 10)
		apply(t, s, ev(stock.EventRestored, "a", "o1", 3), nil)
		apply(t, s, ev(stock.EventRefused, "a", "o1", 3), nil)
		remaining(t, s, "a", 10)
		wantRestored(t, s, "a", "o1", "record after restore")
		// A deduct repeated after the restore takes nothing again.
		_ = s.Apply(context.Background(), ev(stock.EventDeducted, "a", "o1", 3))
		remaining(t, s, "a", 10)
	}},
	{"RefusedEventGivesBack", func(t testing.TB, s stock.Store, l Loader) {
		load(t, l, "a", 10)
		apply(t, s, ev(stock.EventConfirmed, "a", "h1", 4), nil)
		apply(t, s, ev(stock.EventRefused, "a", "h1", 4), nil)
		remaining(t, s, "a", 10)
	}},
	{"RestoreBeforeDeductTombstone", func(t testing.TB, s stock.Store, l Loader) {
		load(t, l, "a", 10)
		apply(t, s, ev(stock.EventRestored, "a", "o1", 3), nil)
		remaining(t, s, "a", 10)
		wantRestored(t, s, "a", "o1", "tombstone")
		// The late deduct changes nothing (whatever it answers).
		_ = s.Apply(context.Background(), ev(stock.EventDeducted, "a", "o1", 3))
		remaining(t, s, "a", 10)
		wantRestored(t, s, "a", "o1", "record after the late deduct")
	}},
	{"RefusalBeforeDeductTombstone", func(t testing.TB, s stock.Store, l Loader) {
		load(t, l, "a", 10)
		// EventRefused for ids never seen: tombstones, as a restore leaves.
		apply(t, s, ev(stock.EventRefused, "a", "o1", 3), nil)
		apply(t, s, ev(stock.EventRefused, "a", "h1", 4), nil)
		remaining(t, s, "a", 10)
		for _, id := range []string{"o1", "h1"} {
			wantRestored(t, s, "a", id, "tombstone")
		}
		// The late deduct and confirm change nothing (whatever they answer).
		_ = s.Apply(context.Background(), ev(stock.EventDeducted, "a", "o1", 3))
		_ = s.Apply(context.Background(), ev(stock.EventConfirmed, "a", "h1", 4))
		remaining(t, s, "a", 10)
		for _, id := range []string{"o1", "h1"} {
			wantRestored(t, s, "a", id, "record after the late decrement")
		}
	}},
	{"RestoreOfRefusedGivesNothing", func(t testing.TB, s stock.Store, l Loader) {
		load(t, l, "a", 2)
		apply(t, s, ev(stock.EventDeducted, "a", "o1", 3), stock.ErrRefused)
		apply(t, s, ev(stock.EventConfirmed, "a", "h1", 4), stock.ErrRefused)
		load(t, l, "b", 1)
		apply(t, s, ev(stock.EventDeducted, "b", "o2", 5), stock.ErrRefused)
		// A restore or refusal of a refused decrement gives back nothing: it took nothing.
		for _, typ := range []stock.EventType{stock.EventRestored, stock.EventRefused} {
			apply(t, s, ev(typ, "a", "o1", 3), nil)
			apply(t, s, ev(typ, "a", "h1", 4), nil)
			apply(t, s, ev(typ, "b", "o2", 5), nil)
			remaining(t, s, "a", 2)
			remaining(t, s, "b", 1)
		}
		// And the refusal stays final.
		apply(t, s, ev(stock.EventRestocked, "a", "r1", 5), nil)
		apply(t, s, ev(stock.EventDeducted, "a", "o1", 3), stock.ErrRefused)
		apply(t, s, ev(stock.EventConfirmed, "a", "h1", 4), stock.ErrRefused)
		remaining(t, s, "a", 7)
	}},
	{"RestockAddsOnce", func(t testing.TB, s stock.Store, l Loader) {
		load(t, l, "a", 10)
		apply(t, s, ev(stock.EventRestocked, "a", "r1", 5), nil)
		apply(t, s, ev(stock.EventRestocked, "a", "r1", 5), nil)
		remaining(t, s, "a", 15)
		wantRecord(t, s, "a", "r1", stock.EventRestocked, 5, stock.StateApplied)
		// A restore does not take back a restock.
		apply(t, s, ev(stock.EventRestored, "a", "r1", 5), nil)
		remaining(t, s, "a", 15)
	}},
	{"RestockUnknownItemNotLoaded", func(t testing.TB, s stock.Store, _ Loader) {
		apply(t, s, ev(stock.EventRestocked, "nosuch", "r1", 5), stock.ErrNotLoaded)
	}},
	{"OtherEventsIgnored", func(t testing.TB, s stock.Store, l Loader) {
		load(t, l, "a", 10)
		for _, typ := range []stock.EventType{stock.EventHeld, stock.EventCancelled, stock.EventExpired} {
			apply(t, s, ev(typ, "a", "h-"+string(typ), 2), nil)
		}
		remaining(t, s, "a", 10)
	}},
	{"IDsScopedPerItem", func(t testing.TB, s stock.Store, l Loader) {
		load(t, l, "a", 10)
		load(t, l, "b", 10)
		apply(t, s, ev(stock.EventDeducted, "a", "o1", 3), nil)
		apply(t, s, ev(stock.EventDeducted, "b", "o1", 4), nil)
		remaining(t, s, "a", 7)
		remaining(t, s, "b", 6)
		apply(t, s, ev(stock.EventRestored, "b", "o1", 4), nil)
		remaining(t, s, "a", 7)
		remaining(t, s, "b", 10)
	}},
	{"RemainingUnknownItem", func(t testing.TB, s stock.Store, _ Loader) {
		_, err := s.Remaining(context.Background(), "nosuch")
		if !errors.Is(err, stock.ErrNotLoaded) {
			t.Fatalf("Remaining of an unknown item = %v, want an error wrapping ErrNotLoaded", err)
		}
	}},
	{"RecordsUnknownIDsAbsent", func(t testing.TB, s stock.Store, l Loader) {
		load(t, l, "a", 10)
		apply(t, s, ev(stock.EventDeducted, "a", "o1", 1), nil)
		apply(t, s, ev(stock.EventDeducted, "a", "o2", 2), nil)
		m, err := s.Records(context.Background(), "a", []string{"o1", "nope", "o2"})
		if err != nil {
			t.Fatalf("Records: %v", err)
		}
		if len(m) != 2 || m["o1"].Qty != 1 || m["o2"].Qty != 2 {
			t.Fatalf("Records = %+v, want o1 (qty 1) and o2 (qty 2) only", m)
		}
		m, err = s.Records(context.Background(), "nosuch", []string{"o1"})
		if err != nil || len(m) != 0 {
			t.Fatalf("Records of an unknown item = %+v, %v; want an empty map", m, err)
		}
	}},
	{"ConcurrentSameID", func(t testing.TB, s stock.Store, l Loader) {
		load(t, l, "a", 10)
		errs := parallel(16, func(int) error { return s.Apply(context.Background(), ev(stock.EventDeducted, "a", "o1", 3)) })
		for i, err := range errs {
			if err != nil {
				t.Fatalf("concurrent Apply %d of one id: %v", i, err)
			}
		}
		remaining(t, s, "a", 7)
	}},
	{"ConcurrentGiveBackOnce", func(t testing.TB, s stock.Store, l Loader) {
		load(t, l, "a", 20)
		apply(t, s, ev(stock.EventDeducted, "a", "o1", 3), nil)
		apply(t, s, ev(stock.EventConfirmed, "a", "h1", 4), nil)
		apply(t, s, ev(stock.EventDeducted, "a", "o2", 5), nil)
		remaining(t, s, "a", 8)
		b, _ := s.(stock.BatchStore) // when it is one, some of the applies go through ApplyBatch
		want := int64(8)
		for _, c := range []struct {
			id    string
			qty   int64
			types []stock.EventType
		}{
			{"o1", 3, []stock.EventType{stock.EventRestored}},
			{"h1", 4, []stock.EventType{stock.EventRefused}},
			{"o2", 5, []stock.EventType{stock.EventRestored, stock.EventRefused}},
		} {
			evOf := func(i int) stock.Event { return ev(c.types[i%len(c.types)], "a", c.id, c.qty) }
			errs := parallel(16, func(i int) error {
				if b != nil && i%4 == 3 {
					return b.ApplyBatch(context.Background(), []stock.Event{evOf(i)})[0]
				}
				return s.Apply(context.Background(), evOf(i))
			})
			for i, err := range errs {
				if err != nil {
					t.Fatalf("concurrent %s %d of applied id %s: %v, want nil", evOf(i).Type, i, c.id, err)
				}
			}
			want += c.qty
			n, err := s.Remaining(context.Background(), "a")
			if err != nil {
				t.Fatalf("Remaining(%q): %v", "a", err)
			}
			if n != want {
				t.Fatalf("after 16 concurrent %v of %s (qty %d): Remaining = %d, want %d (given back exactly once)", c.types, c.id, c.qty, n, want)
			}
			wantRestored(t, s, "a", c.id, "record after the concurrent give-backs")
		}
	}},
	{"ConcurrentNoOversell", func(t testing.TB, s stock.Store, l Loader) {
		load(t, l, "a", 10)
		errs := parallel(30, func(i int) error {
			return s.Apply(context.Background(), ev(stock.EventDeducted, "a", fmt.Sprintf("o%d", i), 1))
		})
		ok := 0
		for i, err := range errs {
			switch {
			case err == nil:
				ok++
			case !errors.Is(err, stock.ErrRefused):
				t.Fatalf("concurrent Apply %d: %v", i, err)
			}
		}
		if ok != 10 {
			t.Fatalf("%d of 30 deducts of 1 applied on a stock of 10, want 10", ok)
		}
		remaining(t, s, "a", 0)
		// Every acknowledged deduct is recorded as applied, every refusal as refused.
		ids := make([]string, 30)
		for i := range ids {
			ids[i] = fmt.Sprintf("o%d", i)
		}
		m, err := s.Records(context.Background(), "a", ids)
		if err != nil {
			t.Fatalf("Records: %v", err)
		}
		for i, err := range errs {
			want := stock.StateApplied
			if err != nil {
				want = stock.StateRefused
			}
			if m[ids[i]].Status != want {
				t.Fatalf("record of %s = %+v, want status %s", ids[i], m[ids[i]], want)
			}
		}
	}},
	{"Batch", func(t testing.TB, s stock.Store, l Loader) {
		b := batchStore(t, s)
		load(t, l, "a", 10)
		evs := []stock.Event{
			ev(stock.EventDeducted, "a", "o1", 3),
			ev(stock.EventDeducted, "a", "o2", 100),
			ev(stock.EventDeducted, "a", "o3", 2),
			ev(stock.EventRestored, "a", "o1", 3),
			ev(stock.EventRestocked, "a", "r1", 1),
		}
		want := []error{nil, stock.ErrRefused, nil, nil, nil}
		for round := range 2 { // the repeat answers as the first application did
			errs := b.ApplyBatch(context.Background(), evs)
			if len(errs) != len(evs) {
				t.Fatalf("ApplyBatch returned %d errors for %d events", len(errs), len(evs))
			}
			for i := range evs {
				if (want[i] == nil) != (errs[i] == nil) || (want[i] != nil && !errors.Is(errs[i], want[i])) {
					t.Fatalf("round %d: ApplyBatch error %d (%s %s) = %v, want %v", round, i, evs[i].Type, evs[i].ID, errs[i], want[i])
				}
			}
			remaining(t, s, "a", 9)
		}
	}},
	{"BatchStopsAtFailure", func(t testing.TB, s stock.Store, l Loader) {
		b := batchStore(t, s)
		load(t, l, "a", 10)
		errs := applyBatch(t, b, stopBatch)
		if errs[0] != nil || !errors.Is(errs[1], stock.ErrRefused) {
			t.Fatalf("ApplyBatch errors 0 and 1 = %v, %v; want nil and an error wrapping ErrRefused", errs[0], errs[1])
		}
		if !errors.Is(errs[2], stock.ErrNotLoaded) {
			t.Fatalf("ApplyBatch error 2 (a restock of an item with no row) = %v, want an error wrapping ErrNotLoaded", errs[2])
		}
		// The events before the failure are applied, the refusal among them did not stop the
		// batch, and the events after it are left unapplied: no stock moved, nothing recorded.
		remaining(t, s, "a", 7)
		wantRecord(t, s, "a", "o1", stock.EventDeducted, 3, stock.StateApplied)
		wantRecord(t, s, "a", "o2", stock.EventDeducted, 100, stock.StateRefused)
		m, err := s.Records(context.Background(), "a", []string{"o3", "r2"})
		if err != nil {
			t.Fatalf("Records: %v", err)
		}
		if len(m) != 0 {
			t.Fatalf("records of the events after the failure = %+v, want none (left unapplied)", m)
		}
		// Once the item is loaded, the rest of the batch applies in full.
		load(t, l, "b", 1)
		errs = applyBatch(t, b, stopBatch[2:])
		for i, err := range errs {
			if err != nil {
				t.Fatalf("ApplyBatch of the rest: error %d (%s %s/%s) = %v, want nil", i, stopBatch[2+i].Type, stopBatch[2+i].SKU, stopBatch[2+i].ID, err)
			}
		}
		remaining(t, s, "a", 12)
		remaining(t, s, "b", 6)
	}},
	{"BatchAnswersUnapplied", func(t testing.TB, s stock.Store, l Loader) {
		b := batchStore(t, s)
		load(t, l, "a", 10)
		errs := applyBatch(t, b, stopBatch)
		if errs[2] == nil {
			t.Fatalf("ApplyBatch error 2 (a restock of an item with no row) = nil, want an error wrapping ErrNotLoaded")
		}
		// Every event after the failure gets an error, and not one that says it was refused
		// (recorded for good) or invalid (never to be applied).
		for i := 3; i < len(stopBatch); i++ {
			e := stopBatch[i]
			switch err := errs[i]; {
			case err == nil:
				t.Fatalf("ApplyBatch error %d (%s %s/%s, after the failure) = nil, want an error", i, e.Type, e.SKU, e.ID)
			case errors.Is(err, stock.ErrRefused), errors.Is(err, stock.ErrInvalid):
				t.Fatalf("ApplyBatch error %d (%s %s/%s, after the failure) = %v, want an error wrapping neither ErrRefused nor ErrInvalid", i, e.Type, e.SKU, e.ID, err)
			}
		}
	}},
}

// stopBatch is a batch whose third event, a restock of an item with no row, fails with an
// error that is not a refusal (its second is refused: 100 of 10).
var stopBatch = []stock.Event{
	ev(stock.EventDeducted, "a", "o1", 3),
	ev(stock.EventDeducted, "a", "o2", 100),
	ev(stock.EventRestocked, "b", "r1", 5),
	ev(stock.EventDeducted, "a", "o3", 2),
	ev(stock.EventRestocked, "a", "r2", 4),
	ev(stock.EventRestored, "a", "o1", 3),
}

// batchStore returns s as a stock.BatchStore, or skips the check.
func batchStore(t testing.TB, s stock.Store) stock.BatchStore {
	t.Helper()
	b, ok := s.(stock.BatchStore)
	if !ok {
		t.Skip("the store does not implement stock.BatchStore")
	}
	return b
}

// applyBatch applies evs with b, checks that it answers once per event, and returns the answers.
func applyBatch(t testing.TB, b stock.BatchStore, evs []stock.Event) []error {
	t.Helper()
	errs := b.ApplyBatch(context.Background(), evs)
	if len(errs) != len(evs) {
		t.Fatalf("ApplyBatch returned %d errors for %d events", len(errs), len(evs))
	}
	return errs
}

// parallel runs f(0..n-1) at once and returns their errors.
func parallel(n int, f func(int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = f(i)
		}()
	}
	close(start)
	wg.Wait()
	return errs
}
