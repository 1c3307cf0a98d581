package systest_test

// Attack 27: carts (DeductMany, HoldMany) with lines of items split over buckets
// (stock.WithBuckets), through the exported API only. A split line is taken in its buyer's
// bucket, the cart is always a saga, its undo gives back in the line's bucket and tombstones the
// lines never taken. The tests check exactly one outcome per cart id under concurrent copies
// (one user, several users), all or nothing when a later line refuses (Levels, ledger and a
// memstore fed by the relay), a split line that needs the stock of every bucket, a cart id
// reused as a plain request id (compared with the same sequence on a plain item), holds with
// expiry, ConfirmMany and CancelMany, cart recovery after sagas cut short, user limits across
// carts and single requests, names with ':' and '~', and sell-out under concurrent carts.
//
// Every test runs on a stocktest miniredis and, when STOCK_REDIS_SERVER names a redis-server,
// on the shared real standalone server and 3-master cluster (a26Each).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
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
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// a27Sold returns the units of an item's ledger entries of id that are taken (held or sold).
func a27Taken(t *testing.T, r *stock.Reserver, sku, id string) int64 {
	t.Helper()
	var n int64
	for e, err := range stockops.Entries(context.Background(), r, sku) {
		require.NoError(t, err)
		if e.ID == id && e.Taken() && e.Kind != stock.KindRestock {
			n += e.Qty
		}
	}
	return n
}

// --- Concurrent copies of one cart id ---------------------------------------------------------

// TestAttack27CartCopiesOneUser: copies of one cart (a split line, a plain line, a second split
// line) sent at once by one user: exactly one is the original, every other is its replay, and
// each item lost exactly its line's units once.
func TestAttack27CartCopiesOneUser(t *testing.T) {
	a26Each(t, []stock.Option{a26Split(3)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		for _, sku := range []string{"cc-a", "cc-b", "plain-cc"} {
			require.NoError(t, e.r.Load(ctx, sku, 30))
		}
		cart := stock.Cart{ID: "cart:1", User: "u1", Lines: []stock.Line{
			{SKU: "plain-cc", Qty: 1}, {SKU: "cc-a", Qty: 2}, {SKU: "cc-b", Qty: 4}, {SKU: "cc-a", Qty: 1},
		}}
		const n = 16
		var orig, replay atomic.Int32
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for range n {
			wg.Go(func() {
				rc, err := e.r.DeductMany(ctx, cart)
				if err != nil {
					errs <- err
					return
				}
				if rc.Replayed {
					replay.Add(1)
				} else {
					orig.Add(1)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("copy refused: %v", err)
		}
		assert.Equal(t, int32(1), orig.Load(), "exactly one original")
		assert.Equal(t, int32(n-1), replay.Load())
		want := map[string]int64{"cc-a": 3, "cc-b": 4, "plain-cc": 1}
		for sku, q := range want {
			l := a26Levels(t, e.r, sku)
			assert.Equal(t, q, l.Sold, sku)
			assert.Equal(t, 30-q, l.Available, sku)
			assert.Equal(t, q, a27Taken(t, e.r, sku, cart.ID), "ledger of %s", sku)
		}
	})
}

// TestAttack27CartCopiesManyUsers: one cart id sent at once by buyers of different buckets:
// exactly one buyer's cart is taken, the others get ErrConflict, and the split lines are taken
// once, in one bucket.
func TestAttack27CartCopiesManyUsers(t *testing.T) {
	a26Each(t, []stock.Option{a26Split(4)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		for _, sku := range []string{"mu-a", "mu-b", "plain-mu"} {
			require.NoError(t, e.r.Load(ctx, sku, 40))
		}
		for round := range 5 {
			id := fmt.Sprintf("order-%d", round)
			const n = 12
			var ok, conflict atomic.Int32
			var winner atomic.Value
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					cart := stock.Cart{ID: id, User: fmt.Sprintf("user-%d", i), Lines: []stock.Line{
						{SKU: "mu-a", Qty: 1}, {SKU: "mu-b", Qty: 1}, {SKU: "plain-mu", Qty: 1},
					}}
					_, err := e.r.DeductMany(ctx, cart)
					switch {
					case err == nil:
						ok.Add(1)
						winner.Store(cart.User)
					case errors.Is(err, stock.ErrConflict):
						conflict.Add(1)
					default:
						t.Errorf("round %d user %d: %v", round, i, err)
					}
				})
			}
			wg.Wait()
			require.Equal(t, int32(1), ok.Load(), "round %d: exactly one buyer's cart", round)
			require.Equal(t, int32(n-1), conflict.Load(), "round %d", round)
			for _, sku := range []string{"mu-a", "mu-b", "plain-mu"} {
				assert.Equal(t, int64(1), a27Taken(t, e.r, sku, id), "round %d %s", round, sku)
			}
		}
		for _, sku := range []string{"mu-a", "mu-b", "plain-mu"} {
			l := a26Levels(t, e.r, sku)
			assert.Equal(t, int64(5), l.Sold, sku)
		}
	})
}

// --- Refused after the split line was taken --------------------------------------------------

