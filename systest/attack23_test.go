package systest_test

// Attack 23: outside tests of the newest parts, through the exported API only, written from
// README.md (Guarantees, Holds, Carts, Sold out: the fast path, Operating it, Testing your code)
// and go doc of package stock and stocktest. Every test names the promise it checks. Each runs
// on miniredis and, with STOCK_REDIS_SERVER set, on a real standalone server and a cluster.

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
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
	"github.com/stockres/stock/stocktest"
)

// a23Backends runs f on every backend with two clients on one database (two processes).
func a23Backends(t *testing.T, f func(t *testing.T, real bool, c1, c2 rueidis.Client)) {
	t.Helper()
	for _, b := range redistest.Backends(t) {
		if b.Name == "sentinel" {
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			c1, c2 := b.Pair(t)
			f(t, b.Real(), c1, c2)
		})
	}
}

// a23Levels asserts the invariant and returns the levels.
func a23Levels(t *testing.T, r *stock.Reserver, sku string) stock.Levels {
	t.Helper()
	l, err := r.Levels(context.Background(), sku)
	require.NoError(t, err, sku)
	require.Equal(t, l.Loaded, l.Available+l.Held+l.Sold, "loaded = available + held + sold for %s: %+v", sku, l)
	require.GreaterOrEqual(t, l.Available, int64(0), sku)
	return l
}

// a23Run starts r.Run and returns a stop function that cancels it and returns its error, failing
// the test if it does not return within bound.
func a23Run(t *testing.T, r *stock.Reserver, opts stock.RunOptions, bound time.Duration) func() error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, opts) }()
	var once sync.Once
	var res error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case res = <-done:
			case <-time.After(bound):
				t.Errorf("Run did not return within %v after its ctx ended", bound)
				res = errors.New("run hung")
			}
		})
		return res
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// ---------------------------------------------------------------------------------------------
// 2. The sold-out fast path: "It only ever refuses, and only what the script would refuse with
// ErrSoldOut ... never refuses an id the ledger has". Differential: a Reserver with the fast
// path against one without it (WithSoldOutCache(0)) on the same Redis, asked the same
// questions one after the other, must give the same answers, for every id the ledger has had
// (deducts, holds live, cancelled and expired, restores, tombstones, restocks, retry refusals)
// and for new ids.

func TestAttack23FastPathDifferential(t *testing.T) {
	a23Backends(t, func(t *testing.T, real bool, c1, c2 rueidis.Client) {
		ctx := context.Background()
		const limit = 3
		fast := newReserver(t, c1, stock.WithUserLimit(limit))
		ref := newReserver(t, c2, stock.WithUserLimit(limit), stock.WithSoldOutCache(0))
		sku := "fp:~ü-Ω"
		require.NoError(t, fast.Load(ctx, sku, 330))

		user := func(i int) string { return fmt.Sprintf("u%d", i%120) }
		var ids []string
		for i := range 300 {
			id := fmt.Sprintf("d%d", i)
			_, err := fast.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: user(i), Qty: 1})
			require.NoError(t, err, id)
			ids = append(ids, id)
		}
		for i := range 20 {
			id := fmt.Sprintf("h%d", i)
			_, err := fast.Hold(ctx, stock.Request{SKU: sku, ID: id, User: user(i + 300), Qty: 1}, time.Hour)
			require.NoError(t, err, id)
			ids = append(ids, id)
		}
		for i := range 5 {
			id := fmt.Sprintf("e%d", i)
			_, err := fast.Hold(ctx, stock.Request{SKU: sku, ID: id, User: user(i + 320), Qty: 1}, 300*time.Millisecond)
			require.NoError(t, err, id)
			ids = append(ids, id)
		}
		for i := range 20 { // restores of deducts
			_, err := fast.Restore(ctx, sku, fmt.Sprintf("d%d", i))
			require.NoError(t, err)
		}
		for i := range 5 { // cancels of holds
			_, err := fast.Cancel(ctx, sku, fmt.Sprintf("h%d", i))
			require.NoError(t, err)
		}
		for i := range 10 { // tombstones
			id := fmt.Sprintf("t%d", i)
			_, err := fast.Restore(ctx, sku, id)
			require.ErrorIs(t, err, stock.ErrUnknownID)
			ids = append(ids, id)
		}
		for i := range 3 { // restocks
			id := fmt.Sprintf("r%d", i)
			_, err := fast.Restock(ctx, sku, id, 2)
			require.NoError(t, err)
			ids = append(ids, id)
		}
		redistest.Sleep(c1, 600*time.Millisecond) // the e holds pass their deadline
		_, err := stockops.Sweep(ctx, fast, sku)
		require.NoError(t, err)
		// Sell out with fill ids.
		for i := 0; ; i++ {
			require.Less(t, i, 1000)
			id := fmt.Sprintf("f%d", i)
			_, err := fast.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: fmt.Sprintf("fill%d", i), Qty: 1})
			if errors.Is(err, stock.ErrSoldOut) {
				break
			}
			require.NoError(t, err)
			ids = append(ids, id)
		}
		// Retry refusals (Tf), recorded now that the item is sold out.
		for i := range 5 {
			id := fmt.Sprintf("x%d", i)
			_, err := fast.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: "ux", Qty: 1, Retry: true})
			require.ErrorIs(t, err, stock.ErrSoldOut)
			ids = append(ids, id)
		}
		// Build the filter: refusals of new ids, enough for a ledger of ~400 entries.
		for i := range 40 {
			_, err := fast.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("warm%d", i), Qty: 1})
			require.ErrorIs(t, err, stock.ErrSoldOut)
		}
		a23Levels(t, fast, sku)

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
				q{false, stock.Request{SKU: sku, ID: id, User: e.User, Qty: qty}},
				q{true, stock.Request{SKU: sku, ID: id, User: e.User, Qty: qty}},
				q{false, stock.Request{SKU: sku, ID: id, User: "someone-else", Qty: qty + 1}},
			)
		}
		for i := range 300 {
			qs = append(qs, q{i%2 == 0, stock.Request{SKU: sku, ID: fmt.Sprintf("new%d", i), User: user(i), Qty: 1}})
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
		a23Levels(t, fast, sku)
	})
}

