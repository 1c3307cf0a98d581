package contract_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
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
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// TestScatteredLastUnits: the last units are scattered one per bucket; a request for
// more than one unit, in any bucket, must get them, and a request for more than all is
// ErrInsufficient (the item has some), then ErrSoldOut once they are gone.
func TestScatteredLastUnits(t *testing.T) {
	for _, n := range []int{2, 3, 64} {
		t.Run(fmt.Sprintf("buckets=%d", n), func(t *testing.T) {
			each(t, []stock.Option{split(n)}, func(t *testing.T, e *requestEnv) {
				for round, user := range []string{"a", "b", "", "zz"} {
					sku := fmt.Sprintf("scatter%d", round)
					require.NoError(t, e.r.Load(ctx, sku, int64(n))) // one unit per bucket
					id := fmt.Sprintf("big%d", round)
					rc, err := e.r.Deduct(ctx, req(sku, id+"x", user, int64(n)+1))
					require.ErrorIs(t, err, stock.ErrInsufficient, "more than the item holds")
					rc = must(e.r.Deduct(ctx, req(sku, id, user, int64(n))))(t, "the buckets together hold %d units", n)
					assert.Equal(t, int64(n), rc.Qty)
					assert.Equal(t, stock.Levels{Available: 0, Sold: int64(n), Loaded: int64(n)}, levels(t, e.r, sku))
					require.ErrorIs(t, testkit.Err(e.r.Deduct(ctx, req(sku, id+"y", user, 1))), stock.ErrSoldOut)
					// A replay still answers the original receipt.
					rc, err = e.r.Deduct(ctx, req(sku, id, user, int64(n)))
					require.NoError(t, err)
					assert.True(t, rc.Replayed)
					assert.Equal(t, int64(n), rc.Qty)
				}
			})
		})
	}
}

// TestBucketCounts: 1 (and less) is not split: a Reserver without WithBuckets sees
// the item; 2, 3, 64 split; 100 counts as 64: a Reserver with 64 sees the same item and its
// answers.
func TestBucketCounts(t *testing.T) {
	each(t, nil, func(t *testing.T, e *requestEnv) {
		plain := e.r
		for _, n := range []int{-3, 0, 1} {
			r := e.another(stock.WithBuckets(func(string) int { return n }))
			sku := fmt.Sprintf("count%d", n+10)
			require.NoError(t, r.Load(ctx, sku, 5))
			require.NoError(t, testkit.Err(r.Deduct(ctx, req(sku, "a", "u", 2))))
			assert.Equal(t, stock.Levels{Available: 3, Sold: 2, Loaded: 5}, levels(t, plain, sku), "%d buckets: not split", n)
		}
		r100 := e.another(stock.WithBuckets(func(string) int { return 100 }))
		r64 := e.another(stock.WithBuckets(func(string) int { return 64 }))
		require.NoError(t, r100.Load(ctx, "big", 64*2))
		require.ErrorIs(t, r64.Load(ctx, "big", 64*2), stock.ErrLoaded)
		for i := range 20 {
			r := r100
			if i%2 == 1 {
				r = r64
			}
			require.NoError(t, testkit.Err(r.Deduct(ctx, req("big", fmt.Sprintf("b%d", i), fmt.Sprintf("u%d", i), 3))))
		}
		// Copies of the same ids through the other Reserver are replays.
		for i := range 20 {
			r := r64
			if i%2 == 1 {
				r = r100
			}
			assert.True(t, must(r.Deduct(ctx, req("big", fmt.Sprintf("b%d", i), fmt.Sprintf("u%d", i), 3)))(t).Replayed)
		}
		assert.Equal(t, levels(t, r100, "big"), levels(t, r64, "big"))
		assert.Equal(t, stock.Levels{Available: 68, Sold: 60, Loaded: 128}, levels(t, r100, "big"))
	})
}

// TestUnsplitReserverOnSplitItem: a Reserver without WithBuckets (or with another
// function) meets an item loaded split. It finds it not loaded (the WithBuckets doc), and must
// never sell the item's stock a second time: the units sold through both Reservers together
// never exceed what was loaded.
func TestUnsplitReserverOnSplitItem(t *testing.T) {
	each(t, []stock.Option{split(3)}, func(t *testing.T, e *requestEnv) {
		require.NoError(t, e.r.Load(ctx, "twice", 10))
		plain := e.another()
		require.ErrorIs(t, testkit.Err(plain.Deduct(ctx, req("twice", "p0", "a", 1))), stock.ErrNotLoaded)
		require.ErrorIs(t, testkit.Err(plain.Hold(ctx, req("twice", "p1", "a", 1), time.Hour)), stock.ErrNotLoaded)
		require.ErrorIs(t, testkit.Err(plain.Levels(ctx, "twice")), stock.ErrNotLoaded)

		// A preheat re-run by the process that does not split the item.
		loadErr := plain.Load(ctx, "twice", 10)
		t.Logf("Load of a split item by a Reserver that does not split it: %v", loadErr)
		var sold int64
		for i := range 15 {
			if _, err := e.r.Deduct(ctx, req("twice", fmt.Sprintf("s%d", i), fmt.Sprintf("u%d", i), 1)); err == nil {
				sold++
			}
			if _, err := plain.Deduct(ctx, req("twice", fmt.Sprintf("q%d", i), fmt.Sprintf("v%d", i), 1)); err == nil {
				sold++
			}
		}
		assert.LessOrEqual(t, sold, int64(10), "units sold through the splitting and the non-splitting Reserver (Load by the latter: %v)", loadErr)
	})
}

// TestDifferentialPlainVsSplit runs one random sequence of operations on a plain item
// and on a split item of the same Reserver and compares every answer (the outcome, Qty and
// Replayed; not Remaining, which is the bucket's), the levels after each step, and the ledger
// entry of the id. Time moves (and both items are swept) on miniredis only.
func TestDifferentialPlainVsSplit(t *testing.T) {
	testkit.ParallelOnMiniredis(t)
	for _, n := range []int{2, 5} {
		t.Run(fmt.Sprintf("buckets=%d", n), func(t *testing.T) {
			each(t, []stock.Option{split(n), stock.WithUserLimit(3)}, func(t *testing.T, e *requestEnv) {
				steps := 300
				if e.real {
					steps = 150
				}
				for seed := range uint64(3) {
					differential(t, e, n, seed, steps)
				}
			})
		})
	}
}