// TestAttack27CartRefusedGivesBack: a cart whose split line (taken first, in SKU order) is
// followed by a plain line that refuses: the cart is a *CartError naming the plain item, the
// split item's Levels are back to before, its bucket's units can be sold again to the same
// buyer, a retry answers the same refusal and takes nothing, and once the relay has drained into
// a memstore the Store equals Redis.
func TestAttack27CartRefusedGivesBack(t *testing.T) {
	a26Each(t, []stock.Option{a26Split(3)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		store := memstore.New()
		for sku, q := range map[string]int64{"gb-a": 6, "gb-b": 9, "plain-zz": 1} {
			require.NoError(t, store.Load(ctx, sku, q))
			require.NoError(t, e.r.Load(ctx, sku, q))
		}
		before := map[string]stock.Levels{}
		for _, sku := range []string{"gb-a", "gb-b", "plain-zz"} {
			before[sku] = a26Levels(t, e.r, sku)
		}
		cart := stock.Cart{ID: "gb:1", User: "buyer", Lines: []stock.Line{
			{SKU: "gb-a", Qty: 5}, {SKU: "gb-b", Qty: 8}, {SKU: "plain-zz", Qty: 2},
		}}
		for attempt := range 3 {
			_, err := e.r.DeductMany(ctx, cart)
			var ce *stock.CartError
			require.ErrorAs(t, err, &ce, "attempt %d", attempt)
			assert.Equal(t, "plain-zz", ce.SKU)
			assert.ErrorIs(t, err, stock.ErrInsufficient)
			for sku, b := range before {
				l := a26Levels(t, e.r, sku)
				assert.Equal(t, b, l, "attempt %d: %s back to before", attempt, sku)
				assert.Equal(t, int64(0), a27Taken(t, e.r, sku, cart.ID), "%s", sku)
			}
		}
		// The units given back are sellable again, to the same buyer (its bucket).
		_, err := e.r.DeductMany(ctx, stock.Cart{ID: "gb:2", User: "buyer", Lines: []stock.Line{
			{SKU: "gb-a", Qty: 6}, {SKU: "gb-b", Qty: 9}, {SKU: "plain-zz", Qty: 1},
		}})
		require.NoError(t, err)
		for _, sku := range []string{"gb-a", "gb-b", "plain-zz"} {
			assert.Equal(t, int64(0), a26Levels(t, e.r, sku).Available, sku)
		}
		rl, err := stockops.NewRelay(e.r, store, nil, &stock.RelayOptions{MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
		require.NoError(t, err)
		drain(t, rl)
		for _, sku := range []string{"gb-a", "gb-b", "plain-zz"} {
			l := a26Levels(t, e.r, sku)
			rem, err := store.Remaining(ctx, sku)
			require.NoError(t, err)
			assert.Equal(t, l.Available+l.Held, rem, "store vs Redis: %s", sku)
		}
		assert.LessOrEqual(t, store.MaxApplications(), 1)
	})
}

// TestAttack27CartSplitLineFromEveryBucket: a split line whose quantity is the whole item (every
// bucket must give its stock) is taken; the next unit is refused for stock; nothing stranded.
func TestAttack27CartSplitLineFromEveryBucket(t *testing.T) {
	a26Each(t, []stock.Option{a26Split(4)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		require.NoError(t, e.r.Load(ctx, "all-a", 37))
		require.NoError(t, e.r.Load(ctx, "plain-all", 5))
		// Other buyers first take a little in several buckets.
		for i := range 5 {
			_, err := e.r.Deduct(ctx, stock.Request{SKU: "all-a", ID: fmt.Sprintf("pre-%d", i), User: fmt.Sprintf("pre-u%d", i), Qty: 1})
			require.NoError(t, err)
		}
		rc, err := e.r.DeductMany(ctx, stock.Cart{ID: "whole", User: "whale", Lines: []stock.Line{
			{SKU: "all-a", Qty: 32}, {SKU: "plain-all", Qty: 5},
		}})
		require.NoError(t, err)
		require.Len(t, rc.Items, 2)
		l := a26Levels(t, e.r, "all-a")
		assert.Equal(t, int64(0), l.Available)
		assert.Equal(t, int64(37), l.Sold)
		_, err = e.r.DeductMany(ctx, stock.Cart{ID: "late", User: "late", Lines: []stock.Line{{SKU: "all-a", Qty: 1}}})
		assert.ErrorIs(t, err, stock.ErrSoldOut)
	})
}

// TestAttack27CartWholeItemMinusOneRefused: a split line asking one unit more than the buckets
// together hold is refused, and gives back everything (transfers included): Levels equal before
// and the whole item is then sold to one buyer.
func TestAttack27CartWholeItemPlusOneRefused(t *testing.T) {
	a26Each(t, []stock.Option{a26Split(3)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		require.NoError(t, e.r.Load(ctx, "p1-a", 10))
		require.NoError(t, e.r.Load(ctx, "p1-b", 10))
		before := a26Levels(t, e.r, "p1-a")
		_, err := e.r.DeductMany(ctx, stock.Cart{ID: "p1", User: "w", Lines: []stock.Line{
			{SKU: "p1-a", Qty: 10}, {SKU: "p1-b", Qty: 11},
		}})
		var ce *stock.CartError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, "p1-b", ce.SKU)
		assert.ErrorIs(t, err, stock.ErrInsufficient)
		assert.Equal(t, before, a26Levels(t, e.r, "p1-a"))
		assert.Equal(t, before, a26Levels(t, e.r, "p1-b"))
		_, err = e.r.DeductMany(ctx, stock.Cart{ID: "p2", User: "other", Lines: []stock.Line{
			{SKU: "p1-a", Qty: 10}, {SKU: "p1-b", Qty: 10},
		}})
		require.NoError(t, err)
	})
}

// --- Cart id reused as a plain request id -----------------------------------------------------

// a27Outcome names an answer for comparison between a plain and a split item.
func a27Outcome(rc stock.Receipt, err error) string {
	if err != nil {
		for _, k := range []error{stock.ErrConflict, stock.ErrRestored, stock.ErrUserLimit, stock.ErrSoldOut,
			stock.ErrInsufficient, stock.ErrUnknownID, stock.ErrExpired, stock.ErrInvalid} {
			if errors.Is(err, k) {
				var ce *stock.CartError
				if errors.As(err, &ce) {
					return "cart:" + k.Error()
				}
				return k.Error()
			}
		}
		return "other:" + err.Error()
	}
	return fmt.Sprintf("ok qty=%d replayed=%v", rc.Qty, rc.Replayed)
}

func a27CartOutcome(rc stock.CartReceipt, err error) string {
	if err != nil {
		return a27Outcome(stock.Receipt{}, err)
	}
	return fmt.Sprintf("ok lines=%d replayed=%v", len(rc.Items), rc.Replayed)
}

// TestAttack27CartIDReusedAsRequestID: the same sequence (a cart, then single requests under the
// cart's id on its item, by its buyer and by another; and a single request first, then a cart
// under its id) on a plain item and on a split one gives the same answers and the same Levels.
func TestAttack27CartIDReusedAsRequestID(t *testing.T) {
	a26Each(t, []stock.Option{a26Split(3)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		run := func(x string) []string {
			require.NoError(t, e.r.Load(ctx, x, 20))
			var out []string
			add := func(s string) { out = append(out, s) }
			// cart first
			add(a27CartOutcome(e.r.DeductMany(ctx, stock.Cart{ID: x + ":o1", User: "u", Lines: []stock.Line{{SKU: x, Qty: 2}}})))
			add(a27Outcome(e.r.Deduct(ctx, stock.Request{SKU: x, ID: x + ":o1", User: "u", Qty: 2})))
			add(a27Outcome(e.r.Deduct(ctx, stock.Request{SKU: x, ID: x + ":o1", User: "v", Qty: 2})))
			add(a27Outcome(e.r.Deduct(ctx, stock.Request{SKU: x, ID: x + ":o1", User: "u", Qty: 3})))
			add(a27Outcome(e.r.Hold(ctx, stock.Request{SKU: x, ID: x + ":o1", User: "u", Qty: 2}, time.Minute)))
			// single request first, then a cart under its id
			add(a27Outcome(e.r.Deduct(ctx, stock.Request{SKU: x, ID: x + ":o2", User: "u", Qty: 1})))
			add(a27CartOutcome(e.r.DeductMany(ctx, stock.Cart{ID: x + ":o2", User: "u", Lines: []stock.Line{{SKU: x, Qty: 1}}})))
			add(a27CartOutcome(e.r.DeductMany(ctx, stock.Cart{ID: x + ":o2", User: "w", Lines: []stock.Line{{SKU: x, Qty: 1}}})))
			// a restore of the cart's line by its id, then the cart again
			add(a27Outcome(e.r.Restore(ctx, x, x+":o1")))
			add(a27CartOutcome(e.r.DeductMany(ctx, stock.Cart{ID: x + ":o1", User: "u", Lines: []stock.Line{{SKU: x, Qty: 2}}})))
			// a refused cart, then a single request under its id
			add(a27CartOutcome(e.r.DeductMany(ctx, stock.Cart{ID: x + ":o3", User: "u", Lines: []stock.Line{{SKU: x, Qty: 1}, {SKU: "plain-none", Qty: 1}}})))
			add(a27Outcome(e.r.Deduct(ctx, stock.Request{SKU: x, ID: x + ":o3", User: "u", Qty: 1})))
			add(a27Outcome(e.r.Deduct(ctx, stock.Request{SKU: x, ID: x + ":o3", User: "w", Qty: 1})))
			add(a27Outcome(e.r.Hold(ctx, stock.Request{SKU: x, ID: x + ":o3", User: "u", Qty: 1}, time.Minute)))
			add(a27CartOutcome(e.r.DeductMany(ctx, stock.Cart{ID: x + ":o3", User: "u", Lines: []stock.Line{{SKU: x, Qty: 1}, {SKU: "plain-none", Qty: 1}}})))
			// a cart refused after x's line was taken (zzz-none, split, sorts after x), then
			// single requests and copies under its id
			add(a27CartOutcome(e.r.DeductMany(ctx, stock.Cart{ID: x + ":o4", User: "u", Lines: []stock.Line{{SKU: x, Qty: 1}, {SKU: "zzz-none", Qty: 1}}})))
			add(a27Outcome(e.r.Deduct(ctx, stock.Request{SKU: x, ID: x + ":o4", User: "u", Qty: 1})))
			add(a27Outcome(e.r.Deduct(ctx, stock.Request{SKU: x, ID: x + ":o4", User: "w", Qty: 1})))
			add(a27Outcome(e.r.Restore(ctx, x, x+":o4")))
			add(a27CartOutcome(e.r.DeductMany(ctx, stock.Cart{ID: x + ":o4", User: "u", Lines: []stock.Line{{SKU: x, Qty: 1}, {SKU: "zzz-none", Qty: 1}}})))
			// no buyer: routed by the cart id
			add(a27CartOutcome(e.r.DeductMany(ctx, stock.Cart{ID: x + ":o5", Lines: []stock.Line{{SKU: x, Qty: 1}, {SKU: "zzz-none", Qty: 1}}})))
			add(a27Outcome(e.r.Deduct(ctx, stock.Request{SKU: x, ID: x + ":o5", Qty: 1})))
			add(a27Outcome(e.r.Deduct(ctx, stock.Request{SKU: x, ID: x + ":o5", User: "u", Qty: 1})))
			add(a27CartOutcome(e.r.DeductMany(ctx, stock.Cart{ID: x + ":o6", Lines: []stock.Line{{SKU: x, Qty: 2}}})))
			add(a27Outcome(e.r.Deduct(ctx, stock.Request{SKU: x, ID: x + ":o6", Qty: 2})))
			add(a27Outcome(e.r.Restore(ctx, x, x+":o6")))
			add(a27Outcome(e.r.Restore(ctx, x, x+":o6")))
			// the cart id was first another buyer's single request (same quantity): the cart is
			// refused and its undo leaves the other buyer's entry alone
			add(a27Outcome(e.r.Deduct(ctx, stock.Request{SKU: x, ID: x + ":o7", User: "w", Qty: 1})))
			add(a27CartOutcome(e.r.DeductMany(ctx, stock.Cart{ID: x + ":o7", User: "u", Lines: []stock.Line{{SKU: x, Qty: 1}, {SKU: "plain-other", Qty: 1}}})))
			if en, err := e.r.Ledger(ctx, x, x+":o7"); assert.NoError(t, err) {
				add(fmt.Sprintf("o7 entry %s %s %s %d", en.User, en.Kind, en.State, en.Qty))
			}
			add(fmt.Sprint(a27Taken(t, e.r, x, x+":o7"), a27Taken(t, e.r, "plain-other", x+":o7")))
			// the same buyer's single request (same quantity), then a cart under its id that
			// another line refuses
			add(a27Outcome(e.r.Deduct(ctx, stock.Request{SKU: x, ID: x + ":o8", User: "u", Qty: 1})))
			add(a27CartOutcome(e.r.DeductMany(ctx, stock.Cart{ID: x + ":o8", User: "u", Lines: []stock.Line{{SKU: x, Qty: 1}, {SKU: "zzz-none", Qty: 1}}})))
			add(fmt.Sprint(a27Taken(t, e.r, x, x+":o8")))
			// a give-back before the cart: Restore and Cancel of an id never used, then the cart
			add(a27Outcome(e.r.Restore(ctx, x, x+":o9")))
			add(a27CartOutcome(e.r.DeductMany(ctx, stock.Cart{ID: x + ":o9", User: "u", Lines: []stock.Line{{SKU: x, Qty: 1}, {SKU: "plain-other", Qty: 1}}})))
			add(a27Outcome(e.r.Cancel(ctx, x, x+":o10")))
			add(a27CartOutcome(e.r.HoldMany(ctx, stock.Cart{ID: x + ":o10", User: "u", Lines: []stock.Line{{SKU: x, Qty: 1}, {SKU: "plain-other", Qty: 1}}}, time.Minute)))
			add(fmt.Sprint(a27Taken(t, e.r, x, x+":o9"), a27Taken(t, e.r, "plain-other", x+":o9"), a27Taken(t, e.r, x, x+":o10"), a27Taken(t, e.r, "plain-other", x+":o10")))
			// odd cart ids
			for _, id := range []string{x + ":{o11}|1", x + "|0", "~" + x + ":o12~", x + ":o13 ü"} {
				add(a27CartOutcome(e.r.DeductMany(ctx, stock.Cart{ID: id, User: "u", Lines: []stock.Line{{SKU: x, Qty: 1}, {SKU: "plain-other", Qty: 1}}})))
				add(a27Outcome(e.r.Restore(ctx, x, id)))
				add(a27CartOutcome(e.r.DeductMany(ctx, stock.Cart{ID: id, User: "u", Lines: []stock.Line{{SKU: x, Qty: 1}, {SKU: "plain-other", Qty: 1}}})))
			}
			l := a26Levels(t, e.r, x)
			add(fmt.Sprintf("levels %d/%d/%d", l.Available, l.Held, l.Sold))
			return out
		}
		require.NoError(t, e.r.Load(ctx, "plain-none", 0))
		require.NoError(t, e.r.Load(ctx, "zzz-none", 0))
		require.NoError(t, e.r.Load(ctx, "plain-other", 100))
		plain := run("plain-ri")
		split := run("ri-split")
		assert.Equal(t, plain, split)
		po := a26Levels(t, e.r, "plain-other")
		t.Logf("plain: %q", plain)
		assert.Equal(t, int64(100), po.Available+po.Held+po.Sold)
	})
}

// --- Holds -----------------------------------------------------------------------------------

// TestAttack27HoldManyExpiry: a cart of holds with split lines; one buyer's holds expire; the
// sweep (or the next request) gives them back in their bucket; ConfirmMany answers ErrExpired
// and takes nothing; CancelMany of a live cart twice gives back once.
func TestAttack27HoldManyExpiry(t *testing.T) {
	a26Each(t, []stock.Option{a26Split(3)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		for _, sku := range []string{"hx-a", "hx-b", "plain-hx"} {
			require.NoError(t, e.r.Load(ctx, sku, 10))
		}
		lines := []stock.Line{{SKU: "hx-a", Qty: 3}, {SKU: "hx-b", Qty: 2}, {SKU: "plain-hx", Qty: 1}}
		skus := []string{"hx-a", "hx-b", "plain-hx"}
		_, err := e.r.HoldMany(ctx, stock.Cart{ID: "h1", User: "hu", Lines: lines}, 500*time.Millisecond)
		require.NoError(t, err)
		_, err = e.r.HoldMany(ctx, stock.Cart{ID: "h2", User: "hv", Lines: lines}, time.Hour)
		require.NoError(t, err)
		assert.Equal(t, int64(4), a26Levels(t, e.r, "hx-a").Available)
		e.advance(1500 * time.Millisecond)
		_, err = e.r.ConfirmMany(ctx, "h1", skus...)
		assert.ErrorIs(t, err, stock.ErrExpired)
		_, err = e.r.ConfirmMany(ctx, "h1", skus...)
		assert.ErrorIs(t, err, stock.ErrExpired, "retry")
		_, err = stockops.Sweep(ctx, e.r)
		require.NoError(t, err)
		l := a26Levels(t, e.r, "hx-a")
		assert.Equal(t, int64(7), l.Available, "h1 given back: %+v", l)
		assert.Equal(t, int64(3), l.Held)
		// CancelMany twice: one give-back.
		_, err = e.r.CancelMany(ctx, "h2", skus...)
		require.NoError(t, err)
		rcs, err := e.r.CancelMany(ctx, "h2", skus...)
		require.NoError(t, err)
		for _, rc := range rcs {
			assert.True(t, rc.Replayed, "second cancel is a replay: %+v", rc)
		}
		for _, sku := range skus {
			l := a26Levels(t, e.r, sku)
			assert.Equal(t, int64(10), l.Available, sku)
			assert.Equal(t, int64(0), l.Held+l.Sold, sku)
		}
		_, err = e.r.ConfirmMany(ctx, "h2", skus...)
		assert.ErrorIs(t, err, stock.ErrRestored)
		// A retry of h1's HoldMany answers the expiry, takes nothing.
		_, err = e.r.HoldMany(ctx, stock.Cart{ID: "h1", User: "hu", Lines: lines}, time.Hour)
		assert.ErrorIs(t, err, stock.ErrExpired)
		assert.Equal(t, int64(10), a26Levels(t, e.r, "hx-a").Available)
	})
}

// TestAttack27ConfirmManyRacesExpiry: ConfirmMany of carts whose holds expire about when the
// confirm runs: each cart ends confirmed whole or given back whole, never half.
func TestAttack27ConfirmManyRacesExpiry(t *testing.T) {
	a26Each(t, []stock.Option{a26Split(3)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		skus := []string{"cr-a", "cr-b", "plain-cr"}
		for _, sku := range skus {
			require.NoError(t, e.r.Load(ctx, sku, 200))
		}
		const n = 20
		for i := range n {
			_, err := e.r.HoldMany(ctx, stock.Cart{ID: fmt.Sprintf("cr-%d", i), User: fmt.Sprintf("cu-%d", i), Lines: []stock.Line{
				{SKU: "cr-a", Qty: 1}, {SKU: "cr-b", Qty: 2}, {SKU: "plain-cr", Qty: 3},
			}}, 300*time.Millisecond)
			require.NoError(t, err)
		}
		var wg sync.WaitGroup
		wg.Go(func() { e.advance(300 * time.Millisecond) })
		results := make([]error, n)
		for i := range n {
			wg.Go(func() {
				_, results[i] = e.r.ConfirmMany(ctx, fmt.Sprintf("cr-%d", i), skus...)
			})
		}
		wg.Wait()
		e.advance(time.Second)
		_, err := stockops.Sweep(ctx, e.r)
		require.NoError(t, err)
		var confirmed int64
		for i, err := range results {
			id := fmt.Sprintf("cr-%d", i)
			if err != nil && !errors.Is(err, stock.ErrExpired) {
				t.Errorf("%s: %v", id, err)
				continue
			}
			taken := []int64{a27Taken(t, e.r, "cr-a", id), a27Taken(t, e.r, "cr-b", id), a27Taken(t, e.r, "plain-cr", id)}
			if err == nil {
				confirmed++
				assert.Equal(t, []int64{1, 2, 3}, taken, "%s confirmed whole", id)
			} else {
				assert.Equal(t, []int64{0, 0, 0}, taken, "%s given back whole", id)
			}
		}
		for k, sku := range skus {
			l := a26Levels(t, e.r, sku)
			assert.Equal(t, int64(0), l.Held, sku)
			assert.Equal(t, confirmed*int64(k+1), l.Sold, sku)
		}
	})
}

// --- Cart recovery ---------------------------------------------------------------------------

// TestAttack27RecoverCutSagas: carts with split lines sent under contexts that end at random
// moments (a process cut mid-saga); after cart recovery every cart is taken whole or not at
// all, the stock adds up, and a retry of an undone cart takes nothing.
func TestAttack27RecoverCutSagas(t *testing.T) {
	a26Each(t, []stock.Option{a26Split(3)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		skus := []string{"rc-a", "rc-b", "rc:c~d", "plain-rc"}
		for _, sku := range skus {
			require.NoError(t, e.r.Load(ctx, sku, 500))
		}
		const n = 40
		rng := rand.New(rand.NewPCG(27, 1))
		var wg sync.WaitGroup
		for i := range n {
			d := time.Duration(rng.IntN(25000)) * time.Microsecond
			if !e.real {
				d *= 6 // miniredis runs a saga in about 15 ms
			}
			wg.Go(func() {
				cctx, cancel := context.WithTimeout(ctx, d)
				defer cancel()
				_, _ = e.r.DeductMany(cctx, stock.Cart{ID: fmt.Sprintf("rc-%d", i), User: fmt.Sprintf("ru-%d", i%7), Lines: []stock.Line{
					{SKU: "rc-a", Qty: 1}, {SKU: "rc-b", Qty: 2}, {SKU: "rc:c~d", Qty: 3}, {SKU: "plain-rc", Qty: 4},
				}})
			})
		}
		wg.Wait()
		time.Sleep(200 * time.Millisecond) // let calls already sent land
		e.advance(3 * time.Second)
		_, err := stockops.RecoverCarts(ctx, e.r, 2*time.Second)
		require.NoError(t, err)
		var whole int64
		for i := range n {
			id := fmt.Sprintf("rc-%d", i)
			var taken []int64
			for _, sku := range skus {
				taken = append(taken, a27Taken(t, e.r, sku, id))
			}
			switch {
			case taken[0] == 1 && taken[1] == 2 && taken[2] == 3 && taken[3] == 4:
				whole++
			case taken[0] == 0 && taken[1] == 0 && taken[2] == 0 && taken[3] == 0:
			default:
				t.Errorf("%s half taken: %v", id, taken)
			}
		}
		for k, sku := range skus {
			l := a26Levels(t, e.r, sku)
			assert.Equal(t, whole*int64(k+1), l.Sold, "%s", sku)
		}
		t.Logf("%d of %d carts taken whole", whole, n)
		// Retries: a taken cart replays, an undone one takes nothing.
		for i := range n {
			id := fmt.Sprintf("rc-%d", i)
			_, _ = e.r.DeductMany(ctx, stock.Cart{ID: id, User: fmt.Sprintf("ru-%d", i%7), Lines: []stock.Line{
				{SKU: "rc-a", Qty: 1}, {SKU: "rc-b", Qty: 2}, {SKU: "rc:c~d", Qty: 3}, {SKU: "plain-rc", Qty: 4},
			}})
		}
		var whole2 int64
		for i := range n {
			id := fmt.Sprintf("rc-%d", i)
			if a27Taken(t, e.r, "rc-a", id) == 1 {
				whole2++
			}
			for k, sku := range skus {
				tk := a27Taken(t, e.r, sku, id)
				assert.True(t, tk == 0 || tk == int64(k+1), "%s %s: %d", id, sku, tk)
			}
		}
		for k, sku := range skus {
			l := a26Levels(t, e.r, sku)
			assert.Equal(t, whole2*int64(k+1), l.Sold, "%s after retries", sku)
		}
	})
}

// --- User limits -----------------------------------------------------------------------------

// TestAttack27UserLimitCartsAndSingles: with WithUserLimit(3), carts and single deducts and
// holds of one buyer on a split item, concurrently: the buyer never has more than 3 units.
func TestAttack27UserLimitCartsAndSingles(t *testing.T) {
	a26Each(t, []stock.Option{a26Split(4), stock.WithUserLimit(3)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		require.NoError(t, e.r.Load(ctx, "ul-a", 100))
		require.NoError(t, e.r.Load(ctx, "plain-ul", 100))
		var wg sync.WaitGroup
		for i := range 24 {
			wg.Go(func() {
				id := fmt.Sprintf("ul-%d", i)
				switch i % 3 {
				case 0:
					_, _ = e.r.DeductMany(ctx, stock.Cart{ID: id, User: "greedy", Lines: []stock.Line{{SKU: "ul-a", Qty: 2}, {SKU: "plain-ul", Qty: 1}}})
				case 1:
					_, _ = e.r.Deduct(ctx, stock.Request{SKU: "ul-a", ID: id, User: "greedy", Qty: 1})
				default:
					_, _ = e.r.HoldMany(ctx, stock.Cart{ID: id, User: "greedy", Lines: []stock.Line{{SKU: "ul-a", Qty: 1}}}, time.Hour)
				}
			})
		}
		wg.Wait()
		l := a26Levels(t, e.r, "ul-a")
		assert.LessOrEqual(t, l.Held+l.Sold, int64(3), "%+v", l)
		assert.Equal(t, int64(3), l.Held+l.Sold, "the buyer reached its limit: %+v", l)
		// The limit error in a cart is a CartError wrapping ErrUserLimit.
		_, err := e.r.DeductMany(ctx, stock.Cart{ID: "ul-last", User: "greedy", Lines: []stock.Line{{SKU: "ul-a", Qty: 1}}})
		assert.ErrorIs(t, err, stock.ErrUserLimit)
		var ce *stock.CartError
		assert.ErrorAs(t, err, &ce)
	})
}

// --- Sell-out under concurrent carts ---------------------------------------------------------

// TestAttack27SellOutCarts: N goroutines of two buyers (so at most two of the four buckets are
// theirs) send carts (two split lines and a plain one) over S units, each until its first
// refusal: exactly the carts the stock allows succeed (the other buckets' stock moves to the
// buyers'), and at the end nothing is stranded.
func TestAttack27SellOutCarts(t *testing.T) {
	a26Each(t, []stock.Option{a26Split(4)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		const s = 30 // units of so-a; so-b and the plain one have more
		require.NoError(t, e.r.Load(ctx, "so-a", s))
		require.NoError(t, e.r.Load(ctx, "so:b~x", 3*s))
		require.NoError(t, e.r.Load(ctx, "plain-so", 3*s))
		var ok, out atomic.Int64
		var wg sync.WaitGroup
		for g := range 24 {
			wg.Go(func() {
				for k := 0; ; k++ {
					_, err := e.r.DeductMany(ctx, stock.Cart{ID: fmt.Sprintf("so-%d-%d", g, k), User: fmt.Sprintf("sb-%d", g%2), Lines: []stock.Line{
						{SKU: "so-a", Qty: 1}, {SKU: "so:b~x", Qty: 2}, {SKU: "plain-so", Qty: 1},
					}})
					switch {
					case err == nil:
						ok.Add(1)
					case errors.Is(err, stock.ErrSoldOut), errors.Is(err, stock.ErrInsufficient):
						out.Add(1)
						return
					default:
						t.Errorf("%v", err)
						return
					}
				}
			})
		}
		wg.Wait()
		assert.Equal(t, int64(s), ok.Load(), "every unit of so-a sold in a cart")
		la := a26Levels(t, e.r, "so-a")
		assert.Equal(t, int64(0), la.Available, "stranded: %+v", la)
		assert.Equal(t, int64(s), la.Sold)
		lb := a26Levels(t, e.r, "so:b~x")
		assert.Equal(t, int64(2*s), lb.Sold, "%+v", lb)
		lp := a26Levels(t, e.r, "plain-so")
		assert.Equal(t, int64(s), lp.Sold, "%+v", lp)
	})
}

// TestAttack27RecoverRacesSagas: cart recovery with no age bound (olderThan 0) runs in a loop
// while buyers send carts with split lines (several copies of some cart ids): recovery may undo
// a cart in progress, but every cart id then has one outcome that every copy answered, the
// ledger agrees with it (every line taken or none), and the stock adds up.
func TestAttack27RecoverRacesSagas(t *testing.T) {
	a26Each(t, []stock.Option{a26Split(3)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		skus := []string{"rr-a", "rr:b~", "plain-rr"}
		for _, sku := range skus {
			require.NoError(t, e.r.Load(ctx, sku, 1000))
		}
		lines := []stock.Line{{SKU: "rr-a", Qty: 1}, {SKU: "rr:b~", Qty: 2}, {SKU: "plain-rr", Qty: 3}}
		stop := make(chan struct{})
		var recovering sync.WaitGroup
		var undid atomic.Int64
		for range 3 {
			recovering.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					n, err := stockops.RecoverCarts(ctx, e.r, 0)
					assert.NoError(t, err)
					undid.Add(int64(n))
				}
			})
		}
		const carts, copies = 120, 3
		outcomes := make([][copies]string, carts)
		var wg sync.WaitGroup
		for i := range carts {
			for k := range copies {
				wg.Go(func() {
					_, err := e.r.DeductMany(ctx, stock.Cart{ID: fmt.Sprintf("rr-%d", i), User: fmt.Sprintf("rru-%d", i), Lines: lines})
					switch {
					case err == nil:
						outcomes[i][k] = "taken"
					case errors.Is(err, stock.ErrRestored):
						outcomes[i][k] = "undone"
					default:
						outcomes[i][k] = err.Error()
					}
				})
			}
		}
		wg.Wait()
		close(stop)
		recovering.Wait()
		t.Logf("recovery undid %d carts", undid.Load())
		_, err := stockops.RecoverCarts(ctx, e.r, 0)
		require.NoError(t, err)
		var whole int64
		for i := range carts {
			id := fmt.Sprintf("rr-%d", i)
			o := outcomes[i]
			for k := 1; k < copies; k++ {
				assert.Equal(t, o[0], o[k], "%s: copies answered %v", id, o)
			}
			taken := []int64{a27Taken(t, e.r, "rr-a", id), a27Taken(t, e.r, "rr:b~", id), a27Taken(t, e.r, "plain-rr", id)}
			switch o[0] {
			case "taken":
				whole++
				assert.Equal(t, []int64{1, 2, 3}, taken, "%s answered taken", id)
			case "undone":
				assert.Equal(t, []int64{0, 0, 0}, taken, "%s answered undone", id)
			default:
				t.Errorf("%s: %v", id, o)
			}
			// A late copy agrees and changes nothing.
			_, err := e.r.DeductMany(ctx, stock.Cart{ID: id, User: fmt.Sprintf("rru-%d", i), Lines: lines})
			if o[0] == "taken" {
				assert.NoError(t, err, id)
			} else {
				assert.ErrorIs(t, err, stock.ErrRestored, id)
			}
		}
		for k, sku := range skus {
			l := a26Levels(t, e.r, sku)
			assert.Equal(t, whole*int64(k+1), l.Sold, sku)
		}
		t.Logf("%d of %d carts taken", whole, carts)
	})
}

