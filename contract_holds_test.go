package stock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/stockops"
)

// Regression tests for the contract holes of holds, the item lifecycle and the sold-out fast
// path: each fails on the code before its fix.

// soldOutReserver loads sku with one unit on a Reserver with the default options (the sold-out
// fast path on, with the client's server-assisted cache on real servers), sells it, and lets
// Redis refuse one request as sold out, so that the Reserver answers the next ones in-process.
func soldOutReserver(t *testing.T, c rueidis.Client, sku string) *stock.Reserver {
	t.Helper()
	ctx := context.Background()
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
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			tries := 1000
			if !b.Real() {
				tries = 50
			}
			f(t, b, soldOutReserver(t, b.Client(t), sku), tries)
		})
	}
}

// assertState asserts the state of id's ledger entry of sku.
func assertState(t *testing.T, r *stock.Reserver, sku, id string, want stock.State, msgAndArgs ...any) {
	t.Helper()
	e := entry(t, r, sku, id)
	assert.Equal(t, want, e.State, msgAndArgs...)
}

// TestFastPathTombstoneOwnWrite: a Restore of an unknown id leaves a tombstone; the same
// Reserver must then answer a Deduct of that id ErrRestored, as the ledger says, never
// ErrSoldOut from a cached read that predates the tombstone.
func TestFastPathTombstoneOwnWrite(t *testing.T) {
	eachSoldOutBackend(t, "T", func(t *testing.T, b redistest.Backend, r *stock.Reserver, tries int) {
		ctx := context.Background()
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
		ctx := context.Background()
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

// holdMany holds n units of sku, one per id prefix-0..n-1, for ttl, in deadline order.
func holdMany(t *testing.T, r *stock.Reserver, sku, prefix string, n int, ttl time.Duration) {
	t.Helper()
	for i := range n {
		must(t)(r.Hold(context.Background(), stock.Request{SKU: sku, ID: fmt.Sprint(prefix, i), Qty: 1}, ttl))
	}
}

// TestExpiredHoldAnswerIndependentOfOthers: with more than 64 holds past their deadline, a
// replay of the last one's Hold is ErrExpired (not a replay of a live hold), and Extend and
// Confirm of late ones release them: an id's answer does not depend on how many other holds are
// due.
func TestExpiredHoldAnswerIndependentOfOthers(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c, stock.WithSoldOutCache(0))
		require.NoError(t, r.Load(ctx, "H", 1000))
		const n = 200
		holdMany(t, r, "H", "h", n, 300*time.Millisecond)
		redistest.Sleep(c, 400*time.Millisecond)

		// Coalesced deducts and holds share deduct.lua; Hold is the one under test. Each call
		// is on a due hold of its own, from the last one back.
		for i, call := range []struct {
			name             string
			do               func(id string) error
			want             error
			answer, released string // what the answer and the released hold show
		}{
			{"hold", func(id string) error {
				_, err := r.Hold(ctx, stock.Request{SKU: "H", ID: id, Qty: 1}, time.Minute)
				return err
			}, stock.ErrExpired, "a replay of an expired hold", "the replayed hold is released"},
			{"extend", func(id string) error { _, err := r.Extend(ctx, "H", id, time.Minute); return err },
				stock.ErrExpired, "", "Extend answers expired and releases the hold"},
			{"confirm", func(id string) error { _, err := r.Confirm(ctx, "H", id); return err },
				stock.ErrExpired, "", ""},
			// A deduct of a due hold's id is a conflict (another kind), and releases it all the same.
			{"deduct", func(id string) error {
				_, err := r.Deduct(ctx, stock.Request{SKU: "H", ID: id, Qty: 1})
				return err
			}, stock.ErrConflict, "", ""},
		} {
			id := fmt.Sprint("h", n-1-i)
			require.ErrorIs(t, call.do(id), call.want, "%s: %s", call.name, call.answer)
			assertState(t, r, "H", id, stock.StateExpired, "%s: %s", call.name, call.released)
		}

		_, err := stockops.Sweep(ctx, r, "H")
		require.NoError(t, err)
		assert.Equal(t, stock.Levels{Available: 1000, Loaded: 1000}, levels(t, r, "H"))
		for id, e := range ledger(t, r, "H") {
			assert.Equal(t, stock.StateExpired, e.State, id)
		}
	})
}