// "after a write of a Reserver has returned, that Reserver's answers never predate the write":
// writes of this Reserver that give stock back or change the answer (restore, cancel, restock,
// extend to a near deadline, close, reopen, a tombstone), each followed at once by a request
// that the fast path must not refuse as sold out. Many rounds, to hit the invalidation race.
func TestAttack23FastPathOwnWritesWithHolds(t *testing.T) {
	a23Backends(t, func(t *testing.T, real bool, c1, _ rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c1)
		sku := "own:holds~é"
		require.NoError(t, r.Load(ctx, sku, 4))
		for i := range 4 {
			_, err := r.Hold(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("H%d", i), Qty: 1}, time.Hour)
			require.NoError(t, err)
		}
		live := []string{"H0", "H1", "H2", "H3"}
		n := 0
		newID := func() string { n++; return fmt.Sprintf("n%d", n) }
		soldOut := func() {
			t.Helper()
			for range 3 {
				_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: newID(), Qty: 1})
				require.ErrorIs(t, err, stock.ErrSoldOut)
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
				_, err := r.Cancel(ctx, sku, old)
				require.NoError(t, err, "cancel %s", old)
				nid := fmt.Sprintf("G%d", i)
				_, err = r.Hold(ctx, stock.Request{SKU: sku, ID: nid, Qty: 1}, time.Hour)
				require.NoError(t, err, "round %d: a hold right after this Reserver's cancel", i)
				live = append(live[1:], nid)
				_, err = r.Hold(ctx, stock.Request{SKU: sku, ID: old, Qty: 1}, time.Hour)
				require.ErrorIs(t, err, stock.ErrRestored, "round %d: the cancelled hold again", i)
			case 1: // restock, then take it
				_, err := r.Restock(ctx, sku, fmt.Sprintf("rs%d", i), 1)
				require.NoError(t, err)
				_, err = r.Deduct(ctx, stock.Request{SKU: sku, ID: newID(), Qty: 1})
				require.NoError(t, err, "round %d: a deduct right after this Reserver's restock", i)
			case 2: // a tombstone, then its late deduct: ErrRestored, never ErrSoldOut
				id := fmt.Sprintf("tomb%d", i)
				_, err := r.Restore(ctx, sku, id)
				require.ErrorIs(t, err, stock.ErrUnknownID)
				_, err = r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: 1})
				require.ErrorIs(t, err, stock.ErrRestored, "round %d: late deduct of a tombstone", i)
				_, err = r.Hold(ctx, stock.Request{SKU: sku, ID: id, Qty: 1}, time.Minute)
				require.ErrorIs(t, err, stock.ErrRestored, "round %d: late hold of a tombstone", i)
			case 3: // close: ErrClosed; reopen: sold out again
				require.NoError(t, r.CloseItem(ctx, sku))
				_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: newID(), Qty: 1})
				require.ErrorIs(t, err, stock.ErrClosed, "round %d: deduct right after this Reserver's close", i)
				_, err = r.Hold(ctx, stock.Request{SKU: sku, ID: newID(), Qty: 1}, time.Minute)
				require.ErrorIs(t, err, stock.ErrClosed, "round %d: hold right after close", i)
				require.NoError(t, r.ReopenItem(ctx, sku))
			case 4: // sell with a deduct restored at once: the restore frees one unit
				_, err := r.Restock(ctx, sku, fmt.Sprintf("rt%d", i), 1)
				require.NoError(t, err)
				id := newID()
				_, err = r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: 1})
				require.NoError(t, err)
				soldOut()
				_, err = r.Restore(ctx, sku, id)
				require.NoError(t, err)
				_, err = r.Deduct(ctx, stock.Request{SKU: sku, ID: newID(), Qty: 1})
				require.NoError(t, err, "round %d: a deduct right after this Reserver's restore", i)
				// the replay of the restored id: ErrRestored, never sold out
				_, err = r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: 1})
				require.ErrorIs(t, err, stock.ErrRestored, "round %d: the restored id again", i)
			}
			a23Levels(t, r, sku)
		}
		t.Logf("answered in-process: %d", stockops.SoldOutAnswers(r))
	})
}

// Extend to a near deadline: "items with a hold due within a second" go to Redis, and a hold
// past its deadline is released by the item's next deduct. A hold extended from an hour to 1.2s
// must free its unit for a new request once due, whatever the fast path cached before.
func TestAttack23FastPathExtendShortens(t *testing.T) {
	a23Backends(t, func(t *testing.T, real bool, c1, _ rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c1, stock.WithClock(func() time.Time { return time.Now().Add(-20 * time.Minute) }))
		sku := "ext:short"
		require.NoError(t, r.Load(ctx, sku, 2))
		for i := range 2 {
			_, err := r.Hold(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("H%d", i), Qty: 1}, time.Hour)
			require.NoError(t, err)
		}
		for i := range 20 {
			_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("w%d", i), Qty: 1})
			require.ErrorIs(t, err, stock.ErrSoldOut)
		}
		_, err := r.Extend(ctx, sku, "H1", 1200*time.Millisecond)
		require.NoError(t, err)
		for i := range 20 { // still live: sold out
			_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("v%d", i), Qty: 1})
			require.ErrorIs(t, err, stock.ErrSoldOut)
		}
		redistest.Sleep(c1, 1500*time.Millisecond)
		rc, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: "after", Qty: 1})
		require.NoError(t, err, "the extended hold is due: the script releases it and takes the request")
		assert.Equal(t, int64(0), rc.Remaining)
		_, err = r.Confirm(ctx, sku, "H1")
		require.ErrorIs(t, err, stock.ErrExpired)
		a23Levels(t, r, sku)
	})
}