// --- A process killed mid-saga ---------------------------------------------------------------

const (
	a27EnvChild  = "A27_CART_CHILD"
	a27EnvAddrs  = "A27_CART_ADDRS"
	a27EnvSingle = "A27_CART_SINGLE"
	a27EnvTag    = "A27_CART_TAG"
)

// a27KillLines are the lines of every cart of TestAttack27CartKilledProcess.
var a27KillLines = []stock.Line{{SKU: "kill-a", Qty: 1}, {SKU: "kill:b~", Qty: 2}, {SKU: "plain-kill", Qty: 1}}

// TestAttack27CartChildProcess is the buyer process of TestAttack27CartKilledProcess: it sends
// carts until it is killed, and prints each answer it got ("ok ID" or "no ID ERR").
func TestAttack27CartChildProcess(t *testing.T) {
	if os.Getenv(a27EnvChild) != "1" {
		t.Skip("the child process of TestAttack27CartKilledProcess")
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: strings.Split(os.Getenv(a27EnvAddrs), ","),
		ForceSingleClient: os.Getenv(a27EnvSingle) == "1", DisableCache: true})
	require.NoError(t, err)
	r, err := stock.New(c, a26Split(3))
	require.NoError(t, err)
	tag := os.Getenv(a27EnvTag)
	fmt.Println("ready")
	var wg sync.WaitGroup
	var mu sync.Mutex
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				id := fmt.Sprintf("%s-%d-%d", tag, g, i)
				_, err := r.DeductMany(context.Background(), stock.Cart{ID: id, User: fmt.Sprintf("ku-%d", i%5), Lines: a27KillLines})
				mu.Lock()
				if err == nil {
					fmt.Println("ok", id)
				} else {
					fmt.Println("no", id, strings.ReplaceAll(err.Error(), "\n", " "))
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}

