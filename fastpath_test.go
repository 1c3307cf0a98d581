package stock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
	"github.com/stockres/stock/stockops"
)

// TestSoldOutFastPath: once an item is sold out, new requests are answered without a round trip
// on a server that tracks (and through Redis on miniredis, with the same answers); repeats of
// ids the ledger has, retries, tombstoned ids, closed items and due holds still go to Redis; a
// restore or restock made by another process ends the sold-out answers.
func TestSoldOutFastPath(t *testing.T) {
	eachPair(t, func(t *testing.T, b redistest.Backend, c, c2 rueidis.Client) {
		var local atomic.Int64
		r := newReserver(t, c, stock.WithSoldOutCache(time.Minute), stock.WithObserver(stock.ObserverFunc(func(_ context.Context, o stock.Observation) {
			if o.Local {
				assert.Equal(t, "sold_out", o.Outcome)
				local.Add(1)
			}
		})))
		other := newReserver(t, c2)
		require.NoError(t, r.Load(ctx, "A", 5))
		testkit.Sell(t, r, "A", "o", "", 5)
		mustFail(t, stock.ErrSoldOut, "Redis answers the first sold-out request")(
			r.Deduct(ctx, stock.Request{SKU: "A", ID: "first", Qty: 1}))
		mustFail(t, stock.ErrUnknownID)(other.Restore(ctx, "A", "ghost")) // a tombstone: "ghost" can never take stock

		scripts, reads := int64(-1), int64(-1)
		if b.Name == "standalone" {
			scripts, reads = commandCalls(t, c, "evalsha", "eval", "fcall"), commandCalls(t, c, "hmget", "get")
		}
		for i := range 200 {
			mustFail(t, stock.ErrSoldOut)(r.Deduct(ctx, stock.Request{SKU: "A", ID: fmt.Sprintf("n%d", i), Qty: 1}))
			mustFail(t, stock.ErrSoldOut)(r.Hold(ctx, stock.Request{SKU: "A", ID: fmt.Sprintf("h%d", i), Qty: 1}, time.Minute))
		}
		if b.Real() {
			assert.Equal(t, int64(400), stockops.SoldOutAnswers(r), "every new request answered in-process")
		} else {
			assert.Zero(t, stockops.SoldOutAnswers(r), "miniredis does not track: every request goes to Redis")
		}
		if scripts >= 0 {
			assert.Equal(t, scripts, commandCalls(t, c, "evalsha", "eval", "fcall"), "no script ran for sold-out requests")
			assert.LessOrEqual(t, commandCalls(t, c, "hmget", "get"), reads+3,
				"400 requests: the probe for client-side caching, one read of the item's state, one of its filter")
		}

		// Ids the ledger has are answered by Redis, as the script answers them.
		answered := stockops.SoldOutAnswers(r)
		for i := range 5 {
			rc := must(t, "a repeat of a successful id is a replay, never sold out")(
				r.Deduct(ctx, stock.Request{SKU: "A", ID: fmt.Sprintf("o%d", i), Qty: 1}))
			assert.True(t, rc.Replayed)
		}
		mustFail(t, stock.ErrRestored)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "ghost", Qty: 1}))
		mustFail(t, stock.ErrSoldOut)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "late", Qty: 1, Retry: true}))
		assert.Equal(t, answered, stockops.SoldOutAnswers(r), "ids the ledger has and retries go to Redis")
		e, err := r.Ledger(ctx, "A", "late")
		require.NoError(t, err, "a retry's refusal is recorded by the script")
		assert.Equal(t, stock.KindTombstone, e.Kind)

		// Stock given back by another process: the next request is taken.
		must(t)(other.Restore(ctx, "A", "o0"))
		takeSoon(t, r, "A", "after-restore")
		must(t)(other.Restock(ctx, "A", "restock-1", 1))
		takeSoon(t, r, "A", "after-restock")
		mustFail(t, stock.ErrConflict, "the restock's id is in the ledger")(r.Deduct(ctx, stock.Request{SKU: "A", ID: "restock-1", Qty: 1}))

		// A closed item is answered "closed", as the script answers it.
		require.NoError(t, other.CloseItem(ctx, "A"))
		require.Eventually(t, func() bool {
			_, err := r.Deduct(ctx, stock.Request{SKU: "A", ID: "while-closed", Qty: 1})
			return assert.ObjectsAreEqual(true, err != nil && strings.Contains(err.Error(), stock.ErrClosed.Error()))
		}, 2*time.Second, time.Millisecond)
		require.NoError(t, other.ReopenItem(ctx, "A"))

		// A hold that runs out gives its stock back on the item's next request.
		must(t)(other.Restore(ctx, "A", "o1"))
		took := takeSoon(t, other, "A", "before-hold") // other sells it: r has not seen stock
		must(t)(other.Restore(ctx, "A", took))
		must(t)(other.Hold(ctx, stock.Request{SKU: "A", ID: "short-hold", Qty: 1}, time.Second))
		redistest.Sleep(c, 1100*time.Millisecond)
		rc := must(t, "the expired hold's unit is taken")(r.Deduct(ctx, stock.Request{SKU: "A", ID: "after-expiry", Qty: 1}))
		assert.Zero(t, rc.Remaining)
		l := levels(t, r, "A")
		assert.Equal(t, stock.Levels{Available: 0, Held: 0, Sold: 6, Loaded: 6}, l)
		assert.Equal(t, stockops.SoldOutAnswers(r), local.Load(), "observations of the answers given in-process")
	})
}

