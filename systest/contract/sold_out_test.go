package contract_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
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

// Promise (package doc, non-guarantees): the sold-out fast path "never admits a request, and
// never refuses an id the ledger has", and after a write through a Reserver returned,
// that Reserver's answers do not predate it. Ids the ledger had before the first sell-out (taken,
// tombstoned, expired, cancelled), a large ledger, and a second Reserver whose cache is warm.
func TestFastPathIDsBeforeSellOut(t *testing.T) {
	testkit.ParallelOnMiniredis(t)
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		c1, _, r1, r2 := pairReservers(t, b)
		const n = 3000
		require.NoError(t, r1.Load(ctx, "f", n+2))
		require.ErrorIs(t, testkit.Err(r1.Restore(ctx, "f", "tomb")), stock.ErrUnknownID)
		require.NoError(t, testkit.Err(r1.Hold(ctx, req("f", "cancelled", "", 1), time.Hour)))
		require.NoError(t, testkit.Err(r1.Cancel(ctx, "f", "cancelled")))
		require.NoError(t, testkit.Err(r1.Hold(ctx, req("f", "expired", "", 1), 100*time.Millisecond)))
		redistest.Sleep(c1, 200*time.Millisecond)
		deductEach(t, r1, stock.Request{SKU: "f", Qty: 1}, numbered("o", n)...)
		require.NoError(t, testkit.Err(r1.Deduct(ctx, req("f", "last", "", 2))))
		// Sold out. Warm the caches with refusals, then ask for every id the ledger has.
		warmSoldOut(t, r2, "f", b.Real())
		warmSoldOut(t, r1, "f", b.Real())
		for _, r := range []*stock.Reserver{r2, r1} {
			for i := range n {
				require.True(t, must(r.Deduct(ctx, req("f", fmt.Sprint("o", i), "", 1)))(t, "replay of o%d", i).Replayed)
			}
			assert.ErrorIs(t, testkit.Err(r.Deduct(ctx, req("f", "tomb", "", 1))), stock.ErrRestored)
			assert.ErrorIs(t, testkit.Err(r.Hold(ctx, req("f", "cancelled", "", 1), time.Hour)), stock.ErrRestored)
			assert.ErrorIs(t, testkit.Err(r.Hold(ctx, req("f", "expired", "", 1), time.Hour)), stock.ErrExpired)
			assert.ErrorIs(t, testkit.Err(r.Deduct(ctx, req("f", "last", "", 3))), stock.ErrConflict)
		}
		t.Logf("answered in-process: r1 %d, r2 %d", stockops.SoldOutAnswers(r1), stockops.SoldOutAnswers(r2))
		check(t, r1, "f", n+2)
	})
}

// Promise (as above): after a Reserver's own write that gave units back has returned, that
// Reserver does not answer "sold out" from its cache. Each write: Restock, Restore, Cancel of a
// live hold, Sweep of an expired hold, Extend and Confirm of an expired hold (they release it),
// Refuse. The other Reserver only reads and is refused (it takes nothing), so the unit is
// there for the next deduct.
func TestFastPathOwnWritesGiveBack(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		c1, _, r1, r2 := pairReservers(t, b)
		require.NoError(t, r1.Load(ctx, "g", 0))
		stop := make(chan struct{})
		var wg sync.WaitGroup
		untilStopped(&wg, stop, func(int) {
			_, _ = testkit.Available(r2.Levels(ctx, "g"))
			_, _ = r2.Deduct(ctx, req("g", "r2-never", "", 1<<40))
		})
		defer func() { close(stop); wg.Wait() }()
		writes := []string{"restock", "restore", "cancel", "sweep", "extend", "confirm", "refuse"}
		seq := 0
		next := func() string { seq++; return fmt.Sprint("n", seq) }
		for round := range 6 {
			for _, w := range writes {
				// Set up one unit owned by an id of w, then sell out and warm the cache.
				id := next()
				if w != "restock" {
					require.NoError(t, testkit.Err(r1.Restock(ctx, "g", next(), 1)))
				}
				switch w {
				case "restore", "refuse":
					require.NoError(t, testkit.Err(r1.Deduct(ctx, req("g", id, "", 1))))
				case "cancel", "sweep", "extend", "confirm":
					ttl := time.Hour
					if w != "cancel" {
						ttl = 300 * time.Millisecond
					}
					require.NoError(t, testkit.Err(r1.Hold(ctx, req("g", id, "", 1), ttl)))
				}
				warmSoldOut(t, r1, "g", false)
				var err error
				switch w {
				case "restock":
					_, err = r1.Restock(ctx, "g", id, 1)
					require.NoError(t, err)
				case "restore":
					_, err = r1.Restore(ctx, "g", id)
					require.NoError(t, err)
				case "refuse":
					_, err = stockops.Refuse(ctx, r1, "g", id)
					require.NoError(t, err)
				case "cancel":
					_, err = r1.Cancel(ctx, "g", id)
					require.NoError(t, err)
				case "sweep", "extend", "confirm":
					redistest.Sleep(c1, 350*time.Millisecond)
					var n int64
					switch w {
					case "sweep":
						// r2's refused deducts may have released it first.
						n, err = stockops.Sweep(ctx, r1, "g")
						require.NoError(t, err)
						require.LessOrEqual(t, n, int64(1))
					case "extend":
						_, err = r1.Extend(ctx, "g", id, time.Hour)
						require.ErrorIs(t, err, stock.ErrExpired)
					case "confirm":
						_, err = r1.Confirm(ctx, "g", id)
						require.ErrorIs(t, err, stock.ErrExpired)
					}
				}
				_, err = r1.Deduct(ctx, req("g", next(), "", 1))
				require.NoError(t, err, "round %d: after its own %s gave a unit back, r1 said", round, w)
			}
		}
		t.Logf("answered in-process: r1 %d, r2 %d", stockops.SoldOutAnswers(r1), stockops.SoldOutAnswers(r2))
		check(t, r1, "g", 0)
	})
}

