package stock_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
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

func TestDeductMany(t *testing.T) {
	eachReserver(t, nil, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
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
	eachReserver(t, []stock.Option{stock.WithUserLimit(2)}, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
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
	eachReserver(t, nil, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		require.NoError(t, r.Load(ctx, "A", 5))
		require.NoError(t, r.Load(ctx, "B", 5))
		mustCart(t)(r.HoldMany(ctx, stock.Cart{ID: "h1", Lines: []stock.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 2}}}, time.Minute))
		assert.Equal(t, int64(2), levels(t, r, "B").Held)
		require.NoError(t, testkit.Err(r.ConfirmMany(ctx, "h1", "B", "A")))
		assert.Equal(t, int64(2), levels(t, r, "B").Sold)
		mustCart(t)(r.HoldMany(ctx, stock.Cart{ID: "h2", Lines: []stock.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 1}}}, time.Minute))
		require.NoError(t, testkit.Err(r.CancelMany(ctx, "h2", "A", "B")))
		assert.Equal(t, stock.Levels{Available: 3, Sold: 2, Loaded: 5}, levels(t, r, "B"))
		mustFailCart(t, stock.ErrInsufficient)(
			r.HoldMany(ctx, stock.Cart{ID: "h3", Lines: []stock.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 9}}}, time.Minute))
		assert.Zero(t, levels(t, r, "A").Held, "the hold on A was cancelled")
	})
}

// TestCartsConcurrent: carts over overlapping items race; every cart is whole or absent, as a
// saga and with every item in one group (one script per cart).
func TestCartsConcurrent(t *testing.T) {
	cartModes(t, func(t *testing.T, r *stock.Reserver) {
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
	})
}

func TestGroupedCartOneScript(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
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
		assert.ErrorIs(t, testkit.Err(r.Ledger(ctx, "shoe-40", "c2")), stock.ErrUnknownID)
		mustCart(t, "nothing was recorded for the refused cart: the id is free")(
			r.DeductMany(ctx, stock.Cart{ID: "c2", Lines: []stock.Line{{SKU: "shoe-40", Qty: 1}, {SKU: "shoe-41", Qty: 1}}}))
		mustFailCart(t, stock.ErrUserLimit, "the per-user limit per item")(
			r.DeductMany(ctx, stock.Cart{ID: "c3", User: "u", Lines: []stock.Line{{SKU: "shoe-40", Qty: 2}, {SKU: "shoe-41", Qty: 1}}}))

		// Mixed with an item outside the group: the saga.
		mustCart(t)(r.DeductMany(ctx, stock.Cart{ID: "c4", Lines: []stock.Line{{SKU: "shoe-41", Qty: 1}, {SKU: "hat", Qty: 1}}}))
		// Holds in one script too; single operations work on grouped items.
		mustCart(t)(
			r.HoldMany(ctx, stock.Cart{ID: "h1", Lines: []stock.Line{{SKU: "shoe-40", Qty: 1}, {SKU: "shoe-41", Qty: 1}}}, time.Minute))
		require.NoError(t, testkit.Err(r.ConfirmMany(ctx, "h1", "shoe-40", "shoe-41")))
		must(t)(r.Restore(ctx, "shoe-40", "c1"))
		for _, sku := range []string{"shoe-40", "shoe-41", "hat"} {
			checkLedger(t, r, sku, 4)
		}
		assert.Equal(t, stock.Levels{Available: 2, Sold: 2, Loaded: 4}, levels(t, r, "shoe-40"))
		assert.Equal(t, stock.Levels{Available: 0, Sold: 4, Loaded: 4}, levels(t, r, "shoe-41"))
	})
}