// Another process gives stock back: "The cache time (WithSoldOutCache, 1 s) bounds it should an
// invalidation be lost". A request with a new id must be taken within a few seconds at most.
func TestAttack23FastPathOtherProcessBounded(t *testing.T) {
	a23Backends(t, func(t *testing.T, real bool, c1, c2 rueidis.Client) {
		ctx := context.Background()
		r1 := newReserver(t, c1)
		r2 := newReserver(t, c2)
		sku := "other:proc"
		require.NoError(t, r1.Load(ctx, sku, 1))
		_, err := r1.Deduct(ctx, stock.Request{SKU: sku, ID: "a", Qty: 1})
		require.NoError(t, err)
		n := 0
		for round := range 10 {
			for range 15 {
				n++
				_, err := r1.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("w%d", n), Qty: 1})
				require.ErrorIs(t, err, stock.ErrSoldOut)
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
				_, err = r2.Hold(ctx, stock.Request{SKU: sku, ID: "noop", Qty: 1}, time.Minute) // sold out: changes nothing
				require.ErrorIs(t, err, stock.ErrSoldOut)
				_, err = r2.Restock(ctx, sku, fmt.Sprintf("r%d", round), 1)
				gave = "restock"
			}
			require.NoError(t, err)
			start := time.Now()
			var taken bool
			for time.Since(start) < 4*time.Second {
				n++
				_, err := r1.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("w%d", n), Qty: 1})
				if err == nil {
					taken = true
					break
				}
				require.ErrorIs(t, err, stock.ErrSoldOut)
				time.Sleep(time.Millisecond)
			}
			require.True(t, taken, "round %d (%s by another process): still sold out after 4s", round, gave)
			a23Levels(t, r1, sku)
		}
	})
}

// ---------------------------------------------------------------------------------------------
// 3. Per-user limits with collisions and concurrent copies.

// N goroutines, S stock: exactly S successes; the per-user limit holds; concurrent copies of one
// request take once; the same id across users on one item: one wins, the others ErrConflict;
// the same id on two items names two requests. The ledger, Levels and the Store agree.
func TestAttack23UserLimitConcurrentCopies(t *testing.T) {
	a23Backends(t, func(t *testing.T, real bool, c1, c2 rueidis.Client) {
		ctx := context.Background()
		const limit = 2
		r1 := newReserver(t, c1, stock.WithUserLimit(limit))
		r2 := newReserver(t, c2, stock.WithUserLimit(limit))
		rs := []*stock.Reserver{r1, r2}
		const S = 37
		skus := []string{"lim:a", "lim:b~ü"}
		for _, s := range skus {
			require.NoError(t, r1.Load(ctx, s, S))
		}
		store := memstore.New()
		for _, s := range skus {
			require.NoError(t, store.Load(ctx, s, S))
		}
		// A complete pass records the primaries as reconciled before Run starts, so that Run's
		// guard does not fence r1 as a guard added to a live deployment (documented) while the
		// requests run.
		rec, err := stockops.NewReconciler(r1, store, nil)
		require.NoError(t, err)
		pr, err := rec.Pass(ctx)
		require.NoError(t, err)
		require.True(t, pr.Complete)
		stop := a23Run(t, r1, stock.RunOptions{Store: store, Relay: &stock.RelayOptions{Poll: 10 * time.Millisecond},
			Reconcile: &stock.ReconcileOptions{Interval: time.Hour}}, 30*time.Second)

		type res struct {
			sku, id, user string
			err           error
			rc            stock.Receipt
		}
		var mu sync.Mutex
		var out []res
		var wg sync.WaitGroup
		// 60 users x 3 distinct ids each x 2 copies of each request, on both items, with the
		// same ids on both items; plus 10 users who race for the same ids ("shared-k").
		for u := range 60 {
			for k := range 3 {
				for cp := range 2 {
					for _, sku := range skus {
						wg.Add(1)
						go func() {
							defer wg.Done()
							req := stock.Request{SKU: sku, ID: fmt.Sprintf("o-%d-%d", u, k), User: fmt.Sprintf("user%d", u), Qty: 1}
							rc, err := rs[(u+cp)%2].Deduct(ctx, req)
							mu.Lock()
							out = append(out, res{sku, req.ID, req.User, err, rc})
							mu.Unlock()
						}()
					}
				}
			}
		}
		for u := range 10 {
			for k := range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					req := stock.Request{SKU: skus[0], ID: fmt.Sprintf("shared-%d", k), User: fmt.Sprintf("racer%d", u), Qty: 1}
					rc, err := rs[u%2].Deduct(ctx, req)
					mu.Lock()
					out = append(out, res{req.SKU, req.ID, req.User, err, rc})
					mu.Unlock()
				}()
			}
		}
		wg.Wait()

		// Count.
		for _, sku := range skus {
			fresh := map[string]int{}      // id -> non-replayed successes
			winners := map[string]string{} // id -> user of the success
			perUser := map[string]map[string]bool{}
			total := 0
			for _, o := range out {
				if o.sku != sku {
					continue
				}
				switch {
				case o.err == nil:
					if !o.rc.Replayed {
						fresh[o.id]++
						total++
					}
					if w, ok := winners[o.id]; ok {
						require.Equal(t, w, o.user, "%s/%s: two users acknowledged", sku, o.id)
					}
					winners[o.id] = o.user
					if perUser[o.user] == nil {
						perUser[o.user] = map[string]bool{}
					}
					perUser[o.user][o.id] = true
				case errors.Is(o.err, stock.ErrSoldOut), errors.Is(o.err, stock.ErrUserLimit),
					errors.Is(o.err, stock.ErrConflict), errors.Is(o.err, stock.ErrInsufficient):
				default:
					t.Fatalf("%s/%s: unexpected %v", sku, o.id, o.err)
				}
			}
			for id, n := range fresh {
				assert.Equal(t, 1, n, "%s/%s: %d non-replayed successes", sku, id, n)
			}
			assert.Equal(t, S, total, "%s: S units, S successes (N requests far above S)", sku)
			for u, ids := range perUser {
				assert.LessOrEqual(t, len(ids), limit, "%s: user %s acknowledged %d ids", sku, u, len(ids))
			}
			l := a23Levels(t, r1, sku)
			assert.Equal(t, int64(S), l.Sold)
			assert.Equal(t, int64(0), l.Available)
			entries := ledger(t, r1, sku)
			taken := 0
			for id, e := range entries {
				if e.Taken() {
					taken++
					assert.Equal(t, winners[id], e.User, "%s/%s: the ledger's user is the acknowledged one", sku, id)
				}
			}
			assert.Equal(t, S, taken, "%s: taken entries", sku)
		}
		// The store gets every sale, once.
		require.Eventually(t, func() bool {
			for _, sku := range skus {
				n, err := store.Remaining(ctx, sku)
				if err != nil || n != 0 {
					return false
				}
			}
			return true
		}, 20*time.Second, 20*time.Millisecond, "the store reaches 0 remaining")
		require.NoError(t, ignoreCanceled(stop()))
		assert.LessOrEqual(t, store.MaxApplications(), 1)
		for _, sku := range skus {
			p, d, err := stockops.Pending(ctx, r1, sku)
			require.NoError(t, err)
			assert.Zero(t, p, "%s: outbox drained", sku)
			assert.Zero(t, d)
		}
	})
}

func ignoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// The limit is per user and per item, over restores and holds: a user at the limit who gets a
// unit back (restore, cancel, an expired hold) may take one more, once, even under concurrent
// copies of the next request with distinct ids.
func TestAttack23UserLimitGiveBackRace(t *testing.T) {
	a23Backends(t, func(t *testing.T, real bool, c1, c2 rueidis.Client) {
		ctx := context.Background()
		r1 := newReserver(t, c1, stock.WithUserLimit(2))
		r2 := newReserver(t, c2, stock.WithUserLimit(2))
		sku := "lim:give"
		require.NoError(t, r1.Load(ctx, sku, 100))
		_, err := r1.Deduct(ctx, stock.Request{SKU: sku, ID: "a", User: "bob", Qty: 1})
		require.NoError(t, err)
		_, err = r1.Hold(ctx, stock.Request{SKU: sku, ID: "b", User: "bob", Qty: 1}, 400*time.Millisecond)
		require.NoError(t, err)
		_, err = r1.Deduct(ctx, stock.Request{SKU: sku, ID: "c", User: "bob", Qty: 1})
		require.ErrorIs(t, err, stock.ErrUserLimit)
		for round, give := range []func() error{
			func() error { redistest.Sleep(c1, time.Second); return nil }, // the hold expires
			func() error { _, err := r2.Restore(ctx, sku, "a"); return err },
		} {
			require.NoError(t, give())
			var ok atomic.Int32
			var wg sync.WaitGroup
			for g := range 24 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := []*stock.Reserver{r1, r2}[g%2].Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("x%d-%d", round, g), User: "bob", Qty: 1})
					if err == nil {
						ok.Add(1)
					} else if !errors.Is(err, stock.ErrUserLimit) {
						t.Errorf("unexpected %v", err)
					}
				}()
			}
			wg.Wait()
			assert.Equal(t, int32(1), ok.Load(), "round %d: one unit given back, one more taken", round)
		}
		l := a23Levels(t, r1, sku)
		assert.Equal(t, int64(2), l.Sold)
		assert.Equal(t, int64(0), l.Held)
	})
}

// ---------------------------------------------------------------------------------------------
// Carts across grouped and ungrouped items, concurrent copies, the per-user limit per item.

func TestAttack23CartsGroupedAndSaga(t *testing.T) {
	a23Backends(t, func(t *testing.T, real bool, c1, c2 rueidis.Client) {
		ctx := context.Background()
		group := func(sku string) string {
			if len(sku) > 2 && sku[:2] == "g-" {
				return "bundle"
			}
			return ""
		}
		r1 := newReserver(t, c1, stock.WithGroups(group), stock.WithUserLimit(1))
		r2 := newReserver(t, c2, stock.WithGroups(group), stock.WithUserLimit(1))
		rs := []*stock.Reserver{r1, r2}
		const S = 9
		skus := []string{"g-shirt", "g-cap", "plain:mug", "bundle"} // "bundle" shares its name with the group
		for _, s := range skus {
			require.NoError(t, r1.Load(ctx, s, S))
		}
		carts := [][]stock.Line{
			{{SKU: "g-shirt", Qty: 1}, {SKU: "g-cap", Qty: 1}},     // one script
			{{SKU: "g-shirt", Qty: 1}, {SKU: "plain:mug", Qty: 1}}, // saga
			{{SKU: "bundle", Qty: 1}, {SKU: "g-cap", Qty: 1}},      // saga, item named as the group
			{{SKU: "plain:mug", Qty: 1}, {SKU: "bundle", Qty: 1}},  // saga, ungrouped
		}
		type res struct {
			cart int
			id   string
			user string
			rc   stock.CartReceipt
			err  error
		}
		var mu sync.Mutex
		var out []res
		var wg sync.WaitGroup
		for u := range 16 {
			for k := range carts {
				id := fmt.Sprintf("cart-%d-%d", u, k)
				for cp := range 4 { // four concurrent copies of each cart
					wg.Add(1)
					go func() {
						defer wg.Done()
						rc, err := rs[(u+k+cp)%2].DeductMany(ctx, stock.Cart{ID: id, User: fmt.Sprintf("user%d", u), Lines: carts[k]})
						mu.Lock()
						out = append(out, res{k, id, fmt.Sprintf("user%d", u), rc, err})
						mu.Unlock()
					}()
				}
			}
		}
		wg.Wait()
		byID := map[string][]res{}
		for _, o := range out {
			byID[o.id] = append(byID[o.id], o)
		}
		sold := map[string]int64{}
		perUserItem := map[string]int{}
		for id, copies := range byID {
			var fresh, ok int
			for _, o := range copies {
				if o.err == nil {
					ok++
					if !o.rc.Replayed {
						fresh++
					}
				} else {
					var ce *stock.CartError
					if !errors.As(o.err, &ce) {
						t.Errorf("%s: error without a CartError: %v", id, o.err)
					}
				}
			}
			if ok > 0 {
				assert.Equal(t, 1, fresh, "%s: exactly one copy completes the cart (%d ok)", id, ok)
				// One outcome: every copy answers it.
				assert.Equal(t, len(copies), ok, "%s: a cart id has one outcome, but copies disagreed: %v", id, copies)
				for _, l := range carts[copies[0].cart] {
					sold[l.SKU] += l.Qty
					perUserItem[copies[0].user+"/"+l.SKU]++
				}
			}
		}
		for k, n := range perUserItem {
			assert.LessOrEqual(t, n, 1, "per-user limit per item: %s", k)
		}
		for _, s := range skus {
			l := a23Levels(t, r1, s)
			assert.Equal(t, sold[s], l.Sold, "%s: sold = units of the acknowledged carts", s)
			assert.Equal(t, int64(0), l.Held)
			e := ledger(t, r1, s)
			var taken int64
			for id, en := range e {
				if en.Taken() {
					taken += en.Qty
					cs := byID[id]
					require.NotEmpty(t, cs, "%s: taken entry %s of no cart", s, id)
					assert.NoError(t, cs[0].err, "%s: entry %s is taken, its cart was refused", s, id)
				}
			}
			assert.Equal(t, sold[s], taken, "%s: ledger", s)
		}
		// The store agrees after Run.
		store := memstore.New()
		for _, s := range skus {
			require.NoError(t, store.Load(ctx, s, S))
		}
		stop := a23Run(t, r2, stock.RunOptions{Store: store, Relay: &stock.RelayOptions{Poll: 10 * time.Millisecond}}, 30*time.Second)
		require.Eventually(t, func() bool {
			for _, s := range skus {
				n, err := store.Remaining(ctx, s)
				if err != nil || n != S-sold[s] {
					return false
				}
			}
			return true
		}, 20*time.Second, 20*time.Millisecond)
		require.NoError(t, ignoreCanceled(stop()))
		assert.LessOrEqual(t, store.MaxApplications(), 1)
	})
}