func differential(t *testing.T, e *requestEnv, n int, seed uint64, steps int) {
	plainSKU, splitSKU := fmt.Sprintf("plain-d%d", seed), fmt.Sprintf("split-d%d", seed)
	rng := rand.New(rand.NewPCG(seed, uint64(n)))
	initial := int64(3 + rng.IntN(8))
	require.NoError(t, e.r.Load(ctx, plainSKU, initial))
	require.NoError(t, e.r.Load(ctx, splitSKU, initial))
	users := []string{"", "ann", "bob", "cyd", "dee", "eve"}
	type answer struct {
		outcome  string
		qty      int64
		replayed bool
	}
	var log []string
	for step := range steps {
		idn := rng.IntN(14)
		id := fmt.Sprintf("id%d", idn)
		// One buyer per id: an id sent by another buyer is bound to differ (the WithBuckets doc:
		// "a later request of that id by another buyer is ErrConflict"); see
		// TestIDReusedByAnotherBuyer.
		user := users[idn%len(users)]
		qty := int64(1 + rng.IntN(3))
		op := rng.IntN(13)
		var desc string
		do := func(sku string) (stock.Receipt, error) {
			req := req(sku, id, user, qty)
			switch op {
			case 0, 1:
				desc = fmt.Sprintf("deduct %s %q %d", id, user, qty)
				return e.r.Deduct(ctx, req)
			case 2:
				req.Retry = true
				desc = fmt.Sprintf("deduct(retry) %s %q %d", id, user, qty)
				return e.r.Deduct(ctx, req)
			case 3, 4:
				desc = fmt.Sprintf("hold %s %q %d", id, user, qty)
				return e.r.Hold(ctx, req, 10*time.Second)
			case 5:
				desc = "confirm " + id
				return e.r.Confirm(ctx, sku, id)
			case 6:
				desc = "cancel " + id
				return e.r.Cancel(ctx, sku, id)
			case 7:
				desc = "restore " + id
				return e.r.Restore(ctx, sku, id)
			case 8:
				desc = "extend " + id
				return e.r.Extend(ctx, sku, id, 10*time.Second)
			case 9:
				desc = fmt.Sprintf("restock %s %d", id, qty)
				return e.r.Restock(ctx, sku, id, qty)
			case 10:
				if rng2 := step % 2; rng2 == 0 {
					desc = "close"
					return stock.Receipt{}, e.r.CloseItem(ctx, sku)
				}
				desc = "reopen"
				return stock.Receipt{}, e.r.ReopenItem(ctx, sku)
			case 11:
				desc = "sweep"
				k, err := stockops.Sweep(ctx, e.r, sku)
				return stock.Receipt{Qty: k}, err
			default:
				desc = "advance+sweep"
				if sku == plainSKU && !e.real {
					e.advance(11 * time.Second)
				}
				if e.real {
					return stock.Receipt{}, nil
				}
				k, err := stockops.Sweep(ctx, e.r, sku)
				return stock.Receipt{Qty: k}, err
			}
		}
		prc, perr := do(plainSKU)
		src, serr := do(splitSKU)
		log = append(log, fmt.Sprintf("%d: %s -> plain %s %+v / split %s %+v", step, desc, stock.Outcome(perr), prc, stock.Outcome(serr), src))
		pa := answer{stock.Outcome(perr), prc.Qty, prc.Replayed}
		sa := answer{stock.Outcome(serr), src.Qty, src.Replayed}
		if pa.outcome == "conflict" || pa.outcome == "restored" || pa.outcome == "sold_out" || pa.outcome == "insufficient" {
			// Qty of these answers is compared by TestConflictReceiptQty.
			pa.qty, sa.qty = 0, 0
		}
		if pa != sa {
			t.Fatalf("seed %d step %d: %s: plain %+v (%v), split %+v (%v)\n%s", seed, step, desc, pa, perr, sa, serr, strings.Join(log[max(0, len(log)-25):], "\n"))
		}
		pl := must(e.r.Levels(ctx, plainSKU))(t)
		sl := levels(t, e.r, splitSKU)
		if pl != sl {
			t.Fatalf("seed %d step %d: %s: levels plain %+v, split %+v\n%s", seed, step, desc, pl, sl, strings.Join(log[max(0, len(log)-25):], "\n"))
		}
		pe, perr := e.r.Ledger(ctx, plainSKU, id)
		se, serr := e.r.Ledger(ctx, splitSKU, id)
		if stock.Outcome(perr) != stock.Outcome(serr) || pe.Kind != se.Kind || pe.State != se.State || pe.Qty != se.Qty || pe.User != se.User {
			t.Fatalf("seed %d step %d: %s: ledger of %s plain %+v (%v), split %+v (%v)\n%s", seed, step, desc, id, pe, perr, se, serr, strings.Join(log[max(0, len(log)-25):], "\n"))
		}
	}
}

// TestRetireBlockedByOneBucket: a live hold in one bucket only, or one undelivered event,
// keeps the whole item from retiring; once it ends, the item retires.
func TestRetireBlockedByOneBucket(t *testing.T) {
	lifecycleEach(t, []stock.Option{lifecycleSplit(3)}, func(t *testing.T, e *env) {
		sku := sku("blk")
		store := storeFor(t, e.r, sku, 9)
		require.NoError(t, testkit.Err(e.r.Hold(ctx, req(sku, "h", "u", 1), time.Hour)))
		require.NoError(t, testkit.Err(e.r.Deduct(ctx, req(sku, "d", "v", 1))))
		lifecycleDrain(t, e.r, store, sku)
		require.NoError(t, e.r.Delist(ctx, sku))
		require.NoError(t, e.r.Delist(ctx, sku), "delisting twice does nothing")
		assert.ErrorIs(t, e.r.ReopenItem(ctx, sku), stock.ErrClosed)
		assert.ErrorIs(t, e.r.Load(ctx, sku, 1), stock.ErrLoaded)
		assert.ErrorIs(t, testkit.Err(e.r.Deduct(ctx, req(sku, "late", "w", 1))), stock.ErrClosed)
		e.advance(20 * time.Millisecond)
		for range 2 {
			rp := pass(t, e, e.r, store, sku)[sku]
			require.False(t, rp.Retired, "retired with a live hold: %v", rp)
		}
		assert.Equal(t, int64(1), testkit.Levels(t, e.r, sku).Held)
		// cancel the hold: an event pending in one bucket
		require.NoError(t, testkit.Err(e.r.Cancel(ctx, sku, "h")))
		rp := pass(t, e, e.r, store, sku)[sku]
		require.False(t, rp.Retired, "retired with an undelivered event: %v", rp)
		lifecycleDrain(t, e.r, store, sku)
		e.advance(20 * time.Millisecond)
		rp = pass(t, e, e.r, store, sku)[sku]
		require.True(t, rp.Retired, "%v", rp)
		require.ErrorIs(t, testkit.Err(e.r.Levels(ctx, sku)), stock.ErrNotLoaded)
		assert.Equal(t, int64(8), must(store.Remaining(ctx, sku))(t))
	})
}

// buyers runs workers goroutines at once, goroutine g calling buy(g, i) for i from 0 to per-1,
// and returns how many calls succeeded and the errors of those that failed with none of allowed.
func buyers(workers, per int, buy func(g, i int) error, allowed ...error) (ok int64, bad []string) {
	var n atomic.Int64
	var mu sync.Mutex
	parallel(workers, func(g int) {
		for i := range per {
			err := buy(g, i)
			switch {
			case err == nil:
				n.Add(1)
			case slices.ContainsFunc(allowed, func(a error) bool { return errors.Is(err, a) }):
			default:
				mu.Lock()
				bad = append(bad, err.Error())
				mu.Unlock()
			}
		}
	})
	return n.Load(), bad
}