// TestCartOtherUserConflict: a cart id completed by one user, sent again with the same lines by
// another user, is ErrConflict and changes nothing; the owner's retry is still a replay.
func TestCartOtherUserConflict(t *testing.T) {
	cartModes(t, func(t *testing.T, r *stock.Reserver) {
		loadItems(t, r, map[string]int64{"A": 5, "B": 5})
		lines := []stock.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 2}}
		alice := stock.Cart{ID: "order-7", User: "alice", Lines: lines}
		mustCart(t)(r.DeductMany(ctx, alice))
		before := []stock.Levels{levels(t, r, "A"), levels(t, r, "B")}

		mustFailCart(t, stock.ErrConflict, "another user's cart under alice's id")(
			r.DeductMany(ctx, stock.Cart{ID: "order-7", User: "mallory", Lines: lines}))
		mustFailCart(t, stock.ErrConflict)(r.HoldMany(ctx, stock.Cart{ID: "order-7", User: "mallory", Lines: lines}, time.Minute))
		mustFailCart(t, stock.ErrConflict, "the same cart without a user is another cart")(
			r.DeductMany(ctx, stock.Cart{ID: "order-7", Lines: lines}))
		assert.Equal(t, before, []stock.Levels{levels(t, r, "A"), levels(t, r, "B")}, "nothing given back")

		rc := mustCart(t, "alice's retry")(r.DeductMany(ctx, alice))
		assert.True(t, rc.Replayed)
		for _, sku := range []string{"A", "B"} {
			e := entry(t, r, sku, "order-7")
			assert.True(t, e.Taken(), "%s still taken by alice", sku)
			assert.Equal(t, "alice", e.User)
		}
	})
}

// TestCartRetryAfterPartialRestore: a completed cart, one line restored, then a retry of the
// cart: the retry answers the cart's outcome and gives back none of the lines it kept.
func TestCartRetryAfterPartialRestore(t *testing.T) {
	cartModes(t, func(t *testing.T, r *stock.Reserver) {
		loadItems(t, r, map[string]int64{"A": 5, "B": 5, "C": 5})
		cart := stock.Cart{ID: "c1", User: "u", Lines: []stock.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 2}, {SKU: "C", Qty: 3}}}
		first := mustCart(t)(r.DeductMany(ctx, cart))
		must(t)(r.Restore(ctx, "B", "c1"))

		rc := mustCart(t, "a retry of a completed cart answers its outcome")(r.DeductMany(ctx, cart))
		assert.True(t, rc.Replayed)
		require.Len(t, rc.Items, 3)
		for i, it := range rc.Items {
			assert.Equal(t, first.Items[i].SKU, it.SKU)
			assert.Equal(t, first.Items[i].Qty, it.Qty)
			assert.Equal(t, first.Items[i].Remaining, it.Remaining, "the original receipt")
			assert.True(t, it.Replayed)
		}
		assert.Equal(t, stock.Levels{Available: 4, Sold: 1, Loaded: 5}, levels(t, r, "A"), "A kept")
		assert.Equal(t, stock.Levels{Available: 5, Loaded: 5}, levels(t, r, "B"), "B restored once")
		assert.Equal(t, stock.Levels{Available: 2, Sold: 3, Loaded: 5}, levels(t, r, "C"), "C kept")

		// A cart of holds whose line was cancelled: the retry says so, and gives nothing back.
		hc := stock.Cart{ID: "h1", User: "u", Lines: []stock.Line{{SKU: "A", Qty: 1}, {SKU: "C", Qty: 1}}}
		mustCart(t)(r.HoldMany(ctx, hc, time.Minute))
		must(t)(r.Cancel(ctx, "A", "h1"))
		_, err := r.HoldMany(ctx, hc, time.Minute)
		testkit.CartRefused(t, err, "A", stock.ErrRestored, "a cart of holds answers its holds' state")
		assert.Equal(t, stock.Levels{Available: 1, Held: 1, Sold: 3, Loaded: 5}, levels(t, r, "C"), "C's hold kept")
	})
}

