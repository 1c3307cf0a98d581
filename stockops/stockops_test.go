package stockops_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// ---- helpers ----

func miniReserver(t *testing.T, opts ...stock.Option) (*stock.Reserver, *miniredis.Miniredis) {
	t.Helper()
	mr := miniredis.RunT(t)
	r, _ := realReserver(t, mr.Addr(), opts...)
	return r, mr
}

// realRedis starts a redis-server on a free loopback port, without persistence, and stops it
// when the test ends, and returns its address and a function that kills the server and starts
// a new one on the same port (a restart without persistence: a new run id, no data). It skips
// the test when STOCK_REDIS_SERVER is unset.
func realRedis(t *testing.T) (string, func()) {
	t.Helper()
	if redistest.ServerBinary(t) == "" {
		t.Skip("needs a real redis-server: set STOCK_REDIS_SERVER")
	}
	s := redistest.StartServer(t, "--appendonly", "no")
	return s.Addr(), func() { s.Kill(); s.Start() }
}

// wantFenced fails the test unless the guard's Check answers fenced as want, without error.
func wantFenced(t *testing.T, g *stockops.FailoverGuard, want bool, when string) {
	t.Helper()
	if fenced, err := g.Check(context.Background()); err != nil || fenced != want {
		t.Fatalf("%s: fenced %v, %v; want fenced %v", when, fenced, err, want)
	}
}

// realReserver is a Reserver (testkit.NewReserver) on a fresh-reading client of addr.
func realReserver(t *testing.T, addr string, opts ...stock.Option) (*stock.Reserver, rueidis.Client) {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return testkit.NewReserver(t, c, opts...), c
}

func load(t *testing.T, r *stock.Reserver, db *memstore.Store, sku string, qty int64) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, r.Load(ctx, sku, qty))
	if db != nil {
		require.NoError(t, db.Load(ctx, sku, qty))
	}
}

func deduct(t *testing.T, r *stock.Reserver, sku, id string, qty int64) stock.Receipt {
	t.Helper()
	rc, err := r.Deduct(context.Background(), stock.Request{SKU: sku, ID: id, Qty: qty})
	require.NoError(t, err, "deduct %s/%s", sku, id)
	return rc
}

// ---- constructors and arguments ----

// NewRelay: "Either [store or pub] may be nil, not both. opts may be nil for the defaults."
// A bad option is ErrInvalid (the package's "bad input is refused with ErrInvalid ... before
// anything is sent to Redis"); a nil *stock.Reserver too, at construction, not by a nil pointer
// dereference in the first Once, far from the mistake.
func TestNewRelayArguments(t *testing.T) {
	r, _ := miniReserver(t)
	db := memstore.New()
	if rl, err := stockops.NewRelay(r, nil, nil, nil); !errors.Is(err, stock.ErrInvalid) || rl != nil {
		t.Fatalf("NewRelay(nil, nil) = %v, %v; want nil, ErrInvalid", rl, err)
	}
	if rl, err := stockops.NewRelay(nil, db, nil, nil); !errors.Is(err, stock.ErrInvalid) || rl != nil {
		t.Fatalf("NewRelay(nil Reserver) = %v, %v; want nil, ErrInvalid", rl, err)
	}
	var noStore stock.Store
	var noPub stock.Publisher
	if _, err := stockops.NewRelay(r, noStore, noPub, &stock.RelayOptions{}); !errors.Is(err, stock.ErrInvalid) {
		t.Fatalf("nil interfaces: %v; want ErrInvalid", err)
	}
	require.NoError(t, testkit.Err(stockops.NewRelay(r, db, nil, nil)), "store only")
	pub := stock.PublisherFunc(func(context.Context, stock.Event) error { return nil })
	require.NoError(t, testkit.Err(stockops.NewRelay(r, nil, pub, (*stock.RelayOptions)(nil))), "publisher only, typed-nil options")
	for _, o := range []stock.RelayOptions{
		{Batch: 10001}, {Batch: -1}, {Lease: -time.Second}, {MinBackoff: time.Minute, MaxBackoff: time.Second},
		{Items: []string{"bad{name}"}}, {Poll: -1},
	} {
		if _, err := stockops.NewRelay(r, db, nil, &o); !errors.Is(err, stock.ErrInvalid) {
			t.Errorf("NewRelay(%+v) = %v; want ErrInvalid", o, err)
		}
	}
}