// TestCountingBuckets: N goroutines over S units, bucket counts 2..64 and awkward names:
// exactly S successes, Levels and a memstore fed by the relay agree, nothing stranded.
func TestCountingBuckets(t *testing.T) {
	testkit.ParallelOnMiniredis(t)
	long := strings.Repeat("L", stock.MaxNameLen-20)
	for _, n := range []int{2, 7, 64} {
		for _, name := range []string{"a:b~c", long} {
			t.Run(fmt.Sprintf("%d/%d", n, len(name)), func(t *testing.T) {
				lifecycleEach(t, []stock.Option{lifecycleSplit(n), stock.WithUserLimit(3)}, func(t *testing.T, e *env) {
					sku := sku(name)
					const S, G, per = 97, 16, 12
					store := storeFor(t, e.r, sku, S)
					ok, bad := buyers(G, per, func(g, i int) error {
						_, err := e.r.Deduct(ctx, req(sku, fmt.Sprint(g, "-", i), fmt.Sprint("u", g, "-", i/3), 1))
						return err
					}, stock.ErrSoldOut)
					require.Empty(t, bad)
					require.Equal(t, int64(S), ok)
					require.Equal(t, stock.Levels{Sold: S, Loaded: S}, testkit.Levels(t, e.r, sku))
					lifecycleDrain(t, e.r, store, sku)
					require.Zero(t, must(store.Remaining(ctx, sku))(t))
					rp := pass(t, e, e.r, store, sku)[sku]
					require.Zero(t, rp.Drift, "%v", rp)
					require.Zero(t, rp.Adjusted, "%v", rp)
				})
			})
		}
	}
}

// TestUnevenCluster: a 3-master cluster whose masters own very unequal slot ranges (0–1000,
// 5461–6000, and everything else): the buckets' slots no longer spread one per master, and the
// library must still be correct: exact counting under concurrency with transfers, holds, the
// relay into a memstore, Delist and retirement, and a reload.
func TestUnevenCluster(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skip("STOCK_REDIS_SERVER not set")
	}
	cl := redistest.StartCluster(t, 3)
	srv := cl.Servers()
	moves := [][]string{{"1001", "5460"}, {"6001", "10922"}}
	for _, s := range srv {
		c := s.Client(t)
		for _, m := range moves {
			require.NoError(t, c.Do(ctx, c.B().Arbitrary("CLUSTER", "DELSLOTSRANGE").Args(m...).Build()).Error())
		}
	}
	c2 := srv[2].Client(t)
	for _, m := range moves {
		require.NoError(t, c2.Do(ctx, c2.B().Arbitrary("CLUSTER", "ADDSLOTSRANGE").Args(m...).Build()).Error())
	}
	require.NoError(t, c2.Do(ctx, c2.B().Arbitrary("CLUSTER", "BUMPEPOCH").Build()).Error())
	id2 := must(c2.Do(ctx, c2.B().Arbitrary("CLUSTER", "MYID").Build()).ToString())(t)
	// every node must see node 2 own slot 3000 and 8000, and the cluster ok
	deadline := time.Now().Add(20 * time.Second)
	for _, s := range srv {
		c := s.Client(t)
		for {
			info := must(c.Do(ctx, c.B().Arbitrary("CLUSTER", "INFO").Build()).ToString())(t)
			nodes := must(c.Do(ctx, c.B().Arbitrary("CLUSTER", "NODES").Build()).ToString())(t)
			ok := strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_slots_assigned:16384")
			for _, line := range strings.Split(nodes, "\n") {
				if strings.Contains(line, id2) {
					ok = ok && strings.Contains(line, "1001-5460") && strings.Contains(line, "6001-16383")
				}
			}
			if ok {
				break
			}
			require.True(t, time.Now().Before(deadline), "cluster did not settle: %s\n%s", info, nodes)
			time.Sleep(100 * time.Millisecond)
		}
	}
	time.Sleep(500 * time.Millisecond)
	c := cl.Client(t)
	r := testkit.NewReserver(t, c, lifecycleSplit(3), stock.WithUserLimit(2))
	e := &env{name: "uneven-cluster", real: true, c: c, r: r, advance: time.Sleep,
		another: func(o ...stock.Option) *stock.Reserver { return testkit.NewReserver(t, c, o...) }}
	fenced, err := stockops.NewFailoverGuard(r).Check(ctx)
	require.NoError(t, err)
	require.False(t, fenced)
	for _, name := range []string{"un:ev~en", strings.Repeat("Z", 100)} {
		sku := sku(name)
		const S = 60
		store := storeFor(t, r, sku, S)
		ok, bad := buyers(12, 10, func(g, i int) error {
			id := fmt.Sprint(g, "-", i)
			user := fmt.Sprint("u", g%4, "-", i/2)
			if i%3 == 0 {
				_, err := r.Hold(ctx, req(sku, id, user, 1), time.Hour)
				if err == nil {
					_, err = r.Confirm(ctx, sku, id)
				}
				return err
			}
			_, err := r.Deduct(ctx, req(sku, id, user, 1))
			return err
		}, stock.ErrSoldOut, stock.ErrUserLimit)
		require.Empty(t, bad)
		l := testkit.Levels(t, r, sku)
		require.Equal(t, ok, l.Sold)
		require.Equal(t, int64(S)-ok, l.Available)
		// sell the rest: nothing stranded in any bucket
		for i := 0; l.Available > 0 && i < 200; i++ {
			require.NoError(t, testkit.Err(r.Deduct(ctx, req(sku, fmt.Sprint("rest", i), fmt.Sprint("r", i), 1))))
			l = testkit.Levels(t, r, sku)
		}
		require.Equal(t, stock.Levels{Sold: S, Loaded: S}, l)
		lifecycleDrain(t, r, store, sku)
		require.Zero(t, must(store.Remaining(ctx, sku))(t))
		retire(t, e, store, sku)
		_, err = r.Levels(ctx, sku)
		require.ErrorIs(t, err, stock.ErrNotLoaded)
		require.NoError(t, r.Load(ctx, sku, 2))
		require.Equal(t, stock.Levels{Available: 2, Loaded: 2}, testkit.Levels(t, r, sku))
	}
}

// TestRetryRefusalSplitVsPlain: on a sold-out item (fast path primed), a Retry request is
// refused and its refusal recorded; after a restock, the same id (its late first attempt, or a
// new retry) is still refused, and a fresh id is served: alike on a plain and a split item.
func TestRetryRefusalSplitVsPlain(t *testing.T) {
	lifecycleEach(t, []stock.Option{lifecycleSplit(3)}, func(t *testing.T, e *env) {
		var out [2][]string
		for j, sku := range []string{sku("plain-rt"), sku("rt")} {
			rec := func(rc stock.Receipt, err error) {
				out[j] = append(out[j], fmt.Sprintf("%s replayed=%v qty=%d", class(err), rc.Replayed, rc.Qty))
			}
			require.NoError(t, e.r.Load(ctx, sku, 2))
			rec(e.r.Deduct(ctx, req(sku, "a", "ua", 1)))
			rec(e.r.Deduct(ctx, req(sku, "b", "ub", 1)))
			for i := range 5 {
				rec(e.r.Deduct(ctx, req(sku, fmt.Sprint("x", i), fmt.Sprint("x", i), 1)))
			}
			rec(e.r.Deduct(ctx, stock.Request{SKU: sku, ID: "q", User: "uq", Qty: 1, Retry: true}))
			rec(e.r.Hold(ctx, stock.Request{SKU: sku, ID: "qh", User: "uqh", Qty: 1, Retry: true}, time.Minute))
			rec(e.r.Restock(ctx, sku, "rs", 3))
			rec(e.r.Deduct(ctx, req(sku, "q", "uq", 1)))
			rec(e.r.Deduct(ctx, stock.Request{SKU: sku, ID: "q", User: "uq", Qty: 1, Retry: true}))
			rec(e.r.Hold(ctx, req(sku, "qh", "uqh", 1), time.Minute))
			rec(e.r.Deduct(ctx, req(sku, "fresh", "uf", 1)))
			rec(e.r.Deduct(ctx, stock.Request{SKU: sku, ID: "a", User: "ua", Qty: 1, Retry: true}))
			out[j] = append(out[j], fmt.Sprintf("%+v", testkit.Levels(t, e.r, sku)))
		}
		assert.Equal(t, out[0], out[1])
	})
}

