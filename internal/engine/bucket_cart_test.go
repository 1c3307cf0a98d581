package engine

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock/internal/protocol"
	"github.com/stockres/stock/internal/redistest"
)

// Carts (DeductMany, HoldMany, ConfirmMany, CancelMany) with lines of an item split over
// buckets. In these tests the items whose name starts with "s" are split over 3 buckets; the
// others are plain. In SKU order: "a" < "p" < "s" < "z".

const cartBuckets = 3

// cartReserver returns a Reserver on c that splits the items named "s..." over cartBuckets,
// with the items of load loaded with their quantities.
func cartReserver(t *testing.T, c rueidis.Client, load map[string]int64, opts ...Option) *Reserver {
	t.Helper()
	opts = append(opts, WithBuckets(func(sku string) int {
		if sku[0] == 's' {
			return cartBuckets
		}
		return 1
	}))
	r, err := New(c, opts...)
	require.NoError(t, err)
	for sku, n := range load {
		require.NoError(t, r.Load(context.Background(), sku, n))
	}
	return r
}

// userWhere returns a user name whose bucket (of cartBuckets) is b when in, any other when not.
func userWhere(b int, in bool) string {
	for i := 0; ; i++ {
		u := "u" + strconv.Itoa(i)
		if (bucketOf(u, cartBuckets) == b) == in {
			return u
		}
	}
}

func requireCartError(t *testing.T, err error, sku string, want error) {
	t.Helper()
	var ce *CartError
	require.ErrorAs(t, err, &ce, "want a *CartError of %s", sku)
	assert.Equal(t, sku, ce.SKU, "the refusing item")
	assert.ErrorIs(t, err, want)
}

// TestBucketedCartAllOrNothing: a split line is taken in its buyer's bucket, gathering the
// other buckets' stock when its own is short; it refuses the cart only when the item as a
// whole cannot serve it; the refusal of any line gives every other line back; a cart's outcome
// is decided once, and every retry answers it.
func TestBucketedCartAllOrNothing(t *testing.T) {
	eachClient(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := cartReserver(t, c, map[string]int64{"s": 3, "p": 10, "a": 1}) // s: one unit per bucket

		// Three units, one in each bucket: the line gathers them in its buyer's bucket.
		rc, err := r.DeductMany(ctx, Cart{ID: "c1", User: "ann", Lines: []Line{{SKU: "s", Qty: 3}, {SKU: "p", Qty: 1}}})
		require.NoError(t, err)
		require.Len(t, rc.Items, 2)
		assert.False(t, rc.Replayed)
		assert.Equal(t, "s", rc.Items[1].SKU)
		assert.Equal(t, int64(3), rc.Items[1].Qty)
		assert.Equal(t, Levels{Sold: 3, Loaded: 3}, bucketLevels(t, r, "s"))
		assert.Equal(t, Levels{Available: 9, Sold: 1, Loaded: 10}, bucketLevels(t, r, "p"))
		e, err := r.Ledger(ctx, "s", "c1")
		require.NoError(t, err)
		assert.Equal(t, Entry{ID: "c1", SKU: "s", User: "ann", Kind: KindDeduct, State: StateReserved, Qty: 3}, Entry{ID: e.ID, SKU: e.SKU, User: e.User, Kind: e.Kind, State: e.State, Qty: e.Qty})

		// The split line refuses: the plain line taken before it is given back.
		_, err = r.DeductMany(ctx, Cart{ID: "c2", User: "bob", Lines: []Line{{SKU: "p", Qty: 1}, {SKU: "s", Qty: 1}}})
		requireCartError(t, err, "s", ErrSoldOut)
		assert.Equal(t, Levels{Available: 9, Sold: 1, Loaded: 10}, bucketLevels(t, r, "p"))
		e, err = r.Ledger(ctx, "p", "c2")
		require.NoError(t, err)
		assert.Equal(t, StateRestored, e.State)

		// A plain line refuses after nothing was taken of the split one: the split line gets a
		// tombstone, nothing else changes.
		_, err = r.Restock(ctx, "s", "r1", 2)
		require.NoError(t, err)
		_, err = r.DeductMany(ctx, Cart{ID: "c3", User: "cid", Lines: []Line{{SKU: "a", Qty: 2}, {SKU: "s", Qty: 1}}})
		requireCartError(t, err, "a", ErrInsufficient)
		e, err = r.Ledger(ctx, "s", "c3")
		require.NoError(t, err)
		assert.Equal(t, KindTombstone, e.Kind)
		assert.Equal(t, Levels{Available: 2, Sold: 3, Loaded: 5}, bucketLevels(t, r, "s"))

		// Retries: an undone cart answers its refusal even now that the stock is there, a done
		// cart its receipts, replayed; neither takes nor gives back anything.
		_, err = r.DeductMany(ctx, Cart{ID: "c2", User: "bob", Lines: []Line{{SKU: "p", Qty: 1}, {SKU: "s", Qty: 1}}})
		requireCartError(t, err, "s", ErrSoldOut)
		_, err = r.DeductMany(ctx, Cart{ID: "c3", User: "cid", Lines: []Line{{SKU: "a", Qty: 2}, {SKU: "s", Qty: 1}}})
		requireCartError(t, err, "a", ErrInsufficient)
		rc, err = r.DeductMany(ctx, Cart{ID: "c1", User: "ann", Lines: []Line{{SKU: "p", Qty: 1}, {SKU: "s", Qty: 3}}})
		require.NoError(t, err)
		assert.True(t, rc.Replayed)
		require.Len(t, rc.Items, 2)
		assert.Equal(t, "s", rc.Items[1].SKU)
		assert.Equal(t, int64(3), rc.Items[1].Qty)
		assert.True(t, rc.Items[1].Replayed)
		// The same cart id by another buyer: a conflict, nothing changed.
		_, err = r.DeductMany(ctx, Cart{ID: "c1", User: "eve", Lines: []Line{{SKU: "p", Qty: 1}, {SKU: "s", Qty: 3}}})
		assert.ErrorIs(t, err, ErrConflict)
		assert.Equal(t, Levels{Available: 2, Sold: 3, Loaded: 5}, bucketLevels(t, r, "s"))
		assert.Equal(t, Levels{Available: 9, Sold: 1, Loaded: 10}, bucketLevels(t, r, "p"))
		assert.Equal(t, Levels{Available: 1, Loaded: 1}, bucketLevels(t, r, "a"))
	})
}

