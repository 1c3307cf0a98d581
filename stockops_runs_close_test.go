package stock_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"

	"github.com/stockres/stock"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// After Close, every method, the operations of package stockops too, returns an error wrapping
// ErrReserverClosed (Reserver.Close's doc). The loops of stockops (Relay.Run, Reconciler.Run,
// FailoverGuard.Run) went on until their context ended: every pass refused, logged as a
// warning each poll, for ever with a context that never ends, and a loop started after Close
// ran all the same.
func TestStockopsRunsEndWithReserverClosedWhenTheReserverCloses(t *testing.T) {
	mr := miniredis.RunT(t)
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{mr.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	r, err := stock.New(client, stock.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a bound for the test only
	defer cancel()
	store := memstore.New()
	if _, err := stockops.Preheat(ctx, r, store, "sku-1", 3); err != nil {
		t.Fatal(err)
	}
	rl, err := stockops.NewRelay(r, store, nil, &stock.RelayOptions{Poll: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := stockops.NewReconciler(r, store, &stock.ReconcileOptions{Interval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	g := stockops.NewFailoverGuard(r)
	loops := map[string]func() error{
		"Relay.Run":         func() error { return rl.Run(ctx) },
		"Reconciler.Run":    func() error { return rc.Run(ctx) },
		"FailoverGuard.Run": func() error { return g.Run(ctx, 10*time.Millisecond) },
	}
	type result struct {
		name string
		err  error
	}
	ended := make(chan result, len(loops))
	for name, run := range loops {
		go func() { ended <- result{name, run()} }()
	}
	time.Sleep(50 * time.Millisecond)
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
	closed := time.Now()
	for range loops {
		select {
		case res := <-ended:
			if !errors.Is(res.err, stock.ErrReserverClosed) {
				t.Errorf("%s after Close = %v, want an error wrapping ErrReserverClosed", res.name, res.err)
			}
		case <-time.After(time.Until(closed.Add(2 * time.Second))):
			t.Fatalf("a stockops loop still runs 2s after Close")
		}
	}
	for name, run := range loops { // started after Close: at once
		start := time.Now()
		if err := run(); !errors.Is(err, stock.ErrReserverClosed) || time.Since(start) > time.Second {
			t.Errorf("%s started after Close = %v after %v, want ErrReserverClosed at once", name, err, time.Since(start).Round(time.Millisecond))
		}
	}
}

// TestPreheatOfAClosedReserverWritesNothing: Preheat on a closed Reserver answers
// ErrReserverClosed before it writes to the store (it loaded the store's row, then failed at
// Redis).
func TestPreheatOfAClosedReserverWritesNothing(t *testing.T) {
	mr := miniredis.RunT(t)
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{mr.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	r, err := stock.New(client)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
	store := memstore.New()
	if _, err := stockops.Preheat(ctx, r, store, "sku-1", 3); !errors.Is(err, stock.ErrReserverClosed) {
		t.Fatalf("Preheat after Close = %v, want ErrReserverClosed", err)
	}
	if n, err := store.Remaining(ctx, "sku-1"); !errors.Is(err, stock.ErrNotLoaded) {
		t.Errorf("the store has the item after a refused Preheat: %d, %v", n, err)
	}
}