// Promise (Hold doc: "a hold past its deadline is released ... by the item's next Deduct", and
// the fast path "never admits a request" only errs for "as long as an invalidation takes to
// arrive after stock came back"): an item sold out only by holds whose deadline passed has
// stock; no write happened when the deadline passed, so no invalidation is coming. A deduct on
// the Reserver whose cache says sold out must still reach Redis and take the unit.
func TestFastPathHoldDeadlinePassed(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		c, r := clientReserver(t, b, stock.WithSoldOutCache(time.Hour))
		require.NoError(t, r.Load(ctx, "p", 1))
		require.NoError(t, testkit.Err(r.Hold(ctx, req("p", "h", "", 1), 200*time.Millisecond)))
		refuseSoldOut(t, r, "p", numbered("x", 20)...)
		redistest.Sleep(c, 400*time.Millisecond)
		rc, err := r.Deduct(ctx, req("p", "after", "", 1))
		assert.NoError(t, err, "the only hold expired: the unit is free (%+v); answered in-process %d", rc, stockops.SoldOutAnswers(r))
		t.Logf("answered in-process: %d", stockops.SoldOutAnswers(r))
		check(t, r, "p", 1)
	})
}

// Promise (as above), under load: 8 goroutines of one Reserver lay tombstones (Restore of an
// unknown id) and take units then repeat them at once, on an item that other Reservers (own
// clients) keep selling out and restocking, so caches are invalidated and refilled all the
// time. A tombstoned id is always ErrRestored, a taken id always a replay, on the Reserver
// that wrote them, and on a second Reserver sharing its client.
func TestFastPathUnderChurn(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		c1, c2 := b.Pair(t)
		r1 := testkit.NewReserver(t, c1)
		r1b := testkit.NewReserver(t, c1) // another Reserver on r1's client
		r2 := testkit.NewReserver(t, c2)
		require.NoError(t, r1.Load(ctx, "s", 0))
		stop := make(chan struct{})
		var bg sync.WaitGroup
		for k := range 2 {
			untilStopped(&bg, stop, func(i int) {
				if k == 0 && i%4 == 0 {
					_, _ = r2.Restock(ctx, "s", fmt.Sprintf("bg-rs-%d", i), 2)
				}
				_, _ = r2.Deduct(ctx, req("s", fmt.Sprintf("bg-%d-%d", k, i), "", 1))
			})
		}
		var (
			mu        sync.Mutex
			wrong     = map[string]int{}
			tombs, rp int
		)
		iters := 1500
		if !b.Real() {
			iters = 150
		}
		parallel(8, func(g int) {
			for i := range iters {
				id := fmt.Sprintf("w%d-%d", g, i)
				if i%2 == 0 {
					_, err := r1.Restore(ctx, "s", id)
					if !errors.Is(err, stock.ErrUnknownID) {
						continue
					}
					rr := r1
					if i%4 == 0 {
						rr = r1b
					}
					_, err = rr.Deduct(ctx, req("s", id, "", 1))
					mu.Lock()
					tombs++
					if !errors.Is(err, stock.ErrRestored) {
						wrong[fmt.Sprintf("tombstone then deduct: %v", err)]++
					}
					mu.Unlock()
					continue
				}
				_, err := r1.Deduct(ctx, req("s", id, "", 1))
				if err != nil {
					continue
				}
				rr := r1
				if i%4 == 1 {
					rr = r1b
				}
				rc, err := rr.Deduct(ctx, req("s", id, "", 1))
				mu.Lock()
				rp++
				if err != nil || !rc.Replayed {
					wrong[fmt.Sprintf("taken then repeated: %v replayed=%v", err, rc.Replayed)]++
				}
				mu.Unlock()
			}
		})
		close(stop)
		bg.Wait()
		t.Logf("%d tombstones, %d repeats; in-process answers r1 %d r1b %d r2 %d", tombs, rp, stockops.SoldOutAnswers(r1), stockops.SoldOutAnswers(r1b), stockops.SoldOutAnswers(r2))
		assert.Empty(t, wrong)
		check(t, r1, "s", 0)
	})
}