// "A cart id has one outcome ... RecoverCarts undoes carts whose process died mid-saga": a
// process whose clock (WithClock) is an hour ahead of Redis's sees every pending cart as old and
// undoes carts while their sagas run. Whatever it undoes, a cart acknowledged as taken keeps
// every line, a refused one keeps none, and the counters hold.
func TestAttack23RecoverCartsSkewedClockRacesSagas(t *testing.T) {
	a23Backends(t, func(t *testing.T, real bool, c1, c2 rueidis.Client) {
		ctx := context.Background()
		buyer := newReserver(t, c1)
		ahead := newReserver(t, c2, stock.WithClock(func() time.Time { return time.Now().Add(time.Hour) }))
		skus := []string{"rc:a", "rc:b", "rc:c"}
		for _, s := range skus {
			require.NoError(t, buyer.Load(ctx, s, 1000))
		}
		stopRecover := make(chan struct{})
		var recovered atomic.Int64
		var rwg sync.WaitGroup
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			for {
				select {
				case <-stopRecover:
					return
				default:
				}
				n, err := stockops.RecoverCarts(ctx, ahead, time.Minute)
				if err != nil {
					t.Errorf("RecoverCarts: %v", err)
					return
				}
				recovered.Add(int64(n))
			}
		}()
		type res struct {
			id  string
			err error
		}
		var mu sync.Mutex
		var out []res
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 25 {
					id := fmt.Sprintf("c%d-%d", g, i)
					_, err := buyer.DeductMany(ctx, stock.Cart{ID: id, User: "u", Lines: []stock.Line{
						{SKU: skus[0], Qty: 1}, {SKU: skus[1], Qty: 2}, {SKU: skus[2], Qty: 1}}})
					mu.Lock()
					out = append(out, res{id, err})
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		close(stopRecover)
		rwg.Wait()
		t.Logf("carts undone by the skewed RecoverCarts: %d", recovered.Load())
		ents := map[string]map[string]stock.Entry{}
		for _, s := range skus {
			ents[s] = ledger(t, buyer, s)
			a23Levels(t, buyer, s)
		}
		var sold [3]int64
		for _, o := range out {
			// Retry: the answer of the cart id must not change.
			_, again := buyer.DeductMany(ctx, stock.Cart{ID: o.id, User: "u", Lines: []stock.Line{
				{SKU: skus[0], Qty: 1}, {SKU: skus[1], Qty: 2}, {SKU: skus[2], Qty: 1}}})
			if o.err == nil {
				assert.NoError(t, again, "%s: taken, then its retry says %v", o.id, again)
			} else {
				assert.Error(t, again, "%s: refused (%v), then its retry took it", o.id, o.err)
			}
			for i, s := range skus {
				e, ok := ents[s][o.id]
				taken := ok && e.Taken()
				if o.err == nil {
					assert.True(t, taken, "%s: acknowledged, but line %s is %+v", o.id, s, e)
					if taken {
						sold[i] += e.Qty
					}
				} else {
					assert.False(t, taken, "%s: refused (%v), but line %s still holds %+v", o.id, o.err, s, e)
				}
			}
		}
		for i, s := range skus {
			l := a23Levels(t, buyer, s)
			assert.Equal(t, sold[i], l.Sold, "%s", s)
		}
	})
}

// ---------------------------------------------------------------------------------------------
// 1. Run with due-work hints.

