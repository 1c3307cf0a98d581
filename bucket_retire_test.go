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
	"github.com/stockres/stock/internal/protocol"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// splitRig is a Reserver that splits every item over 3 buckets, with a Store, a relay and a
// reconciler that retires delisted items after a millisecond.
type splitRig struct {
	r     *stock.Reserver
	c     rueidis.Client
	store *memstore.Store
	relay *stockops.Relay
	rec   *stockops.Reconciler
}

const splitN = 3

func newSplitRig(t *testing.T, c rueidis.Client, sku string, qty int64) splitRig {
	t.Helper()
	ctx := context.Background()
	r := newReserver(t, c, stock.WithBuckets(func(string) int { return splitN }))
	store := memstore.New()
	require.NoError(t, store.Load(ctx, sku, qty))
	require.NoError(t, r.Load(ctx, sku, qty))
	relay := newRelay(t, r, store, nil, &stock.RelayOptions{MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	rec := newReconciler(t, r, store, &stock.ReconcileOptions{Retention: time.Millisecond})
	return splitRig{r: r, c: c, store: store, relay: relay, rec: rec}
}

func (g splitRig) once(t *testing.T) map[string]stockops.Report {
	t.Helper()
	reps, err := g.rec.Once(context.Background())
	require.NoError(t, err)
	m := map[string]stockops.Report{}
	for _, rp := range reps {
		m[rp.SKU] = rp
	}
	return m
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
	ctx := context.Background()
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
func delistedSplitItem(t *testing.T, c rueidis.Client, sku string) splitRig {
	t.Helper()
	ctx := context.Background()
	g := newSplitRig(t, c, sku, 30)
	for i := range 12 {
		must(t)(g.r.Deduct(ctx, stock.Request{SKU: sku, ID: "o" + strconv.Itoa(i), User: "u" + strconv.Itoa(i), Qty: 1}))
	}
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
		ctx := context.Background()
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
		_, err := g.r.Levels(ctx, "sp")
		assert.ErrorIs(t, err, stock.ErrNotLoaded)
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
		ctx := context.Background()
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
		ctx := context.Background()
		g := newSplitRig(t, c, "sp", 9)
		for i := range 6 {
			must(t)(g.r.Deduct(ctx, stock.Request{SKU: "sp", ID: "o" + strconv.Itoa(i), User: "u" + strconv.Itoa(i), Qty: 1}))
		}
		drain(t, g.relay)
		keys, _ := bucketKeys("sp")
		require.NoError(t, g.r.CloseItem(ctx, "sp"))
		_, err := protocol.Delist.Exec(ctx, c, keys[1].ForMarks(), nil).ToArray()
		require.NoError(t, err)

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
		ctx := context.Background()
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
