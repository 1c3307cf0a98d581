package stock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/stockops"
)

func TestHoldConfirm(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c, stock.WithUserLimit(3))
		require.NoError(t, r.Load(ctx, "A", 10))
		req := stock.Request{SKU: "A", ID: "h1", User: "u", Qty: 3}
		rc := must(t)(r.Hold(ctx, req, time.Minute))
		assert.Equal(t, stock.Receipt{SKU: "A", ID: "h1", Qty: 3, Remaining: 7}, rc)
		assert.Equal(t, stock.Levels{Available: 7, Held: 3, Loaded: 10}, levels(t, r, "A"))
		e := entry(t, r, "A", "h1")
		assert.Equal(t, stock.KindHold, e.Kind)
		assert.Equal(t, stock.StateHeld, e.State)
		assert.WithinDuration(t, e.At.Add(time.Minute), e.Deadline, time.Millisecond)

		rc = must(t)(r.Hold(ctx, req, time.Minute))
		assert.True(t, rc.Replayed)
		mustFail(t, stock.ErrConflict, "a hold id is not a deduct id")(r.Deduct(ctx, req))
		mustFail(t, stock.ErrUserLimit, "held units count against the limit")(
			r.Hold(ctx, stock.Request{SKU: "A", ID: "h2", User: "u", Qty: 1}, time.Minute))

		rc = must(t)(r.Confirm(ctx, "A", "h1"))
		assert.False(t, rc.Replayed)
		rc = must(t)(r.Confirm(ctx, "A", "h1"))
		assert.True(t, rc.Replayed)
		assert.Equal(t, stock.Levels{Available: 7, Sold: 3, Loaded: 10}, levels(t, r, "A"))
		mustFail(t, stock.ErrConfirmed)(r.Cancel(ctx, "A", "h1"))
		mustFail(t, stock.ErrConfirmed)(r.Extend(ctx, "A", "h1", time.Minute))
		// A confirmed hold is a sale: Restore gives it back.
		rc = must(t)(r.Restore(ctx, "A", "h1"))
		assert.Equal(t, int64(10), rc.Remaining)
		checkLedger(t, r, "A", 10)
	})
}

func TestHoldCancel(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		require.NoError(t, r.Load(ctx, "A", 10))
		must(t)(r.Hold(ctx, stock.Request{SKU: "A", ID: "h1", Qty: 4}, time.Minute))
		rc := must(t)(r.Cancel(ctx, "A", "h1"))
		assert.Equal(t, stock.Receipt{SKU: "A", ID: "h1", Qty: 4, Remaining: 10}, rc)
		rc = must(t)(r.Cancel(ctx, "A", "h1"))
		assert.True(t, rc.Replayed)
		mustFail(t, stock.ErrRestored)(r.Confirm(ctx, "A", "h1"))
		mustFail(t, stock.ErrRestored)(r.Hold(ctx, stock.Request{SKU: "A", ID: "h1", Qty: 4}, time.Minute))

		// A cancel that overtook its hold wins.
		mustFail(t, stock.ErrUnknownID)(r.Cancel(ctx, "A", "h2"))
		mustFail(t, stock.ErrRestored)(r.Hold(ctx, stock.Request{SKU: "A", ID: "h2", Qty: 1}, time.Minute))
		mustFail(t, stock.ErrUnknownID)(r.Confirm(ctx, "A", "nope"))

		must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "d1", Qty: 1}))
		mustFail(t, stock.ErrConflict, "a deduct is not cancelled, it is restored")(r.Cancel(ctx, "A", "d1"))
		mustFail(t, stock.ErrConflict)(r.Confirm(ctx, "A", "d1"))
		mustFail(t, stock.ErrInvalid)(r.Hold(ctx, stock.Request{SKU: "A", ID: "h3", Qty: 1}, 0))
		mustFail(t, stock.ErrInvalid)(r.Hold(ctx, stock.Request{SKU: "A", ID: "h3", Qty: 1}, stock.MaxHoldTTL+time.Second))
		assert.Equal(t, stock.Levels{Available: 9, Sold: 1, Loaded: 10}, levels(t, r, "A"))
	})
}