// TestCartConcurrentCopies: many copies of each cart id run at once while single deducts race
// them for the scarce item. Each cart id has one outcome: every copy is told the same (taken, or
// refused), and the stock and the ledger match it.
//
// A cart taken by one script (items in one group) is atomic, and its refusal, like a refused
// Deduct, records nothing: a copy refused while the scarce item was out may be followed by a copy
// that finds a unit given back. There, every copy that was told "taken" must agree with the
// stock, and the cart is taken at most once.
func TestCartConcurrentCopies(t *testing.T) {
	cartModes(t, func(t *testing.T, r *stock.Reserver) {
		saga := strings.HasSuffix(t.Name(), "/saga")
		const carts, copies = 40, 8
		loadItems(t, r, map[string]int64{"A": carts, "B": 3, "C": carts}) // B is scarce: carts and single deducts compete for it
		type answer struct {
			ok  bool
			err error
		}
		answers := make([][]answer, carts)
		var wg sync.WaitGroup
		for i := range carts {
			answers[i] = make([]answer, copies)
			cart := stock.Cart{ID: "cart-" + strconv.Itoa(i), User: "u" + strconv.Itoa(i%3),
				Lines: []stock.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 1}, {SKU: "C", Qty: 1}}}
			for j := range copies {
				wg.Go(func() {
					_, err := r.DeductMany(ctx, cart)
					answers[i][j] = answer{ok: err == nil, err: err}
				})
			}
			wg.Go(func() { // a competitor for B: takes a unit and gives it back, so B flickers
				for k := range 4 {
					id := "single-" + strconv.Itoa(i) + "-" + strconv.Itoa(k)
					if _, err := r.Deduct(ctx, stock.Request{SKU: "B", ID: id, Qty: 1}); err == nil {
						_, _ = r.Restore(ctx, "B", id)
					}
				}
			})
		}
		wg.Wait()
		taken := 0
		for i, as := range answers {
			for j, a := range as {
				if a.err != nil && !errors.Is(a.err, stock.ErrSoldOut) && !errors.Is(a.err, stock.ErrInsufficient) && !errors.Is(a.err, stock.ErrRestored) {
					t.Fatalf("cart-%d copy %d: unexpected error %v", i, j, a.err)
				}
				if saga {
					require.Equal(t, as[0].ok, a.ok, "cart-%d: copy 0 got %v, copy %d got %v", i, as[0].err, j, a.err)
				}
				if a.ok {
					as[0].ok = true // the cart was taken
				}
			}
			for _, sku := range []string{"A", "B", "C"} {
				e, err := r.Ledger(ctx, sku, "cart-"+strconv.Itoa(i))
				if err == nil {
					assert.Equal(t, as[0].ok, e.Taken(), "cart-%d: %s's entry %s/%s against the answer %v", i, sku, e.Kind, e.State, as[0].err)
				} else {
					require.ErrorIs(t, err, stock.ErrUnknownID)
					assert.False(t, as[0].ok, "cart-%d was told taken but %s has no entry", i, sku)
				}
			}
			if as[0].ok {
				taken++
			}
		}
		a, c := levels(t, r, "A"), levels(t, r, "C")
		assert.Equal(t, int64(taken), a.Sold, "A sold = carts taken")
		assert.Equal(t, int64(taken), c.Sold, "C sold = carts taken")
		t.Logf("%d of %d carts taken, B: %+v", taken, carts, levels(t, r, "B"))
	})
}

// TestCartRefusalSameForEveryCopy: a cart refused by an item is refused with that item's
// refusal for every later copy too, not only for the attempt that found it.
func TestCartRefusalSameForEveryCopy(t *testing.T) {
	eachReserver(t, nil, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		loadItems(t, r, map[string]int64{"A": 5, "B": 1})
		cart := stock.Cart{ID: "c", Lines: []stock.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 2}}}
		for i := range 2 {
			_, err := r.DeductMany(ctx, cart)
			testkit.CartRefused(t, err, "B", stock.ErrInsufficient, "attempt %d", i)
		}
		assert.Equal(t, stock.Levels{Available: 5, Loaded: 5}, levels(t, r, "A"))
	})
}

