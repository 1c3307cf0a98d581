package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stockres/stock"
	"github.com/stockres/stock/memstore"
)

// TestLoadRange: Load takes 0 to stock.MaxQty (never negative stock); outside that it answers
// ErrInvalid and changes nothing.
func TestLoadRange(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	for _, q := range []int64{-1, -5, stock.MaxQty + 1} {
		if err := s.Load(ctx, "x", q); !errors.Is(err, stock.ErrInvalid) {
			t.Fatalf("Load(x, %d) = %v, want an error wrapping ErrInvalid", q, err)
		}
		if _, err := s.Remaining(ctx, "x"); !errors.Is(err, stock.ErrNotLoaded) {
			t.Fatalf("after Load(x, %d) failed, Remaining = %v, want ErrNotLoaded (nothing created)", q, err)
		}
	}
	for _, q := range []int64{0, stock.MaxQty} {
		sku := "ok" + string(rune('0'+q%10))
		if err := s.Load(ctx, sku, q); err != nil {
			t.Fatalf("Load(%s, %d) = %v", sku, q, err)
		}
		if n, err := s.Remaining(ctx, sku); err != nil || n != q {
			t.Fatalf("Remaining(%s) = %d, %v; want %d", sku, n, err, q)
		}
	}
	// An invalid load of an existing item leaves it as it was.
	if err := s.Load(ctx, "ok0", -1); !errors.Is(err, stock.ErrInvalid) {
		t.Fatalf("Load(ok0, -1) = %v, want ErrInvalid", err)
	}
	if n, _ := s.Remaining(ctx, "ok0"); n != 0 {
		t.Fatalf("Remaining(ok0) = %d after an invalid Load, want 0", n)
	}
}

// TestApplicationsPerEvent: Applications counts per event (sku, id, type), "0 or 1 in a correct
// system", whatever characters the names hold: two different events whose names joined by '/'
// are the same must not share a count (a false double-application alarm).
func TestApplicationsPerEvent(t *testing.T) {
	cases := []struct {
		name string
		evs  []stock.Event
	}{
		{"three levels", []stock.Event{
			{Type: stock.EventDeducted, SKU: "a/b/c", ID: "x", Qty: 1},
			{Type: stock.EventDeducted, SKU: "a/b", ID: "c/x", Qty: 1},
			{Type: stock.EventDeducted, SKU: "a", ID: "b/c/x", Qty: 1},
			{Type: stock.EventRestocked, SKU: "a", ID: "b/c/x/deducted", Qty: 1},
		}},
		{"two levels", []stock.Event{
			event(stock.EventDeducted, "a/b", "c", 1),
			event(stock.EventDeducted, "a", "b/c", 1),
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s := memstore.New()
			for _, ev := range tc.evs {
				if err := s.Load(ctx, ev.SKU, 10); err != nil && !errors.Is(err, stock.ErrLoaded) {
					t.Fatal(err)
				}
			}
			for _, ev := range tc.evs {
				if err := s.Apply(ctx, ev); err != nil {
					t.Fatal(err)
				}
			}
			for _, ev := range tc.evs {
				if n := s.Applications(ev.SKU, ev.ID, ev.Type); n != 1 {
					t.Fatalf("Applications(%q, %q, %s) = %d, want 1", ev.SKU, ev.ID, ev.Type, n)
				}
				if n := s.Applications(ev.SKU, ev.ID, stock.EventRestored); n != 0 {
					t.Fatalf("Applications of a restore of %q/%q never applied = %d, want 0", ev.SKU, ev.ID, n)
				}
			}
			if m := s.MaxApplications(); m != 1 {
				t.Fatalf("MaxApplications() = %d after distinct events applied once each, want 1", m)
			}
		})
	}
}

// event is an event of typ on sku with id and qty, by the buyer "u-"+id.
func event(typ stock.EventType, sku, id string, qty int64) stock.Event {
	return stock.Event{Type: typ, SKU: sku, ID: id, User: "u-" + id, Qty: qty}
}

// remaining is the store's Remaining of sku, failing the test on an error.
func remaining(t *testing.T, s *memstore.Store, sku string) int64 {
	t.Helper()
	n, err := s.Remaining(context.Background(), sku)
	if err != nil {
		t.Fatalf("Remaining(%q): %v", sku, err)
	}
	return n
}

