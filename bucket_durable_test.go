package stock_test

import (
	"context"
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

// TestBucketedDurablePath: an item split over three buckets, with a Store: the relay hands the
// Store one item (each bucket's events in order), a refusal of the Store is given back in the
// right bucket, and a reconcile pass compares the buckets as a whole with the Store and mends a
// drift in them.
func TestBucketedDurablePath(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c, stock.WithUserLimit(3), stock.WithBuckets(func(string) int { return 3 }))
		store := memstore.New()
		require.NoError(t, store.Load(ctx, "b:~x", 29)) // one unit less than Redis
		require.NoError(t, r.Load(ctx, "b:~x", 30))

		var ids []string
		for i := range 30 {
			id := "o" + strconv.Itoa(i)
			_, err := r.Deduct(ctx, stock.Request{SKU: "b:~x", ID: id, User: "u" + strconv.Itoa(i%7), Qty: 1})
			if err == nil {
				ids = append(ids, id)
			}
		}
		require.Len(t, ids, 21, "7 buyers, 3 units each")
		for _, id := range ids[:4] {
			must(t)(r.Restore(ctx, "b:~x", id))
		}
		must(t)(r.Hold(ctx, stock.Request{SKU: "b:~x", ID: "h1", User: "w", Qty: 2}, time.Minute))
		must(t)(r.Confirm(ctx, "b:~x", "h1"))
		must(t)(r.Restock(ctx, "b:~x", "r1", 5))

		rl := newRelay(t, r, store, nil, nil)
		drain(t, rl)
		_, err := store.Remaining(ctx, "b:~x|0")
		assert.ErrorIs(t, err, stock.ErrNotLoaded, "the store sees the item, not its buckets")
		assert.LessOrEqual(t, store.MaxApplications(), 1)

		// Loaded with one unit more in Redis than in the store: a pass finds it and takes it
		// from the buckets.
		l := levels(t, r, "b:~x")
		rem := remaining(t, store, "b:~x")
		assert.Equal(t, rem+1, l.Available+l.Held, "%+v, store %d", l, rem)
		rc := newReconciler(t, r, store, nil)
		res, err := rc.Once(ctx)
		require.NoError(t, err)
		require.Len(t, res, 1, "one report: the item, not its buckets")
		assert.Equal(t, "b:~x", res[0].SKU)
		assert.Equal(t, int64(1), res[0].Drift, "%v", res[0])
		assert.Equal(t, int64(-1), res[0].Adjusted)
		assert.Empty(t, res[0].NeedsHuman)
		l = levels(t, r, "b:~x")
		assert.Equal(t, rem, l.Available+l.Held, "Redis and the store agree: %+v, store %d", l, rem)
		res, err = rc.Once(ctx)
		require.NoError(t, err)
		assert.Zero(t, res[0].Drift, "%v", res[0])

		// A drift (the store says 3 more units): a pass mends it in the buckets.
		store.Set("b:~x", rem+3)
		res, err = rc.Once(ctx)
		require.NoError(t, err)
		assert.Equal(t, int64(-3), res[0].Drift, "%v", res[0])
		assert.Equal(t, int64(3), res[0].Adjusted)
		l = levels(t, r, "b:~x")
		assert.Equal(t, rem+3, l.Available+l.Held)
		res, err = rc.Once(ctx)
		require.NoError(t, err)
		assert.Zero(t, res[0].Drift, "%v", res[0])
	})
}

// TestBucketedRefusalAndQueuePath: sales the store refuses go back to their buckets; on the
// queue path, Consume applies a bucketed item's events in any order, once, and settles them in
// their buckets.
func TestBucketedRefusalAndQueuePath(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c, stock.WithBuckets(func(string) int { return 3 }))

		// The store has 1 unit of the 3 Redis sells: two sales are refused and given back.
		store := memstore.New()
		require.NoError(t, store.Load(ctx, "rf", 1))
		require.NoError(t, r.Load(ctx, "rf", 3))
		for i := range 3 {
			must(t)(r.Deduct(ctx, stock.Request{SKU: "rf", ID: "o" + strconv.Itoa(i), User: "u" + strconv.Itoa(i), Qty: 1}))
		}
		rl := newRelay(t, r, store, nil, nil)
		assert.Equal(t, 2, drain(t, rl).Refused)
		assert.Equal(t, stock.Levels{Available: 2, Sold: 1, Loaded: 3}, levels(t, r, "rf"))
		refusals := 0
		for i := range 3 {
			e := entry(t, r, "rf", "o"+strconv.Itoa(i))
			if e.State == stock.StateRefused {
				refusals++
			}
		}
		assert.Equal(t, 2, refusals)

		// The queue path.
		var queue []stock.Event
		pub := stock.PublisherFunc(func(_ context.Context, ev stock.Event) error {
			queue = append(queue, ev)
			return nil
		})
		qstore := memstore.New()
		require.NoError(t, qstore.Load(ctx, "q", 12))
		require.NoError(t, r.Load(ctx, "q", 12))
		for i := range 9 {
			must(t)(r.Deduct(ctx, stock.Request{SKU: "q", ID: "o" + strconv.Itoa(i), User: "u" + strconv.Itoa(i), Qty: 1}))
		}
		for i := range 3 {
			must(t)(r.Restore(ctx, "q", "o"+strconv.Itoa(i)))
		}
		qrl := newRelay(t, r, nil, pub, nil)
		drain(t, qrl)
		require.Len(t, queue, 12)
		for _, ev := range queue {
			assert.Equal(t, "q", ev.SKU, "the queue sees the item, not its buckets")
		}
		for pass := range 2 { // every event twice, the second time in reverse order
			for j := range queue {
				ev := queue[j]
				if pass == 1 {
					ev = queue[len(queue)-1-j]
				}
				require.NoError(t, stock.Consume(ctx, r, qstore, ev))
			}
		}
		rem, err := qstore.Remaining(ctx, "q")
		require.NoError(t, err)
		assert.Equal(t, int64(6), rem)
		assert.LessOrEqual(t, qstore.MaxApplications(), 1)
		rc := newReconciler(t, r, qstore, &stock.ReconcileOptions{})
		rp, err := rc.Item(ctx, "q")
		require.NoError(t, err)
		assert.Zero(t, rp.Drift, "%v", rp)
		assert.Zero(t, rp.Published, "every published event settled: %v", rp)
		assert.Zero(t, rp.Pending, "%v", rp)
	})
}

// TestBucketedRelayItems: a relay limited to a split item (RelayOptions.Items) delivers the
// events of its buckets.
func TestBucketedRelayItems(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c, stock.WithBuckets(func(string) int { return 3 }))
		store := memstore.New()
		require.NoError(t, store.Load(ctx, "ri", 10))
		require.NoError(t, r.Load(ctx, "ri", 10))
		for i := range 6 {
			must(t)(r.Deduct(ctx, stock.Request{SKU: "ri", ID: "o" + strconv.Itoa(i), User: "u" + strconv.Itoa(i), Qty: 1}))
		}
		rl := newRelay(t, r, store, nil, &stock.RelayOptions{Items: []string{"ri"}})
		assert.Equal(t, 6, drain(t, rl).Delivered)
		rem := remaining(t, store, "ri")
		assert.Equal(t, int64(4), rem)
		p, _, err := stockops.Pending(ctx, r, "ri")
		require.NoError(t, err)
		assert.Zero(t, p)
	})
}
