package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stockres/stock"
	"github.com/stockres/stock/memstore"
	"github.com/stretchr/testify/require"
)

// TestLoadRange: Load takes 0 to stock.MaxQty (never negative stock); outside that it answers
// ErrInvalid and changes nothing.
func TestLoadRange(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	for _, q := range []int64{-1, -5, stock.MaxQty + 1} {
		require.ErrorIs(t, s.Load(ctx, "x", q), stock.ErrInvalid, "Load(x, %d)", q)
		_, err := s.Remaining(ctx, "x")
		require.ErrorIs(t, err, stock.ErrNotLoaded, "after Load(x, %d) failed: nothing created", q)
	}
	for _, q := range []int64{0, stock.MaxQty} {
		sku := "ok" + string(rune('0'+q%10))
		require.NoError(t, s.Load(ctx, sku, q))
		require.Equal(t, q, remaining(t, s, sku))
	}
	// An invalid load of an existing item leaves it as it was.
	require.ErrorIs(t, s.Load(ctx, "ok0", -1), stock.ErrInvalid)
	require.Zero(t, remaining(t, s, "ok0"), "after an invalid Load")
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
				if err := s.Load(ctx, ev.SKU, 10); !errors.Is(err, stock.ErrLoaded) {
					require.NoError(t, err)
				}
			}
			for _, ev := range tc.evs {
				require.NoError(t, s.Apply(ctx, ev))
			}
			for _, ev := range tc.evs {
				require.Equal(t, 1, s.Applications(ev.SKU, ev.ID, ev.Type), "%q/%q %s", ev.SKU, ev.ID, ev.Type)
				require.Zero(t, s.Applications(ev.SKU, ev.ID, stock.EventRestored), "a restore of %q/%q never applied", ev.SKU, ev.ID)
			}
			require.Equal(t, 1, s.MaxApplications(), "after distinct events applied once each")
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
	require.NoError(t, err, "Remaining(%q)", sku)
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
		wg.Go(func() {
			if err := s.Apply(ctx, event(stock.EventDeducted, "a", "o1", 7)); err != nil {
				errs.Add(1)
			}
			if err := s.Apply(ctx, event(stock.EventRestored, "a", "o2", 5)); err != nil { // tombstone
				errs.Add(1)
			}
		})
	}
	wg.Wait()
	require.Zero(t, errs.Load(), "errors from concurrent repeats of one event")
	require.Equal(t, int64(93), remaining(t, s, "a"))
	require.Equal(t, 1, s.Applications("a", "o1", stock.EventDeducted))
	require.Equal(t, 1, s.MaxApplications())
	// Concurrent duplicate restores of the applied id give back once.
	for range 64 {
		wg.Add(1)
		go func() { defer wg.Done(); _ = s.Apply(ctx, event(stock.EventRestored, "a", "o1", 7)) }()
	}
	wg.Wait()
	require.Equal(t, int64(100), remaining(t, s, "a"), "after 64 restores of one id")
	// The tombstoned id can never take stock.
	if err := s.Apply(ctx, event(stock.EventDeducted, "a", "o2", 5)); !errors.Is(err, stock.ErrRefused) {
		require.NoError(t, err)
	}
	require.Equal(t, int64(100), remaining(t, s, "a"), "a late deduct of a tombstoned id took stock")
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
		wg.Go(func() {
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
		})
	}
	wg.Wait()
	close(stop)
	mon.Wait()
	require.GreaterOrEqual(t, minSeen.Load(), int64(0), "remaining went below zero")
	require.LessOrEqual(t, s.MaxApplications(), 1, "an event changed the stock more than once")
	taken := map[string]int64{}
	for _, o := range ops {
		m, err := s.Records(ctx, o.sku, []string{o.id})
		require.NoError(t, err)
		rec, ok := m[o.id]
		require.True(t, ok, "no record of %s/%s", o.sku, o.id)
		switch rec.Status {
		case stock.StateApplied:
			taken[o.sku] += o.qty
		case stock.StateRestored, stock.StateRefused:
		default:
			t.Fatalf("record %+v", rec)
		}
		if rec.Status == stock.StateApplied {
			require.Equal(t, 1, s.Applications(o.sku, o.id, stock.EventDeducted), "%s/%s applied", o.sku, o.id)
		}
	}
	for _, sku := range skus {
		require.Equal(t, loaded-taken[sku], remaining(t, s, sku), "%s: loaded - applied", sku)
		recs, err := s.List(ctx, sku, "", 10000)
		require.NoError(t, err)
		for i := 1; i < len(recs); i++ {
			require.Less(t, recs[i-1].ID, recs[i].ID, "List of %s out of order at %d", sku, i)
		}
		require.Len(t, recs, len(ops)/len(skus), "List of %s", sku)
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
	require.ErrorIs(t, s.Apply(ctx, event(stock.EventDeducted, "a", "o1", 1)), memstore.ErrDown, "Apply while down")
	m, _ := s.Records(ctx, "a", []string{"o1"})
	require.Empty(t, m, "a failed Apply recorded")
	// Reads keep working while down (the reconciler needs them).
	require.Equal(t, int64(10), remaining(t, s, "a"), "a failed Apply took stock")
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
	require.Len(t, errs, 4)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], stock.ErrRefused)
	require.ErrorIs(t, errs[2], memstore.ErrDown)
	require.Error(t, errs[3])
	require.NotErrorIs(t, errs[3], stock.ErrRefused)
	require.NotErrorIs(t, errs[3], stock.ErrInvalid)
	require.Equal(t, int64(9), remaining(t, s, "a"))
	require.Equal(t, int64(10), remaining(t, s, "b"))
	m, _ = s.Records(ctx, "a", []string{"o4"})
	require.Empty(t, m, "an event after the failure was recorded")
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
		if err := s.Apply(ctx, event(stock.EventDeducted, "b", fmt.Sprint("t", i), 1)); !errors.Is(err, stock.ErrRefused) {
			require.NoError(t, err)
		}
	}
	require.Zero(t, remaining(t, s, "b"))
	require.Equal(t, 1, s.MaxApplications())
}