// collidingNames are SKUs built to meet other items' keys if key construction were not
// injective: an item's name followed by each key suffix, and the cart log's old name.
var collidingNames = []string{"tee", "tee:u", "tee:l", "tee:o", "tee:h", "tee:r", "tee:rl", "tee:dl", "tee:b",
	"~carts", "~carts:p", "carts", "items", "epoch", "g", "g:tee"}

// TestKeysInjective: with and without groups, every operation on one item leaves every other
// item (named to collide with its keys) untouched, and the cart log is no item's key.
func TestKeysInjective(t *testing.T) {
	groups := map[string]func(string) string{
		"ungrouped": nil,
		"grouped":   func(string) string { return "g" },
		"mixed": func(sku string) string { // half the items in group g, the other half alone
			if len(sku)%2 == 0 {
				return "g"
			}
			return ""
		},
	}
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		for name, group := range groups {
			t.Run(name, func(t *testing.T) {
				opts := []stock.Option{stock.WithPrefix("k" + name), stock.WithUserLimit(5)}
				if group != nil {
					opts = append(opts, stock.WithGroups(group))
				}
				r := newReserver(t, c, opts...)
				// A cart first, so the cart log exists before "~carts" is loaded.
				loadItems(t, r, map[string]int64{"x1": 5, "x2": 5})
				mustCart(t)(
					r.DeductMany(ctx, stock.Cart{ID: "cart", User: "a", Lines: []stock.Line{{SKU: "x1", Qty: 1}, {SKU: "x2", Qty: 1}}}))
				for _, sku := range collidingNames {
					require.NoError(t, r.Load(ctx, sku, 10), "load %q", sku)
				}
				for _, sku := range collidingNames {
					// Touch every key of sku: the user hash, the ledger, the outbox, holds.
					must(t, "deduct %q", sku)(r.Deduct(ctx, stock.Request{SKU: sku, ID: "a", User: "a", Qty: 1}))
					must(t, "hold %q", sku)(r.Hold(ctx, stock.Request{SKU: sku, ID: "h", User: "b", Qty: 2}, time.Minute))
					mustFail(t, stock.ErrUnknownID)(r.Restore(ctx, sku, "never"))
				}
				for _, sku := range collidingNames {
					assert.Equal(t, stock.Levels{Available: 7, Held: 2, Sold: 1, Loaded: 10}, levels(t, r, sku), "item %q", sku)
					for _, id := range []string{"a", "h", "never"} {
						e, err := r.Ledger(ctx, sku, id)
						require.NoError(t, err, "ledger %q/%q", sku, id)
						assert.Equal(t, sku, e.SKU)
					}
					require.ErrorIs(t, testkit.Err(r.Ledger(ctx, sku, "cart")), stock.ErrUnknownID, "%q has no cart entry", sku)
				}
				rc := mustCart(t, "the cart log survives the items")(
					r.DeductMany(ctx, stock.Cart{ID: "cart", User: "a", Lines: []stock.Line{{SKU: "x1", Qty: 1}, {SKU: "x2", Qty: 1}}}))
				assert.True(t, rc.Replayed)
				mustCart(t, "a cart of the colliding items")(
					r.DeductMany(ctx, stock.Cart{ID: "cart2", Lines: []stock.Line{{SKU: "~carts", Qty: 1}, {SKU: "tee", Qty: 1}}}))
				n := 0
				for sku, err := range stockops.Items(ctx, r) {
					require.NoError(t, err)
					if !strings.HasPrefix(sku, "x") {
						n++
					}
				}
				assert.Equal(t, len(collidingNames), n)
			})
		}
	})
}