// takeSoon deducts new ids of sku until one succeeds, and returns that id: the fast path's
// window must close.
func takeSoon(t *testing.T, r *stock.Reserver, sku, id string) string {
	t.Helper()
	start := time.Now()
	for i := 0; ; i++ {
		took := fmt.Sprintf("%s-%d", id, i)
		_, err := r.Deduct(context.Background(), stock.Request{SKU: sku, ID: took, Qty: 1})
		if err == nil {
			return took
		}
		require.ErrorIs(t, err, stock.ErrSoldOut)
		require.Less(t, time.Since(start), 2*time.Second, "still sold out 2 s after stock came back")
		time.Sleep(20 * time.Microsecond)
	}
}

// TestSoldOutWindow measures how long a process can still answer "sold out" after another one
// gave stock back: the invalidation delay. With a cache time of a minute, only the invalidation
// can end the sold-out answers.
func TestSoldOutWindow(t *testing.T) {
	eachPair(t, func(t *testing.T, b redistest.Backend, c, c2 rueidis.Client) {
		r := newReserver(t, c, stock.WithSoldOutCache(time.Minute))
		other := newReserver(t, c2)
		require.NoError(t, r.Load(ctx, "W", 1))
		must(t)(r.Deduct(ctx, stock.Request{SKU: "W", ID: "w", Qty: 1}))
		const rounds = 100
		var windows []time.Duration
		last := "w"
		for i := range rounds {
			// r learns the item is sold out, and answers it in-process from then on.
			mustFail(t, stock.ErrSoldOut)(r.Deduct(ctx, stock.Request{SKU: "W", ID: fmt.Sprintf("probe-%d", i), Qty: 1}))
			mustFail(t, stock.ErrSoldOut)(r.Deduct(ctx, stock.Request{SKU: "W", ID: fmt.Sprintf("probe2-%d", i), Qty: 1}))
			must(t)(other.Restore(ctx, "W", last))
			start := time.Now()
			for j := 0; ; j++ {
				last = fmt.Sprintf("take-%d-%d", i, j)
				_, err := r.Deduct(ctx, stock.Request{SKU: "W", ID: last, Qty: 1})
				if err == nil {
					break
				}
				require.ErrorIs(t, err, stock.ErrSoldOut)
				require.Less(t, time.Since(start), time.Second, "round %d: sold out 1 s after a restore", i)
			}
			windows = append(windows, time.Since(start))
		}
		slices.Sort(windows)
		t.Logf("%s: window after a restore in another process over %d rounds: p50 %v, p99 %v, max %v; %d requests answered in-process",
			b.Name, rounds, windows[rounds/2], windows[rounds*99/100], windows[rounds-1], stockops.SoldOutAnswers(r))
		if b.Real() {
			assert.GreaterOrEqual(t, stockops.SoldOutAnswers(r), int64(rounds), "the fast path answered")
		}
	})
}