// TestConfirmExtendReleaseExpired: Confirm and Extend release the item's other holds past their
// deadline, as Deduct and Hold do.
func TestConfirmExtendReleaseExpired(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c, stock.WithUserLimit(5))
		require.NoError(t, r.Load(ctx, "C", 10))
		must(t)(r.Hold(ctx, stock.Request{SKU: "C", ID: "live1", Qty: 1}, time.Minute))
		must(t)(r.Hold(ctx, stock.Request{SKU: "C", ID: "live2", Qty: 1}, time.Minute))
		must(t)(r.Hold(ctx, stock.Request{SKU: "C", ID: "old1", User: "u", Qty: 3}, 200*time.Millisecond))
		redistest.Sleep(c, 300*time.Millisecond)

		rc := must(t)(r.Confirm(ctx, "C", "live1"))
		assert.Equal(t, int64(8), rc.Remaining, "the expired hold's 3 units are back")
		assert.Equal(t, stock.Levels{Available: 8, Held: 1, Sold: 1, Loaded: 10}, levels(t, r, "C"))
		assertState(t, r, "C", "old1", stock.StateExpired, "Confirm released the other expired hold")

		must(t, "the user's units of the expired hold were given back")(
			r.Hold(ctx, stock.Request{SKU: "C", ID: "old2", User: "u", Qty: 5}, 200*time.Millisecond))
		redistest.Sleep(c, 300*time.Millisecond)
		rc = must(t)(r.Extend(ctx, "C", "live2", time.Minute))
		assert.Equal(t, int64(8), rc.Remaining)
		assert.Equal(t, stock.Levels{Available: 8, Held: 1, Sold: 1, Loaded: 10}, levels(t, r, "C"))
		assertState(t, r, "C", "old2", stock.StateExpired, "Extend released the other expired hold")
		must(t, "and gave the user's units back")(r.Hold(ctx, stock.Request{SKU: "C", ID: "again", User: "u", Qty: 5}, time.Minute))
	})
}

// TestReopenDelisted: a delisted item cannot be reopened (it would sell again and then be
// retired, its ledger deleted), and the retire script removes only a closed, delisted item,
// whatever the caller checked before.
func TestReopenDelisted(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		g := newRig(t, c, map[string]int64{"A": 10, "B": 10}, &stock.ReconcileOptions{Retention: time.Millisecond})
		must(t)(g.r.Deduct(ctx, stock.Request{SKU: "A", ID: "a1", Qty: 1}))
		require.NoError(t, g.r.Delist(ctx, "A"))
		err := g.r.ReopenItem(ctx, "A")
		require.ErrorIs(t, err, stock.ErrClosed)
		assert.Contains(t, err.Error(), "delisted")
		mustFail(t, stock.ErrClosed, "a delisted item stays closed")(g.r.Deduct(ctx, stock.Request{SKU: "A", ID: "a2", Qty: 1}))
		l := levels(t, g.r, "A")
		assert.True(t, l.Closed)

		// An item delisted and then reopened (as the code before this fix allowed: the
		// delisting stamp stays, the closed flag is gone) is live: retiring must refuse it.
		must(t)(g.r.Deduct(ctx, stock.Request{SKU: "B", ID: "b1", Qty: 1}))
		require.NoError(t, g.r.Delist(ctx, "B"))
		reopenBypassingCheck(t, c, "B")
		must(t, "the item sells")(g.r.Deduct(ctx, stock.Request{SKU: "B", ID: "b2", Qty: 1}))
		drain(t, g.relay)
		time.Sleep(5 * time.Millisecond)
		reps := g.once(t)
		assert.True(t, reps["A"].Retired, "a closed, delisted item is retired: %s", reps["A"])
		assert.False(t, reps["B"].Retired, "a live item is never retired: %s", reps["B"])
		assert.Contains(t, reps["B"].NeedsHuman, "delisted but open", "the pass says why it does not retire it")
		assert.Equal(t, stock.Levels{Available: 8, Sold: 2, Loaded: 10}, levels(t, g.r, "B"), "the live item is kept")
		must(t, "and sells")(g.r.Deduct(ctx, stock.Request{SKU: "B", ID: "b3", Qty: 1}))
	})
}

// reopenBypassingCheck removes the closed flag of sku's item hash directly, as a Reopen of a
// delisted item did before it was refused. It finds the item hash by its fields, so it does not
// depend on the key layout.
func reopenBypassingCheck(t *testing.T, c rueidis.Client, sku string) {
	t.Helper()
	k := findKey(t, c, sku, func(ctx context.Context, n rueidis.Client, key string) bool {
		vs, err := n.Do(ctx, n.B().Hmget().Key(key).Field("a", "d").Build()).ToArray()
		return err == nil && len(vs) == 2 && !vs[0].IsNil() && !vs[1].IsNil()
	})
	require.NoError(t, c.Do(context.Background(), c.B().Hdel().Key(k).Field("c").Build()).Error())
}

