package contract_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
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
	"github.com/stockres/stock/stocktest"
)

// Promise (package doc, Guarantees; Hold, Confirm, Cancel, Restore, Extend docs): ≥ 200
// goroutines on two Reservers (own clients, fast path on) run random operations over shared ids
// on three items; afterwards every acknowledged answer agrees with the ledger, and the ledger
// with the levels.
func TestRandomOpsConcurrent(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		c1, c2 := b.Pair(t)
		// The subject is the count of acknowledged answers, not latency: under -race on a
		// loaded 2-core machine, 200 goroutines queued on one in-process miniredis can wait
		// past the 10 s default, so each call gets a minute (an unknown outcome still fails).
		opts := []stock.Option{stock.WithUserLimit(3), stock.WithTimeout(time.Minute)}
		rs := []*stock.Reserver{testkit.NewReserver(t, c1, opts...), testkit.NewReserver(t, c2, opts...)}
		skus := []string{"p", "q", "r"}
		for _, s := range skus {
			require.NoError(t, rs[0].Load(ctx, s, 150))
		}
		type ack struct{ deduct, hold, confirm, cancel, restore, extend int }
		var mu sync.Mutex
		acks := map[string]*ack{} // sku/id -> acknowledged first-time answers
		get := func(k string) *ack {
			if acks[k] == nil {
				acks[k] = &ack{}
			}
			return acks[k]
		}
		restocked := map[string]int64{}
		goroutines, ops := 240, 30
		if !b.Real() {
			goroutines, ops = 200, 8
		}
		parallel(goroutines, func(g int) {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for range ops {
				r := rs[rng.IntN(2)]
				sku := skus[rng.IntN(len(skus))]
				id := fmt.Sprint("i", rng.IntN(120))
				user := fmt.Sprint("u", rng.IntN(40))
				k := sku + "/" + id
				var rc stock.Receipt
				var err error
				op := rng.IntN(8)
				switch op {
				case 0:
					rc, err = r.Deduct(ctx, req(sku, id, user, 1))
				case 1:
					rc, err = r.Hold(ctx, req(sku, id, user, 1), time.Duration(5+rng.IntN(100))*time.Millisecond)
				case 2:
					rc, err = r.Confirm(ctx, sku, id)
				case 3:
					rc, err = r.Cancel(ctx, sku, id)
				case 4:
					rc, err = r.Restore(ctx, sku, id)
				case 5:
					rc, err = r.Extend(ctx, sku, id, time.Duration(5+rng.IntN(100))*time.Millisecond)
				case 6:
					rid := fmt.Sprint("rs", g, "-", rng.IntN(1000000))
					rc, err = r.Restock(ctx, sku, rid, 1)
					if err == nil {
						mu.Lock()
						restocked[sku]++
						mu.Unlock()
					}
					continue
				case 7:
					if _, err := stockops.Sweep(ctx, r, sku); err != nil && errors.Is(err, stock.ErrInvalid) {
						t.Errorf("%s sweep: %v", k, err)
					}
					continue
				}
				if err != nil && (errors.Is(err, stock.ErrUnknownOutcome) || errors.Is(err, stock.ErrInvalid)) {
					t.Errorf("%s op %d: %v", k, op, err)
				}
				if err != nil || rc.Replayed {
					continue
				}
				mu.Lock()
				a := get(k)
				switch op {
				case 0:
					a.deduct++
				case 1:
					a.hold++
				case 2:
					a.confirm++
				case 3:
					a.cancel++
				case 4:
					a.restore++
				case 5:
					a.extend++
				}
				mu.Unlock()
			}
		})
		for _, s := range skus {
			check(t, rs[0], s, 150)
			entries := testkit.Ledger(t, rs[0], s)
			for _, e := range entries {
				if e.Kind == stock.KindRestock {
					continue
				}
				a := acks[s+"/"+e.ID]
				if a == nil {
					a = &ack{}
				}
				assert.LessOrEqual(t, a.deduct+a.hold, 1, "%s/%s taken twice: %+v %+v", s, e.ID, a, e)
				assert.LessOrEqual(t, a.confirm, 1, "%s/%s confirmed twice", s, e.ID)
				assert.False(t, a.confirm > 0 && a.cancel > 0, "%s/%s confirmed and cancelled: %+v %+v", s, e.ID, a, e)
				if a.confirm > 0 && a.restore == 0 {
					assert.True(t, e.Taken() && e.State != stock.StateHeld, "%s/%s confirm acknowledged: %+v", s, e.ID, e)
				}
				if a.deduct > 0 && a.restore == 0 {
					assert.True(t, e.Taken(), "%s/%s deduct acknowledged, never restored: %+v", s, e.ID, e)
				}
				if (a.deduct+a.hold) > 0 && e.Kind == stock.KindTombstone {
					t.Errorf("%s/%s acknowledged take but entry is a tombstone: %+v", s, e.ID, e)
				}
			}
			for k, a := range acks {
				if len(k) > len(s) && k[:len(s)+1] == s+"/" {
					if _, ok := entries[k[len(s)+1:]]; !ok && (a.deduct+a.hold+a.confirm) > 0 {
						t.Errorf("%s: acknowledged %+v but no ledger entry", k, a)
					}
				}
			}
		}
	})
}

// Promise (Deduct: exactly once per id; "a repeat with a different item quantity or user is
// ErrConflict"; WithCoalescing "never changes an outcome"): 200 goroutines send one id at once
// with two users and two quantities, coalesced into batches: exactly one first answer, every
// other copy a replay of it or ErrConflict, and the stock moved once.
func TestSameIDCoalesced(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		r := testkit.NewReserver(t, b.Client(t), stock.WithCoalescing(2))
		require.NoError(t, r.Load(ctx, "co", 1000))
		for round := range 10 {
			id := fmt.Sprint("same", round)
			var mu sync.Mutex
			first := map[string]int{}
			replays := map[string]int{}
			conflicts := 0
			parallel(200, func(i int) {
				user := []string{"ann", "bob"}[i%2]
				qty := int64(1 + i%3/2)
				rc, err := r.Deduct(ctx, req("co", id, user, qty))
				mu.Lock()
				defer mu.Unlock()
				key := fmt.Sprint(user, "/", qty)
				switch {
				case err == nil && !rc.Replayed:
					first[key]++
				case err == nil:
					replays[key]++
				case errors.Is(err, stock.ErrConflict):
					conflicts++
				default:
					t.Errorf("%s: %v", id, err)
				}
			})
			require.Len(t, first, 1, "round %d: first answers %v", round, first)
			for k, n := range first {
				assert.Equal(t, 1, n, "round %d", round)
				for rk := range replays {
					assert.Equal(t, k, rk, "round %d: a replay with other parameters", round)
				}
			}
			assert.Equal(t, 200, 1+conflicts+func() int {
				n := 0
				for _, v := range replays {
					n += v
				}
				return n
			}())
		}
		t.Logf("%+v", check(t, r, "co", 1000))
	})
}