// TestBucketedCartSlowCopyAfterUndo: a copy of a saga that is still running when another copy
// undid the cart cannot take a split line afterwards, whichever bucket its buyer goes to, and
// even when it routed the line before the undo.
func TestBucketedCartSlowCopyAfterUndo(t *testing.T) {
	eachClient(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := cartReserver(t, c, map[string]int64{"s": 9, "a": 0})
		for i, id := range []string{"k0", "k1", "k2", "k3", "k4", "k5"} {
			home := homeBucket(id, cartBuckets)
			user := userWhere(home, i%2 == 0) // the buyer's bucket: the id's home bucket, or another
			routedFirst := i >= 2
			cart := Cart{ID: id, User: user, Lines: []Line{{SKU: "a", Qty: 1}, {SKU: "s", Qty: 1}}}
			if i >= 4 {
				cart.User = "" // no buyer: the line goes to the id's home bucket
			}
			want := bucketOf(id, cartBuckets)
			if cart.User != "" {
				want = bucketOf(cart.User, cartBuckets)
			}
			if routedFirst {
				// The slow copy routed its line (claimed its bucket), then stalled.
				_, _, err := r.route(ctx, "s", id, cartBuckets, want, false)
				require.NoError(t, err)
			}
			_, err := r.DeductMany(ctx, cart)
			requireCartError(t, err, "a", ErrSoldOut)
			// The slow copy's take of the line, as the saga sends it.
			_, err = r.takeLine(ctx, protocol.TakeDeduct, Request{SKU: "s", ID: id, User: cart.User, Qty: 1}, 0)
			assert.ErrorIs(t, err, ErrRestored, "cart %s (buyer %q, routed first %v)", id, cart.User, routedFirst)
			_, err = r.takeLine(ctx, protocol.TakeHold, Request{SKU: "s", ID: id, User: cart.User, Qty: 1}, time.Minute.Milliseconds())
			assert.ErrorIs(t, err, ErrRestored)
			// Its end of the saga finds the cart undone and answers its refusal.
			code, _, err := r.cartOp(ctx, "done", id, "")
			require.NoError(t, err)
			assert.Equal(t, protocol.Restored, code)
			assert.Equal(t, Levels{Available: 9, Loaded: 9}, bucketLevels(t, r, "s"), "cart %s", id)
		}
	})
}