// findKey returns the one hash key whose name contains "{"+sku+"}" or ":"+sku and that match
// accepts, on any node.
func findKey(t *testing.T, c rueidis.Client, sku string, match func(context.Context, rueidis.Client, string) bool) string {
	t.Helper()
	ctx := context.Background()
	var found []string
	for _, n := range c.Nodes() {
		keys, err := n.Do(ctx, n.B().Keys().Pattern("*").Build()).AsStrSlice()
		require.NoError(t, err)
		for _, k := range keys {
			if !strings.Contains(k, "{"+sku+"}") && !strings.Contains(k, ":"+sku) {
				continue
			}
			if typ, err := n.Do(ctx, n.B().Type().Key(k).Build()).ToString(); err != nil || typ != "hash" {
				continue
			}
			if match(ctx, n, k) {
				found = append(found, k)
			}
		}
	}
	require.Len(t, found, 1, "keys of %s: %v", sku, found)
	return found[0]
}

// plantEntry overwrites id's ledger entry of sku with v.
func plantEntry(t *testing.T, c rueidis.Client, sku, id, v string) {
	t.Helper()
	k := findKey(t, c, sku, func(ctx context.Context, n rueidis.Client, key string) bool {
		e, err := n.Do(ctx, n.B().Hget().Key(key).Field(id).Build()).ToString()
		return err == nil && strings.Count(e, "|") >= 4
	})
	require.NoError(t, c.Do(context.Background(), c.B().Hset().Key(k).FieldValue().FieldValue(id, v).Build()).Error())
}

// TestCorruptEntryAmongDueHolds: a corrupt ledger entry among holds past their deadline makes
// every script that would release them fail with a clear error before it writes anything, so
// loaded = available + held + sold still holds and no hold is half released.
func TestCorruptEntryAmongDueHolds(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c, stock.WithSoldOutCache(0))
		require.NoError(t, r.Load(ctx, "X", 10))
		holdMany(t, r, "X", "x", 3, 1500*time.Millisecond) // long enough for the next steps on a busy machine
		_, err := r.Hold(ctx, stock.Request{SKU: "X", ID: "live", Qty: 2}, time.Minute)
		require.NoError(t, err)
		plantEntry(t, c, "X", "x1", "Hh|1|oops")
		redistest.Sleep(c, 1600*time.Millisecond)
		before := levels(t, r, "X")
		assert.Equal(t, stock.Levels{Available: 5, Held: 5, Loaded: 10}, before)

		calls := map[string]func() error{
			"sweep": func() error { _, err := stockops.Sweep(ctx, r, "X"); return err },
			"deduct": func() error {
				_, err := r.Deduct(ctx, stock.Request{SKU: "X", ID: "d", Qty: 1})
				return err
			},
			"hold": func() error {
				_, err := r.Hold(ctx, stock.Request{SKU: "X", ID: "h", Qty: 1}, time.Minute)
				return err
			},
			"confirm": func() error { _, err := r.Confirm(ctx, "X", "live"); return err },
			"extend":  func() error { _, err := r.Extend(ctx, "X", "live", time.Minute); return err },
		}
		for name, call := range calls {
			err := call()
			require.Error(t, err, name)
			assert.Contains(t, err.Error(), "corrupt ledger entry", name)
			assert.Contains(t, err.Error(), "x1", "%s: the error names the entry", name)
			assert.Equal(t, before, levels(t, r, "X"), "%s changed nothing", name)
			for _, id := range []string{"x0", "x2", "live"} {
				assertState(t, r, "X", id, stock.StateHeld, "%s: %s is untouched", name, id)
			}
		}
	})
}