func TestHoldExpiry(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c, stock.WithUserLimit(1))
		require.NoError(t, r.Load(ctx, "A", 10))
		mustFail(t, stock.ErrUserLimit)(r.Hold(ctx, stock.Request{SKU: "A", ID: "h1", User: "u", Qty: 2}, 500*time.Millisecond))
		for i := range 5 {
			must(t)(r.Hold(ctx, stock.Request{SKU: "A", ID: fmt.Sprint("h", i), User: fmt.Sprint("u", i), Qty: 1}, 500*time.Millisecond))
		}
		must(t)(r.Hold(ctx, stock.Request{SKU: "A", ID: "long", Qty: 1}, 500*time.Millisecond))
		must(t)(r.Extend(ctx, "A", "long", time.Minute))
		assert.Equal(t, int64(6), levels(t, r, "A").Held)
		redistest.Sleep(c, 700*time.Millisecond)

		// Confirm after the deadline is refused, and the hold goes back at once.
		mustFail(t, stock.ErrExpired)(r.Confirm(ctx, "A", "h0"))
		mustFail(t, stock.ErrExpired)(r.Extend(ctx, "A", "h1", time.Minute))
		mustFail(t, stock.ErrExpired, "the replay of an expired hold")(
			r.Hold(ctx, stock.Request{SKU: "A", ID: "h0", User: "u0", Qty: 1}, time.Minute))
		// The next operation on the item released every expired hold (lazy expiry).
		assert.Equal(t, stock.Levels{Available: 9, Held: 1, Loaded: 10}, levels(t, r, "A"))
		// The users' units came back.
		must(t)(r.Hold(ctx, stock.Request{SKU: "A", ID: "again", User: "u3", Qty: 1}, time.Minute))
		rc := must(t)(r.Cancel(ctx, "A", "h2"))
		assert.True(t, rc.Replayed, "cancel after expiry: already given back")
		must(t, "an extended hold outlives its first deadline")(r.Confirm(ctx, "A", "long"))
		_, entries := checkLedger(t, r, "A", 10)
		for i := range 5 {
			assert.Equal(t, stock.StateExpired, entries[fmt.Sprint("h", i)].State)
		}
	})
}

func TestSweep(t *testing.T) {
	eachBackendSerial(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		pub := newRecorder()
		for _, sku := range []string{"A", "B"} {
			require.NoError(t, r.Load(ctx, sku, 1000))
			for i := range 300 { // more than one sweep step
				must(t)(r.Hold(ctx, stock.Request{SKU: sku, ID: fmt.Sprint("h", i), Qty: 1}, 3*time.Second))
			}
		}
		n, err := stockops.Sweep(ctx, r)
		require.NoError(t, err)
		assert.Zero(t, n, "nothing is due yet")
		redistest.Sleep(c, 3100*time.Millisecond)
		n, err = stockops.Sweep(ctx, r)
		require.NoError(t, err)
		assert.Equal(t, int64(600), n)
		for _, sku := range []string{"A", "B"} {
			assert.Equal(t, stock.Levels{Available: 1000, Loaded: 1000}, levels(t, r, sku))
		}
		rl := newRelay(t, r, nil, pub, nil)
		drain(t, rl)
		assert.Equal(t, 600, pub.count(stock.EventHeld))
		assert.Equal(t, 600, pub.count(stock.EventExpired))
	})
}

// TestHoldRace: confirm, cancel and expiry race on the same holds; exactly one wins each.
func TestHoldRace(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		require.NoError(t, r.Load(ctx, "A", 100))
		for i := range 100 {
			must(t)(r.Hold(ctx, stock.Request{SKU: "A", ID: fmt.Sprint("h", i), Qty: 1}, time.Duration(5+i%20)*time.Millisecond))
		}
		var confirmed, cancelled atomic.Int64
		var wg sync.WaitGroup
		for i := range 100 {
			id := fmt.Sprint("h", i)
			wg.Go(func() {
				if rc, err := r.Confirm(ctx, "A", id); err == nil && !rc.Replayed {
					confirmed.Add(1)
				} else if err != nil && !errors.Is(err, stock.ErrExpired) && !errors.Is(err, stock.ErrRestored) {
					t.Error(err)
				}
			})
			wg.Go(func() {
				if rc, err := r.Cancel(ctx, "A", id); err == nil && !rc.Replayed {
					cancelled.Add(1)
				} else if err != nil && !errors.Is(err, stock.ErrConfirmed) {
					t.Error(err)
				}
			})
			wg.Go(func() { _, _ = stockops.Sweep(ctx, r, "A") })
		}
		wg.Wait()
		redistest.Sleep(c, 30*time.Millisecond)
		_, err := stockops.Sweep(ctx, r, "A")
		require.NoError(t, err)
		l, entries := checkLedger(t, r, "A", 100)
		var sold, back int64
		for _, e := range entries {
			switch e.State {
			case stock.StateReserved:
				sold++
			case stock.StateCancelled, stock.StateExpired:
				back++
			default:
				t.Errorf("entry %s left %s", e.ID, e.State)
			}
		}
		assert.Equal(t, confirmed.Load(), sold)
		assert.Equal(t, int64(100), sold+back)
		assert.LessOrEqual(t, cancelled.Load(), back)
		assert.Equal(t, stock.Levels{Available: 100 - sold, Sold: sold, Loaded: 100}, l)
	})
}