// TestTransferCutThenDelist: a deduct that needs a transfer between buckets is cut at each of
// its Redis calls in turn, and the item delisted at once: the counters stay whole, no pass
// retires the item while a transfer is in flight, the sweeper completes the transfer, a Retry
// of the cut deduct is answered for good, and then the item retires with the Store in
// agreement.
func TestTransferCutThenDelist(t *testing.T) {
	lifecycleEach(t, []stock.Option{lifecycleSplit(3)}, func(t *testing.T, e *env) {
		for n := 1; n < 30; n++ {
			sku := sku("xc")
			store := storeFor(t, e.r, sku, 3)
			require.NoError(t, testkit.Err(e.r.Deduct(ctx, req(sku, "w0", "whale", 1))))
			cc := &cut{Client: e.c, n: n}
			cr := testkit.NewReserver(t, cc, lifecycleSplit(3))
			_, cerr := cr.Deduct(ctx, req(sku, "w1", "whale", 1))
			if cut, count := cc.state(); !cut {
				require.NoError(t, cerr)
				t.Logf("the deduct with a transfer makes %d calls", count)
				break
			}
			l := testkit.Levels(t, e.r, sku)
			require.Equal(t, int64(3), l.Loaded, "cut %d", n)
			require.NoError(t, e.r.Delist(ctx, sku), "cut %d", n)
			lifecycleDrain(t, e.r, store, sku)
			e.advance(20 * time.Millisecond)
			rp := pass(t, e, e.r, store, sku)[sku]
			if rp.Retired {
				// only when nothing was in flight: every unit accounted for
				rm := must(store.Remaining(ctx, sku))(t)
				require.Equal(t, 3-l.Sold, rm, "cut %d: retired with %+v, store %d", n, l, rm)
				continue
			}
			// Run's sweeper completes a transfer in flight once it is 5 s old
			runCtx, stopRun := context.WithCancel(ctx)
			runDone := make(chan error, 1)
			go func() {
				runDone <- e.r.Run(runCtx, stock.RunOptions{Store: store, SweepInterval: 20 * time.Millisecond,
					Reconcile: &stock.ReconcileOptions{Interval: -1}, GuardInterval: -1, RecoverCartsAfter: -1,
					Relay: &stock.RelayOptions{Items: []string{sku}}})
			}()
			e.advance(6 * time.Second)
			time.Sleep(300 * time.Millisecond)
			stopRun()
			<-runDone
			rc, rerr := e.r.Deduct(ctx, stock.Request{SKU: sku, ID: "w1", User: "whale", Qty: 1, Retry: true})
			if rerr != nil {
				require.ErrorIs(t, rerr, stock.ErrClosed, "cut %d", n)
			}
			_ = rc
			l = testkit.Levels(t, e.r, sku)
			require.Equal(t, int64(3), l.Loaded)
			require.Zero(t, l.Held)
			lifecycleDrain(t, e.r, store, sku)
			e.advance(20 * time.Millisecond)
			rp = pass(t, e, e.r, store, sku)[sku]
			require.True(t, rp.Retired, "cut %d: %v (levels %+v)", n, rp, l)
			require.Equal(t, 3-l.Sold, must(store.Remaining(ctx, sku))(t), "cut %d", n)
		}
	})
}

// TestStockopsAloneRecoversTransfer: a deployment that runs the background work with
// package stockops instead of Reserver.Run (the package doc offers that) must still be able to
// retire a delisted split item whose transfer was cut in flight: stockops.Sweep covers every
// bucket (README), and Run's sweeper is the only other thing that completes such a transfer.
func TestStockopsAloneRecoversTransfer(t *testing.T) {
	lifecycleEach(t, []stock.Option{lifecycleSplit(3)}, func(t *testing.T, e *env) {
		stuck := false
		// The cut counts the Reserver's background commands too (its hint writer shares the
		// client), so on a loaded machine a pass over the cuts may land none between the two
		// halves of a transfer: up to 3 passes before the test says no cut could.
		for pass := 0; pass < 3 && !stuck; pass++ {
			stuck = cutTransfer(t, e)
		}
		require.True(t, stuck, "no cut left a transfer in flight")
	})
}

// cutTransfer cuts a split item's take after its n-th command, for n = 1, 2, ..., until a
// cut leaves a transfer in flight that keeps the delisted item from retiring; then checks that
// stockops.Sweep completes it and the item retires. It reports whether a cut did.
func cutTransfer(t *testing.T, e *env) (stuck bool) {
	for n := 1; n < 30 && !stuck; n++ {
		sku := sku("xs")
		store := storeFor(t, e.r, sku, 3)
		require.NoError(t, testkit.Err(e.r.Deduct(ctx, req(sku, "w0", "whale", 1))))
		cc := &cut{Client: e.c, n: n}
		cr := testkit.NewReserver(t, cc, lifecycleSplit(3))
		_, _ = cr.Deduct(ctx, req(sku, "w1", "whale", 1))
		if cut, _ := cc.state(); !cut {
			break
		}
		require.NoError(t, e.r.Delist(ctx, sku))
		lifecycleDrain(t, e.r, store, sku)
		e.advance(20 * time.Millisecond)
		if pass(t, e, e.r, store, sku)[sku].Retired {
			continue
		}
		stuck = true // a transfer in flight keeps it
		e.advance(6 * time.Second)
		require.NoError(t, testkit.Err(stockops.Sweep(ctx, e.r, sku)))
		lifecycleDrain(t, e.r, store, sku)
		e.advance(20 * time.Millisecond)
		rp := pass(t, e, e.r, store, sku)[sku]
		require.True(t, rp.Retired, "cut %d: a transfer cut in flight is completed by nothing in stockops: %v", n, rp)
	}
	return stuck
}