// TestNamesAndBounds: item and id names with separators and non-ASCII characters are kept
// apart, ListItems pages in byte order, and quantities are bounded by 1 and stock.MaxQty.
func TestNamesAndBounds(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	names := []string{"a", "a:", "a:b", "a~b", "ü", "ü:ñ~🙂", "a:b:c"}
	for i, sku := range names {
		require.NoError(t, s.Load(ctx, sku, int64(10+i)))
	}
	require.ErrorIs(t, s.Load(ctx, "a:b", 1), stock.ErrLoaded, "second Load")
	for _, sku := range names {
		require.NoError(t, s.Apply(ctx, event(stock.EventDeducted, sku, "o:1~ü", 1)))
	}
	for i, sku := range names {
		require.Equal(t, int64(9+i), remaining(t, s, sku), "%q: ids scoped per item", sku)
	}
	items, err := s.ListItems(ctx, "", 100)
	require.NoError(t, err)
	require.Len(t, items, len(names))
	require.True(t, slices.IsSorted(items), "ListItems not in byte order: %q", items)
	require.Len(t, slices.Compact(slices.Clone(items)), len(items), "ListItems repeats: %q", items)
	page, _ := s.ListItems(ctx, "a:", 2)
	require.Equal(t, []string{"a:b", "a:b:c"}, page, "ListItems after %q", "a:")

	// MaxQty boundaries.
	_ = s.Load(ctx, "max", stock.MaxQty)
	for _, q := range []int64{stock.MaxQty + 1, 0, -1} {
		require.ErrorIs(t, s.Apply(ctx, event(stock.EventDeducted, "max", fmt.Sprint("q", q), q)), stock.ErrInvalid, "qty %d", q)
	}
	require.NoError(t, s.Apply(ctx, event(stock.EventDeducted, "max", "all", stock.MaxQty)))
	require.Zero(t, remaining(t, s, "max"))
	require.ErrorIs(t, s.Apply(ctx, event(stock.EventDeducted, "max", "one", 1)), stock.ErrRefused, "deduct of 1 from 0")
	require.NoError(t, s.Apply(ctx, event(stock.EventRestored, "max", "all", stock.MaxQty)))
	require.Equal(t, int64(stock.MaxQty), remaining(t, s, "max"), "after the restore")
	require.ErrorIs(t, s.Apply(ctx, stock.Event{Type: "bogus", SKU: "max", ID: "x", Qty: 1}), stock.ErrInvalid, "unknown event type")
	require.ErrorIs(t, s.Apply(ctx, stock.Event{Type: stock.EventDeducted, SKU: "", ID: "x", Qty: 1}), stock.ErrInvalid, "empty sku")
}