// TestSameEventConcurrent: one event applied by 64 goroutines at once is applied once, a
// restore of an id never deducted leaves a tombstone that refuses its later deduct, and
// concurrent duplicate restores of an applied id give back once.
func TestSameEventConcurrent(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	_ = s.Load(ctx, "a", 100)
	var wg sync.WaitGroup
	var errs atomic.Int64
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Apply(ctx, event(stock.EventDeducted, "a", "o1", 7)); err != nil {
				errs.Add(1)
			}
			if err := s.Apply(ctx, event(stock.EventRestored, "a", "o2", 5)); err != nil { // tombstone
				errs.Add(1)
			}
		}()
	}
	wg.Wait()
	if errs.Load() != 0 {
		t.Fatalf("%d errors from concurrent repeats of one event", errs.Load())
	}
	if n := remaining(t, s, "a"); n != 93 {
		t.Fatalf("remaining %d, want 93", n)
	}
	if s.Applications("a", "o1", stock.EventDeducted) != 1 || s.MaxApplications() != 1 {
		t.Fatalf("applications %d, max %d; want 1", s.Applications("a", "o1", stock.EventDeducted), s.MaxApplications())
	}
	// Concurrent duplicate restores of the applied id give back once.
	for range 64 {
		wg.Add(1)
		go func() { defer wg.Done(); _ = s.Apply(ctx, event(stock.EventRestored, "a", "o1", 7)) }()
	}
	wg.Wait()
	if n := remaining(t, s, "a"); n != 100 {
		t.Fatalf("remaining after 64 restores of one id: %d, want 100", n)
	}
	// The tombstoned id can never take stock.
	if err := s.Apply(ctx, event(stock.EventDeducted, "a", "o2", 5)); err != nil && !errors.Is(err, stock.ErrRefused) {
		t.Fatal(err)
	}
	if n := remaining(t, s, "a"); n != 100 {
		t.Fatalf("a late deduct of a tombstoned id took stock: %d", n)
	}
}