// TestAttack27CartKilledProcess: a buyer process sending carts with split lines is killed with
// SIGKILL at random moments, several times; then cart recovery runs. Every cart the processes
// started is taken whole or not at all, every cart a process was told was taken is taken, every
// cart it was told was refused took nothing, the levels add up, and a retry of each cart
// agrees with the ledger and takes nothing more. Real servers only (the child needs an address).
func TestAttack27CartKilledProcess(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		if !b.Real() || b.Sentinel() != nil {
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := b.Client(t)
			r := newReserver(t, c, a26Split(3))
			// A new deployment: record the primaries before any item is loaded, so that the
			// failover guard of Run does not fence.
			fenced, err := stockops.NewFailoverGuard(r).Check(ctx)
			require.NoError(t, err)
			require.False(t, fenced)
			store := memstore.New()
			loads := map[string]int64{"kill-a": 1500, "kill:b~": 4000, "plain-kill": 3000}
			for sku, q := range loads {
				require.NoError(t, store.Load(ctx, sku, q))
				require.NoError(t, r.Load(ctx, sku, q))
			}
			acked := map[string]string{}
			const kills = 6
			for k := range kills {
				tag := fmt.Sprintf("kc%d", k)
				cmd := exec.Command(os.Args[0], "-test.run=^TestAttack27CartChildProcess$", "-test.count=1", "-test.v")
				single := "0"
				if b.Name == "standalone" {
					single = "1"
				}
				cmd.Env = append(os.Environ(), a27EnvChild+"=1", a27EnvAddrs+"="+strings.Join(b.Addrs(), ","), a27EnvSingle+"="+single, a27EnvTag+"="+tag)
				out, err := cmd.StdoutPipe()
				require.NoError(t, err)
				require.NoError(t, cmd.Start())
				lines := make(chan string, 1<<16)
				go func() {
					sc := bufio.NewScanner(out)
					for sc.Scan() {
						lines <- sc.Text()
					}
					close(lines)
				}()
				for l := range lines {
					if l == "ready" {
						break
					}
				}
				time.Sleep(time.Duration(50+rand.IntN(400)) * time.Millisecond)
				require.NoError(t, cmd.Process.Kill())
				_ = cmd.Wait()
				for l := range lines {
					f := strings.Fields(l)
					if len(f) >= 2 && (f[0] == "ok" || f[0] == "no") {
						acked[f[1]] = l
					}
				}
			}
			time.Sleep(100 * time.Millisecond)
			n, err := stockops.RecoverCarts(ctx, r, 0)
			require.NoError(t, err)
			// Every cart id of the children, from the ledgers and the answers.
			taken := map[string][3]int64{}
			skus := []string{"kill-a", "kill:b~", "plain-kill"}
			for k, sku := range skus {
				for e, err := range stockops.Entries(ctx, r, sku) {
					require.NoError(t, err)
					if e.Taken() && e.Kind != stock.KindRestock {
						v := taken[e.ID]
						v[k] += e.Qty
						taken[e.ID] = v
					}
				}
			}
			var whole int64
			for id, v := range taken {
				if v == [3]int64{1, 2, 1} {
					whole++
				} else if v != [3]int64{} {
					t.Errorf("cart %s half taken: %v", id, v)
				}
			}
			var oks, nos int
			reasons := map[string]int{}
			for id, l := range acked {
				if strings.HasPrefix(l, "ok ") {
					oks++
					assert.Equal(t, [3]int64{1, 2, 1}, taken[id], "acknowledged cart %s", id)
				} else {
					nos++
					reasons[strings.Join(strings.Fields(l)[2:], " ")]++
					assert.Equal(t, [3]int64{}, taken[id], "refused cart %s: %s", id, l)
				}
			}
			for k, sku := range skus {
				l := a26Levels(t, r, sku)
				assert.Equal(t, whole*a27KillLines[k].Qty, l.Sold, "%s: %+v", sku, l)
			}
			t.Logf("%d kills, %d carts answered ok, %d refused, %d taken whole, %d undone by recovery; refusals %v", kills, oks, nos, whole, n, reasons)
			// Retries of every cart: a taken one replays, an undone one takes nothing.
			for id := range acked {
				user := "ku-" + id[strings.LastIndex(id, "-")+1:]
				i, _ := strconv.Atoi(user[3:])
				user = fmt.Sprintf("ku-%d", i%5)
				_, err := r.DeductMany(ctx, stock.Cart{ID: id, User: user, Lines: a27KillLines})
				if taken[id] == [3]int64{1, 2, 1} {
					assert.NoError(t, err, id)
				} else {
					assert.Error(t, err, id)
				}
			}
			for k, sku := range skus {
				l := a26Levels(t, r, sku)
				assert.Equal(t, whole*a27KillLines[k].Qty, l.Sold, "%s after retries: %+v", sku, l)
			}
			// Run (its sweeper completes the transfers the kills cut) and its relay into the
			// store; then new buyers sell the rest out: nothing stranded, the store equals Redis.
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				done <- r.Run(rctx, stock.RunOptions{Store: store, SweepInterval: 100 * time.Millisecond,
					Relay: &stock.RelayOptions{Poll: 20 * time.Millisecond}})
			}()
			time.Sleep(6 * time.Second)
			for i := 0; ; i++ {
				_, err := r.DeductMany(ctx, stock.Cart{ID: fmt.Sprintf("after-%d", i), User: fmt.Sprintf("late-%d", i), Lines: a27KillLines})
				if err != nil {
					require.ErrorIs(t, err, stock.ErrSoldOut, "after %d late carts", i)
					break
				}
			}
			la := a26Levels(t, r, "kill-a")
			assert.Equal(t, int64(0), la.Available, "kill-a stranded: %+v", la)
			assert.Equal(t, int64(0), la.Held, "%+v", la)
			require.Eventually(t, func() bool {
				for _, sku := range skus {
					p, d, err := stockops.Pending(ctx, r, sku)
					if err != nil || p != 0 || d != 0 {
						return false
					}
				}
				return true
			}, 30*time.Second, 50*time.Millisecond)
			cancel()
			if err := <-done; err != nil {
				require.ErrorIs(t, err, context.Canceled)
			}
			for _, sku := range skus {
				l := a26Levels(t, r, sku)
				rem, err := store.Remaining(ctx, sku)
				require.NoError(t, err)
				assert.Equal(t, l.Available+l.Held, rem, "store vs Redis: %s %+v", sku, l)
			}
			assert.LessOrEqual(t, store.MaxApplications(), 1)
		})
	}
}