// TestReplicaAckGroupedCart: a cart taken by one script (items in one group) waits for the
// replica acknowledgement like any other write.
func TestReplicaAckGroupedCart(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skip("real-server test: set STOCK_REDIS_SERVER to run it")
	}
	primary := redistest.StartServer(t)
	replica := redistest.StartServer(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port()))
	rc := replica.Client(t)
	require.Eventually(t, func() bool {
		info, err := rc.Do(ctx, rc.B().Info().Section("replication").Build()).ToString()
		return err == nil && strings.Contains(info, "master_link_status:up")
	}, 10*time.Second, 20*time.Millisecond)
	r, err := stock.New(primary.Client(t), stock.WithReplicaAck(1, 500*time.Millisecond),
		stock.WithGroups(func(string) string { return "g" }))
	require.NoError(t, err)
	loadItems(t, r, map[string]int64{"A": 5, "B": 5})
	lines := []stock.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 1}}
	mustCart(t, "the replica acknowledges")(r.DeductMany(ctx, stock.Cart{ID: "c1", Lines: lines}))
	replica.Kill()
	cr := mustFailCart(t, stock.ErrNotReplicated, "no replica left to acknowledge the grouped cart")(
		r.DeductMany(ctx, stock.Cart{ID: "c2", Lines: lines}))
	require.Len(t, cr.Items, 2, "the receipts of the write that was made")
	cr = mustFailCart(t, stock.ErrNotReplicated, "a replay is no safer than the cart it replays, which no replica has")(
		r.DeductMany(ctx, stock.Cart{ID: "c2", Lines: lines}))
	assert.True(t, cr.Replayed)
	require.Len(t, cr.Items, 2)
}

func ExampleReserver_DeductMany_retry() {
	r, _, done := exampleReserver()
	defer done()
	for _, sku := range []string{"shirt", "cap"} {
		_ = r.Load(ctx, sku, 10)
	}
	cart := stock.Cart{ID: "order-7", User: "alice", Lines: []stock.Line{{SKU: "shirt", Qty: 1}, {SKU: "cap", Qty: 2}}}
	_, err := r.DeductMany(ctx, cart)
	fmt.Println("taken:", err == nil)
	// Another user's cart can never reach alice's order.
	_, err = r.DeductMany(ctx, stock.Cart{ID: "order-7", User: "mallory", Lines: cart.Lines})
	fmt.Println("mallory:", errors.Is(err, stock.ErrConflict))
	// A retry answers the cart's outcome, even after one of its lines was given back.
	_, _ = r.Restore(ctx, "cap", "order-7")
	rc, err := r.DeductMany(ctx, cart)
	fmt.Println("retry:", err, rc.Replayed)
	// Output:
	// taken: true
	// mallory: true
	// retry: <nil> true
}

// TestRestoreChecksBeforeWriting: a corrupt counter of the item makes Restore fail with an
// error and write nothing, not even the tombstone of an unknown id (Redis does not roll back a
// script that fails halfway).
func TestRestoreChecksBeforeWriting(t *testing.T) {
	eachReserver(t, []stock.Option{stock.WithSoldOutCache(0)}, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		require.NoError(t, r.Load(ctx, "A", 5))
		must(t)(r.Hold(ctx, stock.Request{SKU: "A", ID: "h1", User: "u", Qty: 2}, time.Minute))
		for _, field := range []string{"h", "s", "q"} {
			require.NoError(t, c.Do(ctx, c.B().Hset().Key("stock:{A}").FieldValue().FieldValue(field, "x").Build()).Error())
			require.Error(t, testkit.Err(r.Restore(ctx, "A", "h1")), "corrupt %s", field)
			require.Error(t, testkit.Err(r.Restore(ctx, "A", "unknown")), "corrupt %s", field)
			_, err := r.Ledger(ctx, "A", "unknown")
			require.ErrorIs(t, err, stock.ErrUnknownID, "no tombstone written with %s corrupt", field)
			assertState(t, r, "A", "h1", stock.StateHeld, "the hold untouched with %s corrupt", field)
			require.NoError(t, c.Do(ctx, c.B().Hdel().Key("stock:{A}").Field(field).Build()).Error())
		}
		require.NoError(t, c.Do(ctx, c.B().Hset().Key("stock:{A}:u").FieldValue().FieldValue("u", "x").Build()).Error())
		require.Error(t, testkit.Err(r.Restore(ctx, "A", "h1")), "corrupt user count")
		a, err := c.Do(ctx, c.B().Hget().Key("stock:{A}").Field("a").Build()).AsInt64()
		require.NoError(t, err)
		assert.Equal(t, int64(3), a, "available untouched")
	})
}