// TestMixedConcurrency: many goroutines deduct, restore (before or after the deduct) and
// repeat, on several items; the answers and the records must add up, remaining never below
// zero.
func TestMixedConcurrency(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	skus := []string{"a", "b:1", "c~x", "ü:ñ"}
	const loaded = 50
	for _, sku := range skus {
		_ = s.Load(ctx, sku, loaded)
	}
	type op struct {
		sku, id string
		qty     int64
	}
	var ops []op
	for i := range 400 {
		ops = append(ops, op{skus[i%len(skus)], fmt.Sprintf("id:%d~é", i), int64(1 + i%3)})
	}
	var wg sync.WaitGroup
	var minSeen atomic.Int64
	minSeen.Store(loaded)
	stop := make(chan struct{})
	var mon sync.WaitGroup
	mon.Add(1)
	go func() { // watches remaining while it all runs
		defer mon.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, sku := range skus {
				n, _ := s.Remaining(ctx, sku)
				if n < minSeen.Load() {
					minSeen.Store(n)
				}
				_, _ = s.List(ctx, sku, "", 1000)
			}
			_, _ = s.ListItems(ctx, "", 10)
		}
	}()
	restoreIdx := map[int]bool{}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range ops {
		if r.IntN(4) == 0 {
			restoreIdx[i] = true
		}
	}
	for i, o := range ops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var evs []stock.Event
			evs = append(evs, event(stock.EventDeducted, o.sku, o.id, o.qty), event(stock.EventDeducted, o.sku, o.id, o.qty))
			if restoreIdx[i] {
				evs = append(evs, event(stock.EventRestored, o.sku, o.id, o.qty))
			}
			rand.Shuffle(len(evs), func(a, b int) { evs[a], evs[b] = evs[b], evs[a] })
			for k, e := range evs {
				var err error
				if k%2 == 0 {
					err = s.Apply(ctx, e)
				} else {
					err = s.ApplyBatch(ctx, []stock.Event{e})[0]
				}
				if err != nil && !errors.Is(err, stock.ErrRefused) {
					t.Errorf("Apply %+v: %v", e, err)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	mon.Wait()
	if minSeen.Load() < 0 {
		t.Fatalf("remaining went below zero: %d", minSeen.Load())
	}
	if s.MaxApplications() > 1 {
		t.Fatalf("an event changed the stock %d times", s.MaxApplications())
	}
	taken := map[string]int64{}
	for _, o := range ops {
		m, err := s.Records(ctx, o.sku, []string{o.id})
		if err != nil {
			t.Fatal(err)
		}
		rec, ok := m[o.id]
		if !ok {
			t.Fatalf("no record of %s/%s", o.sku, o.id)
		}
		switch rec.Status {
		case stock.StateApplied:
			taken[o.sku] += o.qty
		case stock.StateRestored, stock.StateRefused:
		default:
			t.Fatalf("record %+v", rec)
		}
		if rec.Status == stock.StateApplied && s.Applications(o.sku, o.id, stock.EventDeducted) != 1 {
			t.Fatalf("%s/%s applied but counted %d times", o.sku, o.id, s.Applications(o.sku, o.id, stock.EventDeducted))
		}
	}
	for _, sku := range skus {
		n := remaining(t, s, sku)
		if n < 0 || n != loaded-taken[sku] {
			t.Fatalf("%s: remaining %d, want %d - %d applied", sku, n, loaded, taken[sku])
		}
		recs, err := s.List(ctx, sku, "", 10000)
		if err != nil {
			t.Fatal(err)
		}
		for i := 1; i < len(recs); i++ {
			if recs[i-1].ID >= recs[i].ID {
				t.Fatalf("List of %s out of order at %d: %q, %q", sku, i, recs[i-1].ID, recs[i].ID)
			}
		}
		if len(recs) != len(ops)/len(skus) {
			t.Fatalf("List of %s: %d records, want %d", sku, len(recs), len(ops)/len(skus))
		}
	}
}

// TestFailWith: while FailWith makes applies fail, a failed Apply changes nothing and reads
// keep working; a failure of one item stops the rest of a batch while a refusal does not; and
// toggling FailWith while applies run applies every event at most once, then once in the end.
func TestFailWith(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	_ = s.Load(ctx, "a", 10)
	_ = s.Load(ctx, "b", 10)
	s.FailWith(memstore.Down)
	if err := s.Apply(ctx, event(stock.EventDeducted, "a", "o1", 1)); !errors.Is(err, memstore.ErrDown) {
		t.Fatalf("Apply while down = %v, want ErrDown", err)
	}
	if m, _ := s.Records(ctx, "a", []string{"o1"}); len(m) != 0 || remaining(t, s, "a") != 10 {
		t.Fatalf("a failed Apply changed something: %+v", m)
	}
	// Reads keep working while down (the reconciler needs them).
	if _, err := s.Remaining(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	// Fail only item b.
	s.FailWith(func(e stock.Event) error {
		if e.SKU == "b" {
			return memstore.ErrDown
		}
		return nil
	})
	errs := s.ApplyBatch(ctx, []stock.Event{
		event(stock.EventDeducted, "a", "o1", 1),
		event(stock.EventDeducted, "a", "o2", 100), // refused: does not stop the batch
		event(stock.EventDeducted, "b", "o3", 1),   // down: stops it
		event(stock.EventDeducted, "a", "o4", 1),
	})
	if len(errs) != 4 || errs[0] != nil || !errors.Is(errs[1], stock.ErrRefused) || !errors.Is(errs[2], memstore.ErrDown) ||
		errs[3] == nil || errors.Is(errs[3], stock.ErrRefused) || errors.Is(errs[3], stock.ErrInvalid) {
		t.Fatalf("ApplyBatch with b down = %v", errs)
	}
	if remaining(t, s, "a") != 9 || remaining(t, s, "b") != 10 {
		t.Fatalf("remaining a %d, b %d; want 9, 10", remaining(t, s, "a"), remaining(t, s, "b"))
	}
	if m, _ := s.Records(ctx, "a", []string{"o4"}); len(m) != 0 {
		t.Fatalf("an event after the failure was recorded: %+v", m)
	}
	// Toggling FailWith while applies run: every event is applied at most once, and each one
	// is applied once in the end.
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				s.FailWith(memstore.Down)
			} else {
				s.FailWith(nil)
			}
		}()
		go func() {
			defer wg.Done()
			_ = s.Apply(ctx, event(stock.EventDeducted, "b", fmt.Sprint("t", i), 0+1))
		}()
	}
	wg.Wait()
	s.FailWith(nil)
	for i := range 50 {
		if err := s.Apply(ctx, event(stock.EventDeducted, "b", fmt.Sprint("t", i), 1)); err != nil && !errors.Is(err, stock.ErrRefused) {
			t.Fatal(err)
		}
	}
	if n := remaining(t, s, "b"); n != 0 || s.MaxApplications() != 1 {
		t.Fatalf("b remaining %d (want 0), max applications %d", n, s.MaxApplications())
	}
}