// TestAttack27ConfirmManyOneLineGone: a cart of holds whose last line (in SKU order) expired
// (the others were extended) or was cancelled: ConfirmMany confirms the first lines, then finds
// the last one gone, and must give the confirmed ones back in their buckets: the cart is
// confirmed whole or not at all, and a retry answers the same and takes nothing.
func TestAttack27ConfirmManyOneLineGone(t *testing.T) {
	a26Each(t, []stock.Option{a26Split(3)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		skus := []string{"cg-a", "cg:b", "cg~z"}
		for _, sku := range skus {
			require.NoError(t, e.r.Load(ctx, sku, 10))
		}
		lines := []stock.Line{{SKU: "cg-a", Qty: 1}, {SKU: "cg:b", Qty: 2}, {SKU: "cg~z", Qty: 3}}
		_, err := e.r.HoldMany(ctx, stock.Cart{ID: "cg-exp", User: "cu", Lines: lines}, 400*time.Millisecond)
		require.NoError(t, err)
		_, err = e.r.HoldMany(ctx, stock.Cart{ID: "cg-can", User: "cv", Lines: lines}, time.Hour)
		require.NoError(t, err)
		for _, sku := range skus[:2] {
			_, err := e.r.Extend(ctx, sku, "cg-exp", time.Hour)
			require.NoError(t, err)
		}
		_, err = e.r.Cancel(ctx, "cg~z", "cg-can")
		require.NoError(t, err)
		e.advance(time.Second)
		for _, c := range []struct {
			id   string
			want error
		}{{"cg-exp", stock.ErrExpired}, {"cg-can", stock.ErrRestored}} {
			for attempt := range 2 {
				_, err := e.r.ConfirmMany(ctx, c.id, skus...)
				var ce *stock.CartError
				require.ErrorAs(t, err, &ce, "%s attempt %d", c.id, attempt)
				assert.ErrorIs(t, err, c.want, "%s attempt %d", c.id, attempt)
				if attempt == 0 {
					// (A retry of the cancelled cart may name its first line, which the first
					// call restored: the doc promises the error, not the item, of a retry.)
					assert.Equal(t, "cg~z", ce.SKU, "%s attempt %d", c.id, attempt)
				}
				for _, sku := range skus {
					assert.Equal(t, int64(0), a27Taken(t, e.r, sku, c.id), "%s %s attempt %d", c.id, sku, attempt)
				}
			}
		}
		for _, sku := range skus {
			l := a26Levels(t, e.r, sku)
			assert.Equal(t, int64(10), l.Available, "%s: %+v", sku, l)
		}
	})
}