// NewReconciler: a reconciler needs a store and a Reserver (ErrInvalid at construction); opts
// may be nil; Run refuses a negative Interval ("stockops.Reconciler.Run refuses it");
// FailoverGuard.Run refuses a non-positive interval.
func TestNewReconcilerArguments(t *testing.T) {
	r, _ := miniReserver(t)
	var noStore stock.Store
	if rc, err := stockops.NewReconciler(r, noStore, nil); !errors.Is(err, stock.ErrInvalid) || rc != nil {
		t.Fatalf("NewReconciler(nil store) = %v, %v; want nil, ErrInvalid", rc, err)
	}
	db := memstore.New()
	if rc, err := stockops.NewReconciler(nil, db, nil); !errors.Is(err, stock.ErrInvalid) || rc != nil {
		t.Fatalf("NewReconciler(nil Reserver) = %v, %v; want nil, ErrInvalid", rc, err)
	}
	require.NoError(t, testkit.Err(stockops.NewReconciler(r, db, (*stock.ReconcileOptions)(nil))), "typed-nil options")
	for _, o := range []stock.ReconcileOptions{{RepairLimit: -1}, {Items: []string{"a b"}}} {
		if _, err := stockops.NewReconciler(r, db, &o); !errors.Is(err, stock.ErrInvalid) {
			t.Errorf("NewReconciler(%+v) = %v; want ErrInvalid", o, err)
		}
	}
	rc := newReconciler(t, r, db, &stock.ReconcileOptions{Interval: -time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := rc.Run(ctx); !errors.Is(err, stock.ErrInvalid) {
		t.Fatalf("Reconciler.Run with a negative Interval = %v; want ErrInvalid", err)
	}
	g := stockops.NewFailoverGuard(r)
	if err := g.Run(ctx, 0); !errors.Is(err, stock.ErrInvalid) {
		t.Fatalf("FailoverGuard.Run(0) = %v; want ErrInvalid", err)
	}
}

// ---- concurrency beside Reserver.Run ----

// "Everything here is safe for concurrent use", and Run "may be called once per Reserver at a
// time; the Reserver's other methods stay usable meanwhile, and more relays and reconcilers ...
// may run beside it". Under live deducts, restores and holds, stockops relays, repairing
// reconciler passes, sweeps, cart recovery and the reads run beside Run: no event is applied
// twice, no pass finds drift or repairs anything (nothing drifted), and at the end Redis and
// the Store agree.
func TestConcurrentBesideRun(t *testing.T) {
	r, _ := miniReserver(t)
	db := memstore.New()
	skus := []string{"p0", "p1", "p2", "p3"}
	for _, s := range skus {
		load(t, r, db, s, 500)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() {
		runDone <- r.Run(ctx, stock.RunOptions{Store: db, SweepInterval: 20 * time.Millisecond,
			Relay:     &stock.RelayOptions{Poll: 5 * time.Millisecond, MinBackoff: 10 * time.Millisecond},
			Reconcile: &stock.ReconcileOptions{Interval: 50 * time.Millisecond}, RecoverCartsAfter: time.Minute})
	}()
	rl := newRelay(t, r, db, nil, &stock.RelayOptions{MinBackoff: 10 * time.Millisecond})
	rec := newReconciler(t, r, db, nil)
	var mu sync.Mutex
	var problems []string
	bad := func(f string, a ...any) { mu.Lock(); problems = append(problems, fmt.Sprintf(f, a...)); mu.Unlock() }
	checkReports := func(where string, reps []stockops.Report) {
		for _, rp := range reps {
			if rp.Drift != 0 || rp.Adjusted != 0 || rp.Rebuilt || rp.Requeued != 0 || rp.NeedsHuman != "" || rp.Missing {
				bad("%s: %s", where, rp)
			}
		}
	}
	var wg sync.WaitGroup
	stopOps := make(chan struct{})
	opLoop := func(f func(i int)) {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stopOps:
					return
				default:
				}
				f(i)
			}
		})
	}
	opLoop(func(int) {
		if _, err := rl.Once(ctx); err != nil && ctx.Err() == nil {
			bad("relay once: %v", err)
		}
	})
	opLoop(func(int) {
		res, err := rec.Pass(ctx)
		if err != nil && ctx.Err() == nil && !errors.Is(err, stock.ErrRegistryLost) {
			// a pass on miniredis cannot record the epoch, but with no guard that is no error
			bad("pass: %v", err)
		}
		checkReports("stockops pass", res.Reports)
	})
	opLoop(func(int) {
		if _, err := stockops.Sweep(ctx, r); err != nil && ctx.Err() == nil {
			bad("sweep: %v", err)
		}
		if _, err := stockops.RecoverCarts(ctx, r, time.Minute); err != nil && ctx.Err() == nil {
			bad("recover: %v", err)
		}
		for _, s := range skus {
			if _, _, err := stockops.Pending(ctx, r, s); err != nil && ctx.Err() == nil {
				bad("pending: %v", err)
			}
		}
		n := 0
		for _, err := range stockops.Items(ctx, r) {
			if err != nil {
				bad("items: %v", err)
			}
			n++
		}
		if n != len(skus) {
			bad("Items listed %d items, want %d", n, len(skus))
		}
		for _, err := range stockops.Entries(ctx, r, skus[0]) {
			if err != nil {
				bad("entries: %v", err)
			}
		}
		time.Sleep(2 * time.Millisecond)
	})
	var workers sync.WaitGroup
	for w := range 4 {
		workers.Go(func() {
			for i := range 60 {
				sku := skus[(w+i)%len(skus)]
				id := fmt.Sprintf("w%d-%d", w, i)
				switch i % 4 {
				case 0, 1:
					if _, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: 2}); err != nil {
						bad("deduct: %v", err)
					}
				case 2:
					if _, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: 1}); err != nil {
						bad("deduct: %v", err)
					}
					if _, err := r.Restore(ctx, sku, id); err != nil {
						bad("restore: %v", err)
					}
				case 3:
					if _, err := r.Hold(ctx, stock.Request{SKU: sku, ID: id, Qty: 1}, time.Minute); err != nil {
						bad("hold: %v", err)
					}
					if _, err := r.Confirm(ctx, sku, id); err != nil {
						bad("confirm: %v", err)
					}
				}
			}
		})
	}
	workers.Wait()
	time.Sleep(200 * time.Millisecond)
	close(stopOps)
	wg.Wait()
	cancel()
	if err := <-runDone; !errors.Is(err, context.Canceled) {
		t.Errorf("Run returned %v", err)
	}
	bctx := context.Background()
	_, err := rl.Once(bctx)
	require.NoError(t, err)
	res, err := rec.Pass(bctx)
	require.NoError(t, err)
	checkReports("final pass", res.Reports)
	for _, s := range skus {
		lv, err := r.Levels(bctx, s)
		require.NoError(t, err)
		rem, _ := db.Remaining(bctx, s)
		if lv.Available+lv.Held != rem || lv.Loaded != lv.Available+lv.Held+lv.Sold {
			t.Errorf("%s: redis %+v, store %d", s, lv, rem)
		}
		if p, d, _ := stockops.Pending(bctx, r, s); p != 0 || d != 0 {
			t.Errorf("%s: pending %d, dead %d after the final relay pass", s, p, d)
		}
	}
	if m := db.MaxApplications(); m > 1 {
		t.Errorf("an event was applied %d times", m)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// ---- the failover guard made through stockops ----

// FailoverGuard (stockops.NewFailoverGuard): a guard that finds items loaded and no epoch, or
// other primaries than the recorded ones, fences the Reserver: Deduct, Hold and DeductMany
// answer ErrFailover (restores go on). A dry run or a pass limited by ReconcileOptions.Items
// does not lift it; a complete repairing stockops pass records the primaries
// (PassResult.EpochRecorded) and lifts this Reserver's fence "at once", without a Check; a pass
// in another process lifts it at the Reserver's next refused requests.
func TestGuardFenceLiftedByStockopsPass(t *testing.T) {
	ctx := context.Background()
	addr, _ := realRedis(t)
	r, c := realReserver(t, addr)
	db := memstore.New()
	g := stockops.NewFailoverGuard(r)
	wantFenced(t, g, false, "fresh deployment")
	load(t, r, db, "a", 10)
	load(t, r, db, "b", 10)
	deduct(t, r, "a", "before", 1)
	// Another primary than the one recorded (as after a failover).
	require.NoError(t, c.Do(ctx, c.B().Set().Key("stock:epoch").Value("another-primary").Build()).Error())
	wantFenced(t, g, true, "after the primaries changed")
	if _, err := r.Deduct(ctx, stock.Request{SKU: "a", ID: "x1", Qty: 1}); !errors.Is(err, stock.ErrFailover) {
		t.Fatalf("Deduct while fenced: %v; want ErrFailover", err)
	}
	if _, err := r.Hold(ctx, stock.Request{SKU: "a", ID: "x2", Qty: 1}, time.Minute); !errors.Is(err, stock.ErrFailover) {
		t.Fatalf("Hold while fenced: %v; want ErrFailover", err)
	}
	if _, err := r.DeductMany(ctx, stock.Cart{ID: "c", Lines: []stock.Line{{SKU: "a", Qty: 1}, {SKU: "b", Qty: 1}}}); !errors.Is(err, stock.ErrFailover) {
		t.Fatalf("DeductMany while fenced: %v; want ErrFailover", err)
	}
	if _, err := r.Restore(ctx, "a", "before"); err != nil {
		t.Fatalf("Restore while fenced: %v; restores go on", err)
	}
	for _, o := range []*stock.ReconcileOptions{{DryRun: true}, {Items: []string{"a", "b"}}} {
		rc := newReconciler(t, r, db, o)
		res, err := rc.Pass(ctx)
		if err != nil || res.EpochRecorded {
			t.Fatalf("pass %+v: EpochRecorded %v, %v; want false, nil", *o, res.EpochRecorded, err)
		}
		if _, err := r.Deduct(ctx, stock.Request{SKU: "a", ID: "x3", Qty: 1}); !errors.Is(err, stock.ErrFailover) {
			t.Fatalf("after pass %+v: Deduct %v; want ErrFailover still", *o, err)
		}
	}
	rc := newReconciler(t, r, db, nil)
	res, err := rc.Pass(ctx)
	if err != nil || !res.Complete || !res.EpochRecorded || res.EpochErr != nil {
		t.Fatalf("full pass: %+v, %v; want complete, epoch recorded", res, err)
	}
	if _, err := r.Deduct(ctx, stock.Request{SKU: "a", ID: "x4", Qty: 1}); err != nil {
		t.Fatalf("Deduct right after the pass (no Check): %v; the pass lifts the fence at once", err)
	}
	wantFenced(t, g, false, "Check after the pass")

	// Fenced again: the epoch lost, the items still there. "Once fenced, the Reserver's refused
	// requests check the guard too, at most once a second, so a pass in another process lifts
	// the fence even when nothing calls Check any more": here a second Reserver with no guard.
	require.NoError(t, c.Do(ctx, c.B().Del().Key("stock:epoch").Build()).Error())
	wantFenced(t, g, true, "items loaded, no epoch")
	if _, err := r.Deduct(ctx, stock.Request{SKU: "a", ID: "y0", Qty: 1}); !errors.Is(err, stock.ErrFailover) {
		t.Fatalf("Deduct: %v; want ErrFailover", err)
	}
	other, _ := realReserver(t, addr)
	if res, err := newReconciler(t, other, db, nil).Pass(ctx); err != nil || !res.EpochRecorded {
		t.Fatalf("other process's pass: %+v, %v", res, err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for i := 0; ; i++ {
		_, err := r.Deduct(ctx, stock.Request{SKU: "a", ID: fmt.Sprint("y", i+1), Qty: 1})
		if err == nil {
			break
		}
		if !errors.Is(err, stock.ErrFailover) || time.Now().After(deadline) {
			t.Fatalf("Deduct %d: %v; the fence should lift within about a second", i, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ---- reports ----

// Once, Pass and Item must describe the same situation with the same Report ("Pass reconciles
// every item once, as Once does, and returns what it found item by item"): every field is
// carried over through the stockops types. A dry run, so the situation stays put between the
// three calls. The situation sets most fields: drift, pending and dead-letter events, a
// registry entry lost (Unregistered, ErrRegistryLost on Once and Pass alike).
func TestReportSameThroughOncePassItem(t *testing.T) {
	ctx := context.Background()
	r, mr := miniReserver(t)
	db := memstore.New()
	load(t, r, db, "a", 10)
	load(t, r, db, "b", 10)
	deduct(t, r, "a", "o1", 2)
	deduct(t, r, "b", "o1", 2)
	rl := newRelay(t, r, db, nil, nil)
	if st, err := rl.Once(ctx); err != nil || st.Delivered != 2 || st.Claimed != 2 {
		t.Fatalf("relay: %+v, %v", st, err)
	}
	deduct(t, r, "a", "o3", 1) // a dead letter: the store rejects it as invalid
	db.FailWith(func(ev stock.Event) error {
		if ev.ID == "o3" {
			return fmt.Errorf("no such product: %w", stock.ErrInvalid)
		}
		return nil
	})
	if st, err := rl.Once(ctx); err != nil || st.DeadLettered != 1 {
		t.Fatalf("relay: %+v, %v; want 1 dead-lettered", st, err)
	}
	db.FailWith(nil)
	deduct(t, r, "a", "o2", 1) // pending
	if p, d, err := stockops.Pending(ctx, r, "a"); p != 1 || d != 1 || err != nil {
		t.Fatalf("Pending = %d, %d, %v; want 1, 1", p, d, err)
	}
	db.Set("b", 5) // drift 3 on b
	mr.SRem("stock:items", "b")

	dry := newReconciler(t, r, db, &stock.ReconcileOptions{DryRun: true})
	ia, err := dry.Item(ctx, "a")
	require.NoError(t, err)
	ib, err := dry.Item(ctx, "b")
	require.NoError(t, err)
	once, errOnce := dry.Once(ctx)
	pass, errPass := dry.Pass(ctx)
	if !errors.Is(errOnce, stock.ErrRegistryLost) || !errors.Is(errPass, stock.ErrRegistryLost) {
		t.Fatalf("Once: %v; Pass: %v; both want ErrRegistryLost", errOnce, errPass)
	}
	if len(once) != 2 || len(pass.Reports) != 2 || len(pass.Errors) != 2 {
		t.Fatalf("once %d reports, pass %d reports %d errors; want 2", len(once), len(pass.Reports), len(pass.Errors))
	}
	if ib.Drift != 3 || !ib.Unregistered || ib.StoreRemaining != 5 || ib.Available != 8 {
		t.Fatalf("item b: %#v", ib)
	}
	if ia.Pending != 1 || ia.DeadLetters != 1 || ia.InFlight != 2 || ia.Drift != 0 || ia.NeedsHuman == "" {
		t.Fatalf("item a: %#v; want pending events in flight", ia)
	}
	// Item does not know the registry: it reports b as unregistered too (it looks at the key).
	for i, want := range []stockops.Report{ia, ib} {
		if once[i] != want {
			t.Errorf("Once report %d:\n%#v\nItem:\n%#v", i, once[i], want)
		}
		if pass.Reports[i] != want {
			t.Errorf("Pass report %d:\n%#v\nItem:\n%#v", i, pass.Reports[i], want)
		}
	}
	if len(pass.Unregistered) != 1 || pass.Unregistered[0] != "b" || !pass.Complete || pass.EpochRecorded {
		t.Errorf("PassResult: %+v", pass)
	}
}

// ---- Sweep ----

// Sweep: "releases the holds past their deadline of the given items, or of every item in the
// registry when none is given ... An item that fails does not stop the others: the errors of
// all items are joined. A corrupt ledger entry is an error that names its id, and that step
// releases nothing." Bad names are ErrInvalid before anything is sent; an item named twice is
// not released twice.
func TestSweep(t *testing.T) {
	ctx := context.Background()
	r, mr := miniReserver(t)
	now := time.Now()
	mr.SetTime(now) // the scripts read TIME: miniredis's clock
	for _, s := range []string{"a", "b", "bad"} {
		load(t, r, nil, s, 10)
		_, err := r.Hold(ctx, stock.Request{SKU: s, ID: "h1", Qty: 3}, time.Second)
		require.NoError(t, err)
	}
	if n, err := stockops.Sweep(ctx, r, "a", "b"); n != 0 || err != nil {
		t.Fatalf("Sweep before the deadline = %d, %v", n, err)
	}
	mr.SetTime(now.Add(5 * time.Second))
	for _, skus := range [][]string{{""}, {"a", "b{"}, {"a", "has space"}} {
		if n, err := stockops.Sweep(ctx, r, skus...); n != 0 || !errors.Is(err, stock.ErrInvalid) {
			t.Fatalf("Sweep(%q) = %d, %v; want 0, ErrInvalid", skus, n, err)
		}
	}
	lv, _ := r.Levels(ctx, "a")
	require.EqualValues(t, 3, lv.Held, "an invalid Sweep released holds of a: %+v", lv)
	if n, err := stockops.Sweep(ctx, r, "a", "a", "a"); n != 3 || err != nil {
		t.Fatalf("Sweep(a, a, a) = %d, %v; want 3 units, nil", n, err)
	}
	mr.HSet("stock:{bad}:l", "h1", "garbage")
	n, err := stockops.Sweep(ctx, r) // every item: bad fails, b is still released
	if n != 3 || err == nil || !strings.Contains(err.Error(), "h1") {
		t.Fatalf("Sweep() with a corrupt entry = %d, %v; want b's 3 units and an error naming h1", n, err)
	}
	if lv, _ := r.Levels(ctx, "b"); lv.Held != 0 || lv.Available != 10 {
		t.Fatalf("b after the sweep: %+v", lv)
	}
	lv, _ = r.Levels(ctx, "bad")
	require.EqualValues(t, 3, lv.Held, "bad after a failed sweep step: %+v; nothing released", lv)
}

// ---- iteration ----

// Items and Entries are range-over-func iterators in pages: breaking out of them early (after
// more than one page) must not panic ("range function continued iteration"), and they list
// every item and entry once. Entries: "Iteration stops at the first error, which is yielded
// with a zero Entry."
func TestItemsEntriesIteration(t *testing.T) {
	ctx := context.Background()
	r, mr := miniReserver(t)
	const n = 700
	load(t, r, nil, "big", n)
	for i := range n {
		load(t, r, nil, fmt.Sprint("i", i), 1)
		deduct(t, r, "big", fmt.Sprint("o", i), 1)
	}
	items := map[string]bool{}
	for s, err := range stockops.Items(ctx, r) {
		require.NoError(t, err)
		items[s] = true
	}
	require.Len(t, items, n+1, "Items listed %d items, want %d", len(items), n+1)
	ids := map[string]bool{}
	for e, err := range stockops.Entries(ctx, r, "big") {
		require.NoError(t, err)
		if e.SKU != "big" || e.Kind != stock.KindDeduct || e.Qty != 1 {
			t.Fatalf("entry %+v", e)
		}
		ids[e.ID] = true
	}
	require.Len(t, ids, n, "Entries listed %d ids, want %d", len(ids), n)
	for _, stop := range []int{1, 300, 600} {
		k := 0
		for range stockops.Items(ctx, r) {
			if k++; k == stop {
				break
			}
		}
		k = 0
		for range stockops.Entries(ctx, r, "big") {
			if k++; k == stop {
				break
			}
		}
		if k != stop {
			t.Fatalf("broke at %d, want %d", k, stop)
		}
	}
	// A bad name, then a corrupt entry: one error, with a zero Entry, and nothing after it.
	for _, sku := range []string{"", "x{y}"} {
		var got []error
		for e, err := range stockops.Entries(ctx, r, sku) {
			if e != (stock.Entry{}) {
				t.Errorf("Entries(%q) yielded %+v with %v; want a zero Entry", sku, e, err)
			}
			got = append(got, err)
		}
		if len(got) != 1 || !errors.Is(got[0], stock.ErrInvalid) {
			t.Errorf("Entries(%q) yielded %v; want one ErrInvalid", sku, got)
		}
	}
	mr.HSet("stock:{big}:l", "o5", "garbage")
	var errs int
	for e, err := range stockops.Entries(ctx, r, "big") {
		if err != nil {
			errs++
			if e != (stock.Entry{}) || !strings.Contains(err.Error(), "o5") {
				t.Errorf("corrupt entry: %+v, %v; want a zero Entry and an error naming o5", e, err)
			}
			continue // the iterator must stop by itself
		}
		if errs > 0 {
			t.Fatalf("an entry after the error: %+v", e)
		}
	}
	require.EqualValues(t, 1, errs, "%d errors, want 1", errs)
	// Items with an early break inside a nested Entries loop: no panic, no leak of state.
	k := 0
	for s := range stockops.Items(ctx, r) {
		for range stockops.Entries(ctx, r, s) {
			break
		}
		if k++; k == 3 {
			break
		}
	}
}

// ---- Refuse and the relay's refusals ----

// Refuse "gives back the stock of an id that the database of record refused (ErrRefused), once.
// The entry becomes refused and an EventRefused is queued for the publisher." The Receipt of the
// stock package comes through the forwarding layer whole, on success and on error, and errors
// keep their sentinels.
func TestRefuse(t *testing.T) {
	ctx := context.Background()
	r, _ := miniReserver(t)
	load(t, r, nil, "a", 10)
	deduct(t, r, "a", "o1", 3)
	p0, _, _ := stockops.Pending(ctx, r, "a")
	rc, err := stockops.Refuse(ctx, r, "a", "o1")
	if err != nil || rc.SKU != "a" || rc.ID != "o1" || rc.Qty != 3 || rc.Remaining != 10 || rc.Replayed {
		t.Fatalf("Refuse = %+v, %v", rc, err)
	}
	rc, err = stockops.Refuse(ctx, r, "a", "o1")
	if err != nil || !rc.Replayed || rc.Qty != 3 {
		t.Fatalf("second Refuse = %+v, %v; want a replay", rc, err)
	}
	if lv, _ := r.Levels(ctx, "a"); lv.Available != 10 || lv.Sold != 0 {
		t.Fatalf("levels after Refuse twice: %+v", lv)
	}
	if e, err := r.Ledger(ctx, "a", "o1"); err != nil || e.State != stock.StateRefused {
		t.Fatalf("ledger: %+v, %v; want refused", e, err)
	}
	if p1, _, _ := stockops.Pending(ctx, r, "a"); p1 != p0+1 {
		t.Fatalf("pending %d -> %d; want one EventRefused queued", p0, p1)
	}
	var got []stock.Event
	pub := stock.PublisherFunc(func(_ context.Context, ev stock.Event) error { got = append(got, ev); return nil })
	rl := newRelay(t, r, nil, pub, nil)
	if st, err := rl.Once(ctx); err != nil || st.Delivered != 2 {
		t.Fatalf("relay: %+v, %v", st, err)
	}
	if len(got) != 2 || got[0].Type != stock.EventDeducted || got[1].Type != stock.EventRefused || got[1].Qty != 3 {
		t.Fatalf("published %+v; want deducted then refused", got)
	}
	// Bad input: ErrInvalid. An unknown id: ErrUnknownID, and the id cannot take stock later.
	for _, c := range [][2]string{{"", "x"}, {"a", ""}, {"a{", "x"}, {"a", "x y"}} {
		if _, err := stockops.Refuse(ctx, r, c[0], c[1]); !errors.Is(err, stock.ErrInvalid) {
			t.Errorf("Refuse(%q, %q) = %v; want ErrInvalid", c[0], c[1], err)
		}
	}
	rc, err = stockops.Refuse(ctx, r, "a", "never")
	if !errors.Is(err, stock.ErrUnknownID) || rc.SKU != "a" || rc.ID != "never" {
		t.Fatalf("Refuse of an unknown id = %+v, %v; want ErrUnknownID", rc, err)
	}
	if _, err := r.Deduct(ctx, stock.Request{SKU: "a", ID: "never", Qty: 1}); !errors.Is(err, stock.ErrRestored) {
		t.Fatalf("late deduct of a refused unknown id: %v; want ErrRestored", err)
	}
	_, err = r.Restock(ctx, "a", "rs1", 5)
	require.NoError(t, err)
	if _, err := stockops.Refuse(ctx, r, "a", "rs1"); !errors.Is(err, stock.ErrConflict) {
		t.Fatalf("Refuse of a restock = %v; want ErrConflict", err)
	}
}

// "When the Store refuses a deduct (ErrRefused), the relay gives the stock back in Redis once
// (the ledger entry becomes refused) and an EventRefused follows through the outbox."
func TestRelayRefusal(t *testing.T) {
	ctx := context.Background()
	r, _ := miniReserver(t)
	db := memstore.New()
	load(t, r, nil, "a", 10)
	require.NoError(t, db.Load(ctx, "a", 2))
	deduct(t, r, "a", "o1", 2)
	deduct(t, r, "a", "o2", 2) // the store cannot cover it
	rl := newRelay(t, r, db, nil, nil)
	st, err := rl.Once(ctx)
	if err != nil || st.Refused != 1 {
		t.Fatalf("relay: %+v, %v; want 1 refused", st, err)
	}
	if e, _ := r.Ledger(ctx, "a", "o2"); e.State != stock.StateRefused {
		t.Fatalf("o2: %+v; want refused", e)
	}
	_, err = rl.Once(ctx)
	require.NoError(t, err)
	if lv, _ := r.Levels(ctx, "a"); lv.Available != 8 || lv.Sold != 2 {
		t.Fatalf("levels: %+v", lv)
	}
	if p, d, _ := stockops.Pending(ctx, r, "a"); p != 0 || d != 0 {
		t.Fatalf("pending %d, dead %d", p, d)
	}
	n := db.Applications("a", "o2", stock.EventDeducted)
	require.EqualValues(t, 0, n, "o2 applied %d times", n)
}

// ---- cart recovery ----

// RecoverCarts "undoes the carts whose saga started more than olderThan ago and never ended ...
// a late retry of such a cart returns ErrRestored. It returns the number of carts this call
// undid (... concurrent calls add up to the carts undone)". The sagas are cut short by an
// error injected on the second item's script, as if the process had died there.
func TestRecoverCartsConcurrent(t *testing.T) {
	ctx := context.Background()
	r, mr := miniReserver(t)
	load(t, r, nil, "a", 100)
	load(t, r, nil, "b", 100)
	var fail atomic.Bool
	mr.Server().SetPreHook(func(p *server.Peer, cmd string, args ...string) bool {
		if !fail.Load() || !(strings.EqualFold(cmd, "evalsha") || strings.EqualFold(cmd, "eval")) {
			return false
		}
		for _, a := range args {
			if strings.HasPrefix(a, "stock:{b}") {
				p.WriteError("ERR injected: the process died here")
				return true
			}
		}
		return false
	})
	const carts = 12
	cart := func(i int) stock.Cart {
		return stock.Cart{ID: fmt.Sprint("c", i), Lines: []stock.Line{{SKU: "a", Qty: 2}, {SKU: "b", Qty: 1}}}
	}
	fail.Store(true)
	for i := range carts {
		require.Error(t, testkit.Err(r.DeductMany(ctx, cart(i))), "cart %d went through the injected error", i)
	}
	fail.Store(false)
	if lv, _ := r.Levels(ctx, "a"); lv.Available != 100-2*carts {
		t.Fatalf("a before recovery: %+v; want the carts' first lines taken", lv)
	}
	if n, err := stockops.RecoverCarts(ctx, r, time.Hour); n != 0 || err != nil {
		t.Fatalf("RecoverCarts(1h) = %d, %v; the carts are younger", n, err)
	}
	var total atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			n, err := stockops.RecoverCarts(ctx, r, 0)
			assert.NoError(t, err)
			total.Add(int64(n))
		})
	}
	wg.Wait()
	if total.Load() != carts {
		t.Fatalf("concurrent RecoverCarts undid %d carts in all, want %d", total.Load(), carts)
	}
	if lv, _ := r.Levels(ctx, "a"); lv.Available != 100 || lv.Sold != 0 {
		t.Fatalf("a after recovery: %+v", lv)
	}
	if n, err := stockops.RecoverCarts(ctx, r, 0); n != 0 || err != nil {
		t.Fatalf("RecoverCarts again = %d, %v; want 0", n, err)
	}
	if _, err := r.DeductMany(ctx, cart(0)); !errors.Is(err, stock.ErrRestored) {
		t.Fatalf("late retry of a recovered cart: %v; want ErrRestored", err)
	}
}

// ---- the queue path ----

// "With no Store (the queue path: NewRelay(r, nil, publisher, nil)), an event the Publisher
// accepted ... stays, in flight for the Reconciler, until a consumer applies it through
// stock.Consume." and "a pass while a queue's consumers are down adds no stock for the sales
// waiting in the queue". Report.Published and InFlight say so.
func TestQueuePathInFlight(t *testing.T) {
	ctx := context.Background()
	r, _ := miniReserver(t)
	db := memstore.New()
	load(t, r, db, "a", 10)
	deduct(t, r, "a", "o1", 2)
	deduct(t, r, "a", "o2", 3)
	var queue []stock.Event
	pub := stock.PublisherFunc(func(_ context.Context, ev stock.Event) error { queue = append(queue, ev); return nil })
	rl := newRelay(t, r, nil, pub, nil)
	if st, err := rl.Once(ctx); err != nil || st.Delivered != 2 || len(queue) != 2 {
		t.Fatalf("relay: %+v, %v, queue %d", st, err, len(queue))
	}
	if p, d, _ := stockops.Pending(ctx, r, "a"); p != 0 || d != 0 {
		t.Fatalf("pending %d, dead %d after publishing", p, d)
	}
	rec := newReconciler(t, r, db, nil)
	rp, err := rec.Item(ctx, "a")
	if err != nil || rp.Published != 2 || rp.InFlight != 5 || rp.Drift != 0 || rp.Adjusted != 0 || rp.StoreRemaining != 10 {
		t.Fatalf("consumers down: %#v, %v", rp, err)
	}
	assert.Contains(t, rp.String(), "2 published", "Report.String() = %q; want it to say 2 published", rp.String())
	for _, ev := range queue {
		require.NoError(t, stock.Consume(ctx, r, db, ev), "consume %+v", ev)
	}
	rp, err = rec.Item(ctx, "a")
	if err != nil || rp.Published != 0 || rp.InFlight != 0 || rp.Drift != 0 || rp.StoreRemaining != 5 {
		t.Fatalf("after consume: %#v, %v", rp, err)
	}
}

// TestGuardRestartWithoutPersistenceStaysFenced: FailoverGuard.Check promises "A Redis with no
// recorded epoch is a new deployment only when no item is loaded and this guard saw no other
// primaries before ... Otherwise (... the epoch lost with the data in a restart without
// persistence) nothing tells which writes were lost, so it fences until a complete repairing
// Reconciler pass records the primaries." And ErrFailover: Deduct is refused "while a failover
// guard has seen the Redis primaries change ... and no reconcile pass has run since".
//
// After a restart without persistence (the registry and the epoch lost with the data) the
// guard's first Check fences, and its later Checks, with no pass in between, must not take the
// empty Redis for a new deployment: comparing only with the primaries of its last check would
// record the new primaries as reconciled in "<prefix>:epoch" and lift the fence (and every
// other process's guard's at their next check) about a second after the restart, so that
// Deduct would answer ErrNotLoaded instead of ErrFailover and an operator's re-run preheat
// (Load) would sell again on Redis before any pass compared it with the Store.
func TestGuardRestartWithoutPersistenceStaysFenced(t *testing.T) {
	ctx := context.Background()
	addr, restart := realRedis(t)
	r, _ := realReserver(t, addr)
	other, _ := realReserver(t, addr) // another process, with its own guard
	db := memstore.New()
	g := stockops.NewFailoverGuard(r)
	og := stockops.NewFailoverGuard(other)
	for _, gg := range []*stockops.FailoverGuard{g, og} {
		wantFenced(t, gg, false, "new deployment")
	}
	load(t, r, db, "a", 10)
	deduct(t, r, "a", "o1", 2)
	rl := newRelay(t, r, db, nil, nil)
	_, err := rl.Once(ctx)
	require.NoError(t, err)
	deduct(t, r, "a", "o2", 3) // acknowledged, not yet in the Store: lost in the restart

	restart()
	check := func(gg *stockops.FailoverGuard) bool {
		t.Helper()
		for i := 0; ; i++ {
			fenced, err := gg.Check(ctx)
			if err == nil {
				return fenced
			}
			if i == 20 {
				t.Fatalf("Check after the restart: %v", err)
			}
			time.Sleep(50 * time.Millisecond) // the clients reconnect
		}
	}
	if !check(g) || !check(og) {
		t.Fatal("the first Check after a restart without persistence did not fence")
	}
	// No reconcile pass has run. Checks keep the fence.
	for i := range 3 {
		if !check(g) {
			t.Errorf("Check %d after the restart lifted the fence with no reconcile pass", i+2)
			break
		}
	}
	if !check(og) {
		t.Errorf("the other process's guard lifted its fence with no reconcile pass")
	}
	if _, err := r.Deduct(ctx, stock.Request{SKU: "a", ID: "x1", Qty: 1}); !errors.Is(err, stock.ErrFailover) {
		t.Errorf("Deduct after the restart, before any pass: %v; want ErrFailover", err)
	}
	// A complete repairing pass lifts it (and rebuilds the item from the Store).
	rec := newReconciler(t, r, db, nil)
	res, err := rec.Pass(ctx)
	if !errors.Is(err, stock.ErrRegistryLost) || !res.EpochRecorded {
		t.Fatalf("pass after the restart: %+v, %v; want ErrRegistryLost and the epoch recorded", res, err)
	}
	if check(g) {
		t.Fatal("still fenced after a complete repairing pass")
	}
	if lv, err := r.Levels(ctx, "a"); err != nil || lv.Available != 8 {
		t.Fatalf("a rebuilt from the Store: %+v, %v; want 8 available", lv, err)
	}
}

// Report: "For an item the Store does not know it says so; Available, Held, Pending,
// DeadLetters and InFlight are then Redis's figures (every undelivered event in flight),
// StoreRemaining and Drift are 0, and nothing is repaired." Report.String is one line that
// carries the figures and the call for a human.
func TestReportItemUnknownToStore(t *testing.T) {
	ctx := context.Background()
	r, _ := miniReserver(t)
	db := memstore.New()
	load(t, r, nil, "ghost", 10)
	deduct(t, r, "ghost", "o1", 4) // and the hold below: 2 events pending, 4 units in flight
	_, err := r.Hold(ctx, stock.Request{SKU: "ghost", ID: "h1", Qty: 1}, time.Minute)
	require.NoError(t, err)
	rec := newReconciler(t, r, db, nil)
	reps, err := rec.Once(ctx)
	if err != nil || len(reps) != 1 {
		t.Fatalf("Once: %v, %v", reps, err)
	}
	rp := reps[0]
	if rp.SKU != "ghost" || rp.Available != 5 || rp.Held != 1 || rp.Pending != 2 || rp.InFlight != 4 ||
		rp.StoreRemaining != 0 || rp.Drift != 0 || rp.Adjusted != 0 || rp.Rebuilt || rp.NeedsHuman == "" {
		t.Fatalf("report: %#v", rp)
	}
	line := rp.String()
	for _, want := range []string{"ghost", "redis 5+1 held", "in flight 4", "2 pending", "NEEDS A HUMAN"} {
		assert.Contains(t, line, want, "String() = %q; want it to contain %q", line, want)
	}
	assert.NotContains(t, line, "\n", "String() is more than one line: %q", line)
	if lv, _ := r.Levels(ctx, "ghost"); lv.Available != 5 || lv.Held != 1 {
		t.Fatalf("a pass changed an item the store does not know: %+v", lv)
	}
	if busy := (stockops.Report{SKU: "b", Busy: true, Drift: 5}).String(); !strings.Contains(busy, "busy") || strings.Contains(busy, "drift") {
		t.Errorf("busy report: %q", busy)
	}
}

// Relay.Once "returns the first error met (after finishing the other items); events that
// failed stay in the outbox for a later pass", and "A failed event holds back its item, with
// backoff, not the other items". RelayOptions.Items limits the relay to those items.
func TestRelayOnceFailingItem(t *testing.T) {
	ctx := context.Background()
	r, _ := miniReserver(t)
	db := memstore.New()
	for _, s := range []string{"a", "b", "c"} {
		load(t, r, db, s, 10)
		deduct(t, r, s, "o1", 1)
		deduct(t, r, s, "o2", 1)
	}
	db.FailWith(func(ev stock.Event) error {
		if ev.SKU == "a" {
			return memstore.ErrDown
		}
		return nil
	})
	rl := newRelay(t, r, db, nil, &stock.RelayOptions{Items: []string{"a", "b"}})
	st, err := rl.Once(ctx)
	if !errors.Is(err, memstore.ErrDown) || st.Delivered != 2 || st.Retried != 2 || st.Claimed != 4 {
		t.Fatalf("Once = %+v, %v; want b's 2 delivered, a's 2 retried, an error wrapping ErrDown", st, err)
	}
	for s, want := range map[string]int64{"a": 2, "b": 0, "c": 2} {
		if p, _, _ := stockops.Pending(ctx, r, s); p != want {
			t.Errorf("%s: %d pending, want %d", s, p, want)
		}
	}
	n, _ := db.Remaining(ctx, "c")
	assert.EqualValues(t, 10, n, "c (not in RelayOptions.Items) reached the store: remaining %d", n)
}

// newRelay and newReconciler are stockops.NewRelay and NewReconciler, which must succeed.
var (
	newRelay      = testkit.NewRelay
	newReconciler = testkit.NewReconciler
)