// Promise (WithPrefix, fast path): two Reservers on one caching client, prefixes "a" and "a:b",
// each with an item "x": one's sold-out state never answers for the other.
func TestFastPathPerPrefix(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		c := b.Client(t)
		ra := testkit.NewReserver(t, c, stock.WithPrefix("a"))
		rb := testkit.NewReserver(t, c, stock.WithPrefix("a:b"))
		rg := testkit.NewReserver(t, c, stock.WithPrefix("a"), stock.WithGroups(func(string) string { return "x" }))
		require.NoError(t, ra.Load(ctx, "x", 0))
		require.NoError(t, rb.Load(ctx, "x", 5))
		require.NoError(t, rg.Load(ctx, "x", 5))
		warmSoldOut(t, ra, "x", b.Real())
		for i := range 5 {
			require.NoError(t, testkit.Err(rb.Deduct(ctx, req("x", fmt.Sprint("b", i), "", 1))))
			require.NoError(t, testkit.Err(rg.Deduct(ctx, req("x", fmt.Sprint("g", i), "", 1))))
		}
		check(t, ra, "x", 0)
		check(t, rb, "x", 5)
		check(t, rg, "x", 5)
	})
}

// Promise (fast path, after an own write; Delist: "A retired item answers ErrNotLoaded and may
// be loaded again"; Reopen): a Reserver whose cache says an item is sold out, that then retires
// it (its reconciler), loads it again, or closes, restocks and reopens it, sells the new stock.
// Grouped items too.
func TestFastPathLifecycle(t *testing.T) {
	for _, grouped := range []bool{false, true} {
		t.Run(fmt.Sprintf("grouped=%v", grouped), func(t *testing.T) {
			testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
				c := b.Client(t)
				var opts []stock.Option
				if grouped {
					opts = append(opts, stock.WithGroups(func(string) string { return "g" }))
				}
				r := testkit.NewReserver(t, c, opts...)
				store := memstore.New()
				require.NoError(t, r.Load(ctx, "life", 1))
				require.NoError(t, store.Load(ctx, "life", 1))
				require.NoError(t, testkit.Err(r.Deduct(ctx, req("life", "o1", "", 1))))
				warmSoldOut(t, r, "life", b.Real())
				// Tombstone on the warm grouped/ungrouped item.
				require.ErrorIs(t, testkit.Err(r.Restore(ctx, "life", "t1")), stock.ErrUnknownID)
				assert.ErrorIs(t, testkit.Err(r.Deduct(ctx, req("life", "t1", "", 1))), stock.ErrRestored)
				// Close, restock, reopen.
				warmSoldOut(t, r, "life", b.Real())
				require.NoError(t, r.CloseItem(ctx, "life"))
				require.NoError(t, testkit.Err(r.Restock(ctx, "life", "rs1", 1)))
				require.NoError(t, r.ReopenItem(ctx, "life"))
				require.NoError(t, testkit.Err(r.Deduct(ctx, req("life", "o2", "", 1))), "after close, restock, reopen")
				// Delist, retire, load again.
				warmSoldOut(t, r, "life", b.Real())
				drainOfLifecycle(t, r, store)
				require.NoError(t, r.Delist(ctx, "life"))
				redistest.Sleep(c, 20*time.Millisecond)
				rec := must(stockops.NewReconciler(r, store, &stock.ReconcileOptions{Retention: time.Millisecond}))(t)
				reps := reports(t, rec)
				require.True(t, reps["life"].Retired, "%v", reps["life"])
				_, err := r.Deduct(ctx, req("life", "o3", "", 1))
				assert.ErrorIs(t, err, stock.ErrNotLoaded, "a retired item")
				require.NoError(t, r.Load(ctx, "life", 3))
				for i := range 3 {
					_, err = r.Deduct(ctx, req("life", fmt.Sprint("new", i), "", 1))
					require.NoError(t, err, "the reloaded item, deduct %d", i)
				}
				testkit.Levels(t, r, "life")
			})
		})
	}
}

// Promise (Request.Retry): "A retry's refusal for lack of stock (ErrSoldOut, ErrInsufficient) is
// then recorded for the id, so that the earlier attempt, should it reach Redis after the retry,
// is refused too: the answer the caller got stays the final one" — also when the Reserver's
// fast path is warm (a refusal answered in-process records nothing), for Hold, and for a second
// Reserver.
func TestRetryRefusalRecordedWithFastPath(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		_, _, r1, r2 := pairReservers(t, b)
		require.NoError(t, r1.Load(ctx, "rt", 0))
		for i := range 30 {
			warmSoldOut(t, r1, "rt", b.Real())
			id := fmt.Sprint("late", i)
			// Even i deduct, odd i hold.
			take := func(r *stock.Reserver, retry bool) error {
				req := stock.Request{SKU: "rt", ID: id, User: "u", Qty: 1, Retry: retry}
				if i%2 == 0 {
					_, err := r.Deduct(ctx, req)
					return err
				}
				_, err := r.Hold(ctx, req, time.Minute)
				return err
			}
			require.ErrorIs(t, take(r1, true), stock.ErrSoldOut)
			require.NoError(t, testkit.Err(r1.Restock(ctx, "rt", fmt.Sprint("rs", i), 1)))
			// The first attempt arrives late, on either Reserver.
			err := take([]*stock.Reserver{r1, r2}[i%3%2], false)
			assert.Error(t, err, "%s: the caller was told sold out, the late first attempt took stock", id)
			// Sell the restocked unit out again.
			_, err = r1.Deduct(ctx, req("rt", fmt.Sprint("fill", i), "", 1))
			if err != nil {
				require.ErrorIs(t, err, stock.ErrSoldOut)
			}
		}
		t.Logf("in-process answers r1 %d", stockops.SoldOutAnswers(r1))
		check(t, r1, "rt", 0)
	})
}

