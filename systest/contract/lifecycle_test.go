package contract_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// drainOfLifecycle runs a relay pass until nothing is pending for the items.
func drainOfLifecycle(t *testing.T, r *stock.Reserver, store *memstore.Store) {
	t.Helper()
	rl := must(stockops.NewRelay(r, store, nil, &stock.RelayOptions{MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))(t)
	for range 20 {
		st := must(rl.Once(context.Background()))(t)
		if st.Claimed == 0 {
			return
		}
	}
}

// retiring lets 20ms pass on c and returns a reconciler of r and store with a retention of 1ms:
// its passes retire the delisted items that are settled.
func retiring(t *testing.T, c rueidis.Client, r *stock.Reserver, store stock.Store) *stockops.Reconciler {
	t.Helper()
	redistest.Sleep(c, 20*time.Millisecond)
	return must(stockops.NewReconciler(r, store, &stock.ReconcileOptions{Retention: time.Millisecond}))(t)
}

func reports(t *testing.T, rec *stockops.Reconciler) map[string]stockops.Report {
	t.Helper()
	reps := must(rec.Once(context.Background()))(t)
	m := map[string]stockops.Report{}
	for _, rp := range reps {
		m[rp.SKU] = rp
	}
	return m
}

// Promise (Delist, Reopen, Close docs): "only a closed, delisted item is ever retired", "a
// delisted item cannot be reopened", "Its pipeline finishes as with Close", and "A retired item
// answers ErrNotLoaded and may be loaded again". Items: closed only, reopened, delisted with a
// live hold, delisted with events pending, delisted with a name that prefixes others, delisted
// and retired then loaded again (the next pass must not retire the new item).
func TestRetireOnlyDelisted(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		c, r := clientReserver(t, b)
		store := memstore.New()
		skus := []string{"closed", "reopened", "held", "pending", "x", "x:u", "gone"}
		for _, sku := range skus {
			loadBoth(t, r, store, sku, 10)
			require.NoError(t, testkit.Err(r.Deduct(ctx, req(sku, "o1", "u", 2))))
		}
		require.NoError(t, testkit.Err(r.Hold(ctx, req("held", "h1", "u", 1), time.Hour)))
		drainOfLifecycle(t, r, store)
		require.NoError(t, testkit.Err(r.Deduct(ctx, req("pending", "o2", "", 1))))

		require.NoError(t, r.CloseItem(ctx, "closed"))
		require.NoError(t, r.CloseItem(ctx, "reopened"))
		require.NoError(t, r.ReopenItem(ctx, "reopened"))
		for _, sku := range []string{"held", "pending", "x", "gone"} {
			require.NoError(t, r.Delist(ctx, sku))
			require.NoError(t, r.Delist(ctx, sku), "delisting twice does nothing")
			assert.ErrorIs(t, r.ReopenItem(ctx, sku), stock.ErrClosed, sku)
			assert.True(t, check(t, r, sku, 10).Closed, sku)
			assert.ErrorIs(t, testkit.Err(r.Deduct(ctx, req(sku, "late", "", 1))), stock.ErrClosed, sku)
			assert.ErrorIs(t, r.Load(ctx, sku, 5), stock.ErrLoaded, sku)
		}
		rec := retiring(t, c, r, store)
		reps := reports(t, rec)
		for _, sku := range []string{"closed", "reopened", "held", "pending", "x:u"} {
			assert.False(t, reps[sku].Retired, "%s retired: %v", sku, reps[sku])
			testkit.Levels(t, r, sku)
		}
		assert.True(t, reps["gone"].Retired, "gone: %v", reps["gone"])
		assert.True(t, reps["x"].Retired, "x: %v", reps["x"])
		assert.ErrorIs(t, testkit.Err(r.Levels(ctx, "gone")), stock.ErrNotLoaded)
		// The held item's pipeline finishes: the hold is confirmed after the delisting.
		require.NoError(t, testkit.Err(r.Confirm(ctx, "held", "h1")))
		assert.Equal(t, int64(3), testkit.Levels(t, r, "held").Sold)
		drainOfLifecycle(t, r, store)
		redistest.Sleep(c, 20*time.Millisecond)
		reps = reports(t, rec)
		assert.True(t, reps["held"].Retired, "held, confirmed and delivered: %v", reps["held"])
		assert.True(t, reps["pending"].Retired, "pending, delivered: %v", reps["pending"])

		// Loaded again after retirement: a new item, not retired by the next passes.
		require.NoError(t, r.Load(ctx, "gone", 7))
		store.Set("gone", 7)
		require.NoError(t, testkit.Err(r.Deduct(ctx, req("gone", "o1", "u", 1))))
		assert.Equal(t, int64(1), must(r.Ledger(ctx, "gone", "o1"))(t).Qty, "a new sale, not a replay of the retired item's o1")
		drainOfLifecycle(t, r, store)
		redistest.Sleep(c, 20*time.Millisecond)
		for range 2 {
			reps = reports(t, rec)
			assert.False(t, reps["gone"].Retired, "the reloaded item: %v", reps["gone"])
		}
		l := testkit.Levels(t, r, "gone")
		assert.False(t, l.Closed)
		// The store took nothing for the new o1 (it has the retired item's o1): the repair gives
		// the unit back from Sold, and Loaded stays what was loaded (it was raised to 8, a
		// restock that never happened).
		assert.Equal(t, stock.Levels{Available: 7, Loaded: 7}, l)
		require.NoError(t, r.CloseItem(ctx, "gone"))
		require.NoError(t, r.ReopenItem(ctx, "gone"), "a reloaded item is not delisted")
	})
}