// TestMixedIntoStore: carts of deducts and holds with split lines, their confirms,
// cancels and restores of single lines, and single requests on the split items, from several
// goroutines while Run relays into a memstore: once drained, the Store equals Redis for every
// item, no event was applied twice, and a reconcile pass finds no drift.
func TestMixedIntoStore(t *testing.T) {
	each(t, []stock.Option{split(3)}, func(t *testing.T, e *requestEnv) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		store := memstore.New()
		skus := []string{"mx-a", "mx:b~", "plain-mx"}
		for _, sku := range skus {
			require.NoError(t, store.Load(ctx, sku, 200))
			require.NoError(t, e.r.Load(ctx, sku, 200))
		}
		done := make(chan error, 1)
		go func() {
			done <- e.r.Run(ctx, stock.RunOptions{Store: store, Relay: &stock.RelayOptions{Poll: 20 * time.Millisecond}})
		}()
		parallel(6, func(g int) {
			rng := rand.New(rand.NewPCG(uint64(g), 27))
			for k := range 20 {
				id := fmt.Sprintf("mx-%d-%d", g, k)
				user := fmt.Sprintf("mxu-%d", rng.IntN(8))
				lines := []stock.Line{{SKU: "mx-a", Qty: 1 + rng.Int64N(3)}, {SKU: "mx:b~", Qty: 1 + rng.Int64N(3)}, {SKU: "plain-mx", Qty: 1}}
				switch rng.IntN(5) {
				case 0:
					_, _ = e.r.DeductMany(ctx, stock.Cart{ID: id, User: user, Lines: lines})
				case 1:
					if _, err := e.r.DeductMany(ctx, stock.Cart{ID: id, User: user, Lines: lines}); err == nil {
						_, _ = e.r.Restore(ctx, "mx:b~", id)
					}
				case 2:
					if _, err := e.r.HoldMany(ctx, stock.Cart{ID: id, User: user, Lines: lines}, time.Hour); err == nil {
						_, _ = e.r.ConfirmMany(ctx, id, skus...)
					}
				case 3:
					if _, err := e.r.HoldMany(ctx, stock.Cart{ID: id, User: user, Lines: lines}, time.Hour); err == nil {
						_, _ = e.r.CancelMany(ctx, id, skus...)
					}
				default:
					if _, err := e.r.Deduct(ctx, req("mx-a", id, user, 2)); err == nil && rng.IntN(2) == 0 {
						_, _ = e.r.Restore(ctx, "mx-a", id)
					}
				}
			}
		})
		eventuallyDelivered(t, e.r, 30*time.Second, skus...)
		cancel()
		if err := <-done; err != nil {
			require.ErrorIs(t, err, context.Canceled)
		}
		for _, sku := range skus {
			l := levels(t, e.r, sku)
			assert.Equal(t, l.Available+l.Held, must(store.Remaining(context.Background(), sku))(t), "store vs Redis: %s %+v", sku, l)
			reconcile(t, e.r, store, sku)
		}
		assert.LessOrEqual(t, store.MaxApplications(), 1)
	})
}

// sales runs rounds of give-backs and sell-outs on sku (split over several buckets), so
// that units given back in one bucket are moved by transfers and sold in others. It returns
// the ids whose sale Redis acknowledged and that were not given back since (id → units).
// between, when not nil, runs after each round (a relay pass, say).
func sales(t *testing.T, e *requestEnv, sku string, seed uint64, rounds int, between func(round int)) map[string]int64 {
	t.Helper()
	return salesQ(t, e, sku, seed, rounds, 2, between)
}

// salesQ is sales with sales of 1 to maxQty units (a large one is often refused after
// its bucket pulled units from its siblings: units then pass through a bucket with no event).
func salesQ(t *testing.T, e *requestEnv, sku string, seed uint64, rounds int, maxQty int, between func(round int)) map[string]int64 {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e37))
	sold := map[string]int64{}
	var n int
	buy := func() {
		// Buyers of random buckets until the item is sold out.
		for range 200 {
			n++
			id := fmt.Sprintf("d%d", n)
			q := int64(1 + rng.IntN(maxQty))
			_, err := e.r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: fmt.Sprintf("u%d", rng.IntN(50)), Qty: q})
			if err == nil {
				sold[id] = q
				continue
			}
			if errors.Is(err, stock.ErrInsufficient) {
				continue
			}
			require.ErrorIs(t, err, stock.ErrSoldOut)
			return
		}
		t.Fatalf("never sold out")
	}
	buy()
	for round := range rounds {
		// Give-backs: restores of earlier sales, a restock, holds cancelled, holds left to expire.
		ids := make([]string, 0, len(sold))
		for id := range sold {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		for _, id := range ids[:min(len(ids), 1+rng.IntN(3))] {
			require.NoError(t, testkit.Err(e.r.Restore(ctx, sku, id)))
			delete(sold, id)
		}
		require.NoError(t, testkit.Err(e.r.Restock(ctx, sku, fmt.Sprintf("rs%d", round), int64(1+rng.IntN(3)))))
		buy()
		// Holds: taken from what a restock brings, half cancelled, half left to expire.
		require.NoError(t, testkit.Err(e.r.Restock(ctx, sku, fmt.Sprintf("rh%d", round), 4)))
		for k := range 4 {
			id := fmt.Sprintf("h%d-%d", round, k)
			_, err := e.r.Hold(ctx, stock.Request{SKU: sku, ID: id, User: fmt.Sprintf("u%d", rng.IntN(50)), Qty: 1}, 2*time.Second)
			if err != nil {
				require.True(t, errors.Is(err, stock.ErrSoldOut) || errors.Is(err, stock.ErrInsufficient), "%v", err)
				continue
			}
			if k%2 == 0 {
				_, err = e.r.Cancel(ctx, sku, id)
				require.NoError(t, err)
			}
		}
		e.advance(3 * time.Second)
		buy()
		if between != nil {
			between(round)
		}
	}
	return sold
}