// Promise (Extend, Confirm, Cancel, Restore docs): the documented answer of each operation on
// each kind of id, and nothing changes on a refusal.
func TestAnswerTable(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		r := testkit.NewReserver(t, b.Client(t))
		require.NoError(t, r.Load(ctx, "t", 10))
		require.NoError(t, testkit.Err(r.Deduct(ctx, req("t", "d", "", 1))))
		require.NoError(t, testkit.Err(r.Restock(ctx, "t", "rs", 1)))
		for _, id := range []string{"hc", "hx", "hl"} {
			require.NoError(t, testkit.Err(r.Hold(ctx, req("t", id, "", 1), time.Hour)))
		}
		require.NoError(t, testkit.Err(r.Confirm(ctx, "t", "hc")))
		require.NoError(t, testkit.Err(r.Cancel(ctx, "t", "hx")))
		require.ErrorIs(t, testkit.Err(r.Restore(ctx, "t", "tomb")), stock.ErrUnknownID)
		before := check(t, r, "t", 10)

		assert.ErrorIs(t, testkit.Err(r.Extend(ctx, "t", "hc", time.Hour)), stock.ErrConfirmed, "extend after confirm")
		assert.ErrorIs(t, testkit.Err(r.Extend(ctx, "t", "hx", time.Hour)), stock.ErrRestored, "extend after cancel")
		assert.ErrorIs(t, testkit.Err(r.Extend(ctx, "t", "none", time.Hour)), stock.ErrUnknownID, "extend of no hold")
		assert.ErrorIs(t, testkit.Err(r.Confirm(ctx, "t", "d")), stock.ErrConflict, "confirm of a deduct")
		assert.ErrorIs(t, testkit.Err(r.Confirm(ctx, "t", "hx")), stock.ErrRestored, "confirm after cancel")
		assert.Error(t, testkit.Err(r.Confirm(ctx, "t", "tomb")), "confirm of a tombstone")
		assert.ErrorIs(t, testkit.Err(r.Cancel(ctx, "t", "hc")), stock.ErrConfirmed, "cancel after confirm")
		assert.True(t, must(r.Cancel(ctx, "t", "hx"))(t).Replayed, "second cancel")
		assert.True(t, must(r.Confirm(ctx, "t", "hc"))(t).Replayed, "second confirm")
		assert.ErrorIs(t, testkit.Err(r.Restore(ctx, "t", "rs")), stock.ErrConflict, "restore of a restock")
		assert.ErrorIs(t, testkit.Err(r.Hold(ctx, req("t", "d", "", 1), time.Hour)), stock.ErrConflict, "hold with a deduct's id")
		assert.ErrorIs(t, testkit.Err(r.Deduct(ctx, req("t", "hl", "", 1))), stock.ErrConflict, "deduct with a hold's id")
		assert.ErrorIs(t, testkit.Err(r.Deduct(ctx, req("t", "rs", "", 1))), stock.ErrConflict, "deduct with a restock's id")
		assert.ErrorIs(t, testkit.Err(r.Restock(ctx, "t", "d", 1)), stock.ErrConflict, "restock with a deduct's id")
		assert.ErrorIs(t, testkit.Err(r.Hold(ctx, req("t", "tomb", "", 1), time.Hour)), stock.ErrRestored, "hold of a tombstoned id")
		assert.Equal(t, before, check(t, r, "t", 10), "refusals change nothing")
		// Restore of a confirmed hold gives the sale back; of a live hold cancels it.
		require.NoError(t, testkit.Err(r.Restore(ctx, "t", "hc")))
		require.NoError(t, testkit.Err(r.Restore(ctx, "t", "hl")))
		assert.False(t, must(r.Ledger(ctx, "t", "hl"))(t).Taken())
		assert.Equal(t, stock.Levels{Available: 10, Held: 0, Sold: 1, Loaded: 11}, check(t, r, "t", 10))
	})
}

// Broken promise under test: N goroutines over S stock give exactly S
// acknowledged successes, and ledger, Levels and the store agree after the
// relay drains, on the direct path and on the queue path with concurrent,
// out-of-order, duplicating consumers (and relays running concurrently).
func TestCountingBothPaths(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		for _, queue := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/queue=%v", b.Name, queue), func(t *testing.T) {
				r := testkit.NewReserver(t, b.Client(t))
				st := memstore.New()
				const sku, S, N = "cnt", 50, 200
				loadRedisAndStore(t, r, st, S, sku)
				q := &repairQueue{}
				var rl *stockops.Relay
				var err error
				if queue {
					rl, err = stockops.NewRelay(r, nil, q, nil)
				} else {
					rl, err = stockops.NewRelay(r, st, nil, nil)
				}
				require.NoError(t, err)
				stop := make(chan struct{})
				var bg sync.WaitGroup
				var consumeErr atomic.Value
				// two relays and two consumers running during the sale
				for range 2 {
					untilStopped(&bg, stop, func(int) {
						if _, err := rl.Once(ctx); err != nil {
							consumeErr.Store(err)
						}
						time.Sleep(time.Millisecond)
					})
				}
				// What each consumer still holds when the sale ends (held back, failed, or a
				// duplicate to redeliver) is redelivered by the drain, as a broker redelivers
				// what a stopped consumer did not acknowledge.
				kept := make([][]stock.Event, 2)
				if queue {
					for k := range kept {
						rng := rand.New(rand.NewPCG(uint64(k+1), 0))
						untilStopped(&bg, stop, func(int) {
							mine := append(kept[k], q.take()...)
							rng.Shuffle(len(mine), func(i, j int) { mine[i], mine[j] = mine[j], mine[i] })
							var keep []stock.Event
							for _, ev := range mine {
								err := stock.Consume(ctx, r, st, ev)
								if errors.Is(err, stock.ErrHeldBack) {
									keep = append(keep, ev)
								} else if err != nil {
									consumeErr.Store(err)
									keep = append(keep, ev)
								} else if rng.IntN(5) == 0 {
									keep = append(keep, ev) // redelivered duplicate
								}
							}
							kept[k] = keep
							time.Sleep(time.Millisecond)
						})
					}
				}
				// a reconciler running all through the sale: it must never repair anything
				var repaired atomic.Value
				rcBG, _ := stockops.NewReconciler(r, st, nil)
				untilStopped(&bg, stop, func(int) {
					res, _ := rcBG.Pass(ctx)
					for _, rp := range res.Reports {
						if rp.Adjusted != 0 || rp.Resynced != 0 || rp.Requeued != 0 || rp.Rerecorded != 0 || rp.Rebuilt {
							repaired.Store(rp.String())
						}
					}
					time.Sleep(2 * time.Millisecond)
				})
				var ok atomic.Int64
				var wg sync.WaitGroup
				for i := 0; i < N; i++ {
					wg.Add(1)
					go func(i int) {
						defer wg.Done()
						_, err := r.Deduct(ctx, req(sku, fmt.Sprint("u", i), "", 1))
						switch {
						case err == nil:
							ok.Add(1)
						case errors.Is(err, stock.ErrSoldOut), errors.Is(err, stock.ErrInsufficient):
						default:
							t.Errorf("deduct %d: %v", i, err)
						}
					}(i)
				}
				wg.Wait()
				close(stop)
				bg.Wait()
				if v := consumeErr.Load(); v != nil {
					t.Logf("an error during the run: %v", v)
				}
				assert.Nil(t, repaired.Load(), "a pass during the sale repaired something")
				assert.Equal(t, int64(S), ok.Load(), "successes")
				// drain
				left := slices.Concat(kept...)
				for i := 0; i < 20; i++ {
					require.NoError(t, testkit.Err(rl.Once(ctx)))
					if queue {
						repairConsumeAll(t, ctx, r, st, append(left, q.take()...), rand.New(rand.NewPCG(uint64(i), 0)))
						left = nil
					}
				}
				pending, dead, err := stockops.Pending(ctx, r, sku)
				require.NoError(t, err)
				assert.Equal(t, [2]int64{0, 0}, [2]int64{pending, dead}, "pending, dead letters")
				lv, err := r.Levels(ctx, sku)
				require.NoError(t, err)
				rem, _ := st.Remaining(ctx, sku)
				assert.Zero(t, rem, "store remaining")
				assert.Equal(t, stock.Levels{Sold: S, Loaded: S}, lv)
				applied, taken := 0, 0
				for e, err := range stockops.Entries(ctx, r, sku) {
					require.NoError(t, err)
					if e.Taken() {
						taken++
					}
					if e.State == stock.StateApplied {
						applied++
					}
				}
				assert.Equal(t, [2]int{S, S}, [2]int{taken, applied}, "ledger: taken, applied")
				assert.LessOrEqual(t, st.MaxApplications(), 1, "double application")
				rc, _ := stockops.NewReconciler(r, st, nil)
				res, err := rc.Pass(ctx)
				for _, rp := range res.Reports {
					if rp.Drift != 0 || rp.Adjusted != 0 || rp.Published != 0 {
						t.Errorf("after drain: %s (%v)", rp, err)
					}
				}
			})
		}
	}
}