// TestBucketedCartRecovery: a saga with a split line whose process died is finished by a
// retry, or undone by cart recovery (in the bucket the line was taken in), after which a retry
// is refused and a slow copy cannot take the line.
func TestBucketedCartRecovery(t *testing.T) {
	eachClient(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := cartReserver(t, c, map[string]int64{"p": 10, "s": 10})
		crash := func(id string, takeSplit bool) Cart {
			c := Cart{ID: id, User: "ann", Lines: []Line{{SKU: "p", Qty: 1}, {SKU: "s", Qty: 2}}}
			lines, err := sumLines(c)
			require.NoError(t, err)
			_, _, err = r.cartOp(ctx, "begin", c.ID, encodeCart("D", c.User, lines))
			require.NoError(t, err)
			_, err = r.takeLine(ctx, "D", Request{SKU: "p", ID: id, User: c.User, Qty: 1}, 0)
			require.NoError(t, err)
			if takeSplit {
				_, err = r.takeLine(ctx, "D", Request{SKU: "s", ID: id, User: c.User, Qty: 2}, 0)
				require.NoError(t, err)
			}
			return c // the process "dies" here
		}
		rc, err := r.DeductMany(ctx, crash("c1", false)) // a retry finishes the cart
		require.NoError(t, err)
		require.Len(t, rc.Items, 2)
		assert.True(t, rc.Items[0].Replayed)
		assert.False(t, rc.Items[1].Replayed)
		assert.Equal(t, Levels{Available: 8, Sold: 2, Loaded: 10}, bucketLevels(t, r, "s"))

		c2, c3 := crash("c2", true), crash("c3", false)
		assert.Equal(t, Levels{Available: 6, Sold: 4, Loaded: 10}, bucketLevels(t, r, "s"))
		n, err := r.recoverCarts(ctx, -time.Second)
		require.NoError(t, err)
		assert.Equal(t, 2, n)
		assert.Equal(t, Levels{Available: 8, Sold: 2, Loaded: 10}, bucketLevels(t, r, "s"), "c2's line given back")
		assert.Equal(t, Levels{Available: 9, Sold: 1, Loaded: 10}, bucketLevels(t, r, "p"))
		for _, c := range []Cart{c2, c3} {
			_, err = r.DeductMany(ctx, c)
			assert.ErrorIs(t, err, ErrRestored)
			_, err = r.takeLine(ctx, "D", Request{SKU: "s", ID: c.ID, User: c.User, Qty: 2}, 0)
			assert.ErrorIs(t, err, ErrRestored, "a slow copy of %s", c.ID)
		}
		assert.Equal(t, Levels{Available: 8, Sold: 2, Loaded: 10}, bucketLevels(t, r, "s"))
		n, err = r.recoverCarts(ctx, -time.Second)
		require.NoError(t, err)
		assert.Zero(t, n)
	})
}