// splitCheck checks that the Store applied every acknowledged sale (none refused, in the
// ledger or in the store), and that it equals Redis.
func splitCheck(t *testing.T, e *requestEnv, store *memstore.Store, sku string, sold map[string]int64) {
	t.Helper()
	ids := make([]string, 0, len(sold))
	for id := range sold {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	recs := must(store.Records(ctx, sku, ids))(t)
	var refused []string
	for _, id := range ids {
		ent := must(e.r.Ledger(ctx, sku, id))(t)
		if ent.State == stock.StateRefused || recs[id].Status != stock.StateApplied {
			refused = append(refused, fmt.Sprintf("%s(ledger %v, store %v)", id, ent.State, recs[id].Status))
		}
	}
	assert.Empty(t, refused, "acknowledged sales the Store refused or did not apply")
	l := levels(t, e.r, sku)
	assert.Equal(t, l.Available+l.Held, must(store.Remaining(ctx, sku))(t), "store remaining vs Redis available+held (%+v)", l)
	assert.LessOrEqual(t, store.MaxApplications(), 1, "an event applied twice")
}

// drained reports whether sku has nothing left to deliver.
func drained(t *testing.T, e *requestEnv, sku string) bool {
	t.Helper()
	p, d, err := stockops.Pending(context.Background(), e.r, sku)
	require.NoError(t, err)
	require.Zero(t, d, "dead letters")
	return p == 0
}

// splitDrain runs rl.Once until sku is drained and returns the number of passes; it fails after
// limit passes (liveness: barriers never hold delivery back forever).
func splitDrain(t *testing.T, e *requestEnv, sku string, limit int, rls ...*stockops.Relay) (passes, refused int) {
	t.Helper()
	for passes < limit {
		if drained(t, e, sku) {
			return passes, refused
		}
		passes++
		var ref atomic.Int64
		parallel(len(rls), func(i int) {
			ref.Add(int64(must(rls[i].Once(ctx))(t).Refused))
		})
		refused += int(ref.Load())
	}
	t.Fatalf("%s not drained after %d passes", sku, passes)
	return
}

func splitRelay(t *testing.T, e *requestEnv, store stock.Store, o *stock.RelayOptions) *stockops.Relay {
	t.Helper()
	return must(stockops.NewRelay(e.r, store, nil, o))(t)
}

// TestRelayOrderAcrossBuckets: give-backs in one bucket moved and sold in others; the
// relay (several shapes) delivers everything after the activity; the Store refuses nothing,
// and the item drains within a bounded number of passes.
func TestRelayOrderAcrossBuckets(t *testing.T) {
	testkit.ParallelOnMiniredis(t)
	shapes := []struct {
		name   string
		relays int
		opts   func(sku string) *stock.RelayOptions
	}{
		{"batch1", 1, func(string) *stock.RelayOptions { return &stock.RelayOptions{Batch: 1} }},
		{"batch2", 1, func(string) *stock.RelayOptions { return &stock.RelayOptions{Batch: 2} }},
		{"three-relays-batch2", 3, func(string) *stock.RelayOptions { return &stock.RelayOptions{Batch: 2} }},
		{"items", 1, func(sku string) *stock.RelayOptions { return &stock.RelayOptions{Batch: 1, Items: []string{sku}} }},
		{"default", 1, func(string) *stock.RelayOptions { return nil }},
	}
	for _, buckets := range []int{3, 5} {
		for _, sh := range shapes {
			t.Run(fmt.Sprintf("b%d-%s", buckets, sh.name), func(t *testing.T) {
				splitEach(t, []stock.Option{split(buckets)}, func(t *testing.T, e *requestEnv) {
					for seed := range uint64(3) {
						sku := fmt.Sprintf("ord-%d-%s-%d", buckets, sh.name, seed)
						store := storeFor(t, e.r, sku, 6)
						sold := sales(t, e, sku, seed, 4, nil)
						var rls []*stockops.Relay
						for range sh.relays {
							rls = append(rls, splitRelay(t, e, store, sh.opts(sku)))
						}
						passes, refused := splitDrain(t, e, sku, 400, rls...)
						t.Logf("%s: %d passes, %d refused", sku, passes, refused)
						assert.Zero(t, refused, "the relay counted refusals")
						splitCheck(t, e, store, sku, sold)
					}
				})
			})
		}
	}
}

// drainAdv is splitDrain that lets time pass between passes (backoffs), and tolerates
// dead letters when dead is true.
func drainAdv(t *testing.T, e *requestEnv, sku string, limit int, dead bool, rl *stockops.Relay) (passes, refused int) {
	t.Helper()
	for passes < limit {
		p, d, err := stockops.Pending(context.Background(), e.r, sku)
		require.NoError(t, err)
		if !dead {
			require.Zero(t, d, "dead letters")
		}
		if p == 0 {
			return passes, refused
		}
		passes++
		st, err := rl.Once(context.Background())
		if err != nil && !errors.Is(err, stock.ErrInvalid) {
			require.NoError(t, err)
		}
		refused += st.Refused
		e.advance(30 * time.Millisecond)
	}
	t.Fatalf("%s not drained after %d passes", sku, passes)
	return
}

// TestDonorRetryable: the Store fails the give-backs (restocks, restores) with a temporary
// error for a while. The sales that spend their units in other buckets must wait (not be
// refused), and go on once the Store is back.
func TestDonorRetryable(t *testing.T) {
	each(t, []stock.Option{split(3)}, func(t *testing.T, e *requestEnv) {
		for seed := range uint64(3) {
			sku := fmt.Sprintf("retry-%d", seed)
			store := storeFor(t, e.r, sku, 6)
			var down atomic.Bool
			down.Store(true)
			var failed atomic.Int64
			store.FailWith(func(ev stock.Event) error {
				if down.Load() && (ev.Type == stock.EventRestocked || ev.Type == stock.EventRestored) {
					failed.Add(1)
					return memstore.ErrDown
				}
				return nil
			})
			sold := sales(t, e, sku, seed+30, 3, nil)
			rl := splitRelay(t, e, store, &stock.RelayOptions{Batch: 2, MinBackoff: 5 * time.Millisecond, MaxBackoff: 10 * time.Millisecond})
			refused := 0
			for range 20 {
				st, err := rl.Once(ctx)
				if err != nil {
					require.ErrorIs(t, err, memstore.ErrDown)
				}
				refused += st.Refused
				e.advance(30 * time.Millisecond)
			}
			require.Positive(t, failed.Load(), "the store failed some give-backs")
			assert.Zero(t, refused, "a sale refused while a give-back was failing")
			down.Store(false)
			passes, r2 := drainAdv(t, e, sku, 400, false, rl)
			t.Logf("%s: %d give-backs failed, drained in %d passes after", sku, failed.Load(), passes)
			assert.Zero(t, r2, "the relay counted refusals")
			splitCheck(t, e, store, sku, sold)
		}
	})
}

// TestDonorInvalid: the Store rejects every restock as invalid (ErrInvalid): it is
// dead-lettered, for an operator (documented). The relay must not be blocked by it: every
// other event is delivered within a bounded number of passes, and the dead letter is
// reported by Pending.
func TestDonorInvalid(t *testing.T) {
	splitEach(t, []stock.Option{split(3)}, func(t *testing.T, e *requestEnv) {
		sku := "invalid"
		store := storeFor(t, e.r, sku, 6)
		store.FailWith(func(ev stock.Event) error {
			if ev.Type == stock.EventRestocked {
				return fmt.Errorf("bad restock: %w", stock.ErrInvalid)
			}
			return nil
		})
		sold := sales(t, e, sku, 40, 3, nil)
		rl := splitRelay(t, e, store, &stock.RelayOptions{Batch: 2, MinBackoff: 5 * time.Millisecond, MaxBackoff: 10 * time.Millisecond})
		passes, refused := drainAdv(t, e, sku, 400, true, rl)
		_, d, err := stockops.Pending(ctx, e.r, sku)
		require.NoError(t, err)
		assert.Positive(t, d, "the rejected restocks are dead letters")
		nref := 0
		for id := range sold {
			ent := must(e.r.Ledger(ctx, sku, id))(t)
			if ent.State == stock.StateRefused {
				nref++
			}
		}
		t.Logf("%d passes, %d dead letters, %d sales refused by the relay (%d in the ledger)", passes, d, refused, nref)
	})
}

// TestCutTransfers: buyers whose context ends at random moments (some inside a
// rebalance, cutting a transfer half way); then the sweeper completes the cut transfers and
// the relay delivers everything: no acknowledged sale (by Redis's ledger) refused.
func TestCutTransfers(t *testing.T) {
	splitEach(t, []stock.Option{split(4)}, func(t *testing.T, e *requestEnv) {
		sku := "cut"
		store := storeFor(t, e.r, sku, 8)
		rng := rand.New(rand.NewPCG(5, 5))
		var ids []string
		n := 0
		for round := range 30 {
			require.NoError(t, testkit.Err(e.r.Restock(ctx, sku, fmt.Sprintf("rs%d", round), int64(1+rng.IntN(3)))))
			for range 6 {
				n++
				id := fmt.Sprintf("c%d", n)
				ids = append(ids, id)
				cctx, cancel := context.WithTimeout(ctx, time.Duration(rng.IntN(400))*time.Microsecond)
				_, _ = e.r.Deduct(cctx, stock.Request{SKU: sku, ID: id, User: fmt.Sprintf("u%d", rng.IntN(40)), Qty: 1})
				cancel()
			}
			if round%5 == 4 {
				// Restores of a few sold ids: give-backs in their buckets.
				for _, id := range ids[len(ids)-3:] {
					_, err := e.r.Restore(ctx, sku, id)
					if !errors.Is(err, stock.ErrUnknownID) { // a deduct cut before it ran
						require.NoError(t, err)
					}
				}
			}
		}
		// Cut transfers complete once 5 s old.
		inFlight := 0
		e7 := &env{name: e.name, real: e.real, c: e.c, r: e.r, advance: e.advance, another: e.another}
		for _, k := range keysOf(t, e7, sku) {
			if strings.HasSuffix(k, ":xf") {
				n := must(e.c.Do(ctx, e.c.B().Zcard().Key(k).Build()).AsInt64())(t)
				inFlight += int(n)
			}
		}
		t.Logf("transfers in flight before the sweep: %d", inFlight)
		e.advance(6 * time.Second)
		require.NoError(t, testkit.Err(stockops.Sweep(ctx, e.r, sku)))
		// Sell out whatever is left, through every bucket.
		for k := range 60 {
			id := fmt.Sprintf("z%d", k)
			ids = append(ids, id)
			_, err := e.r.Deduct(ctx, req(sku, id, fmt.Sprintf("u%d", k), 1))
			if errors.Is(err, stock.ErrSoldOut) {
				break
			}
		}
		sold := takenByID(t, e.r, sku, ids)
		rl := splitRelay(t, e, store, &stock.RelayOptions{Batch: 1})
		passes, refused := splitDrain(t, e, sku, 400, rl)
		t.Logf("%d sold, drained in %d passes", len(sold), passes)
		assert.Zero(t, refused, "the relay counted refusals")
		splitCheck(t, e, store, sku, sold)
		reconcile(t, e.r, store, sku)
	})
}

// TestRetireAfterTransfers: after many transfers (and barriers), the item drains, is
// delisted and retired: no key of it is left, barriers included.
func TestRetireAfterTransfers(t *testing.T) {
	each(t, []stock.Option{split(4)}, func(t *testing.T, e *requestEnv) {
		sku := "retire-ord"
		store := storeFor(t, e.r, sku, 6)
		sold := sales(t, e, sku, 60, 4, nil)
		rl := splitRelay(t, e, store, &stock.RelayOptions{Batch: 2})
		_, refused := splitDrain(t, e, sku, 400, rl)
		assert.Zero(t, refused)
		splitCheck(t, e, store, sku, sold)
		e7 := &env{name: e.name, real: e.real, c: e.c, r: e.r, advance: e.advance, another: e.another}
		retire(t, e7, store, sku)
		// What is left: each bucket's item hash, with only its retired mark and delist time (as
		// TestRetireLeavesNoKeys pins); no barrier, transfer or claim key.
		left := keysOf(t, e7, sku)
		assert.Len(t, left, 4, "%v", left)
		for _, k := range left {
			require.True(t, strings.HasSuffix(k, "}"), "key left behind: %s", k)
			m := must(e.c.Do(ctx, e.c.B().Hgetall().Key(k).Build()).AsStrMap())(t)
			assert.Len(t, m, 2, "%s: %v", k, m)
			assert.Equal(t, "1", m["x"], "%s: %v", k, m)
		}
		assert.ErrorIs(t, testkit.Err(e.r.Levels(ctx, sku)), stock.ErrNotLoaded)
	})
}

// keysOf lists the item's keys (its buckets' included, "{sku|..."), not other items'.
func keysOf(t *testing.T, e *env, sku string) []string {
	t.Helper()
	var mine []string
	for _, k := range lifecycleKeys(t, e, sku) {
		if strings.Contains(k, "{"+sku+"}") || strings.Contains(k, "{"+sku+"|") {
			mine = append(mine, k)
		}
	}
	return mine
}

// TestQueueDonorDown: the queue path where the Store is down for the give-backs for a
// while: Consume answers them with a temporary error; the sales that spend their units in
// other buckets are held back (never refused) and go through once the Store is back.
func TestQueueDonorDown(t *testing.T) {
	splitEach(t, []stock.Option{split(3)}, func(t *testing.T, e *requestEnv) {
		splitSeeds(t, e, "qdown", 3, 6, func(seed uint64, sku string, store *memstore.Store) {
			sold := sales(t, e, sku, seed+110, 3, nil)
			evs, _ := publishAll(t, e, sku, 2)
			var down atomic.Bool
			down.Store(true)
			store.FailWith(func(ev stock.Event) error {
				if down.Load() && (ev.Type == stock.EventRestocked || ev.Type == stock.EventRestored) {
					return memstore.ErrDown
				}
				return nil
			})
			queue := slices.Clone(evs)
			rand.New(rand.NewPCG(seed, 11)).Shuffle(len(queue), func(i, j int) { queue[i], queue[j] = queue[j], queue[i] })
			for round := 0; len(queue) > 0; round++ {
				require.Less(t, round, 200, "events never applied: %d", len(queue))
				if round == 5 {
					down.Store(false)
				}
				var again []stock.Event
				for _, ev := range queue {
					err := stock.Consume(ctx, e.r, store, ev)
					if err != nil {
						if !errors.Is(err, stock.ErrHeldBack) {
							require.ErrorIs(t, err, memstore.ErrDown, "%+v", ev)
						}
						again = append(again, ev)
					}
				}
				queue = again
			}
			splitCheck(t, e, store, sku, sold)
		})
	})
}

// bucketOf returns the bucket id's claim names (from the claims hashes of sku's buckets).
func bucketOf(t *testing.T, e *requestEnv, sku, id string) int {
	t.Helper()
	e7 := &env{name: e.name, real: e.real, c: e.c, r: e.r, advance: e.advance, another: e.another}
	for _, k := range keysOf(t, e7, sku) {
		if !strings.HasSuffix(k, ":i") {
			continue
		}
		v, err := e.c.Do(ctx, e.c.B().Hget().Key(k).Field(id).Build()).ToString()
		if rueidis.IsRedisNil(err) {
			continue
		}
		require.NoError(t, err)
		var b int
		_, err = fmt.Sscanf(v, "%d", &b)
		require.NoError(t, err, "claim %q", v)
		return b
	}
	t.Fatalf("no claim for %s", id)
	return -1
}

// TestQueueManyBarriersInDonor: the queue path (a relay with no Store) with no consumer
// running. Bucket 0 receives 70 transfers from bucket 1 (70 barriers), then gives units to
// bucket 1, whose buyer buys them. The README says that with no Store "delivered means left
// the outbox: handed to the Publisher", so the relay must publish every event within a bounded
// number of passes without waiting for a consumer to apply anything.
func TestQueueManyBarriersInDonor(t *testing.T) {
	for _, transfers := range []int{60, 70} {
		t.Run(fmt.Sprint(transfers), func(t *testing.T) { manyBarriers(t, transfers) })
	}
}

func manyBarriers(t *testing.T, transfers int) {
	if transfers > 64 {
	}
	each(t, []stock.Option{split(2)}, func(t *testing.T, e *requestEnv) {
		sku := fmt.Sprintf("many-%d", transfers)
		require.NoError(t, e.r.Load(ctx, sku, 400))
		// Buyers of each bucket.
		var users [2]string
		for i := 0; users[0] == "" || users[1] == ""; i++ {
			require.Less(t, i, 50)
			u := fmt.Sprintf("p%d", i)
			require.NoError(t, testkit.Err(e.r.Deduct(ctx, req(sku, u, u, 1))))
			if b := bucketOf(t, e, sku, u); users[b] == "" {
				users[b] = u
			}
		}
		n := 0
		buy := func(b int, q int64) (stock.Receipt, error) {
			n++
			return e.r.Deduct(ctx, req(sku, fmt.Sprintf("%s-%d", users[b], n), users[b], q))
		}
		// Bucket 1's stock, sold one unit at a time (to be given back one at a time).
		var ones []string
		for {
			rc := must(buy(1, 1))(t)
			ones = append(ones, rc.ID)
			if rc.Remaining == 0 {
				break
			}
		}
		// Bucket 0 empty too.
		rc, err := buy(0, 1)
		require.NoError(t, err)
		if rc.Remaining > 0 {
			_, err = buy(0, rc.Remaining)
			require.NoError(t, err)
		}
		require.Zero(t, levels(t, e.r, sku).Available)
		require.Greater(t, len(ones), transfers)
		// transfers 1 → 0: a unit given back in bucket 1, bought by bucket 0's buyer.
		var zeros []string
		for i := range transfers {
			require.NoError(t, testkit.Err(e.r.Restore(ctx, sku, ones[i])))
			rc := must(buy(0, 1))(t, "transfer %d", i)
			zeros = append(zeros, rc.ID)
		}
		// Then bucket 0 gives units back, and bucket 1's buyer takes them (a transfer 0 → 1).
		for _, id := range zeros[:3] {
			require.NoError(t, testkit.Err(e.r.Restore(ctx, sku, id)))
		}
		require.NoError(t, testkit.Err(buy(1, 3)))
		require.Zero(t, levels(t, e.r, sku).Available)
		q := &queue{}
		rl := must(stockops.NewRelay(e.r, nil, q, nil))(t)
		passes := 0
		for ; passes < 50 && !drained(t, e, sku); passes++ {
			require.NoError(t, testkit.Err(rl.Once(ctx)))
			e.advance(200 * time.Millisecond)
		}
		p, _, err := stockops.Pending(ctx, e.r, sku)
		require.NoError(t, err)
		queue := q.take()
		t.Logf("%d published in %d passes, %d pending", len(queue), passes, p)
		assert.Zero(t, p, "events never handed to the Publisher while no consumer runs")
		// Consumers then apply what was published (and the relay goes on): everything is
		// applied in the end, nothing refused.
		store := memstore.New()
		require.NoError(t, store.Load(ctx, sku, 400))
		for round := 0; ; round++ {
			require.Less(t, round, 100, "never drained")
			var again []stock.Event
			for _, ev := range queue {
				err := stock.Consume(ctx, e.r, store, ev)
				if errors.Is(err, stock.ErrHeldBack) {
					again = append(again, ev)
					continue
				}
				require.NoError(t, err)
			}
			require.NoError(t, testkit.Err(rl.Once(ctx)))
			fresh := q.take()
			queue = append(again, fresh...)
			if len(queue) == 0 && drained(t, e, sku) {
				t.Logf("drained with consumers after %d rounds", round+1)
				break
			}
		}
		l := levels(t, e.r, sku)
		assert.Equal(t, l.Available+l.Held, must(store.Remaining(ctx, sku))(t), "store vs Redis (%+v)", l)
	})
}

// splitEach is each with the real servers only when STOCK_TEST_LONG is set: these tests
// wait on real time there (sweeps after the transfer grace, relay backoffs), minutes each, too
// long for every CI run; on miniredis they run always, with its clock moved on instead.
func splitEach(t *testing.T, opts []stock.Option, f func(t *testing.T, e *requestEnv)) {
	t.Helper()
	if os.Getenv("STOCK_TEST_LONG") == "" {
		mini(t, opts, f)
		if redistest.ServerBinary(t) != "" {
			t.Log("real servers: set STOCK_TEST_LONG=1 to run this test on them too (minutes)")
		}
		return
	}
	each(t, opts, f)
}

// A restock of a split item past MaxQty is ErrInvalid and writes nothing (but the id's claim).
func TestBucketsRestockPastMaxQtyRefusedNothingWritten(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", stock.MaxQty-5)
		require.Equal(t, int64(stock.MaxQty-5), e.levels("a").Loaded)
		before := e.snapshot("stock:{a|*")
		require.ErrorIs(t, testkit.Err(e.r.Restock(e.ctx, "a", "r1", 6)), stock.ErrInvalid, "restock past MaxQty")
		after := e.snapshot("stock:{a|*")
		for k, v := range after {
			if strings.HasSuffix(k, ":i") { // the id's claim is documented to stay
				continue
			}
			assert.Equal(t, fmt.Sprint(before[k]), fmt.Sprint(v), "key %s changed by a refused restock", k)
		}
		assert.Zero(t, e.relay().Claimed, "a refused restock queued events")
		require.NoError(t, testkit.Err(e.r.Restock(e.ctx, "a", "r2", 5)), "restock up to MaxQty")
		e.relay()
		e.want("a", stock.MaxQty, 0, 0)
		assert.ErrorIs(t, testkit.Err(e.r.Restock(e.ctx, "a", "r3", 1)), stock.ErrInvalid, "restock of a full item")
		rc := must(e.r.Restock(e.ctx, "a", "r2", 5))(t, "repeat of a made restock once full")
		assert.True(t, rc.Replayed, "repeat of a made restock once full is a replay")
		e.deduct("a", "d1", 3)
		e.mustRestore("a", "d1")
		e.relay()
		e.want("a", stock.MaxQty, 0, 0)
	}, stock.WithBuckets(func(string) int { return 4 }))
}

