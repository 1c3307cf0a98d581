package stock_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// listlessStore is a Store without the optional RecordLister: the reconciler has only the
// ledger entries' times to keep an entry for the retention.
type listlessStore struct{ s *memstore.Store }

func (n listlessStore) Apply(ctx context.Context, ev stock.Event) error { return n.s.Apply(ctx, ev) }
func (n listlessStore) Remaining(ctx context.Context, sku string) (int64, error) {
	return n.s.Remaining(ctx, sku)
}
func (n listlessStore) Records(ctx context.Context, sku string, ids []string) (map[string]stock.Record, error) {
	return n.s.Records(ctx, sku, ids)
}

// redisNow is the server's clock (TIME).
func redisNow(t *testing.T, c rueidis.Client) time.Time {
	t.Helper()
	vs, err := c.Do(context.Background(), c.B().Time().Build()).AsStrSlice()
	require.NoError(t, err)
	s, err1 := strconv.ParseInt(vs[0], 10, 64)
	us, err2 := strconv.ParseInt(vs[1], 10, 64)
	require.NoError(t, err1)
	require.NoError(t, err2)
	return time.Unix(s, us*1000)
}

// TestEntryTimesAreRedisTimeWhateverTheReserversClock: a deduct records Redis's time in its
// ledger entry whatever the clock of the Reserver that took it (hours behind, hours ahead, before
// 1970), so the id stays usable (a retry replays it, Restore and Ledger read it) and no reconcile
// pass trims it before the retention, even with a store that lists no records.
func TestEntryTimesAreRedisTimeWhateverTheReserversClock(t *testing.T) {
	clocks := map[string]func() time.Time{
		"25h behind":  func() time.Time { return time.Now().Add(-25 * time.Hour) },
		"25h ahead":   func() time.Time { return time.Now().Add(25 * time.Hour) },
		"before 1970": func() time.Time { return time.Time{} },
	}
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		for name, clock := range clocks {
			sku := "clock-" + fmt.Sprint(len(name), name[:2])
			skewed := newReserver(t, c, stock.WithClock(clock), stock.WithUserLimit(10))
			ops := newReserver(t, c)
			ms := memstore.New()
			require.NoError(t, ms.Load(ctx, sku, 10))
			require.NoError(t, ops.Load(ctx, sku, 10))
			for i := range 3 { // the first measures the clocks' difference, the others use it
				before := redisNow(t, c)
				must(t, name)(skewed.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprint("o", i), User: "u", Qty: 1}))
				after := redisNow(t, c)
				at := entry(t, skewed, sku, fmt.Sprint("o", i)).At
				assert.WithinRange(t, at, before.Add(-2*time.Second), after.Add(2*time.Second), "%s: entry o%d's time", name, i)
			}
			relay, err := stockops.NewRelay(ops, listlessStore{ms}, nil, nil)
			require.NoError(t, err)
			_, err = relay.Once(ctx)
			require.NoError(t, err)
			rec, err := stockops.NewReconciler(ops, listlessStore{ms}, nil) // the default retention
			require.NoError(t, err)
			rep, err := rec.Item(ctx, sku)
			require.NoError(t, err)
			assert.Zero(t, rep.Trimmed, "%s: entries trimmed within the retention", name)
			rc := must(t, name)(skewed.Deduct(ctx, stock.Request{SKU: sku, ID: "o0", User: "u", Qty: 1, Retry: true}))
			assert.True(t, rc.Replayed, "%s: a retry of a sold id", name)
			must(t, name)(skewed.Restore(ctx, sku, "o1"))
			assert.Equal(t, stock.StateRestored, entry(t, skewed, sku, "o1").State, name)
			lv := levels(t, ops, sku)
			assert.Equal(t, int64(2), lv.Sold, "%s: sold once each", name)
		}
	})
}