// Promise (Delist doc): retirement removes the keys "in bounded steps"; until it is done and
// after, the item is gone as a whole: a large ledger (1,500 entries) retired, then loaded again
// at once, must not lose the new item's entries to a later step of the old retirement.
func TestRetireLargeLedgerThenReload(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		c, r := clientReserver(t, b)
		store := memstore.New()
		const n = 1500
		loadBoth(t, r, store, "big", n)
		deductEach(t, r, stock.Request{SKU: "big", Qty: 1}, numbered("o", n)...)
		drainOfLifecycle(t, r, store)
		require.NoError(t, r.Delist(ctx, "big"))
		rec := retiring(t, c, r, store)
		var retired bool
		for pass := range 6 {
			reps := reports(t, rec)
			t.Logf("pass %d: %v", pass, reps["big"])
			if reps["big"].Retired {
				retired = true
				break
			}
		}
		require.True(t, retired)
		require.ErrorIs(t, testkit.Err(r.Levels(ctx, "big")), stock.ErrNotLoaded)
		require.NoError(t, r.Load(ctx, "big", 10))
		store.Set("big", 10)
		// New ids: the Store keeps the retired item's records, so an old id would be taken by
		// Redis as new and answered by the Store as already applied (a sale lost to the
		// database, then "repaired" by adding units in Redis). Ids are unique per operation.
		deductEach(t, r, stock.Request{SKU: "big", Qty: 1}, numbered("n", 5)...)
		drainOfLifecycle(t, r, store)
		assert.Len(t, testkit.Ledger(t, r, "big"), 5)
		for range 3 {
			reps := reports(t, rec)
			assert.False(t, reps["big"].Retired, "%v", reps["big"])
		}
		// (the passes trim the new applied entries: the retention is 1 ms)
		l := testkit.Levels(t, r, "big")
		assert.Equal(t, int64(5), l.Sold)
		assert.Equal(t, int64(10), l.Loaded)
	})
}

// Promise (Delist doc, Keys): retiring a grouped item removes its keys only, never those of the
// other items of its group (they share one slot and the "{group}" part of their keys), nor an
// ungrouped item of the same name as the group.
func TestRetireGroupedItem(t *testing.T) {
	group := func(sku string) string {
		if sku == "g" {
			return ""
		}
		return "g"
	}
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		c, r := clientReserver(t, b, stock.WithGroups(group))
		store := memstore.New()
		skus := []string{"g", "tee", "tee:l", "tee:u", "cap"}
		for _, sku := range skus {
			loadBoth(t, r, store, sku, 10)
			require.NoError(t, testkit.Err(r.Deduct(ctx, req(sku, "o1", "u", 1))))
			require.NoError(t, testkit.Err(r.Hold(ctx, req(sku, "h1", "u", 1), time.Hour)))
		}
		_, err := r.Cancel(ctx, "tee", "h1")
		require.NoError(t, err)
		drainOfLifecycle(t, r, store)
		require.NoError(t, r.Delist(ctx, "tee"))
		rec := retiring(t, c, r, store)
		reps := reports(t, rec)
		assert.True(t, reps["tee"].Retired, "%v", reps["tee"])
		for _, sku := range []string{"g", "tee:l", "tee:u", "cap"} {
			assert.False(t, reps[sku].Retired, sku)
			l := testkit.Levels(t, r, sku)
			assert.Equal(t, stock.Levels{Available: 8, Held: 1, Sold: 1, Loaded: 10}, l, sku)
			assert.Equal(t, stock.StateHeld, must(r.Ledger(ctx, sku, "h1"))(t, sku).State, sku)
			_, err = r.Confirm(ctx, sku, "h1")
			require.NoError(t, err, sku)
		}
		assert.ErrorIs(t, testkit.Err(r.Levels(ctx, "tee")), stock.ErrNotLoaded)
		_, err = r.DeductMany(ctx, stock.Cart{ID: "k", User: "u", Lines: []stock.Line{{SKU: "tee:l", Qty: 1}, {SKU: "cap", Qty: 1}}})
		require.NoError(t, err)
	})
}

// Promise (Delist: retired only when "a reconcile pass finds Redis and the Store in agreement
// with nothing pending"; Report.DeadLetters "count as in flight"): a delisted item with a
// dead-lettered event (the Store rejected it as invalid) is not retired, so the operator's
// dead letter is not deleted with it.
func TestNoRetireWithDeadLetters(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		c, r := clientReserver(t, b)
		store := memstore.New()
		loadBoth(t, r, store, "dlq", 5)
		require.NoError(t, testkit.Err(r.Deduct(ctx, req("dlq", "bad", "", 1))))
		store.FailWith(func(ev stock.Event) error {
			if ev.ID == "bad" {
				return fmt.Errorf("nope: %w", stock.ErrInvalid)
			}
			return nil
		})
		drainOfLifecycle(t, r, store)
		_, dead, err := stockops.Pending(ctx, r, "dlq")
		require.NoError(t, err)
		require.Equal(t, int64(1), dead)
		require.NoError(t, r.Delist(ctx, "dlq"))
		rec := retiring(t, c, r, store)
		reps, err := rec.Once(ctx)
		t.Logf("%v %v", reps, err)
		for _, rp := range reps {
			assert.False(t, rp.Retired, "retired with a dead letter: %v", rp)
		}
		_, dead, err = stockops.Pending(ctx, r, "dlq")
		require.NoError(t, err)
		assert.Equal(t, int64(1), dead)
	})
}

// Promise (Delist; Restock "adds qty units to a live item"; Load "returns ErrLoaded ... when the
// item exists"): after Delist, Load is ErrLoaded; a Restock either is refused and changes nothing
// or is ledgered and delivered before the item retires; the store and Redis agree at the end.
func TestRestockAfterDelist(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		c, r := clientReserver(t, b)
		store := memstore.New()
		loadBoth(t, r, store, "rd", 5)
		require.NoError(t, r.Delist(ctx, "rd"))
		assert.ErrorIs(t, r.Load(ctx, "rd", 5), stock.ErrLoaded)
		_, err := r.Restock(ctx, "rd", "rs", 3)
		t.Logf("restock after delist: %v", err)
		l := check(t, r, "rd", 5)
		if err == nil {
			assert.Equal(t, int64(8), l.Loaded)
			pending, _, perr := stockops.Pending(ctx, r, "rd")
			require.NoError(t, perr)
			assert.Equal(t, int64(1), pending)
		} else {
			assert.Equal(t, int64(5), l.Loaded)
		}
		rec := retiring(t, c, r, store)
		reps := reports(t, rec)
		if l.Loaded == 8 {
			assert.False(t, reps["rd"].Retired, "retired with the restock pending: %v", reps["rd"])
		}
		drainOfLifecycle(t, r, store)
		redistest.Sleep(c, 20*time.Millisecond)
		reps = reports(t, rec)
		assert.True(t, reps["rd"].Retired, "%v", reps["rd"])
		assert.Equal(t, l.Loaded, must(store.Remaining(ctx, "rd"))(t))
	})
}

