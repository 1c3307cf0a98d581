package failover_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// itemKeySuffixes are the suffixes of an item's keys (docs/reference.md's key table) after
// "stock:{sku}".
var itemKeySuffixes = []string{"", ":l", ":u", ":o", ":h", ":r", ":rl", ":dl", ":b", ":p", ":w"}

// keyCopy is one key's value and time to live, as a replica would hold it.
type keyCopy struct {
	typ   string // "none" when the key did not exist
	str   string
	hash  map[string]string
	zset  []rueidis.ZScore
	pttl  int64 // ms; < 0: no expiry
	saved bool
}

// replicaState is every key of an item at one moment: what a replica that stopped receiving
// then holds.
type replicaState map[string]keyCopy

// snapshotItem copies every key of sku.
func snapshotItem(t *testing.T, c rueidis.Client, sku string) replicaState {
	t.Helper()
	ctx := context.Background()
	st := replicaState{}
	for _, suf := range itemKeySuffixes {
		key := "stock:{" + sku + "}" + suf
		typ, err := c.Do(ctx, c.B().Type().Key(key).Build()).ToString()
		require.NoError(t, err)
		kc := keyCopy{typ: typ, pttl: -1, saved: true}
		switch typ {
		case "none":
		case "string":
			kc.str, err = c.Do(ctx, c.B().Get().Key(key).Build()).ToString()
		case "hash":
			kc.hash, err = c.Do(ctx, c.B().Hgetall().Key(key).Build()).AsStrMap()
		case "zset":
			kc.zset, err = c.Do(ctx, c.B().Zrange().Key(key).Min("0").Max("-1").Withscores().Build()).AsZScores()
		default:
			t.Fatalf("%s is a %s: the snapshot copies strings, hashes and sorted sets", key, typ)
		}
		require.NoError(t, err, key)
		if typ != "none" {
			kc.pttl, err = c.Do(ctx, c.B().Pttl().Key(key).Build()).AsInt64()
			require.NoError(t, err, key)
		}
		st[key] = kc
	}
	return st
}

// rollback puts every key of the snapshot back as it was (a key that did not exist is deleted):
// Redis is now the replica that stopped receiving when the snapshot was taken.
func (st replicaState) rollback(t *testing.T, c rueidis.Client) {
	t.Helper()
	ctx := context.Background()
	for key, kc := range st {
		require.NoError(t, c.Do(ctx, c.B().Del().Key(key).Build()).Error(), key)
		switch kc.typ {
		case "string":
			require.NoError(t, c.Do(ctx, c.B().Set().Key(key).Value(kc.str).Build()).Error(), key)
		case "hash":
			if len(kc.hash) == 0 {
				continue
			}
			cmd := c.B().Hset().Key(key).FieldValue()
			for f, v := range kc.hash {
				cmd = cmd.FieldValue(f, v)
			}
			require.NoError(t, c.Do(ctx, cmd.Build()).Error(), key)
		case "zset":
			if len(kc.zset) == 0 {
				continue
			}
			cmd := c.B().Zadd().Key(key).ScoreMember()
			for _, z := range kc.zset {
				cmd = cmd.ScoreMember(z.Score, z.Member)
			}
			require.NoError(t, c.Do(ctx, cmd.Build()).Error(), key)
		}
		if kc.typ != "none" && kc.pttl > 0 {
			require.NoError(t, c.Do(ctx, c.B().Pexpire().Key(key).Milliseconds(kc.pttl).Build()).Error(), key)
		}
	}
}

// repairRig is a Reserver, a memstore and the relay between them, on one backend, with a clock
// the test moves (the reconciler's retention cutoff).
type repairRig struct {
	c      rueidis.Client
	r      *stock.Reserver
	store  *memstore.Store
	relay  *stockops.Relay
	rec    *stockops.Reconciler
	offset time.Duration // added to the real clock
}