var seq atomic.Int64

// warmSoldOut asks for a sold-out item with new ids until the Reserver answers in-process
// (its fast path is warm); on a client without caching, a few times. With must, it fails the
// test when the fast path never answers.
func warmSoldOut(t *testing.T, r *stock.Reserver, sku string, must bool) {
	t.Helper()
	before := stockops.SoldOutAnswers(r)
	tries := 200
	if !must {
		tries = 20
	}
	for range tries {
		_, err := r.Deduct(context.Background(), stock.Request{SKU: sku, ID: fmt.Sprint("warm-", seq.Add(1)), Qty: 1})
		require.ErrorIs(t, err, stock.ErrSoldOut)
		if stockops.SoldOutAnswers(r) > before {
			return
		}
		if !must {
			time.Sleep(100 * time.Microsecond)
		}
	}
	if must {
		t.Fatalf("%s: the fast path never answered in-process", sku)
	}
}

// refuseSoldOut deducts one unit of sku under each of ids, wanting ErrSoldOut every time.
func refuseSoldOut(t *testing.T, r *stock.Reserver, sku string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		require.ErrorIs(t, testkit.Err(r.Deduct(context.Background(), req(sku, id, "", 1))), stock.ErrSoldOut, "Deduct %s %s", sku, id)
	}
}