// TestAttack27ConfirmManyRacesCancelMany: ConfirmMany and CancelMany of the same carts of holds
// (split lines and a plain one) at once, while Levels is read in a loop: every cart ends
// confirmed whole or given back whole, and every reading keeps loaded = available + held + sold.
func TestAttack27ConfirmManyRacesCancelMany(t *testing.T) {
	a26Each(t, []stock.Option{a26Split(3)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		skus := []string{"cc2-a", "cc2:b", "plain-cc2"}
		for _, sku := range skus {
			require.NoError(t, e.r.Load(ctx, sku, 300))
		}
		lines := []stock.Line{{SKU: "cc2-a", Qty: 1}, {SKU: "cc2:b", Qty: 2}, {SKU: "plain-cc2", Qty: 3}}
		const n = 30
		for i := range n {
			_, err := e.r.HoldMany(ctx, stock.Cart{ID: fmt.Sprintf("cc2-%d", i), User: fmt.Sprintf("cu2-%d", i), Lines: lines}, time.Hour)
			require.NoError(t, err)
		}
		stop := make(chan struct{})
		wait := a26Watch(e.r, "cc2:b", 300, stop)
		var wg sync.WaitGroup
		for i := range n {
			id := fmt.Sprintf("cc2-%d", i)
			wg.Go(func() {
				_, err := e.r.ConfirmMany(ctx, id, skus...)
				if err != nil && !errors.Is(err, stock.ErrRestored) {
					t.Errorf("confirm %s: %v", id, err)
				}
			})
			wg.Go(func() {
				_, err := e.r.CancelMany(ctx, id, skus...)
				if err != nil && !errors.Is(err, stock.ErrConfirmed) {
					t.Errorf("cancel %s: %v", id, err)
				}
			})
		}
		wg.Wait()
		close(stop)
		reads, bad := wait()
		assert.Empty(t, bad, "of %d readings", reads)
		var confirmed int64
		for i := range n {
			id := fmt.Sprintf("cc2-%d", i)
			taken := []int64{a27Taken(t, e.r, "cc2-a", id), a27Taken(t, e.r, "cc2:b", id), a27Taken(t, e.r, "plain-cc2", id)}
			switch {
			case taken[0] == 1 && taken[1] == 2 && taken[2] == 3:
				confirmed++
			case taken[0] == 0 && taken[1] == 0 && taken[2] == 0:
			default:
				t.Errorf("%s half confirmed: %v", id, taken)
			}
		}
		for k, sku := range skus {
			l := a26Levels(t, e.r, sku)
			assert.Equal(t, int64(0), l.Held, "%s: %+v", sku, l)
			assert.Equal(t, confirmed*int64(k+1), l.Sold, "%s: %+v", sku, l)
		}
		t.Logf("%d of %d carts confirmed", confirmed, n)
	})
}