// Levels is "read atomically": Loaded = Available + Held + Sold in every read under concurrent
// deducts, holds, restores and sweeps.
func TestLevelsAtomicUnderLoad(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		r := testkit.NewReserver(t, c)
		require.NoError(t, r.Load(ctx, "lv", 200))
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range 3 {
			untilStopped(&wg, stop, func(i int) {
				id := fmt.Sprintf("w%d-%d", w, i)
				switch i % 3 {
				case 0:
					_, _ = r.Deduct(ctx, req("lv", id, "", 2))
					_, _ = r.Restore(ctx, "lv", id)
				case 1:
					_, _ = r.Hold(ctx, req("lv", id, "", 1), time.Millisecond)
				case 2:
					_, _ = stockops.Sweep(ctx, r, "lv")
				}
			})
		}
		for range 300 {
			l := must(r.Levels(ctx, "lv"))(t)
			require.Equal(t, l.Loaded, l.Available+l.Held+l.Sold, "%+v", l)
			require.Equal(t, int64(200), l.Loaded)
			require.GreaterOrEqual(t, l.Available, int64(0))
		}
		close(stop)
		wg.Wait()
	})
}

// Record.Status is a State: StateApplied, StateRestored (given back, or a tombstone) or
// StateRefused, as recorded by memstore through the relay.
func TestRecordStatusStates(t *testing.T) {
	e := stocktest.New(t)
	r := e.Reserver
	st := memstore.New()
	require.NoError(t, r.Load(ctx, "rs", 10))
	require.NoError(t, st.Load(ctx, "rs", 2))
	require.NoError(t, testkit.Err(r.Deduct(ctx, req("rs", "ok", "", 1))))
	require.NoError(t, testkit.Err(r.Deduct(ctx, req("rs", "back", "", 1))))
	require.NoError(t, testkit.Err(r.Restore(ctx, "rs", "back")))
	_, err := r.Deduct(ctx, req("rs", "refused", "", 2)) // the Store has 1 left
	require.NoError(t, err)
	rl := must(stockops.NewRelay(r, st, nil, nil))(t)
	testkit.Drain(t, rl)
	testkit.Drain(t, rl)
	recs := must(st.Records(ctx, "rs", []string{"ok", "refused", "back", "never"}))(t)
	assert.Equal(t, stock.StateApplied, recs["ok"].Status)
	assert.Equal(t, stock.StateRefused, recs["refused"].Status)
	assert.Equal(t, stock.StateRestored, recs["back"].Status)
	_, has := recs["never"]
	assert.False(t, has)
	assert.Equal(t, stock.StateRefused, must(r.Ledger(ctx, "rs", "refused"))(t).State)
	assert.Equal(t, int64(9), testkit.Levels(t, r, "rs").Available, "only the applied sale stays sold")
	assert.Equal(t, int64(1), must(st.Remaining(ctx, "rs"))(t))
}