// TestSoldOutRace: 1000 goroutines race through sell-out, restores and a restock. No oversell,
// every unit given back is sold again (no sold-out answer outlives the window), and the ledger
// agrees with the counts.
func TestSoldOutRace(t *testing.T) {
	eachPair(t, func(t *testing.T, b redistest.Backend, c, c2 rueidis.Client) {
		r := newReserver(t, c)
		other := newReserver(t, c2)
		const loaded, restored, restocked, buyers = 50, 10, 20, 1000
		require.NoError(t, r.Load(ctx, "R", loaded))

		var (
			mu   sync.Mutex
			won  []string
			next atomic.Int64
			stop = make(chan struct{})
			wg   sync.WaitGroup
		)
		for g := range buyers {
			wg.Go(func() {
				for !stopped(stop) {
					id := fmt.Sprintf("g%d-%d", g, next.Add(1))
					_, err := r.Deduct(ctx, stock.Request{SKU: "R", ID: id, User: fmt.Sprintf("u%d", g), Qty: 1})
					switch {
					case err == nil:
						mu.Lock()
						won = append(won, id)
						mu.Unlock()
					case assert.ErrorIs(t, err, stock.ErrSoldOut):
						time.Sleep(time.Millisecond)
					default:
						return
					}
				}
			})
		}
		soldOut := func(want int) {
			t.Helper()
			deadline := time.Now().Add(20 * time.Second)
			for {
				mu.Lock()
				n := len(won)
				mu.Unlock()
				if n == want {
					return
				}
				require.LessOrEqual(t, n, want, "oversell")
				require.True(t, time.Now().Before(deadline), "%d of %d units sold: stock that came back was not sold", n, want)
				time.Sleep(5 * time.Millisecond)
			}
		}
		soldOut(loaded)
		mu.Lock()
		give := slices.Clone(won[:restored])
		mu.Unlock()
		for _, id := range give {
			must(t)(other.Restore(ctx, "R", id))
		}
		soldOut(loaded + restored)
		must(t)(other.Restock(ctx, "R", "restock", restocked))
		soldOut(loaded + restored + restocked)
		time.Sleep(50 * time.Millisecond) // late requests meet a sold-out item
		close(stop)
		wg.Wait()

		assert.Len(t, won, loaded+restored+restocked)
		l := levels(t, r, "R")
		assert.Equal(t, stock.Levels{Available: 0, Sold: loaded + restocked, Loaded: loaded + restocked}, l)
		states := map[stock.State]int{}
		for e, err := range stockops.Entries(ctx, r, "R") {
			require.NoError(t, err)
			if e.Kind == stock.KindDeduct {
				states[e.State]++
			}
		}
		assert.Equal(t, map[stock.State]int{stock.StateReserved: loaded + restocked, stock.StateRestored: restored}, states)
		t.Logf("%s: %d requests answered in-process", b.Name, stockops.SoldOutAnswers(r))
	})
}