// CloseItem under Run: "Deduct and Hold are refused with ErrClosed, while Restore, Confirm,
// Cancel, expiry, the relay and the reconciler go on, so the item's pipeline finishes."
func TestRunClosedItemPipelineFinishes(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		r := testkit.NewReserver(t, c)
		st := memstore.New()
		loadBoth(t, r, st, "shut", 10)
		require.NoError(t, testkit.Err(r.Deduct(ctx, req("shut", "d", "", 2))))
		require.NoError(t, testkit.Err(r.Hold(ctx, req("shut", "h1", "", 1), time.Hour)))
		require.NoError(t, testkit.Err(r.Hold(ctx, req("shut", "h2", "", 1), 100*time.Millisecond)))
		require.NoError(t, r.CloseItem(ctx, "shut"))
		assert.ErrorIs(t, testkit.Err(r.Hold(ctx, req("shut", "h3", "", 1), time.Hour)), stock.ErrClosed)
		require.NoError(t, testkit.Err(r.Confirm(ctx, "shut", "h1")))
		require.NoError(t, testkit.Err(r.Restore(ctx, "shut", "d")))
		redistest.Sleep(c, 200*time.Millisecond)
		cancel, done := runAsync(r, stock.RunOptions{Store: st, SweepInterval: 10 * time.Millisecond})
		ok := eventually(5*time.Second, func() bool {
			rem, _ := st.Remaining(ctx, "shut")
			return testkit.Levels(t, r, "shut").Held == 0 && testkit.OutboxLen(t, c, "shut") == 0 && rem == 9
		})
		cancel()
		<-done
		assert.True(t, ok, "the closed item's pipeline finished: %+v", testkit.Levels(t, r, "shut"))
		l := testkit.Levels(t, r, "shut")
		assert.Equal(t, int64(9), l.Available)
		assert.True(t, l.Closed)
	})
}

// Delist under Run: "once the retention has passed (ReconcileOptions.Retention...) and a
// reconcile pass finds Redis and the Store in agreement with nothing pending, that pass retires
// the item ... A retired item answers ErrNotLoaded and may be loaded again."
func TestRunRetiresDelistedItem(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		r := testkit.NewReserver(t, c)
		st := memstore.New()
		cancel, done := runAsync(r, stock.RunOptions{Store: st,
			Reconcile: &stock.ReconcileOptions{Retention: 10 * time.Millisecond, Interval: 50 * time.Millisecond}})
		time.Sleep(200 * time.Millisecond)
		loadBoth(t, r, st, "old:1", 10)
		deductEach(t, r, stock.Request{SKU: "old:1", Qty: 1}, numbered("d", 5)...)
		require.NoError(t, r.Delist(ctx, "old:1"))
		require.NoError(t, r.Delist(ctx, "old:1"), "delisting twice does nothing")
		assert.ErrorIs(t, r.ReopenItem(ctx, "old:1"), stock.ErrClosed)
		ok := eventually(10*time.Second, func() bool {
			redistest.Sleep(c, 50*time.Millisecond)
			_, err := r.Levels(ctx, "old:1")
			return errors.Is(err, stock.ErrNotLoaded)
		})
		assert.True(t, ok, "the delisted item was retired")
		_, err := r.Ledger(ctx, "old:1", "d0")
		assert.ErrorIs(t, err, stock.ErrUnknownID, "ledger included")
		require.NoError(t, r.Load(ctx, "old:1", 3), "a retired item may be loaded again")
		assert.Equal(t, int64(3), testkit.Levels(t, r, "old:1").Available)
		cancel()
		err, _ = waitRun(t, done, 10*time.Second)
		assert.ErrorIs(t, err, context.Canceled)
	})
}

// TestConcurrentFirstLoad: many Reservers (own clients) make their first call at once on
// a server without the library: concurrent FUNCTION LOADs, all but one answered "already
// exists". No call may fail.
func TestConcurrentFirstLoad(t *testing.T) {
	faultReal(t)
	s := redistest.StartServer(t)
	admin := s.Client(t)
	const n = 8
	rs := make([]*stock.Reserver, n)
	for i := range rs {
		rs[i] = testkit.NewReserver(t, s.Client(t))
	}
	require.NoError(t, rs[0].Load(ctx, "c", 1000))
	st := newStats()
	for round := 0; round < 6; round++ {
		require.NoError(t, faultDo(t, admin, "FUNCTION", "FLUSH", "SYNC").Error())
		require.NoError(t, faultDo(t, admin, "SCRIPT", "FLUSH", "SYNC").Error())
		// New Reservers each round, so each starts with functions on.
		for i := range rs {
			rs[i] = testkit.NewReserver(t, s.Client(t))
		}
		var wg sync.WaitGroup
		gate := make(chan struct{})
		for i := range rs {
			wg.Go(func() {
				<-gate
				deduct(rs[i], st, "c", fmt.Sprintf("r%d-%d", round, i), 1)
			})
		}
		close(gate)
		wg.Wait()
	}
	t.Logf("raw %v, max %v", st.raw, st.maxDur)
	assert.Empty(t, st.raw)
	faultCheck(t, rs[0], st, map[string]int64{"c": 1000})
	assert.Len(t, faultLibs(t, admin), 1)
}

