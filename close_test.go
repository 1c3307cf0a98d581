package stock

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

// TestCloseWaitsForHintsAndRefusesLaterCalls: the due-work hints of the calls made before Close
// are in Redis when Close returns (the hint writer writes them a moment after the calls), and
// every call after Close answers ErrReserverClosed without sending a command.
func TestCloseWaitsForHintsAndRefusesLaterCalls(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			raw := b.Client(t)
			cc := &countingClient{Client: raw}
			r, err := New(cc)
			require.NoError(t, err)
			require.NoError(t, r.Load(ctx, "sku-d", 10))
			require.NoError(t, r.Load(ctx, "sku-h", 10))
			_, err = r.Deduct(ctx, Request{SKU: "sku-d", ID: "o1", Qty: 1})
			require.NoError(t, err)
			_, err = r.Hold(ctx, Request{SKU: "sku-h", ID: "h1", Qty: 1}, time.Minute)
			require.NoError(t, err)

			require.NoError(t, r.Close(ctx))
			assert.True(t, hinted(t, raw, protocol.RelayDue, "sku-d"), "the deduct's relay hint is written before Close returns")
			assert.True(t, hinted(t, raw, protocol.HoldsDue, "sku-h"), "the hold's hint is written before Close returns")

			sent := cc.all.Load()
			closed := func(what string, err error) {
				t.Helper()
				assert.ErrorIs(t, err, ErrReserverClosed, what)
			}
			_, err = r.Deduct(ctx, Request{SKU: "sku-d", ID: "o2", Qty: 1})
			closed("deduct", err)
			_, err = r.Hold(ctx, Request{SKU: "sku-h", ID: "h2", Qty: 1}, time.Minute)
			closed("hold", err)
			_, err = r.Restore(ctx, "sku-d", "o1")
			closed("restore", err)
			_, err = r.Confirm(ctx, "sku-h", "h1")
			closed("confirm", err)
			_, err = r.Cancel(ctx, "sku-h", "h1")
			closed("cancel", err)
			_, err = r.Extend(ctx, "sku-h", "h1", time.Minute)
			closed("extend", err)
			_, err = r.Restock(ctx, "sku-d", "r1", 5)
			closed("restock", err)
			closed("load", r.Load(ctx, "sku-new", 1))
			_, err = r.Levels(ctx, "sku-d")
			closed("levels", err)
			_, err = r.Ledger(ctx, "sku-d", "o1")
			closed("ledger", err)
			closed("close item", r.CloseItem(ctx, "sku-d"))
			closed("reopen item", r.ReopenItem(ctx, "sku-d"))
			closed("delist", r.Delist(ctx, "sku-d"))
			_, err = r.DeductMany(ctx, Cart{ID: "c1", Lines: []Line{{SKU: "sku-d", Qty: 1}}})
			closed("deduct many", err)
			_, err = r.HoldMany(ctx, Cart{ID: "c2", Lines: []Line{{SKU: "sku-h", Qty: 1}}}, time.Minute)
			closed("hold many", err)
			_, err = r.ConfirmMany(ctx, "h1", "sku-h")
			closed("confirm many", err)
			_, err = r.CancelMany(ctx, "h1", "sku-h")
			closed("cancel many", err)
			closed("run", r.Run(ctx, RunOptions{}))
			closed("consume", Consume(ctx, r, nil, Event{SKU: "sku-d", ID: "o1", Type: EventDeducted, Qty: 1}))
			_, err = r.sweepItems(ctx, "sku-h")
			assert.ErrorIs(t, err, ErrReserverClosed, "an internal sweep's commands are refused")
			assert.Equal(t, sent, cc.all.Load(), "no command is sent after Close")

			assert.NoError(t, r.Close(ctx), "a second Close")
		})
	}
}

// TestCloseDuringCalls: calls running while Close is called either complete (and count in
// the levels and the ledger) or answer ErrReserverClosed and change nothing, and nothing is
// sent once Close returned. Run under -race.
func TestCloseDuringCalls(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			raw := b.Client(t)
			cc := &countingClient{Client: raw}
			r, err := New(cc)
			require.NoError(t, err)
			require.NoError(t, r.Load(ctx, "sku-1", 1_000_000))
			var ok, refused atomic.Int64
			var wg sync.WaitGroup
			started := make(chan struct{})
			var once sync.Once
			for w := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
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
				}()
			}
			<-started
			var cwg sync.WaitGroup
			for range 3 { // concurrent Closes: each returns once the work is done
				cwg.Add(1)
				go func() {
					defer cwg.Done()
					assert.NoError(t, r.Close(ctx))
				}()
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
}

// TestCloseStopsRun: Close stops a Run in progress, which returns ErrReserverClosed, and waits
// for it; Run on a closed Reserver refuses at once.
func TestCloseStopsRun(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			raw := b.Client(t)
			cc := &countingClient{Client: raw}
			r, err := New(cc)
			require.NoError(t, err)
			require.NoError(t, r.Load(ctx, "sku-1", 10))
			pub := PublisherFunc(func(context.Context, Event) error { return nil })
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx, RunOptions{Publisher: pub}) }() // ctx never ends
			_, err = r.Deduct(ctx, Request{SKU: "sku-1", ID: "o1", Qty: 1})
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
}