// TestAttack27CartAfterDueHoldsElsewhere: one buyer's cart of holds takes nearly all of a split
// item (stock moved from the other buckets); once they are due, another buyer's cart needs
// them: its bucket releases the due holds of the other buckets and moves the stock, with no sweep.
func TestAttack27CartAfterDueHoldsElsewhere(t *testing.T) {
	a26Each(t, []stock.Option{a26Split(4)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		require.NoError(t, e.r.Load(ctx, "dh-a", 20))
		require.NoError(t, e.r.Load(ctx, "plain-dh", 20))
		_, err := e.r.HoldMany(ctx, stock.Cart{ID: "dh-1", User: "first", Lines: []stock.Line{{SKU: "dh-a", Qty: 19}, {SKU: "plain-dh", Qty: 1}}}, 300*time.Millisecond)
		require.NoError(t, err)
		e.advance(time.Second)
		for i := range 4 { // buyers of several buckets
			_, err = e.r.DeductMany(ctx, stock.Cart{ID: fmt.Sprintf("dh-next-%d", i), User: fmt.Sprintf("next-%d", i), Lines: []stock.Line{{SKU: "dh-a", Qty: 5}, {SKU: "plain-dh", Qty: 1}}})
			require.NoError(t, err, "cart %d", i)
		}
		l := a26Levels(t, e.r, "dh-a")
		assert.Equal(t, int64(20), l.Sold, "%+v", l)
		_, err = e.r.ConfirmMany(ctx, "dh-1", "dh-a", "plain-dh")
		assert.ErrorIs(t, err, stock.ErrExpired)
	})
}