// TestHoldsLifecycle: Hold, Confirm, Cancel, Extend and expiry on a split item, with
// the stock moved between buckets, and sweeps by stockops.Sweep.
func TestHoldsLifecycle(t *testing.T) {
	each(t, []stock.Option{split(3)}, func(t *testing.T, e *requestEnv) {
		ttl := time.Hour
		short := 2 * time.Second
		require.NoError(t, e.r.Load(ctx, "h", 9))
		for i := range 4 {
			_, err := e.r.Hold(ctx, req("h", fmt.Sprintf("h%d", i), "same", 2), ttl)
			require.NoError(t, err, "hold %d: the user's bucket borrows", i)
		}
		assert.Equal(t, stock.Levels{Available: 1, Held: 8, Loaded: 9}, levels(t, e.r, "h"))
		require.ErrorIs(t, testkit.Err(e.r.Hold(ctx, req("h", "h9", "x", 2), ttl)), stock.ErrInsufficient)

		assert.Equal(t, int64(2), must(e.r.Confirm(ctx, "h", "h0"))(t).Qty)
		assert.True(t, must(e.r.Confirm(ctx, "h", "h0"))(t).Replayed)
		require.ErrorIs(t, testkit.Err(e.r.Cancel(ctx, "h", "h0")), stock.ErrConfirmed)

		rc := must(e.r.Cancel(ctx, "h", "h1"))(t)
		assert.Equal(t, int64(2), rc.Qty)
		rc = must(e.r.Cancel(ctx, "h", "h1"))(t)
		assert.True(t, rc.Replayed)
		require.ErrorIs(t, testkit.Err(e.r.Confirm(ctx, "h", "h1")), stock.ErrRestored)
		require.ErrorIs(t, testkit.Err(e.r.Hold(ctx, req("h", "h1", "same", 2), ttl)), stock.ErrRestored)

		require.NoError(t, testkit.Err(e.r.Extend(ctx, "h", "h2", short)))
		require.NoError(t, testkit.Err(e.r.Extend(ctx, "h", "h3", short)))
		require.ErrorIs(t, testkit.Err(e.r.Extend(ctx, "h", "h0", time.Hour)), stock.ErrConfirmed)
		require.ErrorIs(t, testkit.Err(e.r.Extend(ctx, "h", "nohold", time.Hour)), stock.ErrUnknownID)
		assert.Equal(t, stock.Levels{Available: 3, Held: 4, Sold: 2, Loaded: 9}, levels(t, e.r, "h"))

		e.advance(short + 1500*time.Millisecond)
		require.ErrorIs(t, testkit.Err(e.r.Confirm(ctx, "h", "h2")), stock.ErrExpired)
		// The Confirm released h2, and with it the bucket's other due holds (h3, same buyer):
		// the sweep finds h3 released or releases it.
		assert.Contains(t, []int64{0, 2}, must(stockops.Sweep(ctx, e.r, "h"))(t))
		require.ErrorIs(t, testkit.Err(e.r.Extend(ctx, "h", "h3", time.Hour)), stock.ErrExpired)
		require.NoError(t, testkit.Err(e.r.Cancel(ctx, "h", "h3")), "a cancel of an expired hold is a replay")
		assert.Equal(t, stock.Levels{Available: 7, Sold: 2, Loaded: 9}, levels(t, e.r, "h"))
		for _, id := range []string{"h2", "h3"} {
			assert.Equal(t, stock.StateExpired, must(e.r.Ledger(ctx, "h", id))(t).State, id)
		}
		// The 7 units left serve takes in any bucket.
		testkit.Sell(t, e.r, "h", "d", "w", 7)
		require.ErrorIs(t, testkit.Err(e.r.Deduct(ctx, req("h", "d9", "w9", 1))), stock.ErrSoldOut)
	})
}

// TestCloseReopenRestock: CloseItem refuses takes in every bucket, lets confirms,
// cancels and restores through; ReopenItem sells again; Restock adds once per id; Delist
// refuses a split item with ErrInvalid, and carts of a closed split item are refused with
// ErrClosed; neither changes anything.
func TestCloseReopenRestock(t *testing.T) {
	each(t, []stock.Option{split(3)}, func(t *testing.T, e *requestEnv) {
		require.NoError(t, e.r.Load(ctx, "cl", 6))
		require.ErrorIs(t, e.r.Load(ctx, "cl", 6), stock.ErrLoaded)
		require.NoError(t, testkit.Err(e.r.Hold(ctx, req("cl", "hold", "a", 1), time.Hour)))
		require.NoError(t, testkit.Err(e.r.Hold(ctx, req("cl", "hold2", "b", 1), time.Hour)))
		_, err := e.r.Deduct(ctx, req("cl", "sale", "c", 1))
		require.NoError(t, err)
		require.NoError(t, e.r.CloseItem(ctx, "cl"))
		require.NoError(t, e.r.CloseItem(ctx, "cl"))
		assert.True(t, levels(t, e.r, "cl").Closed)
		for i := range 10 {
			require.ErrorIs(t, testkit.Err(e.r.Deduct(ctx, req("cl", fmt.Sprintf("x%d", i), fmt.Sprintf("z%d", i), 1))), stock.ErrClosed)
			_, err = e.r.Hold(ctx, req("cl", fmt.Sprintf("y%d", i), "", 1), time.Hour)
			require.ErrorIs(t, err, stock.ErrClosed)
		}
		require.NoError(t, testkit.Err(e.r.Confirm(ctx, "cl", "hold")))
		require.NoError(t, testkit.Err(e.r.Cancel(ctx, "cl", "hold2")))
		require.NoError(t, testkit.Err(e.r.Restore(ctx, "cl", "sale")))
		require.ErrorIs(t, testkit.Err(e.r.DeductMany(ctx, stock.Cart{ID: "cart", Lines: []stock.Line{{SKU: "cl", Qty: 1}}})), stock.ErrClosed)
		_, err = e.r.HoldMany(ctx, stock.Cart{ID: "cart2", Lines: []stock.Line{{SKU: "cl", Qty: 1}}}, time.Hour)
		require.ErrorIs(t, err, stock.ErrClosed)
		require.NoError(t, e.r.ReopenItem(ctx, "cl"))
		assert.Equal(t, stock.Levels{Available: 5, Sold: 1, Loaded: 6}, levels(t, e.r, "cl"))
		for i := range 3 {
			assert.Equal(t, i > 0, must(e.r.Restock(ctx, "cl", "rs", 4))(t).Replayed)
		}
		require.ErrorIs(t, testkit.Err(e.r.Restore(ctx, "cl", "rs")), stock.ErrConflict, "restocks cannot be restored")
		assert.Equal(t, stock.Levels{Available: 9, Sold: 1, Loaded: 10}, levels(t, e.r, "cl"))
		deductEach(t, e.r, stock.Request{SKU: "cl", User: "one", Qty: 1}, numbered("after", 9)...)
		require.ErrorIs(t, testkit.Err(e.r.Deduct(ctx, req("cl", "after9", "one", 1))), stock.ErrSoldOut)
		require.ErrorIs(t, e.r.CloseItem(ctx, "never-loaded"), stock.ErrNotLoaded)
		require.ErrorIs(t, testkit.Err(e.r.Levels(ctx, "never-loaded")), stock.ErrNotLoaded)
		_, err = e.r.Deduct(ctx, req("never-loaded", "q", "a", 1))
		require.ErrorIs(t, err, stock.ErrNotLoaded)
	})
}

// It runs on the split items' rig: the same backends, split option and environment.
type env = requestEnv

var lifecycleSplit, lifecycleEach = split, each

// sku makes a unique item name per test and backend.
var lifecycleN atomic.Int64

func sku(prefix string) string { return fmt.Sprintf("%s-n%d", prefix, lifecycleN.Add(1)) }

// pass runs one reconcile pass over the given items with a tiny retention.
func pass(t *testing.T, e *env, r *stock.Reserver, store stock.Store, skus ...string) map[string]stockops.Report {
	t.Helper()
	rc := must(stockops.NewReconciler(r, store, &stock.ReconcileOptions{Items: skus, Retention: time.Millisecond}))(t)
	res := must(rc.Pass(context.Background()))(t)
	out := map[string]stockops.Report{}
	for i, rp := range res.Reports {
		require.NoError(t, res.Errors[i], "%s", rp.SKU)
		out[rp.SKU] = rp
	}
	return out
}