// TestHoldConcurrent: 1000 goroutines hold and confirm or cancel over 100 units with random
// deadlines; the level equation holds throughout and the ledger explains the end.
func TestHoldConcurrent(t *testing.T) {
	eachBackendSerial(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r, store := reserverAndStore(t, c, map[string]int64{"A": 100})
		stop := make(chan struct{})
		var checks atomic.Int64
		var wg, watch sync.WaitGroup
		watch.Go(func() { // the equation at every moment, read atomically
			for {
				select {
				case <-stop:
					return
				default:
				}
				l, err := r.Levels(ctx, "A")
				if assert.NoError(t, err) {
					assert.Equal(t, l.Loaded, l.Available+l.Held+l.Sold)
					assert.GreaterOrEqual(t, l.Available, int64(0))
				}
				checks.Add(1)
			}
		})
		var confirmed atomic.Int64
		for g := range 1000 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(g), 3))
				id := fmt.Sprint("h", g)
				_, err := r.Hold(ctx, stock.Request{SKU: "A", ID: id, Qty: 1}, time.Duration(1+rng.IntN(40))*time.Millisecond)
				if err != nil {
					if !errors.Is(err, stock.ErrSoldOut) {
						t.Error(err)
					}
					return
				}
				redistest.Sleep(c, time.Duration(rng.IntN(30))*time.Millisecond)
				if rng.IntN(3) == 0 {
					_, _ = r.Cancel(ctx, "A", id)
				} else if rc, err := r.Confirm(ctx, "A", id); err == nil && !rc.Replayed {
					confirmed.Add(1)
				}
			})
		}
		wg.Wait()
		close(stop)
		watch.Wait()
		redistest.Sleep(c, 50*time.Millisecond)
		_, err := stockops.Sweep(ctx, r, "A")
		require.NoError(t, err)
		l, _ := checkLedger(t, r, "A", 100)
		assert.Zero(t, l.Held)
		assert.Equal(t, confirmed.Load(), l.Sold)
		assert.Positive(t, checks.Load())
		rl := newRelay(t, r, store, nil, nil)
		drain(t, rl)
		rem, _ := store.Remaining(ctx, "A")
		assert.Equal(t, l.Available, rem, "only confirmed holds reach the store")
	})
}

func TestCloseReopen(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		require.ErrorIs(t, r.CloseItem(ctx, "A"), stock.ErrNotLoaded)
		require.NoError(t, r.Load(ctx, "A", 10))
		must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "d1", Qty: 1}))
		must(t)(r.Hold(ctx, stock.Request{SKU: "A", ID: "h1", Qty: 1}, time.Minute))
		require.NoError(t, r.CloseItem(ctx, "A"))
		require.NoError(t, r.CloseItem(ctx, "A"))
		assert.True(t, levels(t, r, "A").Closed)
		mustFail(t, stock.ErrClosed)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "d2", Qty: 1}))
		mustFail(t, stock.ErrClosed)(r.Hold(ctx, stock.Request{SKU: "A", ID: "h2", Qty: 1}, time.Minute))
		// The pipeline of a closed item finishes.
		rc := must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "d1", Qty: 1}))
		assert.True(t, rc.Replayed)
		must(t)(r.Confirm(ctx, "A", "h1"))
		must(t)(r.Restore(ctx, "A", "d1"))
		require.NoError(t, r.ReopenItem(ctx, "A"))
		must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "d2", Qty: 1}))
		assert.Equal(t, stock.Levels{Available: 8, Sold: 2, Loaded: 10}, levels(t, r, "A"))
	})
}
