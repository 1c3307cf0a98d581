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

func a25ev(typ stock.EventType, sku, id string, qty int64) stock.Event {
	return stock.Event{Type: typ, SKU: sku, ID: id, User: "u-" + id, Qty: qty}
}

func a25rem(t *testing.T, s *memstore.Store, sku string) int64 {
	t.Helper()
	n, err := s.Remaining(context.Background(), sku)
	if err != nil {
		t.Fatalf("Remaining(%q): %v", sku, err)
	}
	return n
}

func TestAttack25SameEventConcurrent(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	_ = s.Load(ctx, "a", 100)
	var wg sync.WaitGroup
	var errs atomic.Int64
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Apply(ctx, a25ev(stock.EventDeducted, "a", "o1", 7)); err != nil {
				errs.Add(1)
			}
			if err := s.Apply(ctx, a25ev(stock.EventRestored, "a", "o2", 5)); err != nil { // tombstone
				errs.Add(1)
			}
		}()
	}
	wg.Wait()
	if errs.Load() != 0 {
		t.Fatalf("%d errors from concurrent repeats of one event", errs.Load())
	}
	if n := a25rem(t, s, "a"); n != 93 {
		t.Fatalf("remaining %d, want 93", n)
	}
	if s.Applications("a", "o1", stock.EventDeducted) != 1 || s.MaxApplications() != 1 {
		t.Fatalf("applications %d, max %d; want 1", s.Applications("a", "o1", stock.EventDeducted), s.MaxApplications())
	}
	// Concurrent duplicate restores of the applied id give back once.
	for range 64 {
		wg.Add(1)
		go func() { defer wg.Done(); _ = s.Apply(ctx, a25ev(stock.EventRestored, "a", "o1", 7)) }()
	}
	wg.Wait()
	if n := a25rem(t, s, "a"); n != 100 {
		t.Fatalf("remaining after 64 restores of one id: %d, want 100", n)
	}
	// The tombstoned id can never take stock.
	if err := s.Apply(ctx, a25ev(stock.EventDeducted, "a", "o2", 5)); err != nil && !errors.Is(err, stock.ErrRefused) {
		t.Fatal(err)
	}
	if n := a25rem(t, s, "a"); n != 100 {
		t.Fatalf("a late deduct of a tombstoned id took stock: %d", n)
	}
}

// Many goroutines deduct, restore (before or after the deduct) and repeat, on several items;
// the answers and the records must add up, remaining never below zero.
func TestAttack25MixedConcurrency(t *testing.T) {
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
			evs = append(evs, a25ev(stock.EventDeducted, o.sku, o.id, o.qty), a25ev(stock.EventDeducted, o.sku, o.id, o.qty))
			if restoreIdx[i] {
				evs = append(evs, a25ev(stock.EventRestored, o.sku, o.id, o.qty))
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
		n := a25rem(t, s, sku)
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

func TestAttack25FailWith(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	_ = s.Load(ctx, "a", 10)
	_ = s.Load(ctx, "b", 10)
	s.FailWith(memstore.Down)
	if err := s.Apply(ctx, a25ev(stock.EventDeducted, "a", "o1", 1)); !errors.Is(err, memstore.ErrDown) {
		t.Fatalf("Apply while down = %v, want ErrDown", err)
	}
	if m, _ := s.Records(ctx, "a", []string{"o1"}); len(m) != 0 || a25rem(t, s, "a") != 10 {
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
		a25ev(stock.EventDeducted, "a", "o1", 1),
		a25ev(stock.EventDeducted, "a", "o2", 100), // refused: does not stop the batch
		a25ev(stock.EventDeducted, "b", "o3", 1),   // down: stops it
		a25ev(stock.EventDeducted, "a", "o4", 1),
	})
	if len(errs) != 4 || errs[0] != nil || !errors.Is(errs[1], stock.ErrRefused) || !errors.Is(errs[2], memstore.ErrDown) ||
		errs[3] == nil || errors.Is(errs[3], stock.ErrRefused) || errors.Is(errs[3], stock.ErrInvalid) {
		t.Fatalf("ApplyBatch with b down = %v", errs)
	}
	if a25rem(t, s, "a") != 9 || a25rem(t, s, "b") != 10 {
		t.Fatalf("remaining a %d, b %d; want 9, 10", a25rem(t, s, "a"), a25rem(t, s, "b"))
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
			_ = s.Apply(ctx, a25ev(stock.EventDeducted, "b", fmt.Sprint("t", i), 0+1))
		}()
	}
	wg.Wait()
	s.FailWith(nil)
	for i := range 50 {
		if err := s.Apply(ctx, a25ev(stock.EventDeducted, "b", fmt.Sprint("t", i), 1)); err != nil && !errors.Is(err, stock.ErrRefused) {
			t.Fatal(err)
		}
	}
	if n := a25rem(t, s, "b"); n != 0 || s.MaxApplications() != 1 {
		t.Fatalf("b remaining %d (want 0), max applications %d", n, s.MaxApplications())
	}
}

