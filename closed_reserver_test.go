package stock_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// After Close, every method, the operations of package stockops too, returns an error wrapping
// ErrReserverClosed at once and writes nothing (Reserver.Close's doc).

// closedReserver returns a Reserver on c, with a loaded item "sku-1", already closed.
func closedReserver(t *testing.T, c rueidis.Client) *stock.Reserver {
	t.Helper()
	r := newReserver(t, c, stock.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	require.NoError(t, r.Load(ctx, "sku-1", 3))
	require.NoError(t, r.Ready(ctx), "Ready of an open Reserver")
	require.NoError(t, r.Close(ctx))
	return r
}

// Close is idempotent: a later Close answers nil even with a context that already ended. It
// answered ctx's error at random (the wait picked between the closed Reserver and the ended
// context), so a shutdown path that closes twice reported a failure that was not.
func TestCloseOfAClosedReserverAnswersNilWhateverItsContext(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		r := closedReserver(t, c)
		ended, cancel := context.WithCancel(ctx)
		cancel()
		for i := range 200 {
			require.NoError(t, r.Close(ended), "Close %d of a closed Reserver with an ended context", i+2)
		}
	})
}

// Ready of a closed Reserver answers ErrReserverClosed at once. It retried the refused commands
// as if Redis were unreachable until its context ended: without a deadline it never returned.
func TestReadyOfAClosedReserverAnswersReserverClosedAtOnce(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		r := closedReserver(t, c)
		wait, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		start := time.Now()
		err := r.Ready(wait)
		assert.ErrorIs(t, err, stock.ErrReserverClosed)
		assert.Less(t, time.Since(start), time.Second, "Ready of a closed Reserver waits")
	})
}

// The loops of stockops (Relay.Run, Reconciler.Run, FailoverGuard.Run) end with
// ErrReserverClosed when the Reserver closes under them, and at once when started after Close.
// They went on until their context ended, every pass refused and logged.
func TestStockopsRunsEndWithReserverClosedWhenTheReserverCloses(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		r := newReserver(t, c, stock.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		loopCtx, cancel := context.WithTimeout(ctx, 10*time.Second) // a bound for the test only
		defer cancel()
		store := memstore.New()
		_, err := stockops.Preheat(ctx, r, store, "sku-1", 3)
		require.NoError(t, err)
		rl := newRelay(t, r, store, nil, &stock.RelayOptions{Poll: 10 * time.Millisecond})
		rc := newReconciler(t, r, store, &stock.ReconcileOptions{Interval: 10 * time.Millisecond})
		g := stockops.NewFailoverGuard(r)
		loops := map[string]func() error{
			"Relay.Run":         func() error { return rl.Run(loopCtx) },
			"Reconciler.Run":    func() error { return rc.Run(loopCtx) },
			"FailoverGuard.Run": func() error { return g.Run(loopCtx, 10*time.Millisecond) },
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
		require.NoError(t, r.Close(ctx))
		deadline := time.After(2 * time.Second)
		for range loops {
			select {
			case res := <-ended:
				assert.ErrorIs(t, res.err, stock.ErrReserverClosed, "%s after Close", res.name)
			case <-deadline:
				t.Fatal("a stockops loop still runs 2s after Close")
			}
		}
		for name, run := range loops { // started after Close: at once
			start := time.Now()
			assert.ErrorIs(t, run(), stock.ErrReserverClosed, "%s started after Close", name)
			assert.Less(t, time.Since(start), time.Second, "%s started after Close waits", name)
		}
	})
}

// Preheat on a closed Reserver answers ErrReserverClosed before it writes to the store: it
// loaded the store's row, then failed at Redis.
func TestPreheatOfAClosedReserverWritesNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		r := closedReserver(t, c)
		store := memstore.New()
		_, err := stockops.Preheat(ctx, r, store, "sku-2", 3)
		require.ErrorIs(t, err, stock.ErrReserverClosed)
		_, err = store.Remaining(ctx, "sku-2")
		assert.ErrorIs(t, err, stock.ErrNotLoaded, "the store has the item after a refused Preheat")
	})
}