// TestSoldOutFilterBuild: the sold-out filter of an item with a large ledger is built from the
// ledger in bounded steps by the refusals after the sell-out; ids added while it is built are
// in it too. Only then are requests answered in-process, and never a repeat of a ledger id.
func TestSoldOutFilterBuild(t *testing.T) {
	eachPair(t, func(t *testing.T, b redistest.Backend, c, c2 rueidis.Client) {
		r := newReserver(t, c)
		other := newReserver(t, c2, stock.WithSoldOutCache(0))
		const units = 3000 // a hash table, not a listpack: HSCAN pages
		require.NoError(t, r.Load(ctx, "F", units))
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Go(func() {
				for i := w; i < units; i += 8 {
					assert.NoError(t, testkit.Err(other.Deduct(ctx, stock.Request{SKU: "F", ID: fmt.Sprintf("d%d", i), Qty: 1})))
				}
			})
		}
		wg.Wait()

		// The first refusal starts the filter and scans one page: not complete.
		mustFail(t, stock.ErrSoldOut)(r.Deduct(ctx, stock.Request{SKU: "F", ID: "n0", Qty: 1}))
		item := "stock:{F}"
		building, err := c.Do(ctx, c.B().Hexists().Key(item).Field("bc").Build()).AsBool()
		require.NoError(t, err)
		if b.Real() { // miniredis answers HSCAN in one page whatever COUNT says
			require.True(t, building, "one step does not scan %d entries", units)
		}
		// While it is built, a unit comes back and is sold to a new id: the script adds it.
		must(t)(other.Restore(ctx, "F", "d0"))
		must(t)(other.Deduct(ctx, stock.Request{SKU: "F", ID: "during", Qty: 1}))

		steps := 0
		for ; steps < units; steps++ {
			mustFail(t, stock.ErrSoldOut)(other.Deduct(ctx, stock.Request{SKU: "F", ID: fmt.Sprintf("n%d", steps+1), Qty: 1}))
			if building, err = c.Do(ctx, c.B().Hexists().Key(item).Field("bc").Build()).AsBool(); err == nil && !building {
				break
			}
			require.NoError(t, err)
		}
		require.False(t, building, "the filter is complete after %d refusals", steps)
		t.Logf("%s: filter of %d ids built by %d refusals after the first", b.Name, units+1, steps+1)

		// Every id the ledger has is answered by Redis: replays, and the restored one.
		before := stockops.SoldOutAnswers(r)
		for i := 1; i < units; i++ {
			rc := must(t, "d%d", i)(r.Deduct(ctx, stock.Request{SKU: "F", ID: fmt.Sprintf("d%d", i), Qty: 1}))
			require.True(t, rc.Replayed)
		}
		rc := must(t)(r.Deduct(ctx, stock.Request{SKU: "F", ID: "during", Qty: 1}))
		require.True(t, rc.Replayed, "an id taken while the filter was built")
		mustFail(t, stock.ErrRestored)(r.Deduct(ctx, stock.Request{SKU: "F", ID: "d0", Qty: 1}))
		assert.Equal(t, before, stockops.SoldOutAnswers(r))
		for i := range 100 {
			mustFail(t, stock.ErrSoldOut)(r.Deduct(ctx, stock.Request{SKU: "F", ID: fmt.Sprintf("x%d", i), Qty: 1}))
		}
		if b.Real() {
			assert.Greater(t, stockops.SoldOutAnswers(r), before+90, "new ids answered in-process (a few filter false positives go to Redis)")
		}
	})
}

