package stock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/stockops"
)

func TestHoldConfirm(t *testing.T) {
	eachReserver(t, []stock.Option{stock.WithUserLimit(3)}, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
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
	eachReserver(t, nil, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
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
	eachReserver(t, []stock.Option{stock.WithUserLimit(1)}, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
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
	eachReserver(t, nil, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
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
		require.NoError(t, testkit.Err(stockops.Sweep(ctx, r, "A")))
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
		r, store := reserverAndStore(t, c, map[string]int64{"A": 100})
		stop := make(chan struct{})
		var checks atomic.Int64
		var wg, watch sync.WaitGroup
		watch.Go(func() { // the equation at every moment, read atomically
			for !stopped(stop) {
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
					assert.ErrorIs(t, err, stock.ErrSoldOut)
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
		require.NoError(t, testkit.Err(stockops.Sweep(ctx, r, "A")))
		l, _ := checkLedger(t, r, "A", 100)
		assert.Zero(t, l.Held)
		assert.Equal(t, confirmed.Load(), l.Sold)
		assert.Positive(t, checks.Load())
		rl := newRelay(t, r, store, nil, nil)
		drain(t, rl)
		assert.Equal(t, l.Available, remaining(t, store, "A"), "only confirmed holds reach the store")
	})
}

func TestCloseReopen(t *testing.T) {
	eachReserver(t, nil, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
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

// TestExpiredHoldAnswerIndependentOfOthers: with more than 64 holds past their deadline, a
// replay of the last one's Hold is ErrExpired (not a replay of a live hold), and Extend and
// Confirm of late ones release them: an id's answer does not depend on how many other holds are
// due.
func TestExpiredHoldAnswerIndependentOfOthers(t *testing.T) {
	eachReserver(t, []stock.Option{stock.WithSoldOutCache(0)}, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		require.NoError(t, r.Load(ctx, "H", 1000))
		const n = 200
		holdMany(t, r, "H", "h", n, 300*time.Millisecond)
		redistest.Sleep(c, 400*time.Millisecond)

		// Coalesced deducts and holds share deduct.lua; Hold is the one under test. Each call
		// is on a due hold of its own, from the last one back.
		for i, call := range []struct {
			name             string
			do               func(id string) error
			want             error
			answer, released string // what the answer and the released hold show
		}{
			{"hold", func(id string) error {
				_, err := r.Hold(ctx, stock.Request{SKU: "H", ID: id, Qty: 1}, time.Minute)
				return err
			}, stock.ErrExpired, "a replay of an expired hold", "the replayed hold is released"},
			{"extend", func(id string) error { _, err := r.Extend(ctx, "H", id, time.Minute); return err },
				stock.ErrExpired, "", "Extend answers expired and releases the hold"},
			{"confirm", func(id string) error { _, err := r.Confirm(ctx, "H", id); return err },
				stock.ErrExpired, "", ""},
			// A deduct of a due hold's id is a conflict (another kind), and releases it all the same.
			{"deduct", func(id string) error {
				_, err := r.Deduct(ctx, stock.Request{SKU: "H", ID: id, Qty: 1})
				return err
			}, stock.ErrConflict, "", ""},
		} {
			id := fmt.Sprint("h", n-1-i)
			require.ErrorIs(t, call.do(id), call.want, "%s: %s", call.name, call.answer)
			assertState(t, r, "H", id, stock.StateExpired, "%s: %s", call.name, call.released)
		}

		require.NoError(t, testkit.Err(stockops.Sweep(ctx, r, "H")))
		assert.Equal(t, stock.Levels{Available: 1000, Loaded: 1000}, levels(t, r, "H"))
		for id, e := range ledger(t, r, "H") {
			assert.Equal(t, stock.StateExpired, e.State, id)
		}
	})
}

// TestConfirmExtendReleaseExpired: Confirm and Extend release the item's other holds past their
// deadline, as Deduct and Hold do.
func TestConfirmExtendReleaseExpired(t *testing.T) {
	eachReserver(t, []stock.Option{stock.WithUserLimit(5)}, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		require.NoError(t, r.Load(ctx, "C", 10))
		must(t)(r.Hold(ctx, stock.Request{SKU: "C", ID: "live1", Qty: 1}, time.Minute))
		must(t)(r.Hold(ctx, stock.Request{SKU: "C", ID: "live2", Qty: 1}, time.Minute))
		must(t)(r.Hold(ctx, stock.Request{SKU: "C", ID: "old1", User: "u", Qty: 3}, 200*time.Millisecond))
		redistest.Sleep(c, 300*time.Millisecond)

		rc := must(t)(r.Confirm(ctx, "C", "live1"))
		assert.Equal(t, int64(8), rc.Remaining, "the expired hold's 3 units are back")
		assert.Equal(t, stock.Levels{Available: 8, Held: 1, Sold: 1, Loaded: 10}, levels(t, r, "C"))
		assertState(t, r, "C", "old1", stock.StateExpired, "Confirm released the other expired hold")

		must(t, "the user's units of the expired hold were given back")(
			r.Hold(ctx, stock.Request{SKU: "C", ID: "old2", User: "u", Qty: 5}, 200*time.Millisecond))
		redistest.Sleep(c, 300*time.Millisecond)
		rc = must(t)(r.Extend(ctx, "C", "live2", time.Minute))
		assert.Equal(t, int64(8), rc.Remaining)
		assert.Equal(t, stock.Levels{Available: 8, Held: 1, Sold: 1, Loaded: 10}, levels(t, r, "C"))
		assertState(t, r, "C", "old2", stock.StateExpired, "Extend released the other expired hold")
		must(t, "and gave the user's units back")(r.Hold(ctx, stock.Request{SKU: "C", ID: "again", User: "u", Qty: 5}, time.Minute))
	})
}

// plantEntry overwrites id's ledger entry of sku with v.
func plantEntry(t *testing.T, c rueidis.Client, sku, id, v string) {
	t.Helper()
	k := findKey(t, c, sku, func(ctx context.Context, n rueidis.Client, key string) bool {
		e, err := n.Do(ctx, n.B().Hget().Key(key).Field(id).Build()).ToString()
		return err == nil && strings.Count(e, "|") >= 4
	})
	require.NoError(t, c.Do(context.Background(), c.B().Hset().Key(k).FieldValue().FieldValue(id, v).Build()).Error())
}

// TestCorruptEntryAmongDueHolds: a corrupt ledger entry among holds past their deadline makes
// every script that would release them fail with a clear error before it writes anything, so
// loaded = available + held + sold still holds and no hold is half released.
func TestCorruptEntryAmongDueHolds(t *testing.T) {
	eachReserver(t, []stock.Option{stock.WithSoldOutCache(0)}, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		require.NoError(t, r.Load(ctx, "X", 10))
		holdMany(t, r, "X", "x", 3, 1500*time.Millisecond) // long enough for the next steps on a busy machine
		require.NoError(t, testkit.Err(r.Hold(ctx, stock.Request{SKU: "X", ID: "live", Qty: 2}, time.Minute)))
		plantEntry(t, c, "X", "x1", "Hh|1|oops")
		redistest.Sleep(c, 1600*time.Millisecond)
		before := levels(t, r, "X")
		assert.Equal(t, stock.Levels{Available: 5, Held: 5, Loaded: 10}, before)

		calls := map[string]func() error{
			"sweep":   func() error { return testkit.Err(stockops.Sweep(ctx, r, "X")) },
			"deduct":  func() error { return testkit.Err(r.Deduct(ctx, stock.Request{SKU: "X", ID: "d", Qty: 1})) },
			"hold":    func() error { return testkit.Err(r.Hold(ctx, stock.Request{SKU: "X", ID: "h", Qty: 1}, time.Minute)) },
			"confirm": func() error { return testkit.Err(r.Confirm(ctx, "X", "live")) },
			"extend":  func() error { return testkit.Err(r.Extend(ctx, "X", "live", time.Minute)) },
		}
		for name, call := range calls {
			err := call()
			require.Error(t, err, name)
			assert.Contains(t, err.Error(), "corrupt ledger entry", name)
			assert.Contains(t, err.Error(), "x1", "%s: the error names the entry", name)
			assert.Equal(t, before, levels(t, r, "X"), "%s changed nothing", name)
			for _, id := range []string{"x0", "x2", "live"} {
				assertState(t, r, "X", id, stock.StateHeld, "%s: %s is untouched", name, id)
			}
		}
	})
}

// TestExpiredCartHoldAnswerIndependentOfOthers: the one-script cart of a group (deductmany.lua)
// releases the holds of a cart past their deadline when the cart is retried, even with more than
// 64 other holds of its items due, and answers the retry as it answers it with none due: a
// replay of the cart (a retry of a taken cart answers that the cart was taken, see the cart
// tests).
func TestExpiredCartHoldAnswerIndependentOfOthers(t *testing.T) {
	opts := []stock.Option{stock.WithSoldOutCache(0), stock.WithGroups(func(string) string { return "g" })}
	eachReserver(t, opts, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		for _, sku := range []string{"g1", "g2"} {
			require.NoError(t, r.Load(ctx, sku, 1000))
			holdMany(t, r, sku, "h", 100, 1500*time.Millisecond)
		}
		// "zcart" sorts after the other holds: on miniredis, whose clock stands still, they all
		// have the same deadline.
		cart := stock.Cart{ID: "zcart", Lines: []stock.Line{{SKU: "g1", Qty: 2}, {SKU: "g2", Qty: 3}}}
		mustCart(t)(r.HoldMany(ctx, cart, 1500*time.Millisecond))
		redistest.Sleep(c, 1600*time.Millisecond)

		_, err := r.HoldMany(ctx, cart, 1500*time.Millisecond)
		var ce *stock.CartError
		require.ErrorAs(t, err, &ce, "a retry of a cart of holds answers its holds' state")
		assert.ErrorIs(t, err, stock.ErrExpired)
		for _, sku := range []string{"g1", "g2"} {
			assertState(t, r, sku, "zcart", stock.StateExpired, "%s: the cart's hold is released", sku)
			l := levels(t, r, sku)
			// The call releases 64 of the other due holds (its bound per call); on a loaded real
			// server the test's own later calls may release more of them before Levels reads.
			assert.LessOrEqual(t, l.Held, int64(100-64), "%s: the call released at least 64 of the other holds, %+v", sku, l)
		}
	})
}

// TestCorruptUnitsAmongDueHolds: a user's unit count that is not a number, for a hold past its
// deadline, stops the release before its first write (HINCRBY would fail halfway through it,
// after the hold's entry was marked expired and before the counters were fixed).
func TestCorruptUnitsAmongDueHolds(t *testing.T) {
	eachReserver(t, []stock.Option{stock.WithSoldOutCache(0)}, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		require.NoError(t, r.Load(ctx, "U", 10))
		for i, u := range []string{"ann", "bob"} {
			must(t)(r.Hold(ctx, stock.Request{SKU: "U", ID: fmt.Sprint("u", i), User: u, Qty: 2}, 200*time.Millisecond))
		}
		k := findKey(t, c, "U", func(ctx context.Context, n rueidis.Client, key string) bool {
			v, err := n.Do(ctx, n.B().Hget().Key(key).Field("bob").Build()).ToString()
			return err == nil && v == "2"
		})
		require.NoError(t, c.Do(ctx, c.B().Hset().Key(k).FieldValue().FieldValue("bob", "two").Build()).Error())
		redistest.Sleep(c, 300*time.Millisecond)
		before := levels(t, r, "U")
		_, err := stockops.Sweep(ctx, r, "U")
		require.Error(t, err)
		assert.Contains(t, err.Error(), "corrupt units of user bob")
		assert.Equal(t, before, levels(t, r, "U"), "nothing released")
		for _, id := range []string{"u0", "u1"} {
			assertState(t, r, "U", id, stock.StateHeld, "%s is untouched", id)
		}
	})
}

// TestCancelExpiredHoldAnswerIndependentOfOthers: a Cancel or Restore of a hold past its
// deadline is a replay (the hold had already gone back), whether or not an earlier call released
// it: with more than 64 holds due, one call releases only 64 of them.
func TestCancelExpiredHoldAnswerIndependentOfOthers(t *testing.T) {
	eachReserver(t, []stock.Option{stock.WithSoldOutCache(0)}, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		require.NoError(t, r.Load(ctx, "K", 1000))
		const n = 100
		holdMany(t, r, "K", "h", n, 1500*time.Millisecond)
		redistest.Sleep(c, 1600*time.Millisecond)
		_, err := r.Hold(ctx, stock.Request{SKU: "K", ID: "trigger", Qty: 1}, time.Minute)
		require.NoError(t, err)
		require.Equal(t, int64(n-64+1), levels(t, r, "K").Held, "the Hold released 64 of the due holds")
		for i := range n {
			id := fmt.Sprint("h", i)
			var rc stock.Receipt
			if i%2 == 0 {
				rc, err = r.Cancel(ctx, "K", id)
			} else {
				rc, err = r.Restore(ctx, "K", id)
			}
			require.NoError(t, err, id)
			assert.True(t, rc.Replayed, "%s: a hold past its deadline had already gone back", id)
			assertState(t, r, "K", id, stock.StateExpired, id)
		}
		assert.Equal(t, stock.Levels{Available: 999, Held: 1, Loaded: 1000}, levels(t, r, "K"))
	})
}