// The sold-out fast path answers every id of a ledger, and new ids, as the script does.
func TestFastPathDifferential(t *testing.T) {
	testkit.ParallelOnMiniredis(t)
	soldOutBackends(t, func(t *testing.T, real bool, c1, c2 rueidis.Client) {
		const limit = 3
		fast := testkit.NewReserver(t, c1, stock.WithUserLimit(limit))
		ref := testkit.NewReserver(t, c2, stock.WithUserLimit(limit), stock.WithSoldOutCache(0))
		sku := "fp:~ü-Ω"
		require.NoError(t, fast.Load(ctx, sku, 330))

		user := func(i int) string { return fmt.Sprintf("u%d", i%120) }
		var ids []string
		for i := range 300 {
			id := fmt.Sprintf("d%d", i)
			require.NoError(t, testkit.Err(fast.Deduct(ctx, req(sku, id, user(i), 1))), id)
			ids = append(ids, id)
		}
		for i := range 20 {
			id := fmt.Sprintf("h%d", i)
			require.NoError(t, testkit.Err(fast.Hold(ctx, req(sku, id, user(i+300), 1), time.Hour)), id)
			ids = append(ids, id)
		}
		for i := range 5 {
			id := fmt.Sprintf("e%d", i)
			require.NoError(t, testkit.Err(fast.Hold(ctx, req(sku, id, user(i+320), 1), 300*time.Millisecond)), id)
			ids = append(ids, id)
		}
		for i := range 20 { // restores of deducts
			require.NoError(t, testkit.Err(fast.Restore(ctx, sku, fmt.Sprintf("d%d", i))))
		}
		for i := range 5 { // cancels of holds
			require.NoError(t, testkit.Err(fast.Cancel(ctx, sku, fmt.Sprintf("h%d", i))))
		}
		for i := range 10 { // tombstones
			id := fmt.Sprintf("t%d", i)
			require.ErrorIs(t, testkit.Err(fast.Restore(ctx, sku, id)), stock.ErrUnknownID)
			ids = append(ids, id)
		}
		for i := range 3 { // restocks
			id := fmt.Sprintf("r%d", i)
			require.NoError(t, testkit.Err(fast.Restock(ctx, sku, id, 2)))
			ids = append(ids, id)
		}
		redistest.Sleep(c1, 600*time.Millisecond) // the e holds pass their deadline
		_, err := stockops.Sweep(ctx, fast, sku)
		require.NoError(t, err)
		// Sell out with fill ids.
		for i := 0; ; i++ {
			require.Less(t, i, 1000)
			id := fmt.Sprintf("f%d", i)
			_, err := fast.Deduct(ctx, req(sku, id, fmt.Sprintf("fill%d", i), 1))
			if errors.Is(err, stock.ErrSoldOut) {
				break
			}
			require.NoError(t, err)
			ids = append(ids, id)
		}
		// Retry refusals (Tf), recorded now that the item is sold out.
		for i := range 5 {
			id := fmt.Sprintf("x%d", i)
			require.ErrorIs(t, testkit.Err(fast.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: "ux", Qty: 1, Retry: true})), stock.ErrSoldOut)
			ids = append(ids, id)
		}
		// Build the filter: refusals of new ids, enough for a ledger of ~400 entries.
		for i := range 40 {
			require.ErrorIs(t, testkit.Err(fast.Deduct(ctx, req(sku, fmt.Sprintf("warm%d", i), "", 1))), stock.ErrSoldOut)
		}
		testkit.Levels(t, fast, sku)

		// Every entry's id, asked as a deduct and as a hold, with the entry's own parameters and
		// with others; and new ids.
		entries := map[string]stock.Entry{}
		for e, err := range stockops.Entries(ctx, ref, sku) {
			require.NoError(t, err)
			entries[e.ID] = e
		}
		for _, id := range ids {
			_, ok := entries[id]
			require.True(t, ok, "ledger lacks %s", id)
		}
		type q struct {
			hold bool
			req  stock.Request
		}
		var qs []q
		keys := make([]string, 0, len(entries))
		for id := range entries {
			keys = append(keys, id)
		}
		sort.Strings(keys)
		for _, id := range keys {
			e := entries[id]
			qty := max(e.Qty, 1)
			qs = append(qs,
				q{false, req(sku, id, e.User, qty)},
				q{true, req(sku, id, e.User, qty)},
				q{false, req(sku, id, "someone-else", qty+1)},
			)
		}
		for i := range 300 {
			qs = append(qs, q{i%2 == 0, req(sku, fmt.Sprintf("new%d", i), user(i), 1)})
		}
		ask := func(r *stock.Reserver, x q) (stock.Receipt, error) {
			if x.hold {
				return r.Hold(ctx, x.req, time.Hour)
			}
			return r.Deduct(ctx, x.req)
		}
		var diffs []string
		for round := range 3 { // several rounds: the fast path's reads warm up
			for _, x := range qs {
				rc1, err1 := ask(fast, x)
				rc2, err2 := ask(ref, x)
				if stock.Outcome(err1) != stock.Outcome(err2) || rc1.Replayed != rc2.Replayed {
					diffs = append(diffs, fmt.Sprintf("round %d hold=%v %+v: fast %v (replayed %v), script %v (replayed %v)",
						round, x.hold, x.req, err1, rc1.Replayed, err2, rc2.Replayed))
				}
			}
		}
		if len(diffs) > 10 {
			diffs = append(diffs[:10], fmt.Sprintf("... %d in all", len(diffs)))
		}
		assert.Empty(t, diffs, "the fast path answered otherwise than the script")
		t.Logf("%s: %d questions, %d answered in-process", sku, 3*len(qs), stockops.SoldOutAnswers(fast))
		if real {
			assert.Positive(t, stockops.SoldOutAnswers(fast), "on a caching client the fast path answers some refusals in-process")
		}
		testkit.Levels(t, fast, sku)
	})
}