// TestSoldOutFastPathClockBehind: the fast path judges a sold-out item's due holds on Redis's
// clock, not the process's. A process whose clock is minutes behind Redis's (WithClock stands
// for it) must not answer "sold out" while a hold whose deadline has passed would free stock:
// the script releases it and takes the request.
func TestSoldOutFastPathClockBehind(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		for _, skew := range []time.Duration{-10 * time.Minute, 10 * time.Minute} {
			t.Run(fmt.Sprintf("%s/%v", b.Name, skew), func(t *testing.T) {
				c, c2 := b.Pair(t)
				r := newReserver(t, c, stock.WithSoldOutCache(time.Minute),
					stock.WithClock(func() time.Time { return time.Now().Add(skew) }))
				other := newReserver(t, c2)
				require.NoError(t, r.Load(ctx, "A", 1))
				must(t)(other.Hold(ctx, stock.Request{SKU: "A", ID: "short-hold", Qty: 1}, time.Second))
				mustFail(t, stock.ErrSoldOut, "the hold has the unit")(r.Deduct(ctx, stock.Request{SKU: "A", ID: "early", Qty: 1}))
				redistest.Sleep(c, 1100*time.Millisecond)
				rc := must(t, "the hold is due on Redis's clock: the script releases it and takes the unit")(
					r.Deduct(ctx, stock.Request{SKU: "A", ID: "after-deadline", Qty: 1}))
				assert.Zero(t, rc.Remaining)
				assert.Zero(t, stockops.SoldOutAnswers(r))
			})
		}
	}
}

