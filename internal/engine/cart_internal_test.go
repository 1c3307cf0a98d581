package engine

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock/internal/redistest"
)

// TestCartSagaCrash: a saga that died between lines is finished by a retry, or undone by
// RecoverCarts, after which a retry is refused.
func TestCartSagaCrash(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			r, err := New(b.Client(t))
			require.NoError(t, err)
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
}