// "after a write of a Reserver has returned, that Reserver's answers never predate the write":
// writes of this Reserver that give stock back or change the answer (restore, cancel, restock,
// extend to a near deadline, close, reopen, a tombstone), each followed at once by a request
// that the fast path must not refuse as sold out. Many rounds, to hit the invalidation race.
func TestFastPathOwnWritesWithHolds(t *testing.T) {
	soldOutBackends(t, func(t *testing.T, real bool, c1, _ rueidis.Client) {
		r := testkit.NewReserver(t, c1)
		sku := "own:holds~é"
		require.NoError(t, r.Load(ctx, sku, 4))
		for i := range 4 {
			require.NoError(t, testkit.Err(r.Hold(ctx, req(sku, fmt.Sprintf("H%d", i), "", 1), time.Hour)))
		}
		live := []string{"H0", "H1", "H2", "H3"}
		n := 0
		newID := func() string { n++; return fmt.Sprintf("n%d", n) }
		soldOut := func() {
			t.Helper()
			for range 3 {
				require.ErrorIs(t, testkit.Err(r.Deduct(ctx, req(sku, newID(), "", 1))), stock.ErrSoldOut)
			}
		}
		rounds := 150
		if !real {
			rounds = 30
		}
		for i := range rounds {
			soldOut()
			switch i % 5 {
			case 0: // cancel a hold, then hold again with a new id
				old := live[0]
				require.NoError(t, testkit.Err(r.Cancel(ctx, sku, old)), "cancel %s", old)
				nid := fmt.Sprintf("G%d", i)
				_, err := r.Hold(ctx, req(sku, nid, "", 1), time.Hour)
				require.NoError(t, err, "round %d: a hold right after this Reserver's cancel", i)
				live = append(live[1:], nid)
				_, err = r.Hold(ctx, req(sku, old, "", 1), time.Hour)
				require.ErrorIs(t, err, stock.ErrRestored, "round %d: the cancelled hold again", i)
			case 1: // restock, then take it
				require.NoError(t, testkit.Err(r.Restock(ctx, sku, fmt.Sprintf("rs%d", i), 1)))
				_, err := r.Deduct(ctx, req(sku, newID(), "", 1))
				require.NoError(t, err, "round %d: a deduct right after this Reserver's restock", i)
			case 2: // a tombstone, then its late deduct: ErrRestored, never ErrSoldOut
				id := fmt.Sprintf("tomb%d", i)
				require.ErrorIs(t, testkit.Err(r.Restore(ctx, sku, id)), stock.ErrUnknownID)
				require.ErrorIs(t, testkit.Err(r.Deduct(ctx, req(sku, id, "", 1))), stock.ErrRestored, "round %d: late deduct of a tombstone", i)
				_, err := r.Hold(ctx, req(sku, id, "", 1), time.Minute)
				require.ErrorIs(t, err, stock.ErrRestored, "round %d: late hold of a tombstone", i)
			case 3: // close: ErrClosed; reopen: sold out again
				require.NoError(t, r.CloseItem(ctx, sku))
				_, err := r.Deduct(ctx, req(sku, newID(), "", 1))
				require.ErrorIs(t, err, stock.ErrClosed, "round %d: deduct right after this Reserver's close", i)
				_, err = r.Hold(ctx, req(sku, newID(), "", 1), time.Minute)
				require.ErrorIs(t, err, stock.ErrClosed, "round %d: hold right after close", i)
				require.NoError(t, r.ReopenItem(ctx, sku))
			case 4: // sell with a deduct restored at once: the restore frees one unit
				require.NoError(t, testkit.Err(r.Restock(ctx, sku, fmt.Sprintf("rt%d", i), 1)))
				id := newID()
				require.NoError(t, testkit.Err(r.Deduct(ctx, req(sku, id, "", 1))))
				soldOut()
				require.NoError(t, testkit.Err(r.Restore(ctx, sku, id)))
				_, err := r.Deduct(ctx, req(sku, newID(), "", 1))
				require.NoError(t, err, "round %d: a deduct right after this Reserver's restore", i)
				// the replay of the restored id: ErrRestored, never sold out
				_, err = r.Deduct(ctx, req(sku, id, "", 1))
				require.ErrorIs(t, err, stock.ErrRestored, "round %d: the restored id again", i)
			}
			testkit.Levels(t, r, sku)
		}
		t.Logf("answered in-process: %d", stockops.SoldOutAnswers(r))
	})
}

// Extend to a near deadline: "items with a hold due within a second" go to Redis, and a hold
// past its deadline is released by the item's next deduct. A hold extended from an hour to 1.2s
// must free its unit for a new request once due, whatever the fast path cached before.
func TestFastPathExtendShortens(t *testing.T) {
	soldOutBackends(t, func(t *testing.T, real bool, c1, _ rueidis.Client) {
		r := testkit.NewReserver(t, c1, stock.WithClock(func() time.Time { return time.Now().Add(-20 * time.Minute) }))
		sku := "ext:short"
		require.NoError(t, r.Load(ctx, sku, 2))
		for i := range 2 {
			require.NoError(t, testkit.Err(r.Hold(ctx, req(sku, fmt.Sprintf("H%d", i), "", 1), time.Hour)))
		}
		refuseSoldOut(t, r, sku, numbered("w", 20)...)
		require.NoError(t, testkit.Err(r.Extend(ctx, sku, "H1", 1200*time.Millisecond)))
		refuseSoldOut(t, r, sku, numbered("v", 20)...) // still live: sold out
		redistest.Sleep(c1, 1500*time.Millisecond)
		rc := must(r.Deduct(ctx, req(sku, "after", "", 1)))(t, "the extended hold is due: the script releases it and takes the request")
		assert.Equal(t, int64(0), rc.Remaining)
		require.ErrorIs(t, testkit.Err(r.Confirm(ctx, sku, "H1")), stock.ErrExpired)
		testkit.Levels(t, r, sku)
	})
}

