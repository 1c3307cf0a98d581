package stock_test

import (
	"cmp"
	"context"
	"errors"
	"github.com/stockres/stock/internal/redistest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/memstore"
)

// fnvBucket is the bucket of n that a split item sends a user (or, without a user, a request id)
// to: FNV-1a of it, mod n (the library's routing, restated so that a test can pick its keys).
func fnvBucket(key string, n int) int {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return int(h % uint32(n))
}

// orderKeyIn returns the first of prefix0, prefix1, ... whose bucket of n is b.
func orderKeyIn(t *testing.T, prefix string, b, n int) string {
	t.Helper()
	for i := range 10000 {
		if k := prefix + strconv.Itoa(i); fnvBucket(k, n) == b {
			return k
		}
	}
	t.Fatalf("no key %s* in bucket %d of %d", prefix, b, n)
	return ""
}

// storeAgrees checks that the Store and Redis tell the same story of a split item after the
// relay delivered everything: what the Store has left is what Redis has available and held.
func storeAgrees(t *testing.T, r *stock.Reserver, store *memstore.Store, sku string) {
	t.Helper()
	l := levels(t, r, sku)
	rem := remaining(t, store, sku)
	assert.Equal(t, l.Available+l.Held, rem, "Redis %+v, store %d", l, rem)
}

// TestBucketedOrderRestockThenSale: a restock in one bucket whose units a transfer moves to
// another bucket, where they are sold: the Store gets the restock before the sales, whatever
// order the relay walks the buckets in, and refuses none of the acknowledged sales.
func TestBucketedOrderRestockThenSale(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		const n = 3
		r := newReserver(t, c, stock.WithBuckets(func(string) int { return n }))
		store := memstore.New()
		require.NoError(t, store.Load(ctx, "ord", 3))
		require.NoError(t, r.Load(ctx, "ord", 3))
		must(t)(r.Restock(ctx, "ord", orderKeyIn(t, "rs", 1, n), 5))
		buyer := orderKeyIn(t, "u", 0, n)
		for i := range 8 {
			must(t, "sale %d", i)(r.Deduct(ctx, stock.Request{SKU: "ord", ID: "o" + strconv.Itoa(i), User: buyer, Qty: 1}))
		}
		rl := newRelay(t, r, store, nil, nil)
		st := drain(t, rl)
		assert.Zero(t, st.Refused, "no acknowledged sale is refused: %+v", st)
		assert.Equal(t, stock.Levels{Sold: 8, Loaded: 8}, levels(t, r, "ord"))
		storeAgrees(t, r, store, "ord")
	})
}

// TestBucketedOrderRestoreThenSale: a sale restored in one bucket, whose unit a transfer moves
// to another bucket where it is sold again: the Store gets the restore first.
func TestBucketedOrderRestoreThenSale(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		const n = 3
		r := newReserver(t, c, stock.WithBuckets(func(string) int { return n }))
		store := memstore.New()
		require.NoError(t, store.Load(ctx, "rso", 6))
		require.NoError(t, r.Load(ctx, "rso", 6))
		rl := newRelay(t, r, store, nil, nil)
		// Everything sold in bucket 1 and delivered: the Store has nothing left.
		seller := orderKeyIn(t, "s", 1, n)
		for i := range 6 {
			must(t)(r.Deduct(ctx, stock.Request{SKU: "rso", ID: "a" + strconv.Itoa(i), User: seller, Qty: 1}))
		}
		drain(t, rl)
		// Four of them restored in bucket 1, then sold again to a buyer of bucket 0.
		for i := range 4 {
			must(t)(r.Restore(ctx, "rso", "a"+strconv.Itoa(i)))
		}
		buyer := orderKeyIn(t, "u", 0, n)
		for i := range 4 {
			must(t, "sale %d", i)(r.Deduct(ctx, stock.Request{SKU: "rso", ID: "b" + strconv.Itoa(i), User: buyer, Qty: 1}))
		}
		st := drain(t, rl)
		assert.Zero(t, st.Refused, "no acknowledged sale is refused: %+v", st)
		assert.Equal(t, stock.Levels{Sold: 6, Loaded: 6}, levels(t, r, "rso"))
		storeAgrees(t, r, store, "rso")
	})
}

// TestBucketedOrderBarrierWaits: while the donor's restock cannot reach the Store (it fails and
// backs off), the target's sales that may spend its units wait, neither refused nor applied;
// once the restock is delivered they follow.
func TestBucketedOrderBarrierWaits(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		const n = 3
		r := newReserver(t, c, stock.WithBuckets(func(string) int { return n }))
		store := memstore.New()
		require.NoError(t, store.Load(ctx, "bw", 3))
		require.NoError(t, r.Load(ctx, "bw", 3))
		must(t)(r.Restock(ctx, "bw", orderKeyIn(t, "rs", 1, n), 5))
		buyer := orderKeyIn(t, "u", 0, n)
		for i := range 8 {
			must(t, "sale %d", i)(r.Deduct(ctx, stock.Request{SKU: "bw", ID: "o" + strconv.Itoa(i), User: buyer, Qty: 1}))
		}
		down := errors.New("store down for restocks")
		store.FailWith(func(ev stock.Event) error {
			if ev.Type == stock.EventRestocked {
				return down
			}
			return nil
		})
		rl := newRelay(t, r, store, nil, &stock.RelayOptions{MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
		for range 3 {
			st, err := rl.Once(ctx)
			require.ErrorIs(t, err, down)
			assert.Zero(t, st.Refused, "%+v", st)
			redistest.Sleep(c, 5*time.Millisecond)
		}
		rem := remaining(t, store, "bw")
		applied := 0
		for i := range 8 {
			applied += store.Applications("bw", "o"+strconv.Itoa(i), stock.EventDeducted)
		}
		// Bucket 0 had one unit of its own and took one from bucket 2 before bucket 1's: the sales
		// before the transfer from bucket 1 may go, the others wait for the restock.
		assert.Equal(t, int64(3)-int64(applied), rem, "only sales not behind the barrier reached the store")
		assert.LessOrEqual(t, applied, 3)
		assert.Less(t, applied, 8, "the sales behind the barrier wait")

		store.FailWith(nil)
		redistest.Sleep(c, 5*time.Millisecond)
		st := drain(t, rl)
		assert.Zero(t, st.Refused, "%+v", st)
		storeAgrees(t, r, store, "bw")
		assert.Equal(t, int64(8), levels(t, r, "bw").Sold)
	})
}

