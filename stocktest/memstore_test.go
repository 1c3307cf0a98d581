package stocktest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stockres/stock"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stocktest"
)

// TestStoreOnMemstore runs the stock.Store conformance suite on memstore (memstore is in the
// root module, which does not depend on this one).
func TestStoreOnMemstore(t *testing.T) {
	stocktest.TestStore(t, func(*testing.T) stock.Store { return memstore.New() })
}

// TestMemstoreCountsThroughRelay: memstore's Applications through the whole path: two distinct
// events, each applied once by the relay, on names the library accepts ('/' is allowed).
func TestMemstoreCountsThroughRelay(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t)
	store := memstore.New()
	for _, sku := range []string{"a/b", "a"} {
		_ = store.Load(ctx, sku, 10)
		load(t, e, sku, 10)
	}
	deduct(t, e, "a/b", "c", 1)
	deduct(t, e, "a", "b/c", 1)
	runUntilEnd(t, e, stock.RunOptions{Store: store, Reconcile: &stock.ReconcileOptions{Interval: -1}})
	waitFor(t, 10*time.Second, "both deducts delivered", func() (bool, string) {
		x, _ := store.Remaining(ctx, "a/b")
		y, _ := store.Remaining(ctx, "a")
		return x == 9 && y == 9, fmt.Sprint(x, y)
	})
	if m := store.MaxApplications(); m != 1 {
		t.Fatalf("memstore.MaxApplications() = %d after the relay applied two distinct events once each (a/b:c and a:b/c), want 1", m)
	}
}