// N goroutines, S stock: exactly S successes; the per-user limit holds; concurrent copies of one
// request take once; the same id across users on one item: one wins, the others ErrConflict;
// the same id on two items names two requests. The ledger, Levels and the Store agree.
func TestUserLimitConcurrentCopies(t *testing.T) {
	soldOutBackends(t, func(t *testing.T, real bool, c1, c2 rueidis.Client) {
		const limit = 2
		r1 := testkit.NewReserver(t, c1, stock.WithUserLimit(limit))
		r2 := testkit.NewReserver(t, c2, stock.WithUserLimit(limit))
		rs := []*stock.Reserver{r1, r2}
		const S = 37
		skus := []string{"lim:a", "lim:b~ü"}
		store := memstore.New()
		loadRedisAndStore(t, r1, store, S, skus...)
		// A complete pass records the primaries as reconciled before Run starts, so that Run's
		// guard does not fence r1 as a guard added to a live deployment (documented) while the
		// requests run.
		rec := must(stockops.NewReconciler(r1, store, nil))(t)
		pr, err := rec.Pass(ctx)
		require.NoError(t, err)
		require.True(t, pr.Complete)
		stop := requestRun(t, r1, stock.RunOptions{Store: store, Relay: &stock.RelayOptions{Poll: 10 * time.Millisecond},
			Reconcile: &stock.ReconcileOptions{Interval: time.Hour}}, 30*time.Second)

		type res struct {
			sku, id, user string
			err           error
			rc            stock.Receipt
		}
		var mu sync.Mutex
		var out []res
		var wg sync.WaitGroup
		send := func(r *stock.Reserver, req stock.Request) {
			wg.Go(func() {
				rc, err := r.Deduct(ctx, req)
				mu.Lock()
				out = append(out, res{req.SKU, req.ID, req.User, err, rc})
				mu.Unlock()
			})
		}
		// 60 users x 3 distinct ids each x 2 copies of each request, on both items, with the
		// same ids on both items; plus 10 users who race for the same ids ("shared-k").
		for u := range 60 {
			for k := range 3 {
				for cp := range 2 {
					for _, sku := range skus {
						send(rs[(u+cp)%2], req(sku, fmt.Sprintf("o-%d-%d", u, k), fmt.Sprintf("user%d", u), 1))
					}
				}
			}
		}
		for u := range 10 {
			for k := range 3 {
				send(rs[u%2], req(skus[0], fmt.Sprintf("shared-%d", k), fmt.Sprintf("racer%d", u), 1))
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
			l := testkit.Levels(t, r1, sku)
			assert.Equal(t, int64(S), l.Sold)
			assert.Equal(t, int64(0), l.Available)
			entries := testkit.Ledger(t, r1, sku)
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
		eventuallyRemaining(t, store, 20*time.Second, 0, skus...)
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

// The limit is per user and per item, over restores and holds: a user at the limit who gets a
// unit back (restore, cancel, an expired hold) may take one more, once, even under concurrent
// copies of the next request with distinct ids.
func TestUserLimitGiveBackRace(t *testing.T) {
	soldOutBackends(t, func(t *testing.T, real bool, c1, c2 rueidis.Client) {
		r1 := testkit.NewReserver(t, c1, stock.WithUserLimit(2))
		r2 := testkit.NewReserver(t, c2, stock.WithUserLimit(2))
		sku := "lim:give"
		require.NoError(t, r1.Load(ctx, sku, 100))
		require.NoError(t, testkit.Err(r1.Deduct(ctx, req(sku, "a", "bob", 1))))
		require.NoError(t, testkit.Err(r1.Hold(ctx, req(sku, "b", "bob", 1), 400*time.Millisecond)))
		_, err := r1.Deduct(ctx, req(sku, "c", "bob", 1))
		require.ErrorIs(t, err, stock.ErrUserLimit)
		for round, give := range []func() error{
			func() error { redistest.Sleep(c1, time.Second); return nil }, // the hold expires
			func() error { _, err := r2.Restore(ctx, sku, "a"); return err },
		} {
			require.NoError(t, give())
			var ok atomic.Int32
			parallel(24, func(g int) {
				_, err := []*stock.Reserver{r1, r2}[g%2].Deduct(ctx, req(sku, fmt.Sprintf("x%d-%d", round, g), "bob", 1))
				if err == nil {
					ok.Add(1)
				} else if !errors.Is(err, stock.ErrUserLimit) {
					t.Errorf("unexpected %v", err)
				}
			})
			assert.Equal(t, int32(1), ok.Load(), "round %d: one unit given back, one more taken", round)
		}
		l := testkit.Levels(t, r1, sku)
		assert.Equal(t, int64(2), l.Sold)
		assert.Equal(t, int64(0), l.Held)
	})
}

// requestStore wraps a memstore: its Apply blocks, ignoring its context, while stuck says so for
// the call's context; once released the blocked call applies the event (a slow database).
// It is not a BatchStore unless wrapped in batchStore.
type requestStore struct {
	base  // the memstore, without its ApplyBatch: a plain Store unless wrapped
	stuck func(ctx context.Context, ev stock.Event) bool
	gate  *gate
	delay func() time.Duration
}

// base is what requestStore passes through to its memstore.
type base interface {
	stock.Store
	stock.RecordLister
	stock.ItemLister
}

func (s *requestStore) Apply(ctx context.Context, ev stock.Event) error {
	if s.stuck != nil && s.stuck(ctx, ev) {
		s.gate.wait()
	}
	if s.delay != nil {
		time.Sleep(s.delay())
	}
	return s.base.Apply(ctx, ev)
}

type batchStore struct{ *requestStore }

func (s batchStore) ApplyBatch(ctx context.Context, evs []stock.Event) []error {
	if s.stuck != nil && len(evs) > 0 && s.stuck(ctx, evs[0]) {
		s.gate.wait()
	}
	if s.delay != nil {
		time.Sleep(s.delay())
	}
	return s.base.(*memstore.Store).ApplyBatch(ctx, evs)
}

// TestStoreApplyBlocksForever: the store blocks in Apply (and ApplyBatch) from the first
// call, in the main loop, ignoring its context. Run must still return within Drain after ctx
// ended; the blocked call applies its event late, after a second Run with a working store has
// run: nothing is lost or doubled.
func TestStoreApplyBlocksForever(t *testing.T) {
	testkit.ParallelOnMiniredis(t)
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			relayEach(t, nil, func(t *testing.T, e *relayEnv) {
				loaded := map[string]int64{"blk:1": 30, "blk:2": 30, "blk~3": 30}
				mem := memstore.New()
				load(t, e.r, mem, loaded)
				gate := newGate()
				defer gate.release()
				st := &requestStore{base: mem, stuck: func(context.Context, stock.Event) bool { return true }, gate: gate}
				var store stock.Store = st
				if batch {
					store = batchStore{st}
				}
				sale := newSale()
				runCtx, cancel := context.WithCancel(ctx)
				drain := 700 * time.Millisecond
				ch := run(runCtx, e.r, stock.RunOptions{Store: store, Drain: drain, Relay: relay(), Reconcile: &stock.ReconcileOptions{Interval: -1}})
				for i := range 20 {
					for sku := range loaded {
						sale.deduct(t, ctx, e.r, sku, fmt.Sprintf("o%d", i), 1)
					}
				}
				select {
				case <-gate.entered:
				case <-time.After(20 * time.Second):
					for sku := range loaded {
						p, d, err := stockops.Pending(ctx, e.r, sku)
						lease, lerr := e.c.Do(ctx, e.c.B().Pttl().Key("stock:{"+sku+"}:rl").Build()).AsInt64()
						holder, _ := e.c.Do(ctx, e.c.B().Get().Key("stock:{"+sku+"}:rl").Build()).ToString()
						t.Logf("%s: pending %d dead %d err %v lease pttl %d %v holder %q", sku, p, d, err, lease, lerr, holder)
					}
					t.Fatal("the relay never called the store")
				}
				cancel()
				ended := time.Now()
				res := wait(t, ch, ended, drain+3*time.Second)
				require.Error(t, res.err)
				assert.NotEqual(t, context.Canceled.Error(), res.err.Error(), "the error must say a call is still running")

				e.settle()
				st2 := &requestStore{base: mem}
				var store2 stock.Store = st2
				if batch {
					store2 = batchStore{st2}
				}
				finish(t, e, e.r, stock.RunOptions{Store: store2, Drain: time.Second, Relay: relay(), Reconcile: &stock.ReconcileOptions{Interval: -1}}, keys(loaded))
				gate.release() // the stuck calls apply their events now: repeats
				time.Sleep(300 * time.Millisecond)
				sale.checkStore(t, e.r, mem, loaded)
			})
		})
	}
}

// TestOneShotBuyersGetEveryUnit: S units, S+extra buyers who each try once, concurrently.
// Demand exceeds stock, no unit is given back, so exactly S must succeed: fewer is a phantom
// sold-out (a refusal while the item had stock), more an oversell. Buyers are spread, or all
// skewed into one bucket (one buyer name for all, no user limit).
func TestOneShotBuyersGetEveryUnit(t *testing.T) {
	testkit.ParallelOnMiniredis(t)
	for _, n := range []int{2, 3, 64, 100} {
		t.Run(fmt.Sprintf("buckets=%d", n), func(t *testing.T) {
			each(t, []stock.Option{split(n)}, func(t *testing.T, e *requestEnv) {
				for _, skew := range []bool{false, true} {
					for round := range 3 {
						sku := fmt.Sprintf("oneshot-%v-%d", skew, round)
						const S, extra = 40, 8
						require.NoError(t, e.r.Load(ctx, sku, S))
						stop := make(chan struct{})
						wait := watch(e.r, sku, S, stop)
						var ok, refused, other atomic.Int64
						parallel(S+extra, func(i int) {
							user := fmt.Sprintf("u%d", i)
							if skew {
								user = "whale"
							}
							rc, err := e.r.Deduct(ctx, req(sku, fmt.Sprintf("o%d", i), user, 1))
							switch {
							case err == nil:
								ok.Add(1)
								assert.False(t, rc.Replayed)
								assert.Equal(t, int64(1), rc.Qty)
							case errors.Is(err, stock.ErrSoldOut), errors.Is(err, stock.ErrInsufficient):
								refused.Add(1)
							default:
								other.Add(1)
								t.Errorf("deduct: %v", err)
							}
						})
						close(stop)
						reads, bad := wait()
						assert.Empty(t, bad, "levels readings that break the invariant (of %d)", reads)
						l := levels(t, e.r, sku)
						assert.Equal(t, int64(S), ok.Load(), "successes (skew=%v): a refusal while units were left is a phantom sold-out; levels %+v", skew, l)
						assert.Equal(t, int64(extra), refused.Load(), "refusals")
						assert.Equal(t, int64(0), l.Available, "units left unsold: %+v", l)
						assert.Equal(t, int64(S), l.Sold)
						if t.Failed() {
							return // one failing round says it: the others would repeat it
						}
					}
				}
			})
		})
	}
}

// TestConcurrentMultiUnitNoPhantom: buyers of 1 to 3 units, each trying once, against
// a small stock: the units sold never exceed the stock, and once any buyer was refused (nothing
// was given back, so stock only falls) fewer units than that buyer asked for are left.
func TestConcurrentMultiUnitNoPhantom(t *testing.T) {
	each(t, []stock.Option{split(8)}, func(t *testing.T, e *requestEnv) {
		for round := range 4 {
			sku := fmt.Sprintf("multi%d", round)
			const S = 30
			require.NoError(t, e.r.Load(ctx, sku, S))
			var sold atomic.Int64
			var mu sync.Mutex
			minRefused := int64(1 << 40)
			parallel(30, func(i int) {
				q := int64(1 + i%3)
				user := fmt.Sprintf("u%d", i%5)
				rc, err := e.r.Deduct(ctx, req(sku, fmt.Sprintf("m%d", i), user, q))
				switch {
				case err == nil:
					assert.Equal(t, q, rc.Qty)
					sold.Add(q)
				case errors.Is(err, stock.ErrSoldOut), errors.Is(err, stock.ErrInsufficient):
					mu.Lock()
					minRefused = min(minRefused, q)
					mu.Unlock()
				default:
					t.Errorf("deduct: %v", err)
				}
			})
			l := levels(t, e.r, sku)
			assert.Equal(t, sold.Load(), l.Sold, "sold per the receipts")
			assert.LessOrEqual(t, l.Sold, int64(S))
			if minRefused < 1<<40 {
				assert.Less(t, l.Available, minRefused, "a buyer of %d units was refused, yet %d units are left", minRefused, l.Available)
			}
		}
	})
}

// TestUserLimitExact: WithUserLimit(2); every user fires many concurrent deducts and
// holds of one unit, with the stock spread over the buckets so that transfers run: each user
// gets exactly 2 units while stock lasts, and the rest of the users' requests are ErrUserLimit.
func TestUserLimitExact(t *testing.T) {
	each(t, []stock.Option{split(4), stock.WithUserLimit(2)}, func(t *testing.T, e *requestEnv) {
		const users, per = 12, 8
		require.NoError(t, e.r.Load(ctx, "lim", 100))
		got := make([]atomic.Int64, users)
		var limited atomic.Int64
		var firstDeduct sync.Map // user index -> an id of a deduct that took
		var wg sync.WaitGroup
		for u := range users {
			for k := range per {
				wg.Go(func() {
					req := req("lim", fmt.Sprintf("u%d-%d", u, k), fmt.Sprintf("user%d", u), 1)
					var rc stock.Receipt
					var err error
					if k%2 == 0 {
						rc, err = e.r.Deduct(ctx, req)
					} else {
						rc, err = e.r.Hold(ctx, req, time.Hour)
					}
					switch {
					case err == nil:
						got[u].Add(rc.Qty)
						if k%2 == 0 {
							firstDeduct.LoadOrStore(u, req.ID)
						}
					case errors.Is(err, stock.ErrUserLimit):
						limited.Add(1)
						assert.LessOrEqual(t, rc.Qty, int64(2), "ErrUserLimit's Qty is the user's units")
					default:
						t.Errorf("take: %v", err)
					}
				})
			}
		}
		wg.Wait()
		for u := range users {
			assert.Equal(t, int64(2), got[u].Load(), "user%d", u)
		}
		assert.Equal(t, int64(users*(per-2)), limited.Load())
		l := levels(t, e.r, "lim")
		assert.Equal(t, int64(2*users), l.Held+l.Sold)
		// A restore gives one unit back to a user: exactly one more take passes.
		id, ok := firstDeduct.Load(0)
		if !ok {
			// user0 took with holds only: cancel one of them.
			for k := 1; k < per && !ok; k += 2 {
				if _, err := e.r.Cancel(ctx, "lim", fmt.Sprintf("u0-%d", k)); err == nil {
					id, ok = "cancelled", true
				}
			}
		} else {
			require.NoError(t, testkit.Err(e.r.Restore(ctx, "lim", id.(string))))
		}
		require.True(t, ok)
		var again atomic.Int64
		parallel(5, func(k int) {
			_, err := e.r.Deduct(ctx, req("lim", fmt.Sprintf("again%d", k), "user0", 1))
			if err == nil {
				again.Add(1)
			} else {
				assert.ErrorIs(t, err, stock.ErrUserLimit)
			}
		})
		assert.Equal(t, int64(1), again.Load())
	})
}

// TestConcurrentCopiesOfOneRequest: many copies of one request at once, on a stock that
// must move between buckets: one take, every other copy a replay of it.
func TestConcurrentCopiesOfOneRequest(t *testing.T) {
	each(t, []stock.Option{split(3)}, func(t *testing.T, e *requestEnv) {
		for round, user := range []string{"alice", "", "bob"} {
			sku := fmt.Sprintf("copies%d", round)
			require.NoError(t, e.r.Load(ctx, sku, 3)) // one unit per bucket: a take of 2 needs a transfer
			var fresh, replays atomic.Int64
			var mu sync.Mutex
			refusals := map[string]int{}
			var wg sync.WaitGroup
			for range 16 {
				wg.Go(func() {
					rc, err := e.r.Deduct(ctx, req(sku, "one", user, 2))
					if err != nil {
						mu.Lock()
						refusals[stock.Outcome(err)]++
						mu.Unlock()
						return
					}
					assert.Equal(t, int64(2), rc.Qty)
					if rc.Replayed {
						replays.Add(1)
					} else {
						fresh.Add(1)
					}
				})
			}
			wg.Wait()
			assert.Empty(t, refusals, "copies of a request that took were refused (user %q)", user)
			assert.Equal(t, int64(1), fresh.Load(), "exactly one copy takes")
			assert.Equal(t, int64(15), replays.Load())
			l := levels(t, e.r, sku)
			assert.Equal(t, int64(2), l.Sold)
			assert.Equal(t, int64(1), l.Available)
		}
	})
}

// TestIDReusedByAnotherBuyer: an id taken by one buyer, then sent by other buyers, by no
// buyer, with another quantity, or as a hold: ErrConflict, never a second take, concurrently
// too. Receipt.Qty of ErrConflict is "the quantity the id was first used with".
func TestIDReusedByAnotherBuyer(t *testing.T) {
	each(t, []stock.Option{split(4)}, func(t *testing.T, e *requestEnv) {
		require.NoError(t, e.r.Load(ctx, "reuse", 50))
		_, err := e.r.Deduct(ctx, req("reuse", "ord", "alice", 2))
		require.NoError(t, err)
		var conflicts atomic.Int64
		parallel(24, func(i int) {
			req := req("reuse", "ord", fmt.Sprintf("mallory%d", i), 2)
			switch i % 4 {
			case 1:
				req.User = ""
			case 2:
				req.User, req.Qty = "alice", 3
			}
			var err error
			if i%4 == 3 {
				_, err = e.r.Hold(ctx, req, time.Hour)
			} else {
				_, err = e.r.Deduct(ctx, req)
			}
			if assert.ErrorIs(t, err, stock.ErrConflict, "request %+v", req) {
				conflicts.Add(1)
			}
		})
		assert.Equal(t, int64(24), conflicts.Load())
		assert.Equal(t, int64(2), levels(t, e.r, "reuse").Sold, "no second take")
		ent := must(e.r.Ledger(ctx, "reuse", "ord"))(t)
		assert.Equal(t, "alice", ent.User)
		assert.Equal(t, int64(2), ent.Qty)
	})
}

// TestConflictReceiptQty: Receipt.Qty with ErrConflict is the quantity the id was first
// used with (the Receipt doc), as on a plain item, whichever buyer sends the reused id.
func TestConflictReceiptQty(t *testing.T) {
	each(t, []stock.Option{split(4)}, func(t *testing.T, e *requestEnv) {
		for _, sku := range []string{"plain-cq", "split-cq"} {
			require.NoError(t, e.r.Load(ctx, sku, 50))
			require.NoError(t, testkit.Err(e.r.Deduct(ctx, req(sku, "ord", "alice", 2))))
			for i := range 8 {
				req := req(sku, "ord", fmt.Sprintf("other%d", i), 2)
				if i == 7 {
					req.User = ""
				}
				rc, err := e.r.Deduct(ctx, req)
				require.ErrorIs(t, err, stock.ErrConflict)
				assert.Equal(t, int64(2), rc.Qty, "%s: ErrConflict's Receipt.Qty for %+v", sku, req)
			}
		}
	})
}

// TestRestoreOvertakesDeduct: a restore (or cancel) of an id that took nothing leaves a
// tombstone; the late deduct or hold of that id, by any buyer or none, is ErrRestored and takes
// nothing. Concurrent races of restore and deduct take at most once and give back exactly what
// was taken.
func TestRestoreOvertakesDeduct(t *testing.T) {
	each(t, []stock.Option{split(5)}, func(t *testing.T, e *requestEnv) {
		require.NoError(t, e.r.Load(ctx, "late", 100))
		for i := range 20 {
			id := fmt.Sprintf("late%d", i)
			var err error
			if i%2 == 0 {
				_, err = e.r.Restore(ctx, "late", id)
			} else {
				_, err = e.r.Cancel(ctx, "late", id)
			}
			require.ErrorIs(t, err, stock.ErrUnknownID)
			req := req("late", id, fmt.Sprintf("buyer%d", i), 1)
			if i%3 == 0 {
				req.User = ""
			}
			if i%4 == 1 {
				_, err = e.r.Hold(ctx, req, time.Hour)
			} else {
				_, err = e.r.Deduct(ctx, req)
			}
			require.ErrorIs(t, err, stock.ErrRestored, "late take of %s (user %q)", id, req.User)
			assert.Equal(t, stock.KindTombstone, must(e.r.Ledger(ctx, "late", id))(t).Kind)
		}
		assert.Equal(t, int64(100), levels(t, e.r, "late").Available)

		// Races: a restore and a deduct of one id at once. Whatever order they run in, the id
		// takes at most once, and the restore gives back what it took.
		for i := range 30 {
			id := fmt.Sprintf("race%d", i)
			var wg sync.WaitGroup
			var took atomic.Bool
			wg.Go(func() {
				_, err := e.r.Deduct(ctx, req("late", id, fmt.Sprintf("b%d", i), 1))
				if err == nil {
					took.Store(true)
				} else {
					assert.ErrorIs(t, err, stock.ErrRestored)
				}
			})
			wg.Go(func() {
				_, err := e.r.Restore(ctx, "late", id)
				if err != nil {
					assert.ErrorIs(t, err, stock.ErrUnknownID)
				}
			})
			wg.Wait()
			if took.Load() {
				// The deduct ran first and the restore gave it back, or the restore is still to
				// give it back: a second restore settles it.
				require.NoError(t, testkit.Err(e.r.Restore(ctx, "late", id)))
			}
		}
		l := levels(t, e.r, "late")
		assert.Equal(t, int64(100), l.Available, "every race ends with its unit back: %+v", l)
		assert.Equal(t, int64(0), l.Sold)
	})
}

// TestRetryRefusalIsFinal: a retry (Request.Retry) refused for stock is recorded, so the
// first attempt, arriving after stock came back, is refused too; without Retry a refusal records
// nothing and a later attempt may take. Compared with a plain item.
func TestRetryRefusalIsFinal(t *testing.T) {
	each(t, []stock.Option{split(3)}, func(t *testing.T, e *requestEnv) {
		for _, sku := range []string{"plain-retry", "split-retry"} {
			require.NoError(t, e.r.Load(ctx, sku, 3))
			testkit.Sell(t, e.r, sku, "fill", "f", 3)
			var outcomes []string
			for i, user := range []string{"r0", "r1", "r2", ""} {
				_, err := e.r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("retry%d", i), User: user, Qty: 1, Retry: true})
				require.ErrorIs(t, err, stock.ErrSoldOut)
				_, err = e.r.Deduct(ctx, req(sku, fmt.Sprintf("plainref%d", i), user, 1))
				require.ErrorIs(t, err, stock.ErrSoldOut)
			}
			// Stock comes back.
			require.NoError(t, testkit.Err(e.r.Restock(ctx, sku, "rs", 10)))
			for i, user := range []string{"r0", "r1", "r2", ""} {
				_, err := e.r.Deduct(ctx, req(sku, fmt.Sprintf("retry%d", i), user, 1))
				require.Error(t, err, "%s: the first attempt of a refused retry must stay refused", sku)
				outcomes = append(outcomes, stock.Outcome(err))
				_, err = e.r.Deduct(ctx, req(sku, fmt.Sprintf("plainref%d", i), user, 1))
				require.NoError(t, err, "%s: a refusal without Retry records nothing", sku)
			}
			assert.Equal(t, int64(7), levels(t, e.r, sku).Sold)
			t.Logf("%s: late first attempts answered %v", sku, outcomes)
		}
	})
}