// Another process gives stock back: "The cache time (WithSoldOutCache, 1 s) bounds it should an
// invalidation be lost". A request with a new id must be taken within a few seconds at most.
func TestFastPathOtherProcessBounded(t *testing.T) {
	soldOutBackends(t, func(t *testing.T, real bool, c1, c2 rueidis.Client) {
		r1 := testkit.NewReserver(t, c1)
		r2 := testkit.NewReserver(t, c2)
		sku := "other:proc"
		require.NoError(t, r1.Load(ctx, sku, 1))
		_, err := r1.Deduct(ctx, req(sku, "a", "", 1))
		require.NoError(t, err)
		n := 0
		for round := range 10 {
			for range 15 {
				n++
				require.ErrorIs(t, testkit.Err(r1.Deduct(ctx, req(sku, fmt.Sprintf("w%d", n), "", 1))), stock.ErrSoldOut)
			}
			var gave string
			switch round % 3 {
			case 0:
				_, err = r2.Restock(ctx, sku, fmt.Sprintf("r%d", round), 1)
				gave = "restock"
			case 1:
				// restore the last sale of r1
				var last string
				for e, err := range stockops.Entries(ctx, r2, sku) {
					require.NoError(t, err)
					if e.Kind == stock.KindDeduct && e.Taken() {
						last = e.ID
					}
				}
				_, err = r2.Restore(ctx, sku, last)
				gave = "restore " + last
			case 2:
				_, err = r2.Hold(ctx, req(sku, "noop", "", 1), time.Minute) // sold out: changes nothing
				require.ErrorIs(t, err, stock.ErrSoldOut)
				_, err = r2.Restock(ctx, sku, fmt.Sprintf("r%d", round), 1)
				gave = "restock"
			}
			require.NoError(t, err)
			start := time.Now()
			var taken bool
			for time.Since(start) < 4*time.Second {
				n++
				_, err := r1.Deduct(ctx, req(sku, fmt.Sprintf("w%d", n), "", 1))
				if err == nil {
					taken = true
					break
				}
				require.ErrorIs(t, err, stock.ErrSoldOut)
				time.Sleep(time.Millisecond)
			}
			require.True(t, taken, "round %d (%s by another process): still sold out after 4s", round, gave)
			testkit.Levels(t, r1, sku)
		}
	})
}

// A sold-out item of this Reserver is delisted, retired by a reconcile pass and loaded again:
// "A retired item answers ErrNotLoaded and may be loaded again." The fast path that answered for
// its first life must not answer for the second.
func TestFastPathRetiredReloaded(t *testing.T) {
	soldOutBackends(t, func(t *testing.T, real bool, c1, _ rueidis.Client) {
		r := testkit.NewReserver(t, c1)
		st := memstore.New()
		sku := "ret:ü"
		require.NoError(t, r.Load(ctx, sku, 2))
		require.NoError(t, st.Load(ctx, sku, 2))
		deductEach(t, r, stock.Request{SKU: sku, Qty: 1}, numbered("d", 2)...)
		refuseSoldOut(t, r, sku, numbered("w", 20)...)
		require.NoError(t, r.Delist(ctx, sku))
		rl := must(stockops.NewRelay(r, st, nil, nil))(t)
		testkit.Drain(t, rl)
		rec := must(stockops.NewReconciler(r, st, &stock.ReconcileOptions{Retention: time.Millisecond}))(t)
		redistest.Sleep(c1, 50*time.Millisecond)
		retired := false
		for i := 0; i < 20 && !retired; i++ {
			res := must(rec.Pass(ctx))(t)
			for _, rp := range res.Reports {
				retired = retired || (rp.SKU == sku && rp.Retired)
			}
		}
		require.True(t, retired, "the delisted item is retired")
		require.ErrorIs(t, testkit.Err(r.Deduct(ctx, req(sku, "gone", "", 1))), stock.ErrNotLoaded)
		require.NoError(t, r.Load(ctx, sku, 3))
		assert.Equal(t, int64(2), must(r.Deduct(ctx, req(sku, "n1", "", 1)))(t, "a reloaded item sells").Remaining)
		// Sold out again (second life), then a restock of this Reserver.
		deductEach(t, r, stock.Request{SKU: sku, Qty: 1}, "n2", "n3")
		refuseSoldOut(t, r, sku, numbered("x", 20)...)
		for i := range 3 {
			rc := must(r.Deduct(ctx, req(sku, fmt.Sprintf("n%d", i+1), "", 1)))(t, "a repeat of a second-life sale is a replay")
			assert.True(t, rc.Replayed)
		}
		require.NoError(t, testkit.Err(r.Restock(ctx, sku, "rs", 1)))
		_, err := r.Deduct(ctx, req(sku, "after-restock", "", 1))
		require.NoError(t, err)
		testkit.Levels(t, r, sku)
	})
}

