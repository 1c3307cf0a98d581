package stock

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock/internal/redistest"
)

// fixedStore is a Store that has applied nothing and holds n units of every item.
type fixedStore struct{ n int64 }

func (s fixedStore) Apply(context.Context, Event) error               { return nil }
func (s fixedStore) Remaining(context.Context, string) (int64, error) { return s.n, nil }
func (s fixedStore) Records(context.Context, string, []string) (map[string]Record, error) {
	return map[string]Record{}, nil
}

// TestReconcileTakesBackItsOwnLease: a lease left by one of this Reconciler's own passes (a
// Redis restart kept it in the AOF, a failover copied it to the new primary) does not hold the
// item until it expires; another Reconciler's lease does.
func TestReconcileTakesBackItsOwnLease(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := b.Client(t)
			r, err := New(c)
			require.NoError(t, err)
			require.NoError(t, r.Load(ctx, "A", 5))
			rc, err := r.newReconciler(fixedStore{5}, nil)
			require.NoError(t, err)
			other, err := r.newReconciler(fixedStore{5}, nil)
			require.NoError(t, err)
			lease := r.item("A").Lease

			require.NoError(t, c.Do(ctx, c.B().Set().Key(lease).Value(rc.token).Px(time.Minute).Build()).Error())
			rp, err := rc.Item(ctx, "A")
			require.NoError(t, err)
			assert.False(t, rp.Busy, "its own lease left behind: taken over")
			n, err := c.Do(ctx, c.B().Exists().Key(lease).Build()).AsInt64()
			require.NoError(t, err)
			assert.Zero(t, n, "and released after the pass")

			require.NoError(t, c.Do(ctx, c.B().Set().Key(lease).Value(other.token).Px(time.Minute).Build()).Error())
			rp, err = rc.Item(ctx, "A")
			require.NoError(t, err)
			assert.True(t, rp.Busy, "another reconciler's lease holds the item")
			owner, err := c.Do(ctx, c.B().Get().Key(lease).Build()).ToString()
			require.NoError(t, err)
			assert.Equal(t, other.token, owner, "and is left alone")
		})
	}
}