// TestLevelsInvariantUnderTraffic: deducts, holds, confirms, cancels, restores and
// restocks at once on a small stock (so that stock moves between buckets all the time), while
// Levels is read in a loop: every reading keeps loaded = available + held + sold with no counter
// below zero, and at the end the counters match the acknowledged answers.
func TestLevelsInvariantUnderTraffic(t *testing.T) {
	for _, n := range []int{2, 64} {
		t.Run(fmt.Sprintf("buckets=%d", n), func(t *testing.T) {
			each(t, []stock.Option{split(n)}, func(t *testing.T, e *requestEnv) {
				const S = 20
				require.NoError(t, e.r.Load(ctx, "traffic", S))
				stop := make(chan struct{})
				wait := watch(e.r, "traffic", -1, stop)
				var restocked atomic.Int64
				type fate struct {
					qty  int64
					kind string // "sold", "held", "back"
				}
				var mu sync.Mutex
				fates := map[string]fate{}
				settle := func(id string, f fate) {
					mu.Lock()
					fates[id] = f
					mu.Unlock()
				}
				parallel(12, func(w int) {
					rng := rand.New(rand.NewPCG(uint64(w), 26))
					for k := range 25 {
						id := fmt.Sprintf("w%d-%d", w, k)
						q := int64(1 + rng.IntN(2))
						user := fmt.Sprintf("u%d", rng.IntN(6))
						req := req("traffic", id, user, q)
						if rng.IntN(2) == 0 {
							_, err := e.r.Deduct(ctx, req)
							if err != nil {
								assert.True(t, errors.Is(err, stock.ErrSoldOut) || errors.Is(err, stock.ErrInsufficient), "deduct: %v", err)
								continue
							}
							if rng.IntN(2) == 0 {
								require.NoError(t, testkit.Err(e.r.Restore(ctx, "traffic", id)))
								settle(id, fate{q, "back"})
							} else {
								settle(id, fate{q, "sold"})
							}
							continue
						}
						_, err := e.r.Hold(ctx, req, time.Hour)
						if err != nil {
							assert.True(t, errors.Is(err, stock.ErrSoldOut) || errors.Is(err, stock.ErrInsufficient), "hold: %v", err)
							continue
						}
						switch rng.IntN(3) {
						case 0:
							_, err = e.r.Confirm(ctx, "traffic", id)
							require.NoError(t, err)
							settle(id, fate{q, "sold"})
						case 1:
							_, err = e.r.Cancel(ctx, "traffic", id)
							require.NoError(t, err)
							settle(id, fate{q, "back"})
						default:
							settle(id, fate{q, "held"})
						}
					}
					if w%4 == 0 {
						require.NoError(t, testkit.Err(e.r.Restock(ctx, "traffic", fmt.Sprintf("restock%d", w), 3)))
						restocked.Add(3)
					}
				})
				close(stop)
				reads, bad := wait()
				assert.Empty(t, bad, "levels readings that break the invariant (of %d)", reads)
				var sold, held int64
				for _, f := range fates {
					switch f.kind {
					case "sold":
						sold += f.qty
					case "held":
						held += f.qty
					}
				}
				l := levels(t, e.r, "traffic")
				assert.Equal(t, S+restocked.Load(), l.Loaded)
				assert.Equal(t, sold, l.Sold, "sold per the acknowledged answers")
				assert.Equal(t, held, l.Held, "held per the acknowledged answers")
				testkit.CheckLedger(t, e.r, "traffic", S)
			})
		})
	}
}

