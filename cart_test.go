package stock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
)

func TestDeductMany(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		for _, sku := range []string{"A", "B", "C"} {
			require.NoError(t, r.Load(ctx, sku, 5))
		}
		cart := stock.Cart{ID: "cart-1", User: "u", Lines: []stock.Line{{SKU: "B", Qty: 1}, {SKU: "A", Qty: 2}, {SKU: "B", Qty: 2}}}
		rc := mustCart(t)(r.DeductMany(ctx, cart))
		assert.False(t, rc.Replayed)
		require.Len(t, rc.Items, 2)
		assert.Equal(t, stock.Receipt{SKU: "A", ID: "cart-1", Qty: 2, Remaining: 3}, rc.Items[0])
		assert.Equal(t, stock.Receipt{SKU: "B", ID: "cart-1", Qty: 3, Remaining: 2}, rc.Items[1], "lines of one item are summed")
		rc = mustCart(t)(r.DeductMany(ctx, cart))
		assert.True(t, rc.Replayed)
		mustFailCart(t, stock.ErrConflict)(r.DeductMany(ctx, stock.Cart{ID: "cart-1", Lines: []stock.Line{{SKU: "A", Qty: 1}}}))

		// Two lines of one item that would each pass alone must not both pass.
		_, err := r.DeductMany(ctx, stock.Cart{ID: "cart-2", Lines: []stock.Line{{SKU: "C", Qty: 1}, {SKU: "A", Qty: 2}, {SKU: "A", Qty: 2}}})
		var ce *stock.CartError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, "A", ce.SKU)
		assert.ErrorIs(t, err, stock.ErrInsufficient)
		assert.Equal(t, int64(3), levels(t, r, "A").Available)
		assert.Equal(t, int64(5), levels(t, r, "C").Available, "the line taken before the refusal was given back")
		mustFailCart(t, stock.ErrConflict)(
			r.DeductMany(ctx, stock.Cart{ID: "cart-2", Lines: []stock.Line{{SKU: "C", Qty: 1}, {SKU: "A", Qty: 3}}}))
		_, err = r.DeductMany(ctx, stock.Cart{ID: "cart-2", Lines: []stock.Line{{SKU: "C", Qty: 1}, {SKU: "A", Qty: 2}, {SKU: "A", Qty: 2}}})
		assert.ErrorIs(t, err, stock.ErrInsufficient, "an undone cart stays undone, with the refusal that undid it")
		assert.ErrorAs(t, err, &ce)

		// An id already used alone on an item is not the cart's line: the undo leaves it alone.
		must(t)(r.Deduct(ctx, stock.Request{SKU: "C", ID: "cart-3", Qty: 1}))
		mustFailCart(t, stock.ErrConflict)(
			r.DeductMany(ctx, stock.Cart{ID: "cart-3", Lines: []stock.Line{{SKU: "B", Qty: 1}, {SKU: "C", Qty: 2}}}))
		assert.Equal(t, int64(4), levels(t, r, "C").Available)
		assert.Equal(t, int64(2), levels(t, r, "B").Available)

		for name, bad := range map[string]stock.Cart{
			"no lines": {ID: "x"}, "bad sku": {ID: "x", Lines: []stock.Line{{SKU: "a b", Qty: 1}}},
			"zero qty": {ID: "x", Lines: []stock.Line{{SKU: "A", Qty: 0}}}, "no id": {Lines: []stock.Line{{SKU: "A", Qty: 1}}},
			"sum over max": {ID: "x", Lines: []stock.Line{{SKU: "A", Qty: stock.MaxQty}, {SKU: "A", Qty: 1}}},
		} {
			mustFailCart(t, stock.ErrInvalid, name)(r.DeductMany(ctx, bad))
		}
		for _, sku := range []string{"A", "B", "C"} {
			checkLedger(t, r, sku, 5)
		}
	})
}