// Items loaded after Run started, names with ':' '~' and unicode, many holds due at once on
// many items (more than one sweep step), deducts, restores and confirms: every event reaches
// the store once, every hold is released at its deadline without any further call, and Run
// returns after its ctx ends with the outbox drained.
func TestAttack23RunLateItemsManyHoldsDue(t *testing.T) {
	a23Backends(t, func(t *testing.T, real bool, c1, c2 rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c1)
		other := newReserver(t, c2)
		store := memstore.New()
		stop := a23Run(t, r, stock.RunOptions{Store: store, SweepInterval: 50 * time.Millisecond,
			Relay: &stock.RelayOptions{Poll: 20 * time.Millisecond}, Drain: 10 * time.Second}, 30*time.Second)
		time.Sleep(100 * time.Millisecond) // Run is up before the items exist
		var skus []string
		for i := range 40 {
			sku := fmt.Sprintf("late:%d~ñ:日本", i)
			skus = append(skus, sku)
			require.NoError(t, store.Load(ctx, sku, 30))
			require.NoError(t, other.Load(ctx, sku, 30))
		}
		// Run's guard may have looked after the items were loaded (a live deployment: fenced
		// until its first pass completes, as documented): wait for the fence to lift.
		require.Eventually(t, func() bool {
			_, err := r.Deduct(ctx, stock.Request{SKU: skus[0], ID: "probe", Qty: 1})
			if err == nil {
				_, err = r.Restore(ctx, skus[0], "probe")
				require.NoError(t, err)
				return true
			}
			require.ErrorIs(t, err, stock.ErrFailover)
			return false
		}, 20*time.Second, 20*time.Millisecond)
		ttl := 1500 * time.Millisecond
		var holdsTaken, checked int
		for i, sku := range skus {
			w := []*stock.Reserver{r, other}[i%2]
			start := time.Now()
			for h := range 8 {
				_, err := w.Hold(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("h%d", h), User: "u", Qty: 1}, ttl)
				require.NoError(t, err)
				holdsTaken++
			}
			// Before the deadline nothing is released. Checked per item, right after its holds:
			// all 40 items' calls can take longer than one TTL on a loaded machine, and an
			// item whose check comes too late to mean anything is not judged.
			if l := a23Levels(t, r, sku); time.Since(start) < ttl-200*time.Millisecond {
				assert.Equal(t, int64(8), l.Held, "%s: held before the deadline", sku)
				checked++
			}
			_, err := w.Hold(ctx, stock.Request{SKU: sku, ID: "keep", Qty: 2}, time.Hour)
			require.NoError(t, err)
			_, err = w.Confirm(ctx, sku, "keep")
			require.NoError(t, err)
			for d := range 3 {
				_, err := w.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("d%d", d), Qty: 1})
				require.NoError(t, err)
			}
			_, err = w.Restore(ctx, sku, "d0")
			require.NoError(t, err)
		}
		require.Positive(t, checked, "no item was checked before its holds' deadline")
		redistest.Sleep(c1, ttl+100*time.Millisecond)
		require.Eventually(t, func() bool {
			for _, sku := range skus {
				l, err := r.Levels(ctx, sku)
				if err != nil || l.Held != 0 {
					return false
				}
			}
			return true
		}, 15*time.Second, 50*time.Millisecond, "Run releases every due hold without other calls")
		// The store: 30 - 2 (keep) - 2 (d1, d2) = 26.
		require.Eventually(t, func() bool {
			for _, sku := range skus {
				n, err := store.Remaining(ctx, sku)
				if err != nil || n != 26 {
					return false
				}
			}
			return true
		}, 15*time.Second, 50*time.Millisecond, "the store gets every item's events")
		// A last sale, then stop: Drain delivers it.
		for _, sku := range skus {
			_, err := other.Deduct(ctx, stock.Request{SKU: sku, ID: "last", Qty: 1})
			require.NoError(t, err)
		}
		require.NoError(t, ignoreCanceled(stop()))
		for _, sku := range skus {
			l := a23Levels(t, r, sku)
			assert.Equal(t, int64(25), l.Available, sku)
			n, err := store.Remaining(ctx, sku)
			require.NoError(t, err)
			assert.Equal(t, int64(25), n, "%s: the store after Run's drain", sku)
			p, _, err := stockops.Pending(ctx, r, sku)
			require.NoError(t, err)
			assert.Zero(t, p, "%s: outbox after Run returned", sku)
			for h := range 8 {
				e, err := r.Ledger(ctx, sku, fmt.Sprintf("h%d", h))
				require.NoError(t, err)
				assert.Equal(t, stock.StateExpired, e.State)
			}
		}
		assert.LessOrEqual(t, store.MaxApplications(), 1)
		_ = holdsTaken
	})
}

// Two Runs on one Redis, one of them restarted mid-work several times, while two processes
// sell: the store ends equal to Redis, every id applied once.
func TestAttack23TwoRunsRestarted(t *testing.T) {
	a23Backends(t, func(t *testing.T, real bool, c1, c2 rueidis.Client) {
		ctx := context.Background()
		r1 := newReserver(t, c1)
		r2 := newReserver(t, c2)
		store := memstore.New()
		skus := []string{"two:a", "two:b~", "two:ç"}
		for _, s := range skus {
			require.NoError(t, r1.Load(ctx, s, 500))
			require.NoError(t, store.Load(ctx, s, 500))
		}
		opts := stock.RunOptions{Store: store, SweepInterval: 30 * time.Millisecond,
			Relay: &stock.RelayOptions{Poll: 10 * time.Millisecond, Batch: 7}, Reconcile: &stock.ReconcileOptions{Interval: 200 * time.Millisecond}}
		stop1 := a23Run(t, r1, opts, 30*time.Second)
		var sells sync.WaitGroup
		var fail atomic.Value
		var fenced atomic.Int64
		start := time.Now()
		sell := func(r *stock.Reserver, tag string) {
			defer sells.Done()
			for i := range 120 {
				sku := skus[i%len(skus)]
				id := fmt.Sprintf("%s-%d", tag, i)
				var err error
				switch i % 4 {
				case 0, 1:
					_, err = r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: 1})
				case 2:
					_, err = r.Hold(ctx, stock.Request{SKU: sku, ID: id, Qty: 1}, 200*time.Millisecond)
					if err == nil && i%8 == 2 {
						_, err = r.Confirm(ctx, sku, id)
						if errors.Is(err, stock.ErrExpired) {
							err = nil
						}
					}
				case 3:
					_, err = r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: 2})
					if err == nil {
						_, err = r.Restore(ctx, sku, id)
					}
				}
				if errors.Is(err, stock.ErrFailover) {
					// Run's guard fences a Reserver started on a live deployment until a complete
					// pass: wait for it (bounded) and go on with the next id.
					fenced.Add(1)
					if time.Since(start) > 20*time.Second {
						fail.Store(fmt.Errorf("%s: still fenced after 20s: %w", id, err))
						return
					}
					time.Sleep(20 * time.Millisecond)
					continue
				}
				if err != nil {
					fail.Store(fmt.Errorf("%s: %w", id, err))
					return
				}
			}
		}
		sells.Add(2)
		go sell(r1, "p1")
		go sell(r2, "p2")
		for range 4 { // r2's Run, restarted mid-work
			stop2 := a23Run(t, r2, opts, 30*time.Second)
			time.Sleep(150 * time.Millisecond)
			require.NoError(t, ignoreCanceled(stop2()))
		}
		sells.Wait()
		t.Logf("calls refused with ErrFailover: %d", fenced.Load())
		if v := fail.Load(); v != nil {
			t.Fatal(v)
		}
		if !real {
			redistest.Sleep(c1, time.Second) // let the short holds pass their deadline
		} else {
			time.Sleep(300 * time.Millisecond)
		}
		require.Eventually(t, func() bool {
			for _, s := range skus {
				l, err := r1.Levels(ctx, s)
				if err != nil || l.Held != 0 {
					return false
				}
				n, err := store.Remaining(ctx, s)
				if err != nil || n != l.Available {
					return false
				}
			}
			return true
		}, 20*time.Second, 50*time.Millisecond, "the store ends equal to Redis")
		require.NoError(t, ignoreCanceled(stop1()))
		assert.LessOrEqual(t, store.MaxApplications(), 1)
		for _, s := range skus {
			l, _ := checkLedger(t, r1, s, 500)
			n, err := store.Remaining(ctx, s)
			require.NoError(t, err)
			assert.Equal(t, l.Available, n, s)
		}
	})
}

// ---------------------------------------------------------------------------------------------
// 4. stocktest: one clock moves hold deadlines (for Run's sweeper too), leases, backoff and cart
// age.