// TestStoreRefuses: the store holds fewer units than Redis; the relay's refusals are
// given back in Redis exactly once (Redis ends equal to the store, the refused ids refused),
// and a reconcile pass finds no drift.
func TestStoreRefuses(t *testing.T) {
	each(t, []stock.Option{split(3)}, func(t *testing.T, e *requestEnv) {
		store := memstore.New()
		require.NoError(t, store.Load(ctx, "short", 7))
		require.NoError(t, e.r.Load(ctx, "short", 12))
		var wg sync.WaitGroup
		var took atomic.Int64
		parallel(12, func(i int) {
			_, err := e.r.Deduct(ctx, req("short", fmt.Sprintf("s%d", i), fmt.Sprintf("u%d", i%4), 1))
			if assert.NoError(t, err) {
				took.Add(1)
			}
		})
		require.Equal(t, int64(12), took.Load())
		// Several relays at once, each drained, then again.
		rls := make([]*stockops.Relay, 3)
		for i := range rls {
			rl := must(stockops.NewRelay(e.r, store, nil, nil))(t)
			rls[i] = rl
		}
		var refused atomic.Int64
		for _, rl := range rls {
			wg.Go(func() {
				for range 50 {
					st := must(rl.Once(ctx))(t)
					refused.Add(int64(st.Refused))
					if st.Claimed == 0 {
						return
					}
				}
			})
		}
		wg.Wait()
		testkit.Drain(t, rls[0])
		assert.Equal(t, int64(5), refused.Load(), "refusals counted by the relays")
		l := levels(t, e.r, "short")
		assert.Equal(t, stock.Levels{Available: 5, Sold: 7, Loaded: 12}, l, "the 5 refused units back in Redis, once")
		assert.Equal(t, int64(0), must(store.Remaining(ctx, "short"))(t))
		nref := 0
		for i := range 12 {
			ent := must(e.r.Ledger(ctx, "short", fmt.Sprintf("s%d", i)))(t)
			if ent.State == stock.StateRefused {
				nref++
			} else {
				assert.Equal(t, stock.StateApplied, ent.State)
			}
		}
		assert.Equal(t, 5, nref)
		assert.LessOrEqual(t, store.MaxApplications(), 1)
		// Refused ids stay refused; Redis's 5 units left are on sale.
		for i := range 12 {
			_, err := e.r.Deduct(ctx, req("short", fmt.Sprintf("s%d", i), fmt.Sprintf("u%d", i%4), 1))
			assert.NotErrorIs(t, err, stock.ErrUnknownOutcome)
		}
		assert.Equal(t, l, levels(t, e.r, "short"), "replays of settled ids take nothing")
		// Put the missing units into the store, as an operator would after a count: the
		// reconciler then sees no drift.
		store.Set("short", 5)
		reconcile(t, e.r, store, "short")
	})
}