// A restock of a split item one of whose bucket hashes is gone is ErrNotLoaded.
func TestBucketsRestockWithBucketMissingIsNotLoaded(t *testing.T) {
	e := outsideMini(t, stock.WithBuckets(outsideTwoBuckets))
	e.load("a", 10)
	snap := e.snapshot("stock:{a|1|*")
	var hash string
	for k, v := range snap {
		if v.typ == "hash" && strings.Count(k, ":") == 1 {
			hash = k
		}
	}
	require.NotEmpty(t, hash, "no bucket hash among %v", snap)
	require.NoError(t, e.c.Do(e.ctx, e.c.B().Del().Key(hash).Build()).Error())
	for i := 0; i < 4; i++ {
		assert.ErrorIs(t, testkit.Err(e.r.Restock(e.ctx, "a", fmt.Sprintf("r%d", i), 1)), stock.ErrNotLoaded, "restock r%d with bucket 1 missing", i)
	}
}

// A split item loads MaxQty units (not one more) and sells MaxQty-1 of them in one deduct.
func TestBucketsLoadMaxQtyAndPastIt(t *testing.T) {
	e := outsideMini(t, stock.WithBuckets(func(string) int { return 64 }))
	require.NoError(t, e.r.Load(e.ctx, "a", stock.MaxQty))
	assert.Equal(t, stock.Levels{Available: stock.MaxQty, Loaded: stock.MaxQty}, e.levels("a"), "an item loaded with MaxQty")
	assert.ErrorIs(t, e.r.Load(e.ctx, "b", stock.MaxQty+1), stock.ErrInvalid, "Load past MaxQty")
	// Take nearly all of it from one bucket's buyer: transfers must keep the sum exact.
	require.NoError(t, testkit.Err(e.r.Deduct(e.ctx, req("a", "big", "u", stock.MaxQty-1))), "deduct of MaxQty-1 over 64 buckets")
	assert.Equal(t, stock.Levels{Available: 1, Sold: stock.MaxQty - 1, Loaded: stock.MaxQty}, e.levels("a"))
}