// TestBucketedHoldManyConfirmCancel: carts of holds with a split line, confirmed and cancelled
// whole; retries answer the holds' state.
func TestBucketedHoldManyConfirmCancel(t *testing.T) {
	eachClient(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := cartReserver(t, c, map[string]int64{"p": 4, "s": 4, "z": 4})

		h1 := Cart{ID: "h1", User: "ann", Lines: []Line{{SKU: "p", Qty: 1}, {SKU: "s", Qty: 2}}}
		_, err := r.HoldMany(ctx, h1, time.Minute)
		require.NoError(t, err)
		assert.Equal(t, Levels{Available: 2, Held: 2, Loaded: 4}, bucketLevels(t, r, "s"))
		rcs, err := r.ConfirmMany(ctx, "h1", "s", "p")
		require.NoError(t, err)
		assert.Len(t, rcs, 2)
		assert.Equal(t, Levels{Available: 2, Sold: 2, Loaded: 4}, bucketLevels(t, r, "s"))
		rc, err := r.HoldMany(ctx, h1, time.Minute) // the retry of a confirmed cart: its receipts
		require.NoError(t, err)
		assert.True(t, rc.Replayed)

		// A cancelled split line: a retry answers ErrRestored for it and gives nothing back.
		h2 := Cart{ID: "h2", User: "bob", Lines: []Line{{SKU: "p", Qty: 1}, {SKU: "s", Qty: 1}}}
		_, err = r.HoldMany(ctx, h2, time.Minute)
		require.NoError(t, err)
		_, err = r.Cancel(ctx, "s", "h2")
		require.NoError(t, err)
		_, err = r.HoldMany(ctx, h2, time.Minute)
		requireCartError(t, err, "s", ErrRestored)
		assert.Equal(t, Levels{Available: 2, Held: 1, Sold: 1, Loaded: 4}, bucketLevels(t, r, "p"))
		_, err = r.CancelMany(ctx, "h2", "p", "s")
		require.NoError(t, err)
		assert.Equal(t, Levels{Available: 3, Sold: 1, Loaded: 4}, bucketLevels(t, r, "p"))
		assert.Equal(t, Levels{Available: 2, Sold: 2, Loaded: 4}, bucketLevels(t, r, "s"))

		// An expired split line: ConfirmMany cancels the rest and answers ErrExpired, as does a
		// retry of the cart.
		h3 := Cart{ID: "h3", User: "cid", Lines: []Line{{SKU: "s", Qty: 1}, {SKU: "z", Qty: 1}}}
		// Its holds live long enough for the Extend to reach z first on a loaded machine.
		_, err = r.HoldMany(ctx, h3, 500*time.Millisecond)
		require.NoError(t, err)
		_, err = r.Extend(ctx, "z", "h3", time.Hour)
		require.NoError(t, err)
		redistest.Sleep(c, 800*time.Millisecond)
		_, err = r.HoldMany(ctx, h3, time.Minute)
		requireCartError(t, err, "s", ErrExpired)
		_, err = r.ConfirmMany(ctx, "h3", "s", "z")
		requireCartError(t, err, "s", ErrExpired)
		_, err = r.ConfirmMany(ctx, "h3", "s", "z")
		assert.ErrorIs(t, err, ErrExpired)
		assert.Equal(t, Levels{Available: 2, Sold: 2, Loaded: 4}, bucketLevels(t, r, "s"))
		assert.Equal(t, Levels{Available: 4, Loaded: 4}, bucketLevels(t, r, "z"))

		// A cart of holds refused by its split line gives the others back.
		_, err = r.HoldMany(ctx, Cart{ID: "h4", Lines: []Line{{SKU: "p", Qty: 1}, {SKU: "s", Qty: 3}}}, time.Minute)
		requireCartError(t, err, "s", ErrInsufficient)
		assert.Equal(t, Levels{Available: 3, Sold: 1, Loaded: 4}, bucketLevels(t, r, "p"))
		e, err := r.Ledger(ctx, "p", "h4")
		require.NoError(t, err)
		assert.Equal(t, StateCancelled, e.State)
	})
}

// TestBucketedCartNeverOneScript: a split item is in no group, whatever WithGroups says of it,
// so a cart with a split line is a saga (the one script knows no buckets).
func TestBucketedCartNeverOneScript(t *testing.T) {
	eachClient(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := cartReserver(t, c, map[string]int64{"p": 3, "s": 3}, WithGroups(func(string) string { return "g" }))
		rc, err := r.DeductMany(ctx, Cart{ID: "g1", Lines: []Line{{SKU: "p", Qty: 1}, {SKU: "s", Qty: 2}}})
		require.NoError(t, err)
		assert.Len(t, rc.Items, 2)
		assert.Equal(t, Levels{Available: 1, Sold: 2, Loaded: 3}, bucketLevels(t, r, "s"))
		ok, err := r.client.Do(ctx, r.client.B().Hexists().Key(r.cartKeys()[0]).Field("g1").Build()).AsBool()
		require.NoError(t, err)
		assert.True(t, ok, "the cart log records the cart: a saga")
		_, err = r.DeductMany(ctx, Cart{ID: "g2", Lines: []Line{{SKU: "p", Qty: 1}, {SKU: "s", Qty: 2}}})
		requireCartError(t, err, "s", ErrInsufficient)
		assert.Equal(t, Levels{Available: 2, Sold: 1, Loaded: 3}, bucketLevels(t, r, "p"))
	})
}