// TestSoldOutFastPathSplit: the fast path answers for an item split over buckets, from the
// cached state of every bucket, and only what Redis would answer ErrSoldOut: stock given back or
// restocked in any bucket (by this process: at once; by another: once the invalidation is in),
// a hold due in another bucket, an id taken in any bucket, claimed by another buyer or
// restored, and retries all go to Redis and get its answer.
func TestSoldOutFastPathSplit(t *testing.T) {
	const n = 3
	split := stock.WithBuckets(func(string) int { return n })
	eachPair(t, func(t *testing.T, b redistest.Backend, c, c2 rueidis.Client) {
		r := newReserver(t, c, split, stock.WithSoldOutCache(time.Minute))
		other := newReserver(t, c2, split)
		seq := 0
		fresh := func(bk int) stock.Request { // a new id of a new buyer of bucket bk
			seq++
			return stock.Request{SKU: "S", ID: fmt.Sprintf("new%d", seq), User: keyIn(fmt.Sprintf("buyer%d", seq), bk, n), Qty: 1}
		}
		// soldOut checks that requests of every bucket are refused, and that the fast path
		// answers them (a bucket's filter is built by a refusal of Redis in that bucket).
		soldOut := func() {
			t.Helper()
			for bk := range n {
				for range 3 {
					mustFail(t, stock.ErrSoldOut)(r.Deduct(ctx, fresh(bk)))
				}
			}
			if b.Real() {
				before := stockops.SoldOutAnswers(r)
				for bk := range n {
					mustFail(t, stock.ErrSoldOut)(r.Deduct(ctx, fresh(bk)))
				}
				require.Equal(t, before+n, stockops.SoldOutAnswers(r), "every bucket's requests answered by the fast path")
			}
		}

		require.NoError(t, r.Load(ctx, "S", 6))
		// Six takes, two a bucket, each by a buyer of another bucket than its id's.
		var taken []stock.Request
		for i := range 6 {
			req := stock.Request{SKU: "S", ID: keyIn(fmt.Sprintf("t%d", i), i%n, n), User: keyIn(fmt.Sprintf("u%d", i), (i+1)%n, n), Qty: 1}
			must(t)(r.Deduct(ctx, req))
			taken = append(taken, req)
		}
		soldOut()

		scripts := int64(-1)
		if b.Name == "standalone" {
			scripts = commandCalls(t, c, "evalsha", "eval", "fcall")
		}
		answered := stockops.SoldOutAnswers(r)
		for i := range 100 {
			mustFail(t, stock.ErrSoldOut)(r.Deduct(ctx, fresh(i%n)))
			req := fresh(i % n)
			req.User = "" // routed by id
			mustFail(t, stock.ErrSoldOut)(r.Hold(ctx, req, time.Minute))
		}
		if b.Real() {
			assert.Equal(t, answered+200, stockops.SoldOutAnswers(r), "every new request answered by the fast path")
		} else {
			assert.Zero(t, stockops.SoldOutAnswers(r), "miniredis does not track: every request goes to Redis")
		}
		if scripts >= 0 {
			assert.Equal(t, scripts+200, commandCalls(t, c, "evalsha", "eval", "fcall"), "one script a request: the claim of its id")
		}

		// What Redis answers otherwise: replays, conflicts, restored ids, retries.
		answered = stockops.SoldOutAnswers(r)
		for _, req := range taken {
			rc := must(t, "a repeat of a taken id is a replay, never sold out")(r.Deduct(ctx, req))
			assert.True(t, rc.Replayed)
			req.User = keyIn(req.ID+"-other", (testkit.HomeBucket(req.User, n)+1)%n, n)
			mustFail(t, stock.ErrConflict, "a taken id used by a buyer of another bucket")(r.Deduct(ctx, req))
			req.User = ""
			mustFail(t, stock.ErrConflict, "a taken id used without its buyer")(r.Deduct(ctx, req))
		}
		assert.Equal(t, answered, stockops.SoldOutAnswers(r), "taken ids go to Redis")
		refused := stock.Request{SKU: "S", ID: "refused", User: keyIn("ua", 0, n), Qty: 1}
		mustFail(t, stock.ErrSoldOut)(r.Deduct(ctx, refused)) // claims bucket 0 for the id
		answered = stockops.SoldOutAnswers(r)
		for bk := 1; bk < n; bk++ {
			refused.User = keyIn("ub", bk, n)
			mustFail(t, stock.ErrConflict, "an id a refused request of another buyer claimed")(r.Deduct(ctx, refused))
		}
		mustFail(t, stock.ErrUnknownID)(other.Restore(ctx, "S", "ghost"))
		mustFail(t, stock.ErrUnknownID)(r.Restore(ctx, "S", "ghost2"))
		for bk := range n {
			for _, id := range []string{"ghost", "ghost2"} {
				mustFail(t, stock.ErrRestored, "a restored id, buyer of bucket %d", bk)(
					r.Deduct(ctx, stock.Request{SKU: "S", ID: id, User: keyIn("g", bk, n), Qty: 1}))
			}
		}
		late := fresh(1)
		late.Retry = true
		mustFail(t, stock.ErrSoldOut)(r.Deduct(ctx, late))
		e, err := r.Ledger(ctx, "S", late.ID)
		require.NoError(t, err, "a retry's refusal is recorded by the script")
		assert.Equal(t, stock.KindTombstone, e.Kind)
		assert.Equal(t, answered, stockops.SoldOutAnswers(r), "none of these answered by the fast path")

		// Stock given back or restocked in any bucket, by this Reserver: the next request,
		// of a buyer of another bucket, is taken (no window for its own writes).
		for i, bk := range []int{0, 1, 2} {
			must(t)(r.Restore(ctx, "S", taken[bk].ID)) // taken[bk] is in bucket bk+1
			must(t, "after a restore in bucket %d", (bk+1)%n)(r.Deduct(ctx, fresh(bk)))
			soldOut()
			id := keyIn(fmt.Sprintf("restock%d", i), bk, n) // a restock goes to its id's bucket
			must(t)(r.Restock(ctx, "S", id, 1))
			must(t, "after a restock in bucket %d", bk)(r.Hold(ctx, fresh((bk+1)%n), time.Minute))
			soldOut()
		}
		// By another process: once the invalidation is in.
		for bk := range n {
			must(t)(other.Restore(ctx, "S", taken[bk+n].ID)) // taken[bk+n] is in bucket bk+1
			takeSoon(t, r, "S", fmt.Sprintf("after-restore%d", bk))
			soldOut()
			must(t)(other.Restock(ctx, "S", keyIn(fmt.Sprintf("orestock%d", bk), bk, n), 1))
			takeSoon(t, r, "S", fmt.Sprintf("after-restock%d", bk))
			soldOut()
		}

		// A closed item is answered "closed", as Redis answers it.
		require.NoError(t, other.CloseItem(ctx, "S"))
		require.Eventually(t, func() bool {
			_, err := r.Deduct(ctx, fresh(0))
			return errors.Is(err, stock.ErrClosed)
		}, 2*time.Second, time.Millisecond)
		require.NoError(t, other.ReopenItem(ctx, "S"))
		soldOut()

		// A hold due in another bucket: its unit is taken by the next request.
		must(t)(r.Restock(ctx, "S", keyIn("for-hold", 0, n), 1))
		hold := fresh(0)
		hold.ID = "the-hold"
		must(t)(r.Hold(ctx, hold, 2500*time.Millisecond))
		soldOut() // the hold is not due yet
		redistest.Sleep(c, 2600*time.Millisecond)
		must(t, "the unit of a hold due in bucket 0 is taken by a request of bucket 1")(r.Deduct(ctx, fresh(1)))
		assertState(t, r, "S", "the-hold", stock.StateExpired)
		l := levels(t, r, "S")
		assert.Equal(t, int64(0), l.Available)
	})
}