// TestConcurrentCopiesOneID: many concurrent copies of one request id with different buyers
// (so possibly different buckets) take exactly once; the rest are conflicts or, for the same
// buyer, replays. With coalescing on and off.
func TestConcurrentCopiesOneID(t *testing.T) {
	for _, co := range []int{0, 1, 4} {
		t.Run(fmt.Sprint("coalesce", co), func(t *testing.T) {
			lifecycleEach(t, []stock.Option{lifecycleSplit(5), stock.WithCoalescing(co)}, func(t *testing.T, e *env) {
				sku := sku("cp")
				require.NoError(t, e.r.Load(ctx, sku, 1000))
				for round := range 10 {
					id := fmt.Sprint("id", round)
					var ok, replay, conflict atomic.Int64
					var mu sync.Mutex
					var other []string
					parallel(40, func(g int) {
						rc, err := e.r.Deduct(ctx, req(sku, id, fmt.Sprint("u", g%10), 1))
						switch {
						case err == nil && rc.Replayed:
							replay.Add(1)
						case err == nil:
							ok.Add(1)
						case errors.Is(err, stock.ErrConflict):
							conflict.Add(1)
						default:
							mu.Lock()
							other = append(other, err.Error())
							mu.Unlock()
						}
					})
					require.Empty(t, other)
					require.Equal(t, int64(1), ok.Load(), "round %d: exactly one take", round)
					require.Equal(t, int64(3), replay.Load(), "round %d: copies of the winner's buyer replay", round)
					require.Equal(t, int64(36), conflict.Load())
				}
				require.Equal(t, int64(10), testkit.Levels(t, e.r, sku).Sold)
				require.Len(t, testkit.Ledger(t, e.r, sku), 10)
			})
		})
	}
}

// TestCancelledClaims: claims whose contexts end at random moments, then retries with
// Request.Retry: no claim lost, no double take, no goroutine left behind.
func TestCancelledClaims(t *testing.T) {
	testkit.ParallelOnMiniredis(t)
	lifecycleEach(t, []stock.Option{lifecycleSplit(3), stock.WithCoalescing(1)}, func(t *testing.T, e *env) {
		base := 0
		for rnd := range 4 {
			if rnd == 1 {
				// after a first round: the client's connections are all open
				time.Sleep(200 * time.Millisecond)
				base = runtime.NumGoroutine()
			}
			sku := sku("cc")
			const stockN, ids = 150, 300
			require.NoError(t, e.r.Load(ctx, sku, stockN))
			type out struct {
				err   error
				taken bool
			}
			res := make([]out, ids)
			parallel(ids, func(i int) {
				c, cancel := context.WithTimeout(ctx, time.Duration(i%7)*200*time.Microsecond)
				defer cancel()
				_, err := e.r.Deduct(c, req(sku, fmt.Sprint("i", i), fmt.Sprint("u", i%50), 1))
				res[i] = out{err: err, taken: err == nil}
			})
			// retry every one that did not get a definite answer
			taken := 0
			for i := range ids {
				err := res[i].err
				if err != nil && !errors.Is(err, stock.ErrSoldOut) && !errors.Is(err, stock.ErrUserLimit) {
					require.True(t, errors.Is(err, context.DeadlineExceeded) || errors.Is(err, stock.ErrUnknownOutcome), "%v", err)
					rc, err2 := e.r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprint("i", i), User: fmt.Sprint("u", i%50), Qty: 1, Retry: true})
					if err2 == nil {
						_ = rc
						res[i] = out{taken: true}
					} else {
						require.ErrorIs(t, err2, stock.ErrSoldOut)
						res[i] = out{err: err2}
					}
				}
				if res[i].taken {
					taken++
				}
			}
			// a second retry of every id is a replay of its answer
			for i := range ids {
				rc, err := e.r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprint("i", i), User: fmt.Sprint("u", i%50), Qty: 1, Retry: true})
				if res[i].taken {
					require.NoError(t, err, "id %d", i)
					require.True(t, rc.Replayed, "id %d", i)
				} else {
					require.Error(t, err, "id %d: refused, then taken on a retry", i)
				}
			}
			l := testkit.Levels(t, e.r, sku)
			require.Equal(t, int64(taken), l.Sold)
			require.Equal(t, int64(stockN), l.Sold, "stock left while requests were refused")
			n := 0
			for _, en := range testkit.Ledger(t, e.r, sku) {
				if en.Taken() {
					n++
				}
			}
			require.Equal(t, taken, n)
		}
		n := 0
		for range 40 {
			if n = runtime.NumGoroutine(); n <= base+2 {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if n > base+2 {
			buf := make([]byte, 1<<20)
			t.Logf("%s", buf[:runtime.Stack(buf, true)])
		}
		require.LessOrEqual(t, n, base+2, "goroutines left behind after 3 rounds")
	})
}