// TestFastPathOwnWrites: on a sold-out split item, a restore, a cancel or a restock by this
// Reserver is seen by the very next request, whatever bucket it lands in; closed items answer
// ErrClosed; an id already taken is a replay; an id claimed by another buyer is a conflict.
func TestFastPathOwnWrites(t *testing.T) {
	lifecycleEach(t, []stock.Option{lifecycleSplit(3)}, func(t *testing.T, e *env) {
		sku := sku("fp")
		require.NoError(t, e.r.Load(ctx, sku, 6))
		testkit.Sell(t, e.r, sku, "d", "u", 6)
		seq := 0
		soldOut := func() {
			// sell-out is reached and the fast path primed
			for range 5 {
				seq++
				require.ErrorIs(t, testkit.Err(e.r.Deduct(ctx, req(sku, fmt.Sprint("x", seq), fmt.Sprint("x", seq), 1))), stock.ErrSoldOut)
			}
		}
		soldOut()
		type buyer struct{ id, user string }
		var taken []buyer
		for i := range 6 {
			taken = append(taken, buyer{fmt.Sprint("d", i), fmt.Sprint("u", i)})
		}
		for round := range 30 {
			var gone buyer
			if round%3 == 1 {
				require.NoError(t, testkit.Err(e.r.Restock(ctx, sku, fmt.Sprint("rs", round), 1)))
			} else {
				gone, taken = taken[0], taken[1:]
				require.False(t, must(e.r.Restore(ctx, sku, gone.id))(t).Replayed)
			}
			// the very next request, by a new buyer (any bucket), must be served
			seq++
			nb := buyer{fmt.Sprint("n", seq), fmt.Sprint("n", seq)}
			_, err := e.r.Deduct(ctx, req(sku, nb.id, nb.user, 1))
			require.NoError(t, err, "round %d: phantom sold-out after own write", round)
			taken = append(taken, nb)
			if gone.id != "" {
				_, err = e.r.Deduct(ctx, req(sku, gone.id, gone.user, 1))
				require.ErrorIs(t, err, stock.ErrRestored, "round %d: a restored id", round)
			}
			soldOut()
			// a replay of a taken id is never "sold out"; another buyer with it is a conflict
			require.True(t, must(e.r.Deduct(ctx, req(sku, nb.id, nb.user, 1)))(t, "round %d: replay", round).Replayed)
			_, err = e.r.Deduct(ctx, req(sku, nb.id, "someone", 1))
			require.ErrorIs(t, err, stock.ErrConflict, "round %d", round)
		}
		// replays of the first buyers that were never restored
		// a taken id by another buyer: a conflict, never sold out
		require.Zero(t, testkit.Levels(t, e.r, sku).Available)
		// cancel of a hold after sell-out frees stock for the very next request
		require.NoError(t, testkit.Err(e.r.Restock(ctx, sku, "rsh", 1)))
		require.NoError(t, testkit.Err(e.r.Hold(ctx, req(sku, "h", "hu", 1), time.Hour)))
		soldOut()
		require.NoError(t, testkit.Err(e.r.Cancel(ctx, sku, "h")))
		require.NoError(t, testkit.Err(e.r.Deduct(ctx, req(sku, "afterCancel", "ac", 1))), "phantom sold-out after own cancel")
		soldOut()
		// the taken id by its own buyer: a replay; by another buyer: a conflict
		assert.True(t, must(e.r.Deduct(ctx, req(sku, "afterCancel", "ac", 1)))(t).Replayed)
		require.ErrorIs(t, testkit.Err(e.r.Deduct(ctx, req(sku, "afterCancel", "other", 1))), stock.ErrConflict)
		require.ErrorIs(t, testkit.Err(e.r.Hold(ctx, req(sku, "afterCancel", "ac", 1), time.Hour)), stock.ErrConflict)
		// closed: ErrClosed, not sold out
		require.NoError(t, e.r.CloseItem(ctx, sku))
		require.ErrorIs(t, testkit.Err(e.r.Deduct(ctx, req(sku, "closed1", "c", 1))), stock.ErrClosed)
		require.NoError(t, e.r.ReopenItem(ctx, sku))
		soldOut()
		// another process restores: within the window it may say sold out; after it, no
		other := e.another(lifecycleSplit(3))
		_, err := other.Restore(ctx, sku, "afterCancel")
		require.NoError(t, err)
		deadline := time.Now().Add(3 * time.Second)
		for {
			seq++
			_, err = e.r.Deduct(ctx, req(sku, fmt.Sprint("w", seq), fmt.Sprint("w", seq), 1))
			if err == nil {
				break
			}
			require.ErrorIs(t, err, stock.ErrSoldOut)
			require.True(t, time.Now().Before(deadline), "stock given back by another process never seen")
			time.Sleep(time.Millisecond)
		}
		require.Zero(t, testkit.Levels(t, e.r, sku).Available)
	})
}

// TestFastPathHoldDueOtherBucket: a hold due in another bucket than the request's is released
// by the request (no phantom sold-out from the fast path).
func TestFastPathHoldDueOtherBucket(t *testing.T) {
	lifecycleEach(t, []stock.Option{lifecycleSplit(3)}, func(t *testing.T, e *env) {
		sku := sku("fph")
		require.NoError(t, e.r.Load(ctx, sku, 6))
		for i := range 6 {
			ttl := time.Hour
			if i == 0 {
				ttl = time.Second
			}
			require.NoError(t, testkit.Err(e.r.Hold(ctx, req(sku, fmt.Sprint("h", i), fmt.Sprint("u", i), 1), ttl)))
		}
		for i := range 30 {
			require.ErrorIs(t, testkit.Err(e.r.Deduct(ctx, req(sku, fmt.Sprint("x", i), fmt.Sprint("x", i), 1))), stock.ErrSoldOut)
		}
		e.advance(1500 * time.Millisecond)
		// every new buyer, whatever its bucket: the first one must get the expired hold's unit
		require.NoError(t, testkit.Err(e.r.Deduct(ctx, req(sku, "y0", "y0", 1))), "phantom sold-out: a hold due in some bucket")
		l := testkit.Levels(t, e.r, sku)
		assert.Equal(t, int64(5), l.Held)
		assert.Zero(t, l.Available)
	})
}