func TestAttack23StocktestOneClock(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t)
	r := e.Reserver
	store := memstore.New()
	var down atomic.Bool
	down.Store(true)
	store.FailWith(func(ev stock.Event) error {
		if down.Load() {
			return memstore.ErrDown
		}
		return nil
	})
	skus := []string{"kit:a", "kit:b~ü"}
	for _, s := range skus {
		require.NoError(t, r.Load(ctx, s, 10))
		require.NoError(t, store.Load(ctx, s, 10))
	}
	stop := a23Run(t, r, stock.RunOptions{Store: store, SweepInterval: 20 * time.Millisecond,
		Relay:     &stock.RelayOptions{Poll: 10 * time.Millisecond, MinBackoff: 10 * time.Minute, MaxBackoff: 20 * time.Minute},
		Reconcile: &stock.ReconcileOptions{Interval: time.Hour}, RecoverCartsAfter: 5 * time.Minute}, 30*time.Second)

	// Holds: not released by wall-clock time; released by Advance, with no call but Run's.
	_, err := r.HoldMany(ctx, stock.Cart{ID: "cart1", User: "u", Lines: []stock.Line{{SKU: skus[0], Qty: 2}, {SKU: skus[1], Qty: 1}}}, 10*time.Minute)
	require.NoError(t, err)
	_, err = r.Deduct(ctx, stock.Request{SKU: skus[0], ID: "sale", Qty: 1})
	require.NoError(t, err)
	time.Sleep(400 * time.Millisecond)
	assert.Equal(t, int64(2), a23Levels(t, r, skus[0]).Held, "the clock stands still: the hold is live")
	// The store is down: the relay backs off for 10-20 minutes of the kit's clock.
	n, err := store.Remaining(ctx, skus[0])
	require.NoError(t, err)
	assert.Equal(t, int64(10), n)

	// Cart age: a completed cart is never undone, however old.
	e.Advance(6 * time.Minute)
	undone, err := stockops.RecoverCarts(ctx, r, 5*time.Minute)
	require.NoError(t, err)
	assert.Zero(t, undone, "a completed cart is not undone")
	assert.Equal(t, int64(2), a23Levels(t, r, skus[0]).Held, "6 minutes of 10: still held")

	// The store comes back; the backoff passes only with Advance.
	down.Store(false)
	time.Sleep(300 * time.Millisecond)
	e.Advance(5 * time.Minute) // 11 minutes: the holds are due
	require.Eventually(t, func() bool {
		l, err := r.Levels(ctx, skus[0])
		return err == nil && l.Held == 0
	}, 10*time.Second, 20*time.Millisecond, "Run's sweeper releases the holds after Advance")
	_, err = r.ConfirmMany(ctx, "cart1", skus...)
	require.ErrorIs(t, err, stock.ErrExpired)
	e.Advance(21 * time.Minute) // past any backoff
	require.Eventually(t, func() bool {
		n, err := store.Remaining(ctx, skus[0])
		return err == nil && n == 9
	}, 10*time.Second, 20*time.Millisecond, "the relay delivers once the backoff passed on the kit's clock")
	err = stop() // the store was down: Run returns that first error, logged and retried
	assert.True(t, err == nil || errors.Is(err, context.Canceled) || errors.Is(err, memstore.ErrDown), "Run: %v", err)
	assert.LessOrEqual(t, store.MaxApplications(), 1)
	for _, s := range skus {
		p, _, err := stockops.Pending(ctx, r, s)
		require.NoError(t, err)
		assert.Zero(t, p)
	}
}

// stocktest with a lease: a relay that died holding an item's lease (a Store call that never
// returns) hands it over once the lease passes on the kit's clock, and not before.
func TestAttack23StocktestLease(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t)
	r := e.Reserver
	require.NoError(t, r.Load(ctx, "lease:x", 5))
	_, err := r.Deduct(ctx, stock.Request{SKU: "lease:x", ID: "a", Qty: 1})
	require.NoError(t, err)

	stuck := make(chan struct{})
	hung := memstore.New()
	require.NoError(t, hung.Load(ctx, "lease:x", 5))
	entered := make(chan struct{}, 1)
	hung.FailWith(func(stock.Event) error {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-stuck
		return memstore.ErrDown
	})
	defer close(stuck)
	dead, err := stockops.NewRelay(r, hung, nil, &stock.RelayOptions{Lease: time.Minute})
	require.NoError(t, err)
	go func() { _, _ = dead.Once(context.Background()) }()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first relay never reached the store")
	}
	good := memstore.New()
	require.NoError(t, good.Load(ctx, "lease:x", 5))
	rl, err := stockops.NewRelay(r, good, nil, &stock.RelayOptions{Lease: time.Minute})
	require.NoError(t, err)
	time.Sleep(200 * time.Millisecond)
	st, err := rl.Once(ctx)
	require.NoError(t, err)
	assert.Zero(t, st.Delivered, "the lease of the first relay still holds")
	e.Advance(61 * time.Second)
	st, err = rl.Once(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Delivered, "after the lease, on the kit's clock, the event is delivered again")
	n, err := good.Remaining(ctx, "lease:x")
	require.NoError(t, err)
	assert.Equal(t, int64(4), n)
}