// TestDeductCorruptUserUnits: a corrupt count of a buyer's units (anything but what the package
// writes: a decimal integer that a double holds exactly) fails a new id's deduct with an error
// before anything is written, and leaves the replay of an id the ledger has (which reads no
// units) answering as before, with or without a limit.
func TestDeductCorruptUserUnits(t *testing.T) {
	corrupt := []string{"x", "0x10", " 5", "1e2", "1.5", "9223372036854775807", "12345678901234567"}
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		for _, limit := range []int64{0, 3} {
			for i, bad := range corrupt {
				sku := fmt.Sprint("cu", limit, "-", i)
				r := newReserver(t, c, stock.WithSoldOutCache(0), stock.WithUserLimit(limit), stock.WithCoalescing(0))
				require.NoError(t, r.Load(ctx, sku, 5))
				must(t)(r.Deduct(ctx, stock.Request{SKU: sku, ID: "o1", User: "u", Qty: 1}))
				units := "stock:{" + sku + "}:u"
				require.NoError(t, c.Do(ctx, c.B().Hset().Key(units).FieldValue().FieldValue("u", bad).Build()).Error())
				rc := must(t, "limit %d, units %q: a replay reads no units", limit, bad)(r.Deduct(ctx, stock.Request{SKU: sku, ID: "o1", User: "u", Qty: 1}))
				assert.True(t, rc.Replayed)
				assert.Equal(t, int64(4), rc.Remaining)
				_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: "o2", User: "u", Qty: 1})
				require.Error(t, err, "limit %d, units %q", limit, bad)
				assert.Contains(t, err.Error(), "units of user u", "limit %d, units %q", limit, bad)
				require.ErrorIs(t, testkit.Err(r.Ledger(ctx, sku, "o2")), stock.ErrUnknownID, "limit %d, units %q: nothing written", limit, bad)
				assert.Equal(t, int64(4), levels(t, r, sku).Available, "limit %d, units %q", limit, bad)
				got, err := c.Do(ctx, c.B().Hget().Key(units).Field("u").Build()).ToString()
				require.NoError(t, err)
				assert.Equal(t, bad, got, "limit %d: the corrupt units are left as they were", limit)
			}
		}
	})
}

// TestCartCopiesOneNotReplayed: of many concurrent copies of one cart id with enough stock,
// exactly one answers Replayed false (the copy that completed the cart), as for Deduct, and all
// answer the same receipts' quantities.
func TestCartCopiesOneNotReplayed(t *testing.T) {
	cartModes(t, func(t *testing.T, r *stock.Reserver) {
		loadItems(t, r, map[string]int64{"A": 1000, "B": 1000, "C": 1000})
		for round := range 5 {
			cart := stock.Cart{ID: fmt.Sprint("c", round), User: "u", Lines: []stock.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 2}, {SKU: "C", Qty: 3}}}
			const copies = 64
			var wg sync.WaitGroup
			var mu sync.Mutex
			fresh := 0
			for range copies {
				wg.Go(func() {
					rc, err := r.DeductMany(ctx, cart)
					assert.NoError(t, err)
					mu.Lock()
					defer mu.Unlock()
					if !rc.Replayed {
						fresh++
					}
				})
			}
			wg.Wait()
			assert.Equal(t, 1, fresh, "round %d: copies answering not replayed", round)
		}
		assert.Equal(t, int64(5), levels(t, r, "A").Sold)
	})
}