// TestAttack27RecoverCutHoldSagas: TestAttack27RecoverCutSagas with carts of holds: after cart
// recovery every cart holds every line or none, and held units add up.
func TestAttack27RecoverCutHoldSagas(t *testing.T) {
	a26Each(t, []stock.Option{a26Split(3)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		skus := []string{"rh-a", "rh:b", "plain-rh"}
		for _, sku := range skus {
			require.NoError(t, e.r.Load(ctx, sku, 500))
		}
		lines := []stock.Line{{SKU: "rh-a", Qty: 1}, {SKU: "rh:b", Qty: 2}, {SKU: "plain-rh", Qty: 3}}
		const n = 40
		rng := rand.New(rand.NewPCG(27, 2))
		var wg sync.WaitGroup
		for i := range n {
			d := time.Duration(rng.IntN(25000)) * time.Microsecond
			if !e.real {
				d *= 6 // miniredis runs a saga in about 15 ms
			}
			wg.Go(func() {
				cctx, cancel := context.WithTimeout(ctx, d)
				defer cancel()
				_, _ = e.r.HoldMany(cctx, stock.Cart{ID: fmt.Sprintf("rh-%d", i), User: fmt.Sprintf("rhu-%d", i%5), Lines: lines}, time.Hour)
			})
		}
		wg.Wait()
		time.Sleep(200 * time.Millisecond)
		e.advance(3 * time.Second)
		_, err := stockops.RecoverCarts(ctx, e.r, 2*time.Second)
		require.NoError(t, err)
		var whole int64
		for i := range n {
			id := fmt.Sprintf("rh-%d", i)
			taken := []int64{a27Taken(t, e.r, "rh-a", id), a27Taken(t, e.r, "rh:b", id), a27Taken(t, e.r, "plain-rh", id)}
			switch {
			case taken[0] == 1 && taken[1] == 2 && taken[2] == 3:
				whole++
			case taken[0] == 0 && taken[1] == 0 && taken[2] == 0:
			default:
				t.Errorf("%s half held: %v", id, taken)
			}
		}
		for k, sku := range skus {
			l := a26Levels(t, e.r, sku)
			assert.Equal(t, whole*int64(k+1), l.Held, "%s: %+v", sku, l)
		}
		t.Logf("%d of %d carts held whole", whole, n)
	})
}

// TestAttack27CartClosedAndSummedLimit: a cart refused by a closed split item gives back the
// lines before it; lines of one split item are summed before the user limit.
func TestAttack27CartClosedAndSummedLimit(t *testing.T) {
	a26Each(t, []stock.Option{a26Split(3), stock.WithUserLimit(2)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		require.NoError(t, e.r.Load(ctx, "cl-a", 10))
		require.NoError(t, e.r.Load(ctx, "cl-z", 10))
		require.NoError(t, e.r.CloseItem(ctx, "cl-z"))
		_, err := e.r.DeductMany(ctx, stock.Cart{ID: "cl-1", User: "u", Lines: []stock.Line{{SKU: "cl-a", Qty: 2}, {SKU: "cl-z", Qty: 1}}})
		var ce *stock.CartError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, "cl-z", ce.SKU)
		assert.ErrorIs(t, err, stock.ErrClosed)
		assert.Equal(t, int64(10), a26Levels(t, e.r, "cl-a").Available)
		// The give-back freed the buyer's limit.
		_, err = e.r.Deduct(ctx, stock.Request{SKU: "cl-a", ID: "cl-2", User: "u", Qty: 2})
		require.NoError(t, err)
		require.NoError(t, e.r.ReopenItem(ctx, "cl-z"))
		_, err = e.r.DeductMany(ctx, stock.Cart{ID: "cl-3", User: "v", Lines: []stock.Line{{SKU: "cl-z", Qty: 1}, {SKU: "cl-z", Qty: 1}, {SKU: "cl-z", Qty: 1}}})
		assert.ErrorIs(t, err, stock.ErrUserLimit)
		assert.Equal(t, int64(10), a26Levels(t, e.r, "cl-z").Available)
		_, err = e.r.DeductMany(ctx, stock.Cart{ID: "cl-4", User: "v", Lines: []stock.Line{{SKU: "cl-z", Qty: 1}, {SKU: "cl-z", Qty: 1}}})
		require.NoError(t, err)
		assert.Equal(t, int64(8), a26Levels(t, e.r, "cl-z").Available)
	})
}

// TestAttack27MixedIntoStore: carts of deducts and holds with split lines, their confirms,
// cancels and restores of single lines, and single requests on the split items, from several
// goroutines while Run relays into a memstore: once drained, the Store equals Redis for every
// item, no event was applied twice, and a reconcile pass finds no drift.
func TestAttack27MixedIntoStore(t *testing.T) {
	a26Each(t, []stock.Option{a26Split(3)}, func(t *testing.T, e *a26Env) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		store := memstore.New()
		skus := []string{"mx-a", "mx:b~", "plain-mx"}
		for _, sku := range skus {
			require.NoError(t, store.Load(ctx, sku, 200))
			require.NoError(t, e.r.Load(ctx, sku, 200))
		}
		done := make(chan error, 1)
		go func() {
			done <- e.r.Run(ctx, stock.RunOptions{Store: store, Relay: &stock.RelayOptions{Poll: 20 * time.Millisecond}})
		}()
		var wg sync.WaitGroup
		for g := range 6 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(g), 27))
				for k := range 20 {
					id := fmt.Sprintf("mx-%d-%d", g, k)
					user := fmt.Sprintf("mxu-%d", rng.IntN(8))
					lines := []stock.Line{{SKU: "mx-a", Qty: 1 + rng.Int64N(3)}, {SKU: "mx:b~", Qty: 1 + rng.Int64N(3)}, {SKU: "plain-mx", Qty: 1}}
					switch rng.IntN(5) {
					case 0:
						_, _ = e.r.DeductMany(ctx, stock.Cart{ID: id, User: user, Lines: lines})
					case 1:
						if _, err := e.r.DeductMany(ctx, stock.Cart{ID: id, User: user, Lines: lines}); err == nil {
							_, _ = e.r.Restore(ctx, "mx:b~", id)
						}
					case 2:
						if _, err := e.r.HoldMany(ctx, stock.Cart{ID: id, User: user, Lines: lines}, time.Hour); err == nil {
							_, _ = e.r.ConfirmMany(ctx, id, skus...)
						}
					case 3:
						if _, err := e.r.HoldMany(ctx, stock.Cart{ID: id, User: user, Lines: lines}, time.Hour); err == nil {
							_, _ = e.r.CancelMany(ctx, id, skus...)
						}
					default:
						if _, err := e.r.Deduct(ctx, stock.Request{SKU: "mx-a", ID: id, User: user, Qty: 2}); err == nil && rng.IntN(2) == 0 {
							_, _ = e.r.Restore(ctx, "mx-a", id)
						}
					}
				}
			})
		}
		wg.Wait()
		require.Eventually(t, func() bool {
			for _, sku := range skus {
				p, d, err := stockops.Pending(context.Background(), e.r, sku)
				if err != nil || p != 0 || d != 0 {
					return false
				}
			}
			return true
		}, 30*time.Second, 50*time.Millisecond)
		cancel()
		if err := <-done; err != nil {
			require.ErrorIs(t, err, context.Canceled)
		}
		for _, sku := range skus {
			l := a26Levels(t, e.r, sku)
			rem, err := store.Remaining(context.Background(), sku)
			require.NoError(t, err)
			assert.Equal(t, l.Available+l.Held, rem, "store vs Redis: %s %+v", sku, l)
			a26Reconcile(t, e.r, store, sku)
		}
		assert.LessOrEqual(t, store.MaxApplications(), 1)
	})
}