func newRepairRig(t *testing.T, c rueidis.Client, sku string, loaded int64) *repairRig {
	t.Helper()
	ctx := context.Background()
	g := &repairRig{c: c, store: memstore.New()}
	g.r = testkit.NewReserver(t, c, stock.WithClock(func() time.Time { return time.Now().Add(g.offset) }))
	require.NoError(t, g.r.Load(ctx, sku, loaded))
	require.NoError(t, g.store.Load(ctx, sku, loaded))
	var err error
	g.relay, err = stockops.NewRelay(g.r, g.store, nil, &stock.RelayOptions{MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	require.NoError(t, err)
	g.rec, err = stockops.NewReconciler(g.r, g.store, nil) // the default retention: 24h
	require.NoError(t, err)
	return g
}

// reconcile runs one pass and returns the item's report.
func (g *repairRig) reconcile(t *testing.T, sku string) stockops.Report {
	t.Helper()
	reps, err := g.rec.Once(context.Background())
	require.NoError(t, err)
	for _, rp := range reps {
		if rp.SKU == sku {
			t.Logf("reconcile: %s", rp)
			return rp
		}
	}
	t.Fatalf("the pass did not report %s", sku)
	return stockops.Report{}
}

// storeTaken returns the units the store holds as taken (applied deducts and confirmed holds).
func storeTaken(t *testing.T, s stock.RecordLister, sku string) int64 {
	t.Helper()
	recs, err := s.List(context.Background(), sku, "", 1<<30)
	require.NoError(t, err)
	var n int64
	for _, r := range recs {
		if r.Status == stock.StateApplied && (r.Type == stock.EventDeducted || r.Type == stock.EventConfirmed) {
			n += r.Qty
		}
	}
	return n
}

// exact checks an item's counters against what a test knows: they are want, and agree with the
// store (checkBooks; nothing is in flight: the relay is drained).
func (g *repairRig) exact(t *testing.T, sku string, want stock.Levels) {
	t.Helper()
	testkit.Drain(t, g.relay)
	l := testkit.Levels(t, g.r, sku)
	assert.Equal(t, want, l, "levels")
	checkBooks(t, g.store, sku, l)
	assert.LessOrEqual(t, g.store.MaxApplications(), 1, "no event applied twice")
}

// checkBooks checks an item's Levels l against the store, with nothing in flight: the identity
// holds, every counter is ≥ 0, Sold is what the store holds as taken, and the store's remaining
// stock is Redis's available + held. It returns the store's taken and remaining units.
func checkBooks(t *testing.T, store *memstore.Store, sku string, l stock.Levels) (taken, rem int64) {
	t.Helper()
	assert.Equal(t, l.Loaded, l.Available+l.Held+l.Sold, "%s: loaded = available + held + sold: %+v", sku, l)
	assert.True(t, l.Available >= 0 && l.Held >= 0 && l.Sold >= 0 && l.Loaded >= 0, "%s: every counter ≥ 0: %+v", sku, l)
	taken = storeTaken(t, store, sku)
	assert.Equal(t, taken, l.Sold, "%s: Sold is the units the store holds as taken: %+v", sku, l)
	rem, err := store.Remaining(context.Background(), sku)
	require.NoError(t, err)
	assert.Equal(t, rem, l.Available+l.Held, "%s: the store's remaining = Redis's available + held", sku)
	return taken, rem
}

// TestRepairAfterFailoverKeepsLoaded: load x with 100; deduct a, b, c; the relay delivers them;
// the Redis that takes over lacks b and c (a replica that received a and its delivery, and
// nothing after). The repair writes b and c back as sold: {97, Sold 3, Loaded 100}. Restoring
// a, b and c gives everything back: {100, 0, 100}, in Redis and in the store.
func TestRepairAfterFailoverKeepsLoaded(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		g := newRepairRig(t, c, "x", 100)
		_, err := g.r.Deduct(ctx, stock.Request{SKU: "x", ID: "a", Qty: 1})
		require.NoError(t, err)
		testkit.Drain(t, g.relay)
		replica := snapshotItem(t, c, "x") // the replica stops receiving here
		for _, id := range []string{"b", "c"} {
			_, err := g.r.Deduct(ctx, stock.Request{SKU: "x", ID: id, Qty: 1})
			require.NoError(t, err)
		}
		testkit.Drain(t, g.relay)
		g.exact(t, "x", stock.Levels{Available: 97, Sold: 3, Loaded: 100})

		replica.rollback(t, c) // the failover: the replica takes over
		require.Equal(t, stock.Levels{Available: 99, Sold: 1, Loaded: 100}, testkit.Levels(t, g.r, "x"), "the promoted replica has a only")
		rp := g.reconcile(t, "x")
		assert.Equal(t, 2, rp.Rerecorded, "b and c written back from the store")
		assert.Empty(t, rp.NeedsHuman)
		g.exact(t, "x", stock.Levels{Available: 97, Sold: 3, Loaded: 100})
		entries := testkit.Ledger(t, g.r, "x")
		for _, id := range []string{"a", "b", "c"} {
			assert.True(t, entries[id].Taken(), "%s is sold in the ledger: %+v", id, entries[id])
		}
		rc, err := g.r.Deduct(ctx, stock.Request{SKU: "x", ID: "b", Qty: 1, Retry: true})
		require.NoError(t, err)
		assert.True(t, rc.Replayed, "a retry of b is a replay")

		for _, id := range []string{"a", "b", "c"} {
			_, err := g.r.Restore(ctx, "x", id)
			require.NoError(t, err, "restore %s", id)
		}
		g.exact(t, "x", stock.Levels{Available: 100, Sold: 0, Loaded: 100})
		rp = g.reconcile(t, "x")
		assert.Zero(t, rp.Drift)
		assert.Zero(t, rp.Adjusted)
		g.exact(t, "x", stock.Levels{Available: 100, Sold: 0, Loaded: 100})
	})
}