func TestDeductManyUserLimitPerItem(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c, stock.WithUserLimit(2))
		require.NoError(t, r.Load(ctx, "A", 10))
		require.NoError(t, r.Load(ctx, "B", 10))
		mustCart(t, "the limit is per item")(
			r.DeductMany(ctx, stock.Cart{ID: "c1", User: "u", Lines: []stock.Line{{SKU: "A", Qty: 2}, {SKU: "B", Qty: 2}}}))
		mustFailCart(t, stock.ErrUserLimit)(r.DeductMany(ctx, stock.Cart{ID: "c2", User: "u", Lines: []stock.Line{{SKU: "A", Qty: 1}}}))
		mustFailCart(t, stock.ErrUserLimit, "summed lines count against the limit")(
			r.DeductMany(ctx, stock.Cart{ID: "c3", User: "v", Lines: []stock.Line{{SKU: "B", Qty: 1}, {SKU: "B", Qty: 2}}}))
	})
}

func TestHoldMany(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		require.NoError(t, r.Load(ctx, "A", 5))
		require.NoError(t, r.Load(ctx, "B", 5))
		mustCart(t)(r.HoldMany(ctx, stock.Cart{ID: "h1", Lines: []stock.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 2}}}, time.Minute))
		assert.Equal(t, int64(2), levels(t, r, "B").Held)
		_, err := r.ConfirmMany(ctx, "h1", "B", "A")
		require.NoError(t, err)
		assert.Equal(t, int64(2), levels(t, r, "B").Sold)
		mustCart(t)(r.HoldMany(ctx, stock.Cart{ID: "h2", Lines: []stock.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 1}}}, time.Minute))
		_, err = r.CancelMany(ctx, "h2", "A", "B")
		require.NoError(t, err)
		assert.Equal(t, stock.Levels{Available: 3, Sold: 2, Loaded: 5}, levels(t, r, "B"))
		mustFailCart(t, stock.ErrInsufficient)(
			r.HoldMany(ctx, stock.Cart{ID: "h3", Lines: []stock.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 9}}}, time.Minute))
		assert.Zero(t, levels(t, r, "A").Held, "the hold on A was cancelled")
	})
}

// TestCartsConcurrent: carts over overlapping items race; every cart is whole or absent.
func TestCartsConcurrent(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) { cartsConcurrent(t, c) })
}

// TestGroupedCartsConcurrent: the same with every item in one group (one script per cart).
func TestGroupedCartsConcurrent(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		cartsConcurrent(t, c, stock.WithGroups(func(string) string { return "all" }))
	})
}

func cartsConcurrent(t *testing.T, c rueidis.Client, opts ...stock.Option) {
	{
		ctx := context.Background()
		r := newReserver(t, c, opts...)
		skus := []string{"A", "B", "C", "D"}
		for _, sku := range skus {
			require.NoError(t, r.Load(ctx, sku, 40))
		}
		type cartRes struct {
			cart stock.Cart
			ok   bool
		}
		var mu sync.Mutex
		var results []cartRes
		var wg sync.WaitGroup
		for g := range 150 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(g), 9))
				cart := stock.Cart{ID: fmt.Sprint("cart", g)}
				for range 1 + rng.IntN(3) {
					cart.Lines = append(cart.Lines, stock.Line{SKU: skus[rng.IntN(len(skus))], Qty: int64(1 + rng.IntN(3))})
				}
				_, err := r.DeductMany(ctx, cart)
				if err != nil && !errors.Is(err, stock.ErrSoldOut) && !errors.Is(err, stock.ErrInsufficient) {
					t.Error(err)
				}
				mu.Lock()
				results = append(results, cartRes{cart, err == nil})
				mu.Unlock()
			})
		}
		wg.Wait()
		entries := map[string]map[string]stock.Entry{}
		for _, sku := range skus {
			_, entries[sku] = checkLedger(t, r, sku, 40)
		}
		okCarts := 0
		for _, res := range results {
			sums := map[string]int64{}
			for _, l := range res.cart.Lines {
				sums[l.SKU] += l.Qty
			}
			for sku, q := range sums {
				e, seen := entries[sku][res.cart.ID]
				if res.ok {
					require.True(t, seen, "cart %s misses %s", res.cart.ID, sku)
					assert.Equal(t, stock.StateReserved, e.State)
					assert.Equal(t, q, e.Qty)
				} else if seen {
					assert.False(t, e.Taken(), "refused cart %s still holds %s", res.cart.ID, sku)
				}
			}
			if res.ok {
				okCarts++
			}
		}
		assert.Positive(t, okCarts)
	}
}

