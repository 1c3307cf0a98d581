package stock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
)

// conflictSays asserts that err is ErrConflict and that its message says each of says, and
// none of not.
func conflictSays(t *testing.T, err error, says []string, not ...string) {
	t.Helper()
	require.ErrorIs(t, err, stock.ErrConflict)
	for _, s := range says {
		assert.Contains(t, err.Error(), s)
	}
	for _, s := range not {
		assert.NotContains(t, err.Error(), s)
	}
}

// TestConflictSaysWhatDiffers: a request id reused with other parameters is ErrConflict whose
// message names what differs from the id's first use (the kind, the quantity, the user, for a
// cart its lines), never a field that is the same, on plain and split items and for carts.
func TestConflictSaysWhatDiffers(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c, stock.WithBuckets(func(sku string) int {
			if strings.HasPrefix(sku, "S") {
				return 3
			}
			return 0
		}), stock.WithGroups(func(sku string) string {
			if strings.HasPrefix(sku, "G") {
				return "g"
			}
			return ""
		}))
		for _, sku := range []string{"A", "B", "S", "G1", "G2"} {
			require.NoError(t, r.Load(ctx, sku, 100))
		}
		deduct := func(sku, id, user string, qty int64) error {
			_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: user, Qty: qty})
			return err
		}
		hold := func(sku, id, user string, qty int64) error {
			_, err := r.Hold(ctx, stock.Request{SKU: sku, ID: id, User: user, Qty: qty}, time.Minute)
			return err
		}
		for _, sku := range []string{"A", "S"} {
			t.Run(sku, func(t *testing.T) {
				require.NoError(t, deduct(sku, "d1", "u1", 1))
				conflictSays(t, deduct(sku, "d1", "u2", 1), []string{sku + "/d1 was used by another user"}, "units", "quantity", "u1")
				conflictSays(t, deduct(sku, "d1", "u1", 3), []string{"with quantity 1, not 3"}, "user")
				conflictSays(t, deduct(sku, "d1", "", 1), []string{"by a user, not without one"}, "units")
				conflictSays(t, hold(sku, "d1", "u1", 1), []string{"was used for a deduct, not a hold"}, "units", "user")
				conflictSays(t, hold(sku, "d1", "u1", 2), []string{"was used for a deduct, not a hold; with quantity 1, not 2"}, "user")

				require.NoError(t, hold(sku, "h1", "u1", 2))
				conflictSays(t, deduct(sku, "h1", "u1", 2), []string{"was used for a hold, not a deduct"}, "units", "user")

				require.NoError(t, deduct(sku, "d2", "", 1))
				conflictSays(t, deduct(sku, "d2", "u3", 1), []string{"was used without a user, not by u3"}, "units")

				_, err := r.Confirm(ctx, sku, "d1")
				conflictSays(t, err, []string{"was used for a deduct, not a hold"}, "units")
				_, err = r.Extend(ctx, sku, "d1", time.Minute)
				conflictSays(t, err, []string{"was used for a deduct, not a hold"}, "units")
				_, err = r.Cancel(ctx, sku, "d1")
				conflictSays(t, err, []string{"was used for a deduct, not a hold"}, "units")

				must(t)(r.Restock(ctx, sku, "r1", 5))
				conflictSays(t, deduct(sku, "r1", "u1", 5), []string{"was used for a restock, not a deduct"}, "units")
				_, err = r.Restock(ctx, sku, "r1", 6)
				conflictSays(t, err, []string{"with quantity 5, not 6"}, "restock, not")
				_, err = r.Restock(ctx, sku, "d1", 1)
				conflictSays(t, err, []string{"was used for a deduct, not a restock"}, "units")
				if sku == "A" { // a split item's restock goes to a bucket the restore does not look in
					_, err = r.Restore(ctx, sku, "r1")
					conflictSays(t, err, []string{"was used for a restock, which cannot be given back"})
				}
			})
		}

		t.Run("saga cart", func(t *testing.T) {
			lines := []stock.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 1}}
			mustCart(t)(r.DeductMany(ctx, stock.Cart{ID: "c1", User: "u1", Lines: lines}))
			_, err := r.DeductMany(ctx, stock.Cart{ID: "c1", User: "u2", Lines: lines})
			conflictSays(t, err, []string{"cart c1 was used by another user"}, "lines", "u1")
			_, err = r.HoldMany(ctx, stock.Cart{ID: "c1", User: "u1", Lines: lines}, time.Minute)
			conflictSays(t, err, []string{"cart c1 was used for a deduct cart, not a hold cart"}, "user", "lines")
			_, err = r.DeductMany(ctx, stock.Cart{ID: "c1", User: "u1", Lines: []stock.Line{{SKU: "A", Qty: 2}}})
			conflictSays(t, err, []string{"with other lines (item A: quantity 1, not 2; item B in it too)"}, "user")
		})
		t.Run("one-slot cart", func(t *testing.T) {
			lines := []stock.Line{{SKU: "G1", Qty: 1}, {SKU: "G2", Qty: 1}}
			mustCart(t)(r.DeductMany(ctx, stock.Cart{ID: "c2", User: "u1", Lines: lines}))
			_, err := r.DeductMany(ctx, stock.Cart{ID: "c2", User: "u2", Lines: lines})
			conflictSays(t, err, []string{"G1/c2 was used by another user"}, "units")
			var ce *stock.CartError
			assert.ErrorAs(t, err, &ce)
		})
		l, _ := checkLedger(t, r, "A", 100)
		assert.Equal(t, int64(105), l.Loaded, "the conflicts changed nothing: only the restock added")
	})
}
