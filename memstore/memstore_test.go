package memstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stockres/stock"
	"github.com/stockres/stock/memstore"
)

// Load takes 0 to stock.MaxQty; outside that it answers ErrInvalid and changes nothing.
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

// Applications counts per event (sku, id, type), whatever characters the names hold.
func TestApplicationsPerEvent(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	skus := []string{"a", "a/b", "a/b/c"}
	for _, sku := range skus {
		if err := s.Load(ctx, sku, 10); err != nil {
			t.Fatal(err)
		}
	}
	evs := []stock.Event{
		{Type: stock.EventDeducted, SKU: "a/b/c", ID: "x", Qty: 1},
		{Type: stock.EventDeducted, SKU: "a/b", ID: "c/x", Qty: 1},
		{Type: stock.EventDeducted, SKU: "a", ID: "b/c/x", Qty: 1},
		{Type: stock.EventRestocked, SKU: "a", ID: "b/c/x/deducted", Qty: 1},
	}
	for _, ev := range evs {
		if err := s.Apply(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	for _, ev := range evs {
		if n := s.Applications(ev.SKU, ev.ID, ev.Type); n != 1 {
			t.Fatalf("Applications(%q, %q, %s) = %d, want 1", ev.SKU, ev.ID, ev.Type, n)
		}
	}
	if n := s.Applications("a", "b/c/x", stock.EventRestored); n != 0 {
		t.Fatalf("Applications of a restore never applied = %d, want 0", n)
	}
	if m := s.MaxApplications(); m != 1 {
		t.Fatalf("MaxApplications() = %d, want 1", m)
	}
}