// TestExpiredCartHoldAnswerIndependentOfOthers: the one-script cart of a group (deductmany.lua)
// releases the holds of a cart past their deadline when the cart is retried, even with more than
// 64 other holds of its items due, and answers the retry as it answers it with none due: a
// replay of the cart (a retry of a taken cart answers that the cart was taken, see the cart
// tests).
func TestExpiredCartHoldAnswerIndependentOfOthers(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c, stock.WithSoldOutCache(0), stock.WithGroups(func(string) string { return "g" }))
		for _, sku := range []string{"g1", "g2"} {
			require.NoError(t, r.Load(ctx, sku, 1000))
			holdMany(t, r, sku, "h", 100, 1500*time.Millisecond)
		}
		// "zcart" sorts after the other holds: on miniredis, whose clock stands still, they all
		// have the same deadline.
		cart := stock.Cart{ID: "zcart", Lines: []stock.Line{{SKU: "g1", Qty: 2}, {SKU: "g2", Qty: 3}}}
		mustCart(t)(r.HoldMany(ctx, cart, 1500*time.Millisecond))
		redistest.Sleep(c, 1600*time.Millisecond)

		_, err := r.HoldMany(ctx, cart, 1500*time.Millisecond)
		var ce *stock.CartError
		require.ErrorAs(t, err, &ce, "a retry of a cart of holds answers its holds' state")
		assert.ErrorIs(t, err, stock.ErrExpired)
		for _, sku := range []string{"g1", "g2"} {
			assertState(t, r, sku, "zcart", stock.StateExpired, "%s: the cart's hold is released", sku)
			l := levels(t, r, sku)
			// The call releases 64 of the other due holds (its bound per call); on a loaded real
			// server the test's own later calls may release more of them before Levels reads.
			assert.LessOrEqual(t, l.Held, int64(100-64), "%s: the call released at least 64 of the other holds, %+v", sku, l)
		}
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
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
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
				wg.Add(1)
				go func() {
					defer wg.Done()
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
				}()
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
}

// TestCorruptUnitsAmongDueHolds: a user's unit count that is not a number, for a hold past its
// deadline, stops the release before its first write (HINCRBY would fail halfway through it,
// after the hold's entry was marked expired and before the counters were fixed).
func TestCorruptUnitsAmongDueHolds(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c, stock.WithSoldOutCache(0))
		require.NoError(t, r.Load(ctx, "U", 10))
		for i, u := range []string{"ann", "bob"} {
			must(t)(r.Hold(ctx, stock.Request{SKU: "U", ID: fmt.Sprint("u", i), User: u, Qty: 2}, 200*time.Millisecond))
		}
		k := findKey(t, c, "U", func(ctx context.Context, n rueidis.Client, key string) bool {
			v, err := n.Do(ctx, n.B().Hget().Key(key).Field("bob").Build()).ToString()
			return err == nil && v == "2"
		})
		require.NoError(t, c.Do(ctx, c.B().Hset().Key(k).FieldValue().FieldValue("bob", "two").Build()).Error())
		redistest.Sleep(c, 300*time.Millisecond)
		before := levels(t, r, "U")
		_, err := stockops.Sweep(ctx, r, "U")
		require.Error(t, err)
		assert.Contains(t, err.Error(), "corrupt units of user bob")
		assert.Equal(t, before, levels(t, r, "U"), "nothing released")
		for _, id := range []string{"u0", "u1"} {
			assertState(t, r, "U", id, stock.StateHeld, "%s is untouched", id)
		}
	})
}

// TestCancelExpiredHoldAnswerIndependentOfOthers: a Cancel or Restore of a hold past its
// deadline is a replay (the hold had already gone back), whether or not an earlier call released
// it: with more than 64 holds due, one call releases only 64 of them.
func TestCancelExpiredHoldAnswerIndependentOfOthers(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c, stock.WithSoldOutCache(0))
		require.NoError(t, r.Load(ctx, "K", 1000))
		const n = 100
		holdMany(t, r, "K", "h", n, 1500*time.Millisecond)
		redistest.Sleep(c, 1600*time.Millisecond)
		_, err := r.Hold(ctx, stock.Request{SKU: "K", ID: "trigger", Qty: 1}, time.Minute)
		require.NoError(t, err)
		require.Equal(t, int64(n-64+1), levels(t, r, "K").Held, "the Hold released 64 of the due holds")
		for i := range n {
			id := fmt.Sprint("h", i)
			var rc stock.Receipt
			if i%2 == 0 {
				rc, err = r.Cancel(ctx, "K", id)
			} else {
				rc, err = r.Restore(ctx, "K", id)
			}
			require.NoError(t, err, id)
			assert.True(t, rc.Replayed, "%s: a hold past its deadline had already gone back", id)
			assertState(t, r, "K", id, stock.StateExpired, id)
		}
		assert.Equal(t, stock.Levels{Available: 999, Held: 1, Loaded: 1000}, levels(t, r, "K"))
	})
}