// TestNamesAndBounds: item and id names with separators and non-ASCII characters are kept
// apart, ListItems pages in byte order, and quantities are bounded by 1 and stock.MaxQty.
func TestNamesAndBounds(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	names := []string{"a", "a:", "a:b", "a~b", "ü", "ü:ñ~🙂", "a:b:c"}
	for i, sku := range names {
		if err := s.Load(ctx, sku, int64(10+i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Load(ctx, "a:b", 1); !errors.Is(err, stock.ErrLoaded) {
		t.Fatalf("second Load = %v, want ErrLoaded", err)
	}
	for _, sku := range names {
		if err := s.Apply(ctx, event(stock.EventDeducted, sku, "o:1~ü", 1)); err != nil {
			t.Fatal(err)
		}
	}
	for i, sku := range names {
		if n := remaining(t, s, sku); n != int64(9+i) {
			t.Fatalf("%q: remaining %d, want %d (ids scoped per item)", sku, n, 9+i)
		}
	}
	items, err := s.ListItems(ctx, "", 100)
	if err != nil || len(items) != len(names) {
		t.Fatalf("ListItems = %q, %v", items, err)
	}
	for i := 1; i < len(items); i++ {
		if items[i-1] >= items[i] {
			t.Fatalf("ListItems not in byte order: %q", items)
		}
	}
	page, _ := s.ListItems(ctx, "a:", 2)
	if len(page) != 2 || page[0] != "a:b" || page[1] != "a:b:c" {
		t.Fatalf("ListItems after %q = %q", "a:", page)
	}

	// MaxQty boundaries.
	_ = s.Load(ctx, "max", stock.MaxQty)
	if err := s.Apply(ctx, event(stock.EventDeducted, "max", "big", stock.MaxQty+1)); !errors.Is(err, stock.ErrInvalid) {
		t.Fatalf("qty MaxQty+1 = %v, want ErrInvalid", err)
	}
	for _, q := range []int64{0, -1} {
		if err := s.Apply(ctx, event(stock.EventDeducted, "max", fmt.Sprint("q", q), q)); !errors.Is(err, stock.ErrInvalid) {
			t.Fatalf("qty %d = %v, want ErrInvalid", q, err)
		}
	}
	if err := s.Apply(ctx, event(stock.EventDeducted, "max", "all", stock.MaxQty)); err != nil {
		t.Fatal(err)
	}
	if n := remaining(t, s, "max"); n != 0 {
		t.Fatalf("remaining %d, want 0", n)
	}
	if err := s.Apply(ctx, event(stock.EventDeducted, "max", "one", 1)); !errors.Is(err, stock.ErrRefused) {
		t.Fatalf("deduct of 1 from 0 = %v, want ErrRefused", err)
	}
	if err := s.Apply(ctx, event(stock.EventRestored, "max", "all", stock.MaxQty)); err != nil {
		t.Fatal(err)
	}
	if n := remaining(t, s, "max"); n != stock.MaxQty {
		t.Fatalf("remaining after the restore %d, want MaxQty", n)
	}
	if err := s.Apply(ctx, stock.Event{Type: "bogus", SKU: "max", ID: "x", Qty: 1}); !errors.Is(err, stock.ErrInvalid) {
		t.Fatalf("unknown event type = %v, want ErrInvalid", err)
	}
	if err := s.Apply(ctx, stock.Event{Type: stock.EventDeducted, SKU: "", ID: "x", Qty: 1}); !errors.Is(err, stock.ErrInvalid) {
		t.Fatalf("empty sku = %v, want ErrInvalid", err)
	}
}