// TestRestoreRacesDeduct: a restore of an id racing its own deduct, by buyers of several
// buckets: either the deduct took and the restore gave it back, or the restore left a
// tombstone and the deduct is refused with ErrRestored; never a unit lost or made.
func TestRestoreRacesDeduct(t *testing.T) {
	lifecycleEach(t, []stock.Option{lifecycleSplit(4)}, func(t *testing.T, e *env) {
		sku := sku("rr")
		const S = 50
		require.NoError(t, e.r.Load(ctx, sku, S))
		for i := range 60 {
			id := fmt.Sprint("r", i)
			var derr, rerr error
			var drc, rrc stock.Receipt
			var wg sync.WaitGroup
			wg.Add(2)
			go func() {
				defer wg.Done()
				drc, derr = e.r.Deduct(ctx, req(sku, id, fmt.Sprint("u", i), 1))
			}()
			go func() { defer wg.Done(); rrc, rerr = e.r.Restore(ctx, sku, id) }()
			wg.Wait()
			switch {
			case derr == nil:
				// the deduct ran first: the restore gave it back
				require.NoError(t, rerr, "%s", id)
				require.Equal(t, int64(1), rrc.Qty, "%s", id)
			default:
				require.ErrorIs(t, derr, stock.ErrRestored, "%s", id)
				require.ErrorIs(t, rerr, stock.ErrUnknownID, "%s", id)
			}
			_ = drc
			// a second restore and a second deduct change nothing
			_, _ = e.r.Restore(ctx, sku, id)
			require.ErrorIs(t, testkit.Err(e.r.Deduct(ctx, req(sku, id, fmt.Sprint("u", i), 1))), stock.ErrRestored, "%s", id)
			require.Equal(t, stock.Levels{Available: S, Loaded: S}, testkit.Levels(t, e.r, sku), "%s", id)
		}
	})
}

// TestCutAtEachCall: a buyer's process whose n-th Redis call is cut (never sent), for n in
// turn, while its buyers need stock a restock and a restore gave back in other buckets: some
// cuts leave a transfer half way. The sweeper completes them; the item is sold out; the relay
// then delivers everything with no acknowledged sale (by Redis's ledger) refused.
func TestCutAtEachCall(t *testing.T) {
	testkit.ParallelOnMiniredis(t)
	splitEach(t, []stock.Option{split(4)}, func(t *testing.T, e *requestEnv) {
		e7 := &env{name: e.name, real: e.real, c: e.c, r: e.r, advance: e.advance, another: e.another}
		cuts, inFlightTotal := 0, 0
		for n := 1; n <= 40; n++ {
			sku := fmt.Sprintf("cutcall-%d", n)
			store := memstore.New()
			require.NoError(t, store.Load(ctx, sku, 4))
			require.NoError(t, e.r.Load(ctx, sku, 4))
			var ids []string
			buy := func(r *stock.Reserver, prefix string, k int) {
				for i := range k {
					id := fmt.Sprintf("%s%d", prefix, i)
					ids = append(ids, id)
					_, err := r.Deduct(ctx, req(sku, id, id, 1))
					if r == e.r && errors.Is(err, stock.ErrSoldOut) {
						return
					}
				}
			}
			buy(e.r, "a", 50)
			require.NoError(t, testkit.Err(e.r.Restock(ctx, sku, "rs", 3)))
			require.NoError(t, testkit.Err(e.r.Restore(ctx, sku, "a0")))
			cc := &cut{Client: e.c, n: n}
			cr := must(stock.New(cc, split(4)))(t)
			buy(cr, "x", 6)
			if cut, _ := cc.state(); cut {
				cuts++
			}
			for _, k := range keysOf(t, e7, sku) {
				if strings.HasSuffix(k, ":xf") {
					m := must(e.c.Do(ctx, e.c.B().Zcard().Key(k).Build()).AsInt64())(t)
					inFlightTotal += int(m)
				}
			}
			e.advance(6 * time.Second)
			require.NoError(t, testkit.Err(stockops.Sweep(ctx, e.r, sku)))
			buy(e.r, "b", 50)
			sold := takenByID(t, e.r, sku, ids)
			l := levels(t, e.r, sku)
			assert.Zero(t, l.Available, "cut %d: units stranded: %+v", n, l)
			rl := splitRelay(t, e, store, &stock.RelayOptions{Batch: 1})
			_, refused := splitDrain(t, e, sku, 200, rl)
			assert.Zero(t, refused, "cut %d: the relay counted refusals", n)
			splitCheck(t, e, store, sku, sold)
		}
		t.Logf("%d cuts, %d transfers left in flight by them", cuts, inFlightTotal)
	})
}

// WithUserRequired: every take without a user is ErrInvalid naming User and writes nothing;
// the same takes with a user then go through.
func TestUserRequiredRefusesEveryTakeWithoutUser(t *testing.T) {
	for _, split := range []bool{false, true} {
		t.Run(fmt.Sprint("split=", split), func(t *testing.T) {
			opts := []stock.Option{stock.WithUserLimit(2), stock.WithUserRequired(), stock.WithGroups(outsideGroup)}
			if split {
				opts = []stock.Option{stock.WithUserLimit(2), stock.WithUserRequired(), stock.WithBuckets(func(sku string) int {
					if sku == "s" {
						return 4
					}
					return 1
				})}
			}
			e := outsideMini(t, opts...)
			e.load("a", 10)
			e.load("b", 10)
			e.load("s", 10)
			before := e.snapshot("stock:*")
			check := func(what string, err error) {
				t.Helper()
				assert.ErrorIs(t, err, stock.ErrInvalid, "%s without a user", what)
				assert.ErrorContains(t, err, "User", "%s without a user: the error names User", what)
			}
			for _, sku := range []string{"a", "s"} {
				check("Deduct "+sku, testkit.Err(e.r.Deduct(e.ctx, req(sku, "d1", "", 1))))
				check("Deduct retry "+sku, testkit.Err(e.r.Deduct(e.ctx, stock.Request{SKU: sku, ID: "d2", Qty: 1, Retry: true})))
				check("Hold "+sku, testkit.Err(e.r.Hold(e.ctx, req(sku, "h1", "", 1), time.Minute)))
			}
			_, err := e.r.DeductMany(e.ctx, stock.Cart{ID: "c1", Lines: []stock.Line{{SKU: "a", Qty: 1}, {SKU: "b", Qty: 1}}})
			check("DeductMany", err)
			_, err = e.r.HoldMany(e.ctx, stock.Cart{ID: "c2", Lines: []stock.Line{{SKU: "a", Qty: 1}, {SKU: "s", Qty: 1}}}, time.Minute)
			check("HoldMany", err)
			after := e.snapshot("stock:*")
			if fmt.Sprint(before) != fmt.Sprint(after) {
				for k, v := range after {
					assert.Equal(t, fmt.Sprint(before[k]), fmt.Sprint(v), "refused request without a user wrote %s", k)
				}
			}
			// The ids were never used: with a user they take stock.
			for _, sku := range []string{"a", "s"} {
				for _, u := range []string{"alice", "bob", "carol"} {
					id := "d1-" + u
					if u == "alice" {
						id = "d1"
					}
					assert.NoError(t, testkit.Err(e.r.Deduct(e.ctx, req(sku, id, u, 1))), "deduct %s %s by %s after the refusal", sku, id, u)
				}
			}
			// Restore, Confirm, Cancel, Extend and Restock need no user.
			assert.NoError(t, testkit.Err(e.r.Restore(e.ctx, "a", "d1")), "Restore")
			assert.NoError(t, testkit.Err(e.r.Restock(e.ctx, "a", "r", 1)), "Restock")
		})
	}
}

// WithUserRequired without WithUserLimit changes nothing: takes without a user are served.
func TestUserRequiredWithoutLimitChangesNothing(t *testing.T) {
	e := outsideMini(t, stock.WithUserRequired())
	e.load("a", 10)
	assert.NoError(t, testkit.Err(e.r.Deduct(e.ctx, req("a", "d", "", 1))), "Deduct without user and without a limit")
	assert.NoError(t, testkit.Err(e.r.DeductMany(e.ctx, stock.Cart{ID: "c", Lines: []stock.Line{{SKU: "a", Qty: 1}}})), "DeductMany without user and without a limit")
}