func TestGroupedCartOneScript(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		shoes := func(sku string) string {
			if strings.HasPrefix(sku, "shoe-") {
				return "shoe"
			}
			return ""
		}
		r := newReserver(t, c, stock.WithGroups(shoes), stock.WithUserLimit(3))
		for _, sku := range []string{"shoe-40", "shoe-41", "hat"} {
			require.NoError(t, r.Load(ctx, sku, 4))
		}
		n, err := c.Do(ctx, c.B().Exists().Key("stock:{shoe}:{shoe-40}").Build()).AsInt64()
		require.NoError(t, err)
		assert.Equal(t, int64(1), n, "a grouped item's keys carry the group's tag")

		cart := stock.Cart{ID: "c1", User: "u", Lines: []stock.Line{{SKU: "shoe-41", Qty: 1}, {SKU: "shoe-40", Qty: 2}}}
		rc := mustCart(t)(r.DeductMany(ctx, cart))
		assert.Equal(t, []stock.Receipt{{SKU: "shoe-40", ID: "c1", Qty: 2, Remaining: 2}, {SKU: "shoe-41", ID: "c1", Qty: 1, Remaining: 3}}, rc.Items)
		rc = mustCart(t)(r.DeductMany(ctx, cart))
		assert.True(t, rc.Replayed)

		// A refusal writes nothing at all: no entry, no tombstone, on either item.
		_, err = r.DeductMany(ctx, stock.Cart{ID: "c2", Lines: []stock.Line{{SKU: "shoe-40", Qty: 1}, {SKU: "shoe-41", Qty: 9}}})
		var ce *stock.CartError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, "shoe-41", ce.SKU)
		assert.ErrorIs(t, err, stock.ErrInsufficient)
		_, err = r.Ledger(ctx, "shoe-40", "c2")
		assert.ErrorIs(t, err, stock.ErrUnknownID)
		mustCart(t, "nothing was recorded for the refused cart: the id is free")(
			r.DeductMany(ctx, stock.Cart{ID: "c2", Lines: []stock.Line{{SKU: "shoe-40", Qty: 1}, {SKU: "shoe-41", Qty: 1}}}))
		mustFailCart(t, stock.ErrUserLimit, "the per-user limit per item")(
			r.DeductMany(ctx, stock.Cart{ID: "c3", User: "u", Lines: []stock.Line{{SKU: "shoe-40", Qty: 2}, {SKU: "shoe-41", Qty: 1}}}))

		// Mixed with an item outside the group: the saga.
		mustCart(t)(r.DeductMany(ctx, stock.Cart{ID: "c4", Lines: []stock.Line{{SKU: "shoe-41", Qty: 1}, {SKU: "hat", Qty: 1}}}))
		// Holds in one script too; single operations work on grouped items.
		mustCart(t)(
			r.HoldMany(ctx, stock.Cart{ID: "h1", Lines: []stock.Line{{SKU: "shoe-40", Qty: 1}, {SKU: "shoe-41", Qty: 1}}}, time.Minute))
		_, err = r.ConfirmMany(ctx, "h1", "shoe-40", "shoe-41")
		require.NoError(t, err)
		must(t)(r.Restore(ctx, "shoe-40", "c1"))
		for _, sku := range []string{"shoe-40", "shoe-41", "hat"} {
			checkLedger(t, r, sku, 4)
		}
		assert.Equal(t, stock.Levels{Available: 2, Sold: 2, Loaded: 4}, levels(t, r, "shoe-40"))
		assert.Equal(t, stock.Levels{Available: 0, Sold: 4, Loaded: 4}, levels(t, r, "shoe-41"))
	})
}
