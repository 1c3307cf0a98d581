package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock/internal/protocol"
	"github.com/stockres/stock/internal/redistest"
)

// hinted reports whether sku has a hint in the prefix's sets of keys (protocol.RelayDue or
// protocol.HoldsDue).
func hinted(t *testing.T, c rueidis.Client, keys func(string, int) string, sku string) bool {
	t.Helper()
	err := c.Do(context.Background(), c.B().Zscore().Key(keys("stock", protocol.DueShard(sku))).Member(sku).Build()).Error()
	if rueidis.IsRedisNil(err) {
		return false
	}
	require.NoError(t, err)
	return true
}

// errOf is the error of a call's two results.
func errOf[T any](_ T, err error) error { return err }

// TestCloseWaitsForHintsAndRefusesLaterCalls: the due-work hints of the calls made before Close
// are in Redis when Close returns (the hint writer writes them a moment after the calls), and
// every call after Close answers ErrReserverClosed without sending a command.
func TestCloseWaitsForHintsAndRefusesLaterCalls(t *testing.T) {
	eachCountedBackend(t, func(t *testing.T, _ redistest.Backend, cc *countingClient, r *Reserver) {
		ctx := context.Background()
		raw := cc.Client
		require.NoError(t, r.Load(ctx, "sku-d", 10))
		require.NoError(t, r.Load(ctx, "sku-h", 10))
		_, err := r.Deduct(ctx, Request{SKU: "sku-d", ID: "o1", Qty: 1})
		require.NoError(t, err)
		_, err = r.Hold(ctx, Request{SKU: "sku-h", ID: "h1", Qty: 1}, time.Minute)
		require.NoError(t, err)

		require.NoError(t, r.Close(ctx))
		assert.True(t, hinted(t, raw, protocol.RelayDue, "sku-d"), "the deduct's relay hint is written before Close returns")
		assert.True(t, hinted(t, raw, protocol.HoldsDue, "sku-h"), "the hold's hint is written before Close returns")

		sent := cc.all.Load()
		for _, call := range []struct {
			what string
			err  error
		}{ // each call is made here, in this order
			{"deduct", errOf(r.Deduct(ctx, Request{SKU: "sku-d", ID: "o2", Qty: 1}))},
			{"hold", errOf(r.Hold(ctx, Request{SKU: "sku-h", ID: "h2", Qty: 1}, time.Minute))},
			{"restore", errOf(r.Restore(ctx, "sku-d", "o1"))},
			{"confirm", errOf(r.Confirm(ctx, "sku-h", "h1"))},
			{"cancel", errOf(r.Cancel(ctx, "sku-h", "h1"))},
			{"extend", errOf(r.Extend(ctx, "sku-h", "h1", time.Minute))},
			{"restock", errOf(r.Restock(ctx, "sku-d", "r1", 5))},
			{"load", r.Load(ctx, "sku-new", 1)},
			{"levels", errOf(r.Levels(ctx, "sku-d"))},
			{"ledger", errOf(r.Ledger(ctx, "sku-d", "o1"))},
			{"close item", r.CloseItem(ctx, "sku-d")},
			{"reopen item", r.ReopenItem(ctx, "sku-d")},
			{"delist", r.Delist(ctx, "sku-d")},
			{"deduct many", errOf(r.DeductMany(ctx, Cart{ID: "c1", Lines: []Line{{SKU: "sku-d", Qty: 1}}}))},
			{"hold many", errOf(r.HoldMany(ctx, Cart{ID: "c2", Lines: []Line{{SKU: "sku-h", Qty: 1}}}, time.Minute))},
			{"confirm many", errOf(r.ConfirmMany(ctx, "h1", "sku-h"))},
			{"cancel many", errOf(r.CancelMany(ctx, "h1", "sku-h"))},
			{"run", r.Run(ctx, RunOptions{})},
			{"consume", Consume(ctx, r, nil, Event{SKU: "sku-d", ID: "o1", Type: EventDeducted, Qty: 1})},
		} {
			assert.ErrorIs(t, call.err, ErrReserverClosed, call.what)
		}
		_, err = r.sweepItems(ctx, "sku-h")
		assert.ErrorIs(t, err, ErrReserverClosed, "an internal sweep's commands are refused")
		assert.Equal(t, sent, cc.all.Load(), "no command is sent after Close")

		assert.NoError(t, r.Close(ctx), "a second Close")
	})
}

// TestCloseDuringCalls: calls running while Close is called either complete (and count in
// the levels and the ledger) or answer ErrReserverClosed and change nothing, and nothing is
// sent once Close returned. Run under -race.
func TestCloseDuringCalls(t *testing.T) {
	eachCountedBackend(t, func(t *testing.T, _ redistest.Backend, cc *countingClient, r *Reserver) {
		ctx := context.Background()
		raw := cc.Client
		require.NoError(t, r.Load(ctx, "sku-1", 1_000_000))
		var ok, refused atomic.Int64
		var wg sync.WaitGroup
		started := make(chan struct{})
		var once sync.Once
		for w := range 8 {
			wg.Go(func() {
				for i := 0; ; i++ {
					_, err := r.Deduct(ctx, Request{SKU: "sku-1", ID: fmt.Sprintf("w%d-%d", w, i), User: fmt.Sprint("u", w), Qty: 1})
					switch {
					case err == nil:
						ok.Add(1)
						if ok.Load() >= 50 {
							once.Do(func() { close(started) })
						}
					case errors.Is(err, ErrReserverClosed):
						refused.Add(1)
						return
					default:
						t.Errorf("deduct: %v", err)
						return
					}
				}
			})
		}
		<-started
		var cwg sync.WaitGroup
		for range 3 { // concurrent Closes: each returns once the work is done
			cwg.Go(func() {
				assert.NoError(t, r.Close(ctx))
			})
		}
		cwg.Wait()
		sent := cc.all.Load()
		wg.Wait()
		assert.Equal(t, sent, cc.all.Load(), "nothing is sent once Close returned")
		assert.Equal(t, int64(8), refused.Load())

		r2, err := New(raw)
		require.NoError(t, err)
		l, err := r2.Levels(ctx, "sku-1")
		require.NoError(t, err)
		assert.Equal(t, ok.Load(), l.Sold, "every acknowledged deduct, and only those, took stock")
	})
}

// TestCloseStopsRun: Close stops a Run in progress, which returns ErrReserverClosed, and waits
// for it; Run on a closed Reserver refuses at once.
func TestCloseStopsRun(t *testing.T) {
	eachCountedBackend(t, func(t *testing.T, _ redistest.Backend, cc *countingClient, r *Reserver) {
		ctx := context.Background()
		require.NoError(t, r.Load(ctx, "sku-1", 10))
		pub := PublisherFunc(func(context.Context, Event) error { return nil })
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx, RunOptions{Publisher: pub}) }() // ctx never ends
		_, err := r.Deduct(ctx, Request{SKU: "sku-1", ID: "o1", Qty: 1})
		require.NoError(t, err)
		require.NoError(t, r.Close(ctx))
		sent := cc.all.Load()
		select {
		case err := <-done:
			assert.ErrorIs(t, err, ErrReserverClosed)
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return after Close")
		}
		assert.Equal(t, sent, cc.all.Load(), "Run sent nothing after Close returned")
		assert.ErrorIs(t, r.Run(ctx, RunOptions{Publisher: pub}), ErrReserverClosed)
	})
}