// storeFor loads sku with qty units in a new memstore, then in r, and returns the store.
func storeFor(t *testing.T, r *stock.Reserver, sku string, qty int64) *memstore.Store {
	t.Helper()
	store := memstore.New()
	require.NoError(t, store.Load(context.Background(), sku, qty))
	require.NoError(t, r.Load(context.Background(), sku, qty))
	return store
}

// soldOneDrained is storeFor, then one unit of sku sold to the user "u" under the id "d" and
// delivered to the store.
func soldOneDrained(t *testing.T, r *stock.Reserver, sku string, qty int64) *memstore.Store {
	t.Helper()
	store := storeFor(t, r, sku, qty)
	deductEach(t, r, stock.Request{SKU: sku, User: "u", Qty: 1}, "d")
	lifecycleDrain(t, r, store, sku)
	return store
}

func lifecycleDrain(t *testing.T, r *stock.Reserver, store stock.Store, skus ...string) {
	t.Helper()
	rl := must(stockops.NewRelay(r, store, nil, &stock.RelayOptions{Items: skus}))(t)
	for range 50 {
		st := must(rl.Once(context.Background()))(t)
		pending := int64(0)
		for _, s := range skus {
			p, d, err := stockops.Pending(context.Background(), r, s)
			require.NoError(t, err)
			require.Zero(t, d, "dead letters of %s", s)
			pending += p
		}
		_ = st
		if pending == 0 {
			return
		}
	}
	t.Fatalf("relay did not drain %v", skus)
}

// lifecycleKeys lists every key that holds the item's name in its hash tag (standalone and
// miniredis only: a cluster's SCAN is per node).
func lifecycleKeys(t *testing.T, e *env, sku string) []string {
	t.Helper()
	var keys []string
	if e.name == "cluster" || strings.Contains(e.name, "cluster") {
		for _, node := range e.c.Nodes() {
			ks, err := node.Do(ctx, node.B().Keys().Pattern("*"+sku+"*").Build()).AsStrSlice()
			if err != nil && !rueidis.IsRedisNil(err) {
				// a replica or a moved answer: ignore, masters answer
				continue
			}
			keys = append(keys, ks...)
		}
		return keys
	}
	return must(e.c.Do(context.Background(), e.c.B().Keys().Pattern("*"+sku+"*").Build()).AsStrSlice())(t)
}

// retire delists an item (already drained into store) and runs passes until it is retired.
func retire(t *testing.T, e *env, store stock.Store, sku string) {
	t.Helper()
	require.NoError(t, e.r.Delist(ctx, sku))
	e.advance(20 * time.Millisecond)
	for range 5 {
		rp := pass(t, e, e.r, store, sku)[sku]
		if rp.Retired {
			return
		}
		e.advance(20 * time.Millisecond)
	}
	t.Fatalf("%s not retired", sku)
}

// class names the sentinel an error wraps.
func class(err error) string {
	if err == nil {
		return "nil"
	}
	for _, s := range []error{stock.ErrUnknownOutcome, stock.ErrSoldOut, stock.ErrInsufficient, stock.ErrNotLoaded,
		stock.ErrLoaded, stock.ErrConflict, stock.ErrRestored, stock.ErrUserLimit, stock.ErrUnknownID, stock.ErrClosed,
		stock.ErrExpired, stock.ErrConfirmed, stock.ErrInvalid} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	return "other: " + err.Error()
}

// TestRetireReloadOldIDs: after retire + reload, the old ids of a split item behave as those
// of a plain item retired and reloaded the same way; no key of the item is left behind.
func TestRetireReloadOldIDs(t *testing.T) {
	lifecycleEach(t, []stock.Option{lifecycleSplit(3)}, func(t *testing.T, e *env) {
		store := memstore.New()
		split, plain := sku("it:em~x"), sku("plain:em~x")
		type res struct {
			err error
			rc  stock.Receipt
		}
		run := func(sku string) []res {
			var out []res
			do := func(rc stock.Receipt, err error) { out = append(out, res{err, rc}) }
			require.NoError(t, store.Load(ctx, sku, 10))
			require.NoError(t, e.r.Load(ctx, sku, 10))
			for i := range 4 {
				do(e.r.Deduct(ctx, req(sku, fmt.Sprintf("d%d", i), fmt.Sprintf("u%d", i), 1)))
			}
			do(e.r.Restore(ctx, sku, "d0"))
			do(e.r.Hold(ctx, req(sku, "h1", "u9", 2), time.Minute))
			do(e.r.Confirm(ctx, sku, "h1"))
			do(e.r.Restore(ctx, sku, "ghost")) // a tombstone
			lifecycleDrain(t, e.r, store, sku)
			retire(t, e, store, sku)
			_, err := e.r.Levels(ctx, sku)
			out = append(out, res{err: err})
			_, err = e.r.Ledger(ctx, sku, "d1")
			out = append(out, res{err: err})
			do(e.r.Deduct(ctx, req(sku, "d1", "u1", 1)))
			do(e.r.Hold(ctx, req(sku, "hx", "u1", 1), time.Minute))
			do(e.r.Restore(ctx, sku, "d2"))
			do(e.r.Cancel(ctx, sku, "h1"))
			do(e.r.Confirm(ctx, sku, "h1"))
			do(e.r.Extend(ctx, sku, "h1", time.Minute))
			do(e.r.Restock(ctx, sku, "rs", 1))
			require.ErrorIs(t, e.r.CloseItem(ctx, sku), stock.ErrNotLoaded)
			require.ErrorIs(t, e.r.ReopenItem(ctx, sku), stock.ErrNotLoaded)
			require.NoError(t, e.r.Load(ctx, sku, 5))
			// old ids: a deduct, a replay of a restored id, a tombstoned id, a hold confirmed
			do(e.r.Deduct(ctx, req(sku, "d1", "u1", 1)))
			do(e.r.Deduct(ctx, req(sku, "d0", "u0", 1)))
			do(e.r.Deduct(ctx, req(sku, "ghost", "u7", 1)))
			do(e.r.Deduct(ctx, req(sku, "h1", "u9", 2)))
			do(e.r.Deduct(ctx, req(sku, "d2", "other", 1)))
			l := must(e.r.Levels(ctx, sku))(t)
			out = append(out, res{rc: stock.Receipt{Qty: l.Sold, Remaining: l.Available}})
			return out
		}
		p := run(plain)
		s := run(split)
		require.Len(t, s, len(p))
		for i := range p {
			assert.Equal(t, class(p[i].err), class(s[i].err), "step %d: %v / %v", i, p[i].err, s[i].err)
			if p[i].err == nil {
				assert.Equal(t, p[i].rc.Qty, s[i].rc.Qty, "step %d qty", i)
				assert.Equal(t, p[i].rc.Replayed, s[i].rc.Replayed, "step %d replayed", i)
			}
		}
	})
}