// TestBucketedOrderConcurrent: buyers of every bucket buy, restore and restock at once while a
// relay delivers, so that transfers go every way between the buckets: the Store (which refuses
// a sale it is short for) refuses none, and ends where Redis does.
func TestBucketedOrderConcurrent(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		const n = 3
		r := newReserver(t, c, stock.WithBuckets(func(string) int { return n }))
		store := memstore.New()
		require.NoError(t, store.Load(ctx, "cc", 6))
		require.NoError(t, r.Load(ctx, "cc", 6))
		rl := newRelay(t, r, store, nil, &stock.RelayOptions{Batch: 4})

		var refused atomic.Int64
		stop := make(chan struct{})
		relayDone := make(chan struct{})
		go func() {
			defer close(relayDone)
			for {
				select {
				case <-stop:
					return
				default:
				}
				st, err := rl.Once(ctx)
				assert.NoError(t, err)
				refused.Add(int64(st.Refused))
			}
		}()
		var wg sync.WaitGroup
		for w := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				user := orderKeyIn(t, "w"+strconv.Itoa(w)+"-", w%n, n)
				var mine []string
				for i := range 40 {
					id := "w" + strconv.Itoa(w) + "-" + strconv.Itoa(i)
					switch i % 5 {
					case 0:
						_, err := r.Restock(ctx, "cc", id, int64(1+i%3))
						assert.NoError(t, err)
					case 3:
						if len(mine) > 0 {
							_, err := r.Restore(ctx, "cc", mine[0])
							assert.NoError(t, err)
							mine = mine[1:]
						}
					default:
						_, err := r.Deduct(ctx, stock.Request{SKU: "cc", ID: id, User: user, Qty: 1})
						if err == nil {
							mine = append(mine, id)
						} else {
							assert.ErrorIs(t, err, stock.ErrSoldOut)
						}
					}
				}
			}()
		}
		wg.Wait()
		close(stop)
		<-relayDone
		st := drain(t, rl)
		assert.Zero(t, refused.Load()+int64(st.Refused), "no acknowledged sale refused")
		storeAgrees(t, r, store, "cc")
	})
}

// TestBucketedOrderConsume: on the queue path, a consumer handed a bucket's sales before the
// restock of another bucket whose units they spend holds them back (ErrHeldBack) until the
// restock is applied: none is refused.
func TestBucketedOrderConsume(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		const n = 3
		r := newReserver(t, c, stock.WithBuckets(func(string) int { return n }))
		store := memstore.New()
		require.NoError(t, store.Load(ctx, "qo", 3))
		require.NoError(t, r.Load(ctx, "qo", 3))
		must(t)(r.Restock(ctx, "qo", orderKeyIn(t, "rs", 1, n), 5))
		buyer := orderKeyIn(t, "u", 0, n)
		for i := range 8 {
			must(t, "sale %d", i)(r.Deduct(ctx, stock.Request{SKU: "qo", ID: "o" + strconv.Itoa(i), User: buyer, Qty: 1}))
		}
		pub := newRecorder()
		rl := newRelay(t, r, nil, pub, nil)
		drain(t, rl)
		pub.mu.Lock()
		evs := slices.Clone(pub.evs)
		pub.mu.Unlock()
		require.Len(t, evs, 9)
		// The queue hands the sales over first, the restock last.
		slices.SortStableFunc(evs, func(a, b stock.Event) int {
			return cmp.Compare(b2i(a.Type == stock.EventRestocked), b2i(b.Type == stock.EventRestocked))
		})
		heldBack := 0
		for range 10 {
			var again []stock.Event
			for _, ev := range evs {
				err := stock.Consume(ctx, r, store, ev)
				if errors.Is(err, stock.ErrHeldBack) {
					heldBack++
					again = append(again, ev)
					continue
				}
				require.NoError(t, err, "%+v", ev)
			}
			if evs = again; len(evs) == 0 {
				break
			}
		}
		require.Empty(t, evs, "every event applied in the end")
		assert.Positive(t, heldBack, "sales behind the barrier waited")
		assert.Equal(t, stock.Levels{Sold: 8, Loaded: 8}, levels(t, r, "qo"), "no sale refused")
		storeAgrees(t, r, store, "qo")
	})
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