// TestBucketedCartsConcurrent: N carts, each with a plain line and a line of a split item of S
// units, each sent by two concurrent copies, by buyers of all buckets but one: exactly S carts
// are taken, the copies of a cart
// agree (of a taken cart's copies exactly one is not Replayed), and the ledgers and Levels of
// both items agree with the answers.
func TestBucketedCartsConcurrent(t *testing.T) {
	eachClient(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		const S, N = 12, 30
		r := cartReserver(t, c, map[string]int64{"s": S, "p": 1000})
		type answer struct {
			rc  CartReceipt
			err error
		}
		// No buyer goes to the last bucket: its units serve the others' buyers only when the
		// split line gathers them.
		var users []string
		for i := 0; len(users) < N; i++ {
			if u := "b" + strconv.Itoa(i); bucketOf(u, cartBuckets) != cartBuckets-1 {
				users = append(users, u)
			}
		}
		answers := make([][2]answer, N)
		var wg sync.WaitGroup
		for i := range N {
			cart := Cart{ID: "c" + strconv.Itoa(i), User: users[i], Lines: []Line{{SKU: "p", Qty: 1}, {SKU: "s", Qty: 1}}}
			for k := range 2 {
				wg.Go(func() {
					rc, err := r.DeductMany(ctx, cart)
					answers[i][k] = answer{rc, err}
				})
			}
		}
		wg.Wait()
		taken := 0
		for i, a := range answers {
			id := "c" + strconv.Itoa(i)
			if a[0].err == nil || a[1].err == nil {
				require.NoError(t, a[0].err, "cart %s: the copies agree", id)
				require.NoError(t, a[1].err, "cart %s: the copies agree", id)
				assert.True(t, a[0].rc.Replayed != a[1].rc.Replayed, "cart %s: exactly one copy not replayed", id)
				taken++
			} else {
				requireCartError(t, a[0].err, "s", ErrSoldOut)
				requireCartError(t, a[1].err, "s", ErrSoldOut)
			}
			for _, sku := range []string{"p", "s"} {
				e, err := r.Ledger(ctx, sku, id)
				require.NoError(t, err)
				assert.Equal(t, a[0].err == nil, e.Taken(), "cart %s: ledger of %s %+v", id, sku, e)
			}
		}
		assert.Equal(t, S, taken)
		assert.Equal(t, Levels{Sold: S, Loaded: S}, bucketLevels(t, r, "s"))
		assert.Equal(t, Levels{Available: 1000 - S, Sold: S, Loaded: 1000}, bucketLevels(t, r, "p"))
		_, err := r.DeductMany(ctx, Cart{ID: "late", Lines: []Line{{SKU: "s", Qty: 1}}})
		requireCartError(t, err, "s", ErrSoldOut)
		var none []error
		for i := range N {
			for k := range 2 {
				if err := answers[i][k].err; err != nil && !errors.Is(err, ErrSoldOut) {
					none = append(none, err)
				}
			}
		}
		assert.Empty(t, none)
	})
}

// TestCartSagaCrash: a saga that died between lines is finished by a retry, or undone by
// RecoverCarts, after which a retry is refused.
func TestCartSagaCrash(t *testing.T) {
	eachReserver(t, func(t *testing.T, r *Reserver) {
		ctx := context.Background()
		for _, sku := range []string{"A", "B"} {
			require.NoError(t, r.Load(ctx, sku, 5))
		}
		crash := func(id string) Cart {
			c := Cart{ID: id, Lines: []Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 2}}}
			lines, err := sumLines(c)
			require.NoError(t, err)
			// The saga's first steps, then the process "dies".
			_, _, err = r.cartOp(ctx, "begin", c.ID, encodeCart("D", "", lines))
			require.NoError(t, err)
			_, err = r.take(ctx, "D", Request{SKU: "A", ID: id, Qty: 1}, 0)
			require.NoError(t, err)
			return c
		}
		c1 := crash("c1")
		rc, err := r.DeductMany(ctx, c1) // the retry finishes the same cart
		require.NoError(t, err)
		assert.True(t, rc.Items[0].Replayed)
		assert.False(t, rc.Items[1].Replayed)

		c2 := crash("c2")
		n, err := r.recoverCarts(ctx, time.Hour)
		require.NoError(t, err)
		assert.Zero(t, n, "too young to recover")
		n, err = r.recoverCarts(ctx, -time.Second)
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		_, err = r.DeductMany(ctx, c2)
		assert.ErrorIs(t, err, ErrRestored)
		la, err := r.Levels(ctx, "A")
		require.NoError(t, err)
		lb, err := r.Levels(ctx, "B")
		require.NoError(t, err)
		assert.Equal(t, Levels{Available: 4, Sold: 1, Loaded: 5}, la, "only c1")
		assert.Equal(t, Levels{Available: 3, Sold: 2, Loaded: 5}, lb)
		n, err = r.recoverCarts(ctx, -time.Second)
		require.NoError(t, err)
		assert.Zero(t, n, "nothing left pending")
	})
}