// ErrFailover "is returned by Deduct, Hold and DeductMany while a FailoverGuard has seen the Redis
// primaries change and no reconcile pass has run since"; the guard fences "until a repairing
// Reconciler pass over all items completes, in this process or any other one". README: "Any
// complete repairing pass over every item records the reconciled identity in Redis, wherever it
// runs ... every process sharing the Redis lifts its fence". A process whose Run fenced it (Run
// started on a live deployment) and then ended, before its own pass completed; another process
// then completes a repairing pass. The first process must sell again.
func TestAttack23FenceLiftedByOtherProcessAfterRunEnded(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		if !b.Real() || b.Name == "sentinel" {
			continue // the guard is off on miniredis
		}
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c1, c2 := b.Pair(t)
			r1 := newReserver(t, c1)
			r2 := newReserver(t, c2)
			st := memstore.New()
			require.NoError(t, r1.Load(ctx, "fence:x", 100))
			require.NoError(t, st.Load(ctx, "fence:x", 100))
			stop := a23Run(t, r2, stock.RunOptions{Store: &onlyStore{s: st, delay: 500 * time.Millisecond},
				GuardInterval: time.Millisecond, Drain: time.Millisecond}, 30*time.Second)
			fenced := false
			for i := 0; i < 200 && !fenced; i++ {
				_, err := r2.Deduct(ctx, stock.Request{SKU: "fence:x", ID: fmt.Sprintf("probe%d", i), Qty: 1})
				fenced = errors.Is(err, stock.ErrFailover)
				if !fenced {
					time.Sleep(5 * time.Millisecond)
				}
			}
			_ = stop()
			if !fenced {
				t.Skip("Run's guard never fenced (its pass won the race): nothing to check")
			}
			rec, err := stockops.NewReconciler(r1, st, nil)
			require.NoError(t, err)
			var pr stockops.PassResult
			require.Eventually(t, func() bool { // the ended Run's lease lasts at most 5s
				pr, err = rec.Pass(ctx)
				return err == nil && pr.Complete && pr.EpochRecorded
			}, 20*time.Second, 200*time.Millisecond, "a complete repairing pass in the other process")
			time.Sleep(3 * time.Second) // longer than any check interval
			_, err = r2.Deduct(ctx, stock.Request{SKU: "fence:x", ID: "after", Qty: 1})
			assert.NoError(t, err, "a complete repairing pass ran (in another process) since the guard fenced")
		})
	}
}

// Lines of one item are summed before any check, on both cart paths, for the per-user limit as
// for the stock: a cart that would take a user past the limit on one item is refused whole.
func TestAttack23CartLinesSummedForLimit(t *testing.T) {
	a23Backends(t, func(t *testing.T, real bool, c1, _ rueidis.Client) {
		ctx := context.Background()
		group := func(sku string) string {
			if len(sku) > 2 && sku[:2] == "g-" {
				return "grp"
			}
			return ""
		}
		r := newReserver(t, c1, stock.WithGroups(group), stock.WithUserLimit(1))
		for _, s := range []string{"g-a", "g-b", "plain"} {
			require.NoError(t, r.Load(ctx, s, 10))
		}
		for i, lines := range [][]stock.Line{
			{{SKU: "g-a", Qty: 1}, {SKU: "g-b", Qty: 1}, {SKU: "g-a", Qty: 1}},   // one script
			{{SKU: "g-a", Qty: 1}, {SKU: "plain", Qty: 1}, {SKU: "g-a", Qty: 1}}, // saga
			{{SKU: "plain", Qty: 1}, {SKU: "g-b", Qty: 1}, {SKU: "plain", Qty: 1}},
		} {
			for _, hold := range []bool{false, true} {
				c := stock.Cart{ID: fmt.Sprintf("c%d-%v", i, hold), User: "ann", Lines: lines}
				var err error
				if hold {
					_, err = r.HoldMany(ctx, c, time.Minute)
				} else {
					_, err = r.DeductMany(ctx, c)
				}
				var ce *stock.CartError
				require.ErrorAs(t, err, &ce, "cart %d hold=%v", i, hold)
				assert.ErrorIs(t, err, stock.ErrUserLimit, "cart %d hold=%v", i, hold)
				for _, s := range []string{"g-a", "g-b", "plain"} {
					l := a23Levels(t, r, s)
					assert.Equal(t, int64(10), l.Available, "cart %d hold=%v: %s: nothing kept", i, hold, s)
				}
			}
		}
		// And the user can still buy one of each.
		_, err := r.DeductMany(ctx, stock.Cart{ID: "ok", User: "ann", Lines: []stock.Line{{SKU: "g-a", Qty: 1}, {SKU: "plain", Qty: 1}, {SKU: "g-b", Qty: 1}}})
		require.NoError(t, err)
	})
}

// A sold-out item of this Reserver is delisted, retired by a reconcile pass and loaded again:
// "A retired item answers ErrNotLoaded and may be loaded again." The fast path that answered for
// its first life must not answer for the second.
func TestAttack23FastPathRetiredReloaded(t *testing.T) {
	a23Backends(t, func(t *testing.T, real bool, c1, _ rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c1)
		st := memstore.New()
		sku := "ret:ü"
		require.NoError(t, r.Load(ctx, sku, 2))
		require.NoError(t, st.Load(ctx, sku, 2))
		for i := range 2 {
			_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("d%d", i), Qty: 1})
			require.NoError(t, err)
		}
		for i := range 20 {
			_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("w%d", i), Qty: 1})
			require.ErrorIs(t, err, stock.ErrSoldOut)
		}
		require.NoError(t, r.Delist(ctx, sku))
		rl, err := stockops.NewRelay(r, st, nil, nil)
		require.NoError(t, err)
		drain(t, rl)
		rec, err := stockops.NewReconciler(r, st, &stock.ReconcileOptions{Retention: time.Millisecond})
		require.NoError(t, err)
		redistest.Sleep(c1, 50*time.Millisecond)
		retired := false
		for i := 0; i < 20 && !retired; i++ {
			res, err := rec.Pass(ctx)
			require.NoError(t, err)
			for _, rp := range res.Reports {
				retired = retired || (rp.SKU == sku && rp.Retired)
			}
		}
		require.True(t, retired, "the delisted item is retired")
		_, err = r.Deduct(ctx, stock.Request{SKU: sku, ID: "gone", Qty: 1})
		require.ErrorIs(t, err, stock.ErrNotLoaded)
		require.NoError(t, r.Load(ctx, sku, 3))
		rc, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: "n1", Qty: 1})
		require.NoError(t, err, "a reloaded item sells")
		assert.Equal(t, int64(2), rc.Remaining)
		// Sold out again (second life), then a restock of this Reserver.
		for i := range 2 {
			_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("n%d", i+2), Qty: 1})
			require.NoError(t, err)
		}
		for i := range 20 {
			_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("x%d", i), Qty: 1})
			require.ErrorIs(t, err, stock.ErrSoldOut)
		}
		for i := range 3 {
			rc, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("n%d", i+1), Qty: 1})
			require.NoError(t, err, "a repeat of a second-life sale is a replay")
			assert.True(t, rc.Replayed)
		}
		_, err = r.Restock(ctx, sku, "rs", 1)
		require.NoError(t, err)
		_, err = r.Deduct(ctx, stock.Request{SKU: sku, ID: "after-restock", Qty: 1})
		require.NoError(t, err)
		a23Levels(t, r, sku)
	})
}