// TestRepairAfterFailoverKeepsLoadedWithRestocks: the same loss on an item that was restocked,
// with holds and a restore among the lost writes. Loaded stays what was loaded and restocked;
// the lost hold's confirmation is sold, the lost restore is given back.
func TestRepairAfterFailoverKeepsLoadedWithRestocks(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		g := newRepairRig(t, c, "x", 50)
		_, err := g.r.Restock(ctx, "x", "in-1", 30)
		require.NoError(t, err)
		for _, id := range []string{"a", "b"} {
			_, err := g.r.Deduct(ctx, stock.Request{SKU: "x", ID: id, Qty: 4})
			require.NoError(t, err)
		}
		testkit.Drain(t, g.relay)
		replica := snapshotItem(t, c, "x")
		_, err = g.r.Restore(ctx, "x", "a") // lost: a given back
		require.NoError(t, err)
		_, err = g.r.Deduct(ctx, stock.Request{SKU: "x", ID: "c", Qty: 3}) // lost: c sold
		require.NoError(t, err)
		_, err = g.r.Hold(ctx, stock.Request{SKU: "x", ID: "h", Qty: 2}, time.Hour)
		require.NoError(t, err)
		_, err = g.r.Confirm(ctx, "x", "h") // lost: h sold
		require.NoError(t, err)
		testkit.Drain(t, g.relay)
		g.exact(t, "x", stock.Levels{Available: 71, Sold: 9, Loaded: 80})

		replica.rollback(t, c)
		require.Equal(t, stock.Levels{Available: 72, Sold: 8, Loaded: 80}, testkit.Levels(t, g.r, "x"), "the promoted replica has a and b sold")
		rp := g.reconcile(t, "x")
		assert.Empty(t, rp.NeedsHuman)
		g.exact(t, "x", stock.Levels{Available: 71, Sold: 9, Loaded: 80})

		for _, id := range []string{"b", "c", "h"} {
			_, err := g.r.Restore(ctx, "x", id)
			require.NoError(t, err, "restore %s", id)
		}
		g.exact(t, "x", stock.Levels{Available: 80, Sold: 0, Loaded: 80})
		g.reconcile(t, "x")
		g.exact(t, "x", stock.Levels{Available: 80, Sold: 0, Loaded: 80})
	})
}

// TestRepairAfterRepeatPastRetentionKeepsLoaded is the mirror case: an id sold and delivered,
// its entry trimmed after the retention (the reconciler's clock moved past it), the same id
// deducted again (past the retention Redis no longer knows it and sells it again) and delivered:
// the store keeps its one record of the id, so Redis counts units the store never took. The
// repair gives them back to available: Loaded stays 100 (no restock that never happened), Sold
// is what the store holds.
func TestRepairAfterRepeatPastRetentionKeepsLoaded(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		g := newRepairRig(t, c, "x", 100)
		_, err := g.r.Deduct(ctx, stock.Request{SKU: "x", ID: "a", Qty: 2})
		require.NoError(t, err)
		_, err = g.r.Deduct(ctx, stock.Request{SKU: "x", ID: "k", Qty: 1})
		require.NoError(t, err)
		testkit.Drain(t, g.relay)
		g.exact(t, "x", stock.Levels{Available: 97, Sold: 3, Loaded: 100})

		g.offset = 25 * time.Hour // past the default retention of 24h
		rp := g.reconcile(t, "x")
		require.Equal(t, 2, rp.Trimmed, "a and k trimmed")
		require.Empty(t, testkit.Ledger(t, g.r, "x"))
		g.exact(t, "x", stock.Levels{Available: 97, Sold: 3, Loaded: 100})
		// The clock only moved the cutoff of that pass: the entries made from here on are as
		// young as Redis's clock says (which the test cannot move on a real server).
		g.offset = 0

		rc, err := g.r.Deduct(ctx, stock.Request{SKU: "x", ID: "a", Qty: 2})
		require.NoError(t, err, "past the retention the id is new to Redis")
		require.False(t, rc.Replayed)
		testkit.Drain(t, g.relay) // the store has a already: it takes nothing more
		require.Equal(t, int64(3), storeTaken(t, g.store, "x"))

		rp = g.reconcile(t, "x")
		assert.Empty(t, rp.NeedsHuman)
		g.exact(t, "x", stock.Levels{Available: 97, Sold: 3, Loaded: 100})
		g.reconcile(t, "x")
		g.exact(t, "x", stock.Levels{Available: 97, Sold: 3, Loaded: 100})

		// Every sale given back that Redis still knows (a; k's entry is past the retention, and
		// a late Restore gives nothing back): Loaded stays, Sold is what the store holds.
		for _, id := range []string{"a", "k"} {
			if _, err := g.r.Restore(ctx, "x", id); err != nil {
				t.Logf("restore %s: %v", id, err)
			}
		}
		testkit.Drain(t, g.relay)
		l := testkit.Levels(t, g.r, "x")
		assert.Equal(t, int64(100), l.Loaded, "loaded after the restores: %+v", l)
		assert.GreaterOrEqual(t, l.Sold, int64(0), "sold after the restores: %+v", l)
		assert.Equal(t, storeTaken(t, g.store, "x"), l.Sold, "sold = what the store holds after the restores")
		rem, err := g.store.Remaining(ctx, "x")
		require.NoError(t, err)
		assert.Equal(t, rem, l.Available+l.Held, "the store's remaining = Redis's available + held")
	})
}
