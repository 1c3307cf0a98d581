package engine

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock/internal/protocol"
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
	eachReserver(t, func(t *testing.T, r *Reserver) {
		ctx, c := context.Background(), r.client
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

// TestTrimCountsRetentionFromSettling: the trim script judges each candidate by itself, whatever
// the pass that chose it read before (an entry can settle between the pass's read and its trim):
// an entry is removed only once it settled before the cutoff, counted from its last field when
// that is later than its time (a hold's deadline, the moment a sale was given back), and never
// while it is reserved or held.
func TestTrimCountsRetentionFromSettling(t *testing.T) {
	const cutoff = 3000 // ms since the epoch: the entries below are written by hand
	entries := []struct {
		id, entry string
		kept      bool
	}{
		{"sold-settled", "Da|2|8|1000|", false},
		{"restored-early", "Dx|2|8|1000|u", false},
		{"restored-late", "Dx|2|8|1000|u|5000", true}, // given back at 5000: settled after the cutoff
		{"hold-cancelled", "Hc|2|8|1000||5000", true}, // a hold settles at its deadline at the latest
		{"hold-expired", "He|2|8|1000||2000", false},
		{"tombstone", "Tx|0|0|1000|", false},
		{"reserved", "Dr|2|8|1000|", true}, // not settled: its sale is not in the store yet
		{"held", "Hh|2|8|1000||2000", true},
	}
	eachReserver(t, func(t *testing.T, r *Reserver) {
		ctx, c := context.Background(), r.client
		k := r.item("A")
		args := []string{strconv.Itoa(cutoff)}
		want := 0
		for _, e := range entries {
			require.NoError(t, c.Do(ctx, c.B().Hset().Key(k.Ledger).FieldValue().FieldValue(e.id, e.entry).Build()).Error())
			args = append(args, e.id)
			if !e.kept {
				want++
			}
		}
		n, err := protocol.Trim.Exec(ctx, c, k.ForTrim(), args).AsInt64()
		require.NoError(t, err)
		assert.Equal(t, int64(want), n, "entries removed")
		for _, e := range entries {
			got, err := c.Do(ctx, c.B().Hexists().Key(k.Ledger).Field(e.id).Build()).AsBool()
			require.NoError(t, err)
			assert.Equal(t, e.kept, got, "%s (%s) kept", e.id, e.entry)
		}
	})
}
