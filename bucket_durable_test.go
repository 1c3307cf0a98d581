package stock_test

import (
	"cmp"
	"context"
	"errors"
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
	"github.com/stockres/stock/internal/protocol"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// TestBucketedDurablePath: an item split over three buckets, with a Store: the relay hands the
// Store one item (each bucket's events in order), a refusal of the Store is given back in the
// right bucket, and a reconcile pass compares the buckets as a whole with the Store and mends a
// drift in them.
func TestBucketedDurablePath(t *testing.T) {
	opts := []stock.Option{stock.WithUserLimit(3), stock.WithBuckets(func(string) int { return 3 })}
	eachReserver(t, opts, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
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
		assert.ErrorIs(t, testkit.Err(store.Remaining(ctx, "b:~x|0")), stock.ErrNotLoaded, "the store sees the item, not its buckets")
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
	opts := []stock.Option{stock.WithBuckets(func(string) int { return 3 })}
	eachReserver(t, opts, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		// The store has 1 unit of the 3 Redis sells: two sales are refused and given back.
		store := memstore.New()
		require.NoError(t, store.Load(ctx, "rf", 1))
		require.NoError(t, r.Load(ctx, "rf", 3))
		testkit.Sell(t, r, "rf", "o", "u", 3)
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
		qstore := loadBoth(t, r, map[string]int64{"q": 12})
		testkit.Sell(t, r, "q", "o", "u", 9)
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
	opts := []stock.Option{stock.WithBuckets(func(string) int { return 3 })}
	eachReserver(t, opts, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		store := loadBoth(t, r, map[string]int64{"ri": 10})
		testkit.Sell(t, r, "ri", "o", "u", 6)
		rl := newRelay(t, r, store, nil, &stock.RelayOptions{Items: []string{"ri"}})
		assert.Equal(t, 6, drain(t, rl).Delivered)
		assert.Equal(t, int64(4), remaining(t, store, "ri"))
		p, _, err := stockops.Pending(ctx, r, "ri")
		require.NoError(t, err)
		assert.Zero(t, p)
	})
}

// restockThenSales loads sku with 3 units on an item split over splitN buckets and in a Store,
// restocks 5 units in bucket 1, and sells 8 units to a buyer of bucket 0: the sales spend units
// transfers moved from the other buckets, the restock's among them.
func restockThenSales(t *testing.T, c rueidis.Client, sku string) (*stock.Reserver, *memstore.Store) {
	t.Helper()
	r := newReserver(t, c, stock.WithBuckets(func(string) int { return splitN }))
	store := loadBoth(t, r, map[string]int64{sku: 3})
	must(t)(r.Restock(ctx, sku, keyIn("rs", 1, splitN), 5))
	buyer := keyIn("u", 0, splitN)
	sellTo(t, r, sku, "o", buyer, 8)
	return r, store
}

// TestBucketedOrderRestockThenSale: a restock in one bucket whose units a transfer moves to
// another bucket, where they are sold: the Store gets the restock before the sales, whatever
// order the relay walks the buckets in, and refuses none of the acknowledged sales.
func TestBucketedOrderRestockThenSale(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		r, store := restockThenSales(t, c, "ord")
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
		const n = 3
		r := newReserver(t, c, stock.WithBuckets(func(string) int { return n }))
		store := loadBoth(t, r, map[string]int64{"rso": 6})
		rl := newRelay(t, r, store, nil, nil)
		// Everything sold in bucket 1 and delivered: the Store has nothing left.
		seller := keyIn("s", 1, n)
		sellTo(t, r, "rso", "a", seller, 6)
		drain(t, rl)
		// Four of them restored in bucket 1, then sold again to a buyer of bucket 0.
		for i := range 4 {
			must(t)(r.Restore(ctx, "rso", "a"+strconv.Itoa(i)))
		}
		buyer := keyIn("u", 0, n)
		sellTo(t, r, "rso", "b", buyer, 4)
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
		r, store := restockThenSales(t, c, "bw")
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
		const n = 3
		r := newReserver(t, c, stock.WithBuckets(func(string) int { return n }))
		store := loadBoth(t, r, map[string]int64{"cc": 6})
		rl := newRelay(t, r, store, nil, &stock.RelayOptions{Batch: 4})

		var refused atomic.Int64
		stop := make(chan struct{})
		relayDone := make(chan struct{})
		go func() {
			defer close(relayDone)
			for !stopped(stop) {
				st, err := rl.Once(ctx)
				assert.NoError(t, err)
				refused.Add(int64(st.Refused))
			}
		}()
		var wg sync.WaitGroup
		for w := range 6 {
			wg.Go(func() {
				user := keyIn("w"+strconv.Itoa(w)+"-", w%n, n)
				var mine []string
				for i := range 40 {
					id := "w" + strconv.Itoa(w) + "-" + strconv.Itoa(i)
					switch i % 5 {
					case 0:
						assert.NoError(t, testkit.Err(r.Restock(ctx, "cc", id, int64(1+i%3))))
					case 3:
						if len(mine) > 0 {
							assert.NoError(t, testkit.Err(r.Restore(ctx, "cc", mine[0])))
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
			})
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
		r, store := restockThenSales(t, c, "qo")
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

const splitN = 3

// newSplitRig is a rig whose Reserver splits every item over splitN buckets, with sku loaded
// with qty on both sides, and whose reconciler retires delisted items after a millisecond.
func newSplitRig(t *testing.T, c rueidis.Client, sku string, qty int64) rig {
	t.Helper()
	r := newReserver(t, c, stock.WithBuckets(func(string) int { return splitN }))
	return newRigWith(t, c, r, map[string]int64{sku: qty}, &stock.ReconcileOptions{Retention: time.Millisecond})
}

// bucketKeys returns the keys of every bucket of sku, and its registry entries.
func bucketKeys(sku string) (keys []*protocol.Keys, members []string) {
	for i := range splitN {
		name := sku + "|" + strconv.Itoa(i)
		keys = append(keys, protocol.NewKeys(protocol.BucketBase("stock", sku, i, splitN)))
		members = append(members, name)
	}
	return keys, members
}

// assertRetired checks that every key of every bucket of sku is gone (the bucket's hash keeps
// only its retirement mark), and that the registry no longer lists them.
func assertRetired(t *testing.T, c rueidis.Client, sku string) {
	t.Helper()
	keys, members := bucketKeys(sku)
	for _, k := range keys {
		for _, key := range k.All()[1:] {
			n, err := c.Do(ctx, c.B().Exists().Key(key).Build()).AsInt64()
			require.NoError(t, err)
			assert.Zero(t, n, "%s is gone", key)
		}
		fields, err := c.Do(ctx, c.B().Hkeys().Key(k.Item).Build()).AsStrSlice()
		require.NoError(t, err)
		assert.ElementsMatch(t, []string{"x", "d"}, fields, "%s keeps its retirement mark only", k.Item)
	}
	for _, m := range members {
		in, err := c.Do(ctx, c.B().Sismember().Key(protocol.Registry("stock")).Member(m).Build()).AsBool()
		require.NoError(t, err)
		assert.False(t, in, "%s left the registry", m)
	}
}

// delistedSplitItem loads a split item, sells from every bucket (with moves of stock between
// them, give-backs and a confirmed hold, so that every kind of bucket key exists), and delists it.
func delistedSplitItem(t *testing.T, c rueidis.Client, sku string) rig {
	t.Helper()
	g := newSplitRig(t, c, sku, 30)
	testkit.Sell(t, g.r, sku, "o", "u", 12)
	// More than a bucket holds: stock moves in from the others (transfers).
	must(t)(g.r.Deduct(ctx, stock.Request{SKU: sku, ID: "big", User: "whale", Qty: 12}))
	must(t)(g.r.Restore(ctx, sku, "o1"))
	mustFail(t, stock.ErrUnknownID)(g.r.Restore(ctx, sku, "never-used")) // a give-back's claim and tombstone
	must(t)(g.r.Hold(ctx, stock.Request{SKU: sku, ID: "h1", User: "w", Qty: 2}, time.Minute))
	must(t)(g.r.Confirm(ctx, sku, "h1"))
	// Every kind of key a bucket may have exists somewhere: claims and transfers.
	keys, _ := bucketKeys(sku)
	var claims, transfers int64
	for _, k := range keys {
		n, err := c.Do(ctx, c.B().Exists().Key(k.Claims).Build()).AsInt64()
		require.NoError(t, err)
		claims += n
		n, err = c.Do(ctx, c.B().Exists().Key(k.Transfers).Build()).AsInt64()
		require.NoError(t, err)
		transfers += n
	}
	require.Positive(t, claims, "claims hashes")
	require.Positive(t, transfers, "transfers hashes")

	require.NoError(t, g.r.Delist(ctx, sku))
	require.NoError(t, g.r.Delist(ctx, sku), "delisting twice does nothing")
	mustFail(t, stock.ErrClosed)(g.r.Deduct(ctx, stock.Request{SKU: sku, ID: "late", User: "u1", Qty: 1}))
	mustFail(t, stock.ErrClosed)(g.r.Hold(ctx, stock.Request{SKU: sku, ID: "late2", User: "u2", Qty: 1}, time.Minute))
	require.ErrorIs(t, g.r.ReopenItem(ctx, sku), stock.ErrClosed, "a delisted item cannot be reopened")
	assert.True(t, levels(t, g.r, sku).Closed)
	require.ErrorIs(t, g.r.Load(ctx, sku, 5), stock.ErrLoaded)
	return g
}

// TestBucketedDelistRetires: a split item is delisted whole; once its retention has passed and
// its events are delivered, a reconcile pass retires it: every key of every bucket is removed
// (claims, transfers and in-flight sets included), the report says Retired, Levels answers
// ErrNotLoaded, and Load may load the item again.
func TestBucketedDelistRetires(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		g := delistedSplitItem(t, c, "sp")
		require.ErrorIs(t, g.r.Delist(ctx, "ghost"), stock.ErrNotLoaded)
		must(t)(g.r.Restore(ctx, "sp", "o2")) // the pipeline still works
		time.Sleep(10 * time.Millisecond)
		rp := g.once(t)["sp"]
		assert.False(t, rp.Retired, "events are still pending: %v", rp)
		assert.Empty(t, rp.NeedsHuman)
		l := levels(t, g.r, "sp")
		assert.True(t, l.Closed)

		drain(t, g.relay)
		time.Sleep(10 * time.Millisecond)
		reps := g.once(t)
		require.Contains(t, reps, "sp")
		assert.True(t, reps["sp"].Retired, "%v", reps["sp"])
		assert.Zero(t, reps["sp"].Drift)
		assert.Positive(t, reps["sp"].Trimmed, "ledger entries removed")
		assertRetired(t, c, "sp")
		assert.ErrorIs(t, testkit.Err(g.r.Levels(ctx, "sp")), stock.ErrNotLoaded)
		require.ErrorIs(t, g.r.ReopenItem(ctx, "sp"), stock.ErrNotLoaded)
		require.ErrorIs(t, g.r.Delist(ctx, "sp"), stock.ErrNotLoaded)

		reps = g.once(t)
		_, listed := reps["sp"]
		assert.False(t, listed, "a retired item leaves the registry, and is not taken for one Redis lost: %v", reps["sp"])
		one := newReconciler(t, g.r, g.store, &stock.ReconcileOptions{Items: []string{"sp"}, Retention: time.Millisecond})
		rr, err := one.Once(ctx)
		require.NoError(t, err)
		require.Len(t, rr, 1)
		assert.True(t, rr[0].Retired, "%v", rr[0])

		require.NoError(t, g.r.Load(ctx, "sp", 7), "a retired item may be loaded again")
		l = levels(t, g.r, "sp")
		assert.Equal(t, stock.Levels{Available: 7, Loaded: 7}, l)
		must(t, "a new item: the old ledger and claims are gone")(g.r.Deduct(ctx, stock.Request{SKU: "sp", ID: "o1", User: "u1", Qty: 1}))
	})
}

// TestBucketedRetireCut: a pass cut between buckets (one bucket retired, the others delisted)
// leaves an item that Load refuses, that cannot be reopened, and that the next pass finishes
// retiring without comparing or rebuilding anything.
func TestBucketedRetireCut(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		g := delistedSplitItem(t, c, "sp")
		drain(t, g.relay)
		time.Sleep(10 * time.Millisecond)
		// The pass is cut after it retired bucket 2, before it took it out of the registry.
		keys, _ := bucketKeys("sp")
		k := keys[2]
		cutoff := strconv.FormatInt(time.Now().UnixMilli(), 10)
		for range 100 {
			res := protocol.Retire.Exec(ctx, c, append(k.ForRetire(), k.Published, k.Transfers, k.InFlight, k.Claims), []string{cutoff, "500"})
			vs, err := res.AsIntSlice()
			require.NoError(t, err)
			if vs[0] != protocol.Replay {
				require.Equal(t, protocol.OK, vs[0])
				break
			}
		}

		err := g.r.Load(ctx, "sp", 5)
		require.ErrorIs(t, err, stock.ErrLoaded, "a partly retired item is not loaded again")
		require.ErrorIs(t, g.r.ReopenItem(ctx, "sp"), stock.ErrClosed)
		require.ErrorIs(t, g.r.CloseItem(ctx, "sp"), stock.ErrNotLoaded)
		for i := range 2 {
			c1, err := c.Do(ctx, c.B().Hget().Key(keys[i].Item).Field("c").Build()).ToString()
			require.NoError(t, err)
			assert.Equal(t, "1", c1, "bucket %d stays closed", i)
		}

		reps := g.once(t)
		require.Contains(t, reps, "sp")
		assert.True(t, reps["sp"].Retired, "%v", reps["sp"])
		assert.Empty(t, reps["sp"].NeedsHuman)
		assert.False(t, reps["sp"].Rebuilt)
		assertRetired(t, c, "sp")
		require.NoError(t, g.r.Load(ctx, "sp", 5))
		assert.Equal(t, stock.Levels{Available: 5, Loaded: 5}, levels(t, g.r, "sp"))
	})
}

// TestBucketedDelistCut: a Delist cut half way (every bucket closed, one delisted) leaves the
// item closed whole: ReopenItem answers ErrClosed and reopens nothing, and a pass does not
// retire it. A second Delist finishes it, and a pass then retires it.
func TestBucketedDelistCut(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		g := newSplitRig(t, c, "sp", 9)
		testkit.Sell(t, g.r, "sp", "o", "u", 6)
		drain(t, g.relay)
		keys, _ := bucketKeys("sp")
		require.NoError(t, g.r.CloseItem(ctx, "sp"))
		require.NoError(t, testkit.Err(protocol.Delist.Exec(ctx, c, keys[1].ForMarks(), nil).ToArray()))

		require.ErrorIs(t, g.r.ReopenItem(ctx, "sp"), stock.ErrClosed)
		for i, k := range keys {
			c1, err := c.Do(ctx, c.B().Hget().Key(k.Item).Field("c").Build()).ToString()
			require.NoError(t, err)
			assert.Equal(t, "1", c1, "bucket %d was not reopened", i)
		}
		assert.True(t, levels(t, g.r, "sp").Closed)
		require.ErrorIs(t, g.r.Load(ctx, "sp", 1), stock.ErrLoaded)
		time.Sleep(10 * time.Millisecond)
		rp := g.once(t)["sp"]
		assert.False(t, rp.Retired, "%v", rp)
		assert.Contains(t, rp.NeedsHuman, "Delist it again")

		require.NoError(t, g.r.Delist(ctx, "sp"))
		time.Sleep(10 * time.Millisecond)
		rp = g.once(t)["sp"]
		assert.True(t, rp.Retired, "%v", rp)
		assertRetired(t, c, "sp")
	})
}

// TestBucketedRetireWaitsForTransfer: a transfer in flight between two buckets of a delisted
// item (a process died between its halves) keeps every bucket from retiring; once it is
// completed, a pass retires the item.
func TestBucketedRetireWaitsForTransfer(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		g := delistedSplitItem(t, c, "sp")
		drain(t, g.relay)
		keys, _ := bucketKeys("sp")
		donor := -1
		for i, k := range keys {
			a, err := c.Do(ctx, c.B().Hget().Key(k.Item).Field("a").Build()).AsInt64()
			require.NoError(t, err)
			if a > 0 {
				donor = i
				break
			}
		}
		require.GreaterOrEqual(t, donor, 0, "a bucket with stock")
		target := (donor + 1) % splitN
		out, err := protocol.XOut.Exec(ctx, c, keys[donor].ForXOut(), []string{"t1", strconv.Itoa(target), "1", "1"}).AsIntSlice()
		require.NoError(t, err)
		require.Equal(t, protocol.OK, out[0])
		before := levels(t, g.r, "sp")
		time.Sleep(10 * time.Millisecond)

		rp := g.once(t)["sp"]
		assert.False(t, rp.Retired, "%v", rp)
		assert.Equal(t, before, levels(t, g.r, "sp"), "no bucket retired")

		in, err := protocol.XIn.Exec(ctx, c, keys[target].ForXIn(), []string{"t1", strconv.Itoa(donor), "1", strconv.FormatInt(out[3], 10)}).AsIntSlice()
		require.NoError(t, err)
		require.Equal(t, protocol.OK, in[0])
		done, err := protocol.XDone.Exec(ctx, c, keys[donor].ForXDone(), []string{"t1"}).AsIntSlice()
		require.NoError(t, err)
		require.Equal(t, protocol.OK, done[0])
		rp = g.once(t)["sp"]
		assert.True(t, rp.Retired, "%v", rp)
		assertRetired(t, c, "sp")
	})
}