// soldOutReserver loads sku with one unit on a Reserver with the default options (the sold-out
// fast path on, with the client's server-assisted cache on real servers), sells it, and lets
// Redis refuse one request as sold out, so that the Reserver answers the next ones in-process.
func soldOutReserver(t *testing.T, c rueidis.Client, sku string) *stock.Reserver {
	t.Helper()
	r := newReserver(t, c)
	require.NoError(t, r.Load(ctx, sku, 1))
	must(t)(r.Deduct(ctx, stock.Request{SKU: sku, ID: "first", Qty: 1}))
	for i := range 3 { // the first refusal builds the filter; the next ones are answered in-process
		mustFail(t, stock.ErrSoldOut)(r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprint("warm-", i), Qty: 1}))
	}
	return r
}

// eachSoldOutBackend runs f on every backend, the backends in parallel, with soldOutReserver's
// Reserver for sku and how many tries to make: 1000 on a real server, 50 on miniredis (which does
// not track: the fast path is off, the answers the same).
func eachSoldOutBackend(t *testing.T, sku string, f func(t *testing.T, b redistest.Backend, r *stock.Reserver, tries int)) {
	t.Helper()
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		tries := 1000
		if !b.Real() {
			tries = 50
		}
		f(t, b, soldOutReserver(t, b.Client(t), sku), tries)
	})
}

// TestFastPathTombstoneOwnWrite: a Restore of an unknown id leaves a tombstone; the same
// Reserver must then answer a Deduct of that id ErrRestored, as the ledger says, never
// ErrSoldOut from a cached read that predates the tombstone.
func TestFastPathTombstoneOwnWrite(t *testing.T) {
	eachSoldOutBackend(t, "T", func(t *testing.T, b redistest.Backend, r *stock.Reserver, tries int) {
		wrong := 0
		for i := range tries {
			// A new id, answered in-process: the item's state and filter are cached.
			mustFail(t, stock.ErrSoldOut)(r.Deduct(ctx, stock.Request{SKU: "T", ID: fmt.Sprint("new-", i), Qty: 1}))
			ghost := fmt.Sprint("ghost-", i)
			mustFail(t, stock.ErrUnknownID)(r.Restore(ctx, "T", ghost))
			_, err := r.Deduct(ctx, stock.Request{SKU: "T", ID: ghost, Qty: 1})
			if !errors.Is(err, stock.ErrRestored) {
				if wrong++; wrong == 1 {
					t.Errorf("try %d: a deduct of a tombstoned id answered %v, want ErrRestored", i, err)
				}
			}
		}
		assert.Zero(t, wrong, "%d of %d deducts of a tombstoned id were not refused as restored", wrong, tries)
		if b.Real() {
			assert.Positive(t, stockops.SoldOutAnswers(r), "the fast path answered new ids")
		}
	})
}