// TestRetireLeavesNoKeys: a split item with claims, transfers and tombstones leaves no key
// behind once retired, and is out of the registry.
func TestRetireLeavesNoKeys(t *testing.T) {
	for _, n := range []int{2, 5} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			lifecycleEach(t, []stock.Option{lifecycleSplit(n)}, func(t *testing.T, e *env) {
				sku := sku("keys:~x")
				store := storeFor(t, e.r, sku, 20)
				// one user takes everything: transfers from every bucket
				deductEach(t, e.r, stock.Request{SKU: sku, User: "whale", Qty: 1}, numbered("d", 20)...)
				for i := range 5 {
					require.NoError(t, testkit.Err(e.r.Restore(ctx, sku, fmt.Sprintf("d%d", i))))
					_, err := e.r.Restore(ctx, sku, fmt.Sprintf("ghost%d", i))
					require.ErrorIs(t, err, stock.ErrUnknownID) // and a tombstone
				}
				lifecycleDrain(t, e.r, store, sku)
				require.NotEmpty(t, lifecycleKeys(t, e, sku))
				retire(t, e, store, sku)
				// what is left: each bucket's item hash, with only its retired mark and delist time
				left := lifecycleKeys(t, e, sku)
				assert.Len(t, left, n, "%v", left)
				for _, k := range left {
					require.True(t, strings.HasSuffix(k, "}"), "key left behind: %s", k)
					m := must(e.c.Do(ctx, e.c.B().Hgetall().Key(k).Build()).AsStrMap())(t)
					assert.Len(t, m, 2, "%s: %v", k, m)
					assert.Equal(t, "1", m["x"], "%s: %v", k, m)
				}
				for it, err := range stockops.Items(ctx, e.r) {
					require.NoError(t, err)
					assert.False(t, strings.HasPrefix(it, sku), "registry still has %s", it)
				}
			})
		})
	}
}

// TestDelistRacing: Delist while buyers deduct, hold, restore and cancel on every bucket.
// Every operation is either done or refused with ErrClosed; the counters stay whole; the item
// retires once drained and the Store agrees with what the buyers were told.
func TestDelistRacing(t *testing.T) {
	lifecycleEach(t, []stock.Option{lifecycleSplit(4)}, func(t *testing.T, e *env) {
		sku := sku("race")
		const stockN = 200
		store := storeFor(t, e.r, sku, stockN)
		var sold, bad atomic.Int64
		var wg sync.WaitGroup
		var mu sync.Mutex
		var errs []string
		for g := range 8 {
			wg.Go(func() {
				for i := range 30 {
					id := fmt.Sprintf("g%d-%d", g, i)
					user := fmt.Sprintf("u%d-%d", g, i%5)
					var err error
					switch i % 3 {
					case 0:
						_, err = e.r.Deduct(ctx, req(sku, id, user, 1))
						if err == nil {
							sold.Add(1)
							if i%2 == 0 {
								if _, err = e.r.Restore(ctx, sku, id); err == nil {
									sold.Add(-1)
								}
							}
						}
					case 1:
						_, err = e.r.Hold(ctx, req(sku, id, user, 1), time.Hour)
						if err == nil {
							if _, err = e.r.Confirm(ctx, sku, id); err == nil {
								sold.Add(1)
							} else {
								_, err = e.r.Cancel(ctx, sku, id)
							}
						}
					case 2:
						_, err = e.r.Hold(ctx, req(sku, id, user, 1), time.Hour)
						if err == nil {
							_, err = e.r.Cancel(ctx, sku, id)
						}
					}
					if err != nil && !errors.Is(err, stock.ErrClosed) {
						bad.Add(1)
						mu.Lock()
						errs = append(errs, id+": "+err.Error())
						mu.Unlock()
					}
				}
			})
		}
		time.Sleep(5 * time.Millisecond)
		require.NoError(t, e.r.Delist(ctx, sku))
		wg.Wait()
		require.Zero(t, bad.Load(), "%v", errs)
		l := testkit.Levels(t, e.r, sku)
		assert.True(t, l.Closed)
		assert.Equal(t, sold.Load(), l.Sold)
		// cancels and confirms of live holds work after delist; no hold should be left
		assert.Zero(t, l.Held)
		lifecycleDrain(t, e.r, store, sku)
		assert.Equal(t, stockN-sold.Load(), must(store.Remaining(ctx, sku))(t))
		e.advance(20 * time.Millisecond)
		rp := pass(t, e, e.r, store, sku)[sku]
		require.True(t, rp.Retired, "%v", rp)
		require.NoError(t, e.r.Load(ctx, sku, 3))
		assert.Equal(t, stock.Levels{Available: 3, Loaded: 3}, testkit.Levels(t, e.r, sku))
	})
}

// hook is a rueidis client that calls hook once, after the first command (or pipeline) that
// match accepts has run: a deterministic interleaving of another process's work.
type hook struct {
	rueidis.Client
	mu    sync.Mutex
	match func(cmd []string) bool
	hook  func()
	fired bool
}

// matches says whether cmds hold a command match accepts (read before the commands run: rueidis
// recycles them).
func (h *hook) matches(cmds ...rueidis.Completed) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fired || h.match == nil {
		return false
	}
	for _, c := range cmds {
		if cs := c.Commands(); len(cs) > 0 && h.match(cs) {
			h.fired = true
			return true
		}
	}
	return false
}

func (h *hook) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	m := h.matches(cmd)
	res := h.Client.Do(ctx, cmd)
	if m {
		h.hook()
	}
	return res
}

func (h *hook) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	m := h.matches(cmds...)
	res := h.Client.DoMulti(ctx, cmds...)
	if m {
		h.hook()
	}
	return res
}

// didFire says whether the hook ran.
func (h *hook) didFire() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fired
}

// registry returns the registry's members that are the item or its buckets.
func registry(t *testing.T, e *env, sku string) []string {
	t.Helper()
	var out []string
	for it, err := range stockops.Items(context.Background(), e.r) {
		require.NoError(t, err)
		if it == sku || strings.HasPrefix(it, sku+"|") {
			out = append(out, it)
		}
	}
	return out
}