func TestAttack25NamesAndBounds(t *testing.T) {
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
		if err := s.Apply(ctx, a25ev(stock.EventDeducted, sku, "o:1~ü", 1)); err != nil {
			t.Fatal(err)
		}
	}
	for i, sku := range names {
		if n := a25rem(t, s, sku); n != int64(9+i) {
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
	if err := s.Apply(ctx, a25ev(stock.EventDeducted, "max", "big", stock.MaxQty+1)); !errors.Is(err, stock.ErrInvalid) {
		t.Fatalf("qty MaxQty+1 = %v, want ErrInvalid", err)
	}
	for _, q := range []int64{0, -1} {
		if err := s.Apply(ctx, a25ev(stock.EventDeducted, "max", fmt.Sprint("q", q), q)); !errors.Is(err, stock.ErrInvalid) {
			t.Fatalf("qty %d = %v, want ErrInvalid", q, err)
		}
	}
	if err := s.Apply(ctx, a25ev(stock.EventDeducted, "max", "all", stock.MaxQty)); err != nil {
		t.Fatal(err)
	}
	if n := a25rem(t, s, "max"); n != 0 {
		t.Fatalf("remaining %d, want 0", n)
	}
	if err := s.Apply(ctx, a25ev(stock.EventDeducted, "max", "one", 1)); !errors.Is(err, stock.ErrRefused) {
		t.Fatalf("deduct of 1 from 0 = %v, want ErrRefused", err)
	}
	if err := s.Apply(ctx, a25ev(stock.EventRestored, "max", "all", stock.MaxQty)); err != nil {
		t.Fatal(err)
	}
	if n := a25rem(t, s, "max"); n != stock.MaxQty {
		t.Fatalf("remaining after the restore %d, want MaxQty", n)
	}
	if err := s.Apply(ctx, stock.Event{Type: "bogus", SKU: "max", ID: "x", Qty: 1}); !errors.Is(err, stock.ErrInvalid) {
		t.Fatalf("unknown event type = %v, want ErrInvalid", err)
	}
	if err := s.Apply(ctx, stock.Event{Type: stock.EventDeducted, SKU: "", ID: "x", Qty: 1}); !errors.Is(err, stock.ErrInvalid) {
		t.Fatalf("empty sku = %v, want ErrInvalid", err)
	}
}

// Applications is documented as the count for the event (sku, id, type), "0 or 1 in a correct
// system". Names may contain '/', and two different events must not share a count.
func TestAttack25ApplicationsKeyCollision(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	_ = s.Load(ctx, "a/b", 10)
	_ = s.Load(ctx, "a", 10)
	if err := s.Apply(ctx, a25ev(stock.EventDeducted, "a/b", "c", 1)); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctx, a25ev(stock.EventDeducted, "a", "b/c", 1)); err != nil {
		t.Fatal(err)
	}
	if got := s.Applications("a", "b/c", stock.EventDeducted); got != 1 {
		t.Errorf("Applications(a, b/c, deducted) = %d, want 1 (each event applied once)", got)
	}
	if got := s.MaxApplications(); got != 1 {
		t.Errorf("MaxApplications() = %d after two distinct events applied once each, want 1: a false double-application alarm", got)
	}
}

// The Store contract: "Remaining never goes below zero". memstore.Load takes any qty.
func TestAttack25LoadNegative(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	err := s.Load(ctx, "neg", -5)
	n, rerr := s.Remaining(ctx, "neg")
	if err == nil && rerr == nil && n < 0 {
		t.Fatalf("Load(neg, -5) = nil and Remaining = %d: the store holds negative stock (want Load to refuse, e.g. ErrInvalid)", n)
	}
}