// TestFastPathReplayOwnWrite: a deduct acknowledged OK on a sold-out item (stock came back and
// was taken again) and repeated at once on the same Reserver is a replay, never ErrSoldOut.
func TestFastPathReplayOwnWrite(t *testing.T) {
	eachSoldOutBackend(t, "R", func(t *testing.T, _ redistest.Backend, r *stock.Reserver, tries int) {
		wrong := 0
		last := "first"
		for i := range tries {
			mustFail(t, stock.ErrSoldOut)(r.Deduct(ctx, stock.Request{SKU: "R", ID: fmt.Sprint("new-", i), Qty: 1}))
			must(t)(r.Restore(ctx, "R", last))
			// Retry goes to Redis whatever the cache says: the unit given back is taken.
			id := fmt.Sprint("take-", i)
			must(t)(r.Deduct(ctx, stock.Request{SKU: "R", ID: id, Qty: 1, Retry: true}))
			last = id
			rc, err := r.Deduct(ctx, stock.Request{SKU: "R", ID: id, Qty: 1})
			if err != nil || !rc.Replayed {
				if wrong++; wrong == 1 {
					t.Errorf("try %d: a repeat of an acknowledged deduct answered %+v, %v; want a replay", i, rc, err)
				}
			}
		}
		assert.Zero(t, wrong, "%d of %d repeats of acknowledged deducts were not replays", wrong, tries)
		assert.Equal(t, stock.Levels{Available: 0, Sold: 1, Loaded: 1}, levels(t, r, "R"))
	})
}

// TestFastPathConcurrentRepeats: 16 goroutines share one Reserver (the fast path on) on an item
// that keeps selling out and coming back (a 17th gives back what they take); every deduct
// acknowledged OK is repeated at once and must be a replay, and the counters match the
// acknowledged deducts and restores. It checks the fix under concurrency; the
// regression tests that fail without it are TestFastPathTombstoneOwnWrite and
// TestFastPathReplayOwnWrite (this one rarely catches the stale answer: the repeat must come
// before an invalidation that is usually already there).
func TestFastPathConcurrentRepeats(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		r := newReserver(t, b.Client(t))
		const units, workers = 3, 16
		rounds := 400
		if !b.Real() {
			rounds = 30
		}
		require.NoError(t, r.Load(ctx, "C", units))
		var mu sync.Mutex
		var took, gave, wrong int
		var first string
		taken := make(chan string, workers*rounds)
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := range rounds {
					id := fmt.Sprintf("w%d-%d", w, i)
					_, err := r.Deduct(ctx, stock.Request{SKU: "C", ID: id, Qty: 1})
					if errors.Is(err, stock.ErrSoldOut) {
						continue
					}
					if !assert.NoError(t, err) {
						return
					}
					rc, err := r.Deduct(ctx, stock.Request{SKU: "C", ID: id, Qty: 1})
					mu.Lock()
					took++
					if err != nil || !rc.Replayed {
						if wrong++; wrong == 1 {
							first = fmt.Sprintf("%s: %+v, %v", id, rc, err)
						}
					}
					mu.Unlock()
					taken <- id
				}
			})
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			for id := range taken {
				_, err := r.Restore(ctx, "C", id)
				if !assert.NoError(t, err) {
					return
				}
				mu.Lock()
				gave++
				mu.Unlock()
			}
		}()
		wg.Wait()
		close(taken)
		<-done
		assert.Zero(t, wrong, "%d of %d repeats of acknowledged deducts were not replays; first: %s", wrong, took, first)
		assert.Equal(t, stock.Levels{Available: units - int64(took-gave), Sold: int64(took - gave), Loaded: units}, levels(t, r, "C"))
		t.Logf("%s: %d deducts acknowledged, %d restored, %d answered in-process", b.Name, took, gave, stockops.SoldOutAnswers(r))
	})
}