// TestLoadAfterRetirePassBetween: Load of a retired item, with a reconcile pass run between
// Load's registry write and its creation of the item (another process's pass): the item must
// end up both loaded and in the registry (else no relay delivers its events), as a plain item
// does.
func TestLoadAfterRetirePassBetween(t *testing.T) {
	lifecycleEach(t, []stock.Option{lifecycleSplit(3)}, func(t *testing.T, e *env) {
		for _, sku := range []string{sku("plain-lb"), sku("lb")} {
			store := soldOneDrained(t, e.r, sku, 3)
			retire(t, e, store, sku)
			require.Empty(t, registry(t, e, sku))
			store2 := memstore.New() // the database's row for the item's new life
			require.NoError(t, store2.Load(ctx, sku, 5))
			h := &hook{Client: e.c}
			h.match = func(cmd []string) bool { return strings.EqualFold(cmd[0], "SADD") }
			h.hook = func() {
				rc, err := stockops.NewReconciler(e.r, store2, &stock.ReconcileOptions{Items: []string{sku}, Retention: time.Millisecond})
				require.NoError(t, err)
				_, err = rc.Pass(ctx)
				require.NoError(t, err)
			}
			loader := testkit.NewReserver(t, h, lifecycleSplit(3))
			require.NoError(t, loader.Load(ctx, sku, 5))
			require.True(t, h.didFire())
			assert.Equal(t, int64(5), testkit.Levels(t, e.r, sku).Loaded, "%s", sku)
			reg := registry(t, e, sku)
			if strings.HasPrefix(sku, "plain") {
				assert.Equal(t, []string{sku}, reg, "%s: loaded but not registered", sku)
			} else {
				assert.Len(t, reg, 3, "%s: loaded but not (all) registered: %v", sku, reg)
			}
			// the relay (by the registry) delivers a new sale
			deductEach(t, e.r, stock.Request{SKU: sku, User: "u2", Qty: 1}, "new")
			require.NoError(t, testkit.Err(must(stockops.NewRelay(e.r, store2, nil, nil))(t).Once(ctx)))
			assert.Equal(t, int64(4), must(store2.Remaining(ctx, sku))(t), "%s: the new sale never reached the store", sku)
		}
	})
}

// TestLoadDuringRetirement: Load called between two buckets' retirement steps of a pass is
// refused (ErrLoaded) and changes nothing; the pass (or the next) finishes the retirement, then
// Load works.
func TestLoadDuringRetirement(t *testing.T) {
	lifecycleEach(t, []stock.Option{lifecycleSplit(4)}, func(t *testing.T, e *env) {
		sku := sku("ld")
		store := soldOneDrained(t, e.r, sku, 8)
		require.NoError(t, e.r.Delist(ctx, sku))
		e.advance(20 * time.Millisecond)
		var loadErr error
		h := &hook{Client: e.c}
		srems := 0
		h.match = func(cmd []string) bool {
			if strings.EqualFold(cmd[0], "SREM") {
				srems++
				return srems == 2 // after the second bucket's retirement
			}
			return false
		}
		h.hook = func() { loadErr = e.r.Load(ctx, sku, 4) }
		rr := testkit.NewReserver(t, h, lifecycleSplit(4))
		rp := pass(t, e, rr, store, sku)[sku]
		require.True(t, h.didFire())
		require.ErrorIs(t, loadErr, stock.ErrLoaded)
		if !rp.Retired {
			rp = pass(t, e, e.r, store, sku)[sku]
		}
		require.True(t, rp.Retired, "%v", rp)
		require.ErrorIs(t, testkit.Err(e.r.Levels(ctx, sku)), stock.ErrNotLoaded)
		require.NoError(t, e.r.Load(ctx, sku, 4))
		assert.Equal(t, stock.Levels{Available: 4, Loaded: 4}, testkit.Levels(t, e.r, sku))
	})
}

// cut is a rueidis client whose n-th command (counting a pipeline's commands one by one)
// fails as a broken call would: it is never sent.
type cut struct {
	rueidis.Client
	mu    sync.Mutex
	n     int
	count int
	cut   bool
}

func (c *cut) next(k int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	before := c.count
	c.count += k
	if c.n > before && c.n <= c.count {
		c.cut = true
		return true
	}
	return false
}

// state reads whether the cut happened and how many commands went through (the Reserver's
// background hint writer uses the client too).
func (c *cut) state() (cut bool, count int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cut, c.count
}

func lifecycleDead() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

func (c *cut) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if c.next(1) {
		return c.Client.Do(lifecycleDead(), cmd)
	}
	return c.Client.Do(ctx, cmd)
}

func (c *cut) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	if c.next(len(cmds)) {
		return c.Client.DoMulti(lifecycleDead(), cmds...)
	}
	return c.Client.DoMulti(ctx, cmds...)
}

// TestDelistCutEverywhere: a Delist of a split item cut at each of its Redis calls in turn.
// After the cut no bucket may sell beside a delisted one; ReopenItem either reopens the whole
// item (nothing was delisted) or refuses (ErrClosed); a second Delist finishes the job and the
// item retires.
func TestDelistCutEverywhere(t *testing.T) {
	lifecycleEach(t, []stock.Option{lifecycleSplit(3)}, func(t *testing.T, e *env) {
		for n := 1; n < 40; n++ {
			sku := sku("cut")
			store := soldOneDrained(t, e.r, sku, 100)
			cc := &cut{Client: e.c, n: n}
			cr := testkit.NewReserver(t, cc, lifecycleSplit(3))
			derr := cr.Delist(ctx, sku)
			if cut, count := cc.state(); !cut {
				require.NoError(t, derr)
				t.Logf("Delist makes %d calls", count)
				break
			}
			require.Error(t, derr, "cut %d", n)
			// after the cut: new buyers of every bucket
			sold := 0
			for i := range 12 {
				if _, err := e.r.Deduct(ctx, req(sku, fmt.Sprint("b", i), fmt.Sprint("b", i), 1)); err == nil {
					sold++
				} else {
					require.ErrorIs(t, err, stock.ErrClosed, "cut %d", n)
				}
			}
			l := testkit.Levels(t, e.r, sku)
			if sold > 0 {
				t.Logf("cut %d: %d sold after the cut (closed %v)", n, sold, l.Closed)
			}
			rerr := e.r.ReopenItem(ctx, sku)
			if rerr != nil {
				require.ErrorIs(t, rerr, stock.ErrClosed, "cut %d", n)
				// refused: nothing reopened, whatever bucket a buyer lands in
				for i := range 12 {
					_, err := e.r.Deduct(ctx, req(sku, fmt.Sprint("ar", i), fmt.Sprint("ar", i), 1))
					require.ErrorIs(t, err, stock.ErrClosed, "cut %d: a bucket reopened by a refused ReopenItem", n)
				}
			}
			lifecycleDrain(t, e.r, store, sku)
			require.NoError(t, e.r.Delist(ctx, sku), "cut %d", n)
			require.ErrorIs(t, testkit.Err(e.r.Deduct(ctx, req(sku, "afterDelist", "ad", 1))), stock.ErrClosed)
			require.ErrorIs(t, e.r.ReopenItem(ctx, sku), stock.ErrClosed)
			e.advance(20 * time.Millisecond)
			rp := pass(t, e, e.r, store, sku)[sku]
			require.True(t, rp.Retired, "cut %d: %v", n, rp)
		}
	})
}

// TestReloadInOtherForm: an item retired in one form (plain, or split over 3 buckets) answers
// ErrNotLoaded and "may be loaded again": also in the other form, or split over another count,
// by a Reserver configured so from then on.
func TestReloadInOtherForm(t *testing.T) {
	lifecycleEach(t, nil, func(t *testing.T, e *env) {
		forms := map[string]stock.Option{
			"plain":  stock.WithBuckets(func(string) int { return 1 }),
			"split3": lifecycleSplit(3),
			"split5": lifecycleSplit(5),
		}
		for _, tc := range [][2]string{{"plain", "split3"}, {"split3", "plain"}, {"split3", "split5"}, {"split5", "split3"}} {
			t.Run(tc[0]+"-"+tc[1], func(t *testing.T) {
				sku := sku("of")
				first := e.another(forms[tc[0]])
				store := soldOneDrained(t, first, sku, 4)
				fe := *e
				fe.r = first
				retire(t, &fe, store, sku)
				second := e.another(forms[tc[1]])
				require.ErrorIs(t, testkit.Err(second.Levels(ctx, sku)), stock.ErrNotLoaded)
				require.NoError(t, second.Load(ctx, sku, 6), "%s retired, loaded again as %s", tc[0], tc[1])
				require.Equal(t, stock.Levels{Available: 6, Loaded: 6}, testkit.Levels(t, second, sku))
				testkit.Sell(t, second, sku, "n", "n", 6)
			})
		}
	})
}

// After Close, Run and every other call return ErrReserverClosed at once.
func TestRunAfterCloseReturnsAtOnce(t *testing.T) {
	e := outsideMini(t)
	require.NoError(t, e.r.Close(e.ctx))
	start := time.Now()
	err := e.r.Run(context.Background(), stock.RunOptions{Store: e.store})
	assert.ErrorIs(t, err, stock.ErrReserverClosed, "Run after Close")
	assert.Less(t, time.Since(start), time.Second, "Run after Close returns at once")
	assert.ErrorIs(t, e.r.Load(e.ctx, "a", 1), stock.ErrReserverClosed, "Load after Close")
	if _, err := stockops.NewReconciler(e.r, e.store, nil); err == nil {
		rec, _ := stockops.NewReconciler(e.r, e.store, nil)
		assert.ErrorIs(t, testkit.Err(rec.Pass(e.ctx)), stock.ErrReserverClosed, "reconcile pass after Close")
	}
	assert.Empty(t, outsideKeys(t, e.c), "keys after Close")
}

// Close stops Run (which returns ErrReserverClosed), drains what is due to the store, and once
// it returned nothing more is written, even with calls in flight when it began.
func TestCloseWithCallsInFlightThenNothingWritten(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		if b.Name == "cluster" || b.Name == "sentinel" {
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			c := b.Client(t)
			r := must(stock.New(c))(t)
			store := memstore.New()
			require.NoError(t, r.Load(ctx, "a", 100000))
			_ = store.Load(ctx, "a", 100000)
			runErr := make(chan error, 1)
			go func() {
				runErr <- r.Run(ctx, stock.RunOptions{Store: store, GuardInterval: -1, Reconcile: &stock.ReconcileOptions{Interval: -1}})
			}()
			var wg sync.WaitGroup
			stop := make(chan struct{})
			var mu sync.Mutex
			took := map[string]bool{}
			for w := 0; w < 8; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						id := fmt.Sprintf("w%d-%d", w, i)
						_, err := r.Deduct(ctx, req("a", id, id, 1))
						if errors.Is(err, stock.ErrReserverClosed) {
							return
						}
						if err != nil {
							t.Errorf("deduct %s: %v", id, err)
							return
						}
						mu.Lock()
						took[id] = true
						mu.Unlock()
					}
				}(w)
			}
			time.Sleep(200 * time.Millisecond)
			require.NoError(t, r.Close(ctx), "Close")
			close(stop)
			wg.Wait()
			assert.ErrorIs(t, <-runErr, stock.ErrReserverClosed, "Run stopped by Close")
			dump := func() string {
				ks := outsideKeys(t, c)
				var sb strings.Builder
				for _, k := range ks {
					typ, _ := c.Do(ctx, c.B().Type().Key(k).Build()).ToString()
					switch typ {
					case "hash":
						m, _ := c.Do(ctx, c.B().Hgetall().Key(k).Build()).AsStrMap()
						fmt.Fprintf(&sb, "%s=%v;", k, len(m))
					case "zset":
						n, _ := c.Do(ctx, c.B().Zcard().Key(k).Build()).AsInt64()
						fmt.Fprintf(&sb, "%s=%d;", k, n)
					default:
						fmt.Fprintf(&sb, "%s;", k)
					}
				}
				return sb.String()
			}
			first := dump()
			time.Sleep(500 * time.Millisecond)
			assert.Equal(t, first, dump(), "Redis changed after Close returned")
			assert.ErrorIs(t, testkit.Err(r.Levels(ctx, "a")), stock.ErrReserverClosed, "Levels after Close")
			reader, _ := stock.New(c)
			defer reader.Close(ctx)
			lv := must(reader.Levels(ctx, "a"))(t)
			assert.Equal(t, int64(len(took)), lv.Sold, "sold vs acknowledged")
			rem, _ := store.Remaining(ctx, "a")
			assert.Equal(t, lv.Available, rem, "store remaining vs Redis available (drain left %d undelivered)", rem-lv.Available)
		})
	}
}
