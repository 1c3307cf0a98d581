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
	"github.com/stockres/stock/stocktest"
)

// holdsDue holds req under each of ids (by users[i] when users are given) for ttl, then moves the
// server's clock 200 ms past the deadline.
func holdsDue(t *testing.T, c rueidis.Client, r *stock.Reserver, req stock.Request, ids []string, ttl time.Duration, users ...string) {
	t.Helper()
	for i, id := range ids {
		req.ID = id
		if users != nil {
			req.User = users[i]
		}
		require.NoError(t, testkit.Err(r.Hold(context.Background(), req, ttl)), "Hold %s %s", req.SKU, id)
	}
	redistest.Sleep(c, ttl+200*time.Millisecond)
}

// Promise (Hold doc): "after expiry it is ErrExpired", whatever the number of other holds due;
// Confirm and Extend past the deadline are ErrExpired; Cancel of an expired hold is a replay.
// 600 holds are due at once (more than any one bounded release step), and each is asked in
// reverse order before anything else touched the item.
func TestManyHoldsDueAnswers(t *testing.T) {
	const n = 600
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		c, r := clientReserver(t, b)
		require.NoError(t, r.Load(ctx, "h", n))
		holdsDue(t, c, r, stock.Request{SKU: "h", User: "u", Qty: 1}, numbered("h", n), 500*time.Millisecond)
		for i := n - 1; i >= 0; i-- {
			id := fmt.Sprint("h", i)
			var err error
			switch i % 4 {
			case 0:
				var rc stock.Receipt
				rc, err = r.Hold(ctx, req("h", id, "u", 1), 500*time.Millisecond)
				require.ErrorIs(t, err, stock.ErrExpired, "hold replay %s: %+v", id, rc)
			case 1:
				_, err = r.Confirm(ctx, "h", id)
				require.ErrorIs(t, err, stock.ErrExpired, "confirm %s", id)
			case 2:
				_, err = r.Extend(ctx, "h", id, time.Hour)
				require.ErrorIs(t, err, stock.ErrExpired, "extend %s", id)
			case 3:
				// Its Replayed flag: TestCancelOfDueHoldIsReplay.
				require.NoError(t, testkit.Err(r.Cancel(ctx, "h", id)), "cancel of an expired hold %s is a replay", id)
			}
		}
		assert.Equal(t, stock.Levels{Available: n, Loaded: n}, check(t, r, "h", n))
		for id, e := range testkit.Ledger(t, r, "h") {
			assert.Equal(t, stock.StateExpired, e.State, id)
		}
	})
}

// Promise (Hold doc, README Holds): "a hold past its deadline is released ... by the item's next
// Deduct, Hold, Confirm or Extend" and "every deduct, hold, confirm and extend also releases
// the item's expired holds first": with 600 holds due and no sweeper, a deduct of all 600 units
// is not refused for want of stock that only expired holds keep; a Hold of every unit likewise.
func TestDeductAfterManyHoldsDue(t *testing.T) {
	const n = 600
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		c, r := clientReserver(t, b)
		require.NoError(t, r.Load(ctx, "h", n))
		holdsDue(t, c, r, stock.Request{SKU: "h", Qty: 1}, numbered("h", n), 500*time.Millisecond)
		rc, err := r.Deduct(ctx, req("h", "all", "", n))
		require.NoError(t, err, "every unit is free again: %+v", rc)
		t.Logf("after the deduct: %+v", check(t, r, "h", n))
		// And a hold of the whole item after the same situation.
		require.NoError(t, r.Load(ctx, "h2", n))
		holdsDue(t, c, r, stock.Request{SKU: "h2", Qty: 1}, numbered("h", n), 500*time.Millisecond)
		_, err = r.Hold(ctx, req("h2", "all", "", n), time.Minute)
		assert.NoError(t, err, "hold of every unit after 600 holds expired")
		check(t, r, "h2", n)
	})
}

// Promise (Confirm, Extend, Cancel, Hold docs) at the deadline: on miniredis's clock, stopped
// exactly at a hold's deadline and 1 ms either side, every operation must take the same view
// of whether the hold is live, and the ledger must agree with the answers.
func TestHoldDeadlineEdges(t *testing.T) {
	for _, off := range []time.Duration{-time.Millisecond, 0, time.Millisecond} {
		t.Run(fmt.Sprint(off), func(t *testing.T) {
			_, c := redistest.Miniredis(t)
			r := testkit.NewReserver(t, c)
			require.NoError(t, r.Load(ctx, "d", 10))
			ops := []string{"replay", "confirm", "extend", "cancel", "sweep", "deduct"}
			for _, op := range ops {
				require.NoError(t, testkit.Err(r.Hold(ctx, req("d", op, "", 1), time.Second)))
			}
			redistest.Sleep(c, time.Second+off)
			live := map[string]bool{}
			for _, op := range ops {
				var err error
				switch op {
				case "replay":
					_, err = r.Hold(ctx, req("d", op, "", 1), time.Second)
					live[op] = err == nil
				case "confirm":
					_, err = r.Confirm(ctx, "d", op)
					live[op] = err == nil
				case "extend":
					_, err = r.Extend(ctx, "d", op, time.Hour)
					live[op] = err == nil
				case "cancel":
					// A cancel of a live hold and of an expired one both succeed: read the state.
					e, lerr := r.Ledger(ctx, "d", op)
					require.NoError(t, lerr)
					live[op] = e.State == stock.StateHeld
					continue
				case "sweep":
					n, serr := stockops.Sweep(ctx, r, "d")
					require.NoError(t, serr)
					e, lerr := r.Ledger(ctx, "d", op)
					require.NoError(t, lerr)
					live[op] = e.State == stock.StateHeld
					t.Logf("sweep released %d", n)
					continue
				case "deduct":
					_, err = r.Deduct(ctx, req("d", "other", "", 1))
					require.NoError(t, err)
					e, lerr := r.Ledger(ctx, "d", op)
					require.NoError(t, lerr)
					live[op] = e.State == stock.StateHeld
					continue
				}
				if err != nil {
					assert.ErrorIs(t, err, stock.ErrExpired, op)
				}
			}
			t.Logf("offset %v: live %v", off, live)
			for _, op := range ops {
				assert.Equal(t, off < 0, live[op], "offset %v: %s sees the hold live=%v (all: %v)", off, op, live[op], live)
			}
			check(t, r, "d", 10)
		})
	}
}

// Promise: around the deadline on real servers, Confirm racing Sweep, Extend, Cancel and a
// replay of the Hold: the answers agree with each other and with the ledger.
func TestHoldDeadlineRaces(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		c1, _, r1, r2 := pairReservers(t, b)
		require.NoError(t, r1.Load(ctx, "d", 1000))
		confirmed, expired := 0, 0
		for i := range 60 {
			id := fmt.Sprint("d", i)
			require.NoError(t, testkit.Err(r1.Hold(ctx, req("d", id, "u", 1), 20*time.Millisecond)))
			redistest.Sleep(c1, time.Duration(15+i%10)*time.Millisecond)
			var wg sync.WaitGroup
			var cerr, xerr, herr error
			wg.Add(4)
			go func() { defer wg.Done(); _, cerr = r1.Confirm(ctx, "d", id) }()
			go func() { defer wg.Done(); _, xerr = r2.Extend(ctx, "d", id, time.Hour) }()
			go func() {
				defer wg.Done()
				_, herr = r2.Hold(ctx, req("d", id, "u", 1), 20*time.Millisecond)
			}()
			go func() { defer wg.Done(); _, _ = stockops.Sweep(ctx, r2, "d") }()
			wg.Wait()
			e := must(r1.Ledger(ctx, "d", id))(t)
			if cerr == nil {
				confirmed++
				assert.True(t, e.Taken() && e.State != stock.StateHeld, "%s: confirmed, ledger %+v", id, e)
			} else {
				expired++
				assert.ErrorIs(t, cerr, stock.ErrExpired)
				assert.Error(t, xerr, "%s: Extend succeeded but Confirm said %v; ledger %+v", id, cerr, e)
				assert.Equal(t, stock.StateExpired, e.State, "%s: %+v", id, e)
			}
			if herr != nil && !errors.Is(herr, stock.ErrExpired) {
				t.Errorf("%s: hold replay: %v", id, herr)
			}
			if herr != nil && cerr == nil {
				// Confirm saw the hold live; a replay of the Hold that ran before it must too,
				// but one that ran after sees the confirmation (a replay). Either way never ErrExpired
				// for a hold that was confirmed.
				t.Errorf("%s: confirmed, yet its replay answered %v", id, herr)
			}
		}
		t.Logf("confirmed %d, expired %d", confirmed, expired)
		check(t, r1, "d", 1000)
	})
}

// Promise (Extend doc): "ErrExpired past the deadline"; its units went back; afterwards every
// call on the id agrees. Reservers sharing one Redis (caching clients) answer the same.
func TestExtendExpiredAcrossReservers(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		c1, _, r1, r2 := pairReservers(t, b)
		require.NoError(t, r1.Load(ctx, "e", 3))
		require.NoError(t, testkit.Err(r1.Hold(ctx, req("e", "h", "u", 3), 200*time.Millisecond)))
		// r2 caches the item as sold out.
		require.ErrorIs(t, testkit.Err(r2.Deduct(ctx, req("e", "x", "", 1))), stock.ErrSoldOut)
		redistest.Sleep(c1, 300*time.Millisecond)
		require.ErrorIs(t, testkit.Err(r2.Extend(ctx, "e", "h", time.Hour)), stock.ErrExpired)
		assert.Equal(t, stock.Levels{Available: 3, Loaded: 3}, check(t, r1, "e", 3))
		assert.ErrorIs(t, testkit.Err(r1.Extend(ctx, "e", "h", time.Hour)), stock.ErrExpired)
		assert.ErrorIs(t, testkit.Err(r1.Confirm(ctx, "e", "h")), stock.ErrExpired)
		assert.ErrorIs(t, testkit.Err(r2.Hold(ctx, req("e", "h", "u", 3), time.Hour)), stock.ErrExpired)
		assert.ErrorIs(t, testkit.Err(r1.Hold(ctx, req("e", "h", "u", 3), time.Hour)), stock.ErrExpired)
		// r2 wrote (Extend released the hold): its own next deduct is not answered sold out.
		assert.NoError(t, testkit.Err(r2.Deduct(ctx, req("e", "x", "", 1))), "r2 released 3 units itself, then said")
		assert.True(t, must(r1.Cancel(ctx, "e", "h"))(t).Replayed)
		check(t, r1, "e", 3)
	})
}

// Bad hold durations are ErrInvalid and change nothing.
func TestHoldTTLBounds(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		r := testkit.NewReserver(t, b.Client(t))
		require.NoError(t, r.Load(ctx, "t", 3))
		for _, ttl := range []time.Duration{0, -time.Second, stock.MaxHoldTTL + time.Millisecond, 500 * time.Microsecond} {
			assert.ErrorIs(t, testkit.Err(r.Hold(ctx, req("t", "h", "", 1), ttl)), stock.ErrInvalid, "ttl %v", ttl)
		}
		require.NoError(t, testkit.Err(r.Hold(ctx, req("t", "h", "", 1), time.Minute)))
		for _, ttl := range []time.Duration{0, -time.Second, stock.MaxHoldTTL + time.Millisecond} {
			assert.ErrorIs(t, testkit.Err(r.Extend(ctx, "t", "h", ttl)), stock.ErrInvalid, "extend ttl %v", ttl)
		}
		assert.Equal(t, stock.Levels{Available: 2, Held: 1, Loaded: 3}, check(t, r, "t", 3))
	})
}

// Promise (Cancel doc): "A second Cancel, or a Cancel of a hold that already expired, is a
// replay" — and an id's answer must not depend on how many other holds are due.
func TestCancelOfDueHoldIsReplay(t *testing.T) {
	for _, n := range []int{1, 64, 65, 200} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
				c, r := clientReserver(t, b)
				require.NoError(t, r.Load(ctx, "h", int64(n)))
				holdsDue(t, c, r, stock.Request{SKU: "h", Qty: 1}, numbered("h", n), 300*time.Millisecond)
				last := fmt.Sprint("h", n-1)
				rc := must(r.Cancel(ctx, "h", last))(t)
				e := must(r.Ledger(ctx, "h", last))(t)
				assert.True(t, rc.Replayed, "cancel of an expired hold (%d due) is a replay; receipt %+v, entry state %s", n, rc, e.State)
				assert.Equal(t, stock.StateExpired, e.State)
				check(t, r, "h", int64(n))
			})
		})
	}
}

// Promise (Restore doc): "A live hold is cancelled"; a hold past its deadline is not live: a
// Restore of it gives back nothing more (its units went back at the deadline) and the entry
// ends expired; the item's counters stay right.
func TestRestoreOfDueHold(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		c, r := clientReserver(t, b, stock.WithUserLimit(2))
		require.NoError(t, r.Load(ctx, "r", 5))
		require.NoError(t, testkit.Err(r.Hold(ctx, req("r", "h", "u", 2), 200*time.Millisecond)))
		redistest.Sleep(c, 300*time.Millisecond)
		rc, err := r.Restore(ctx, "r", "h")
		t.Logf("restore of a due hold: %+v %v", rc, err)
		e, lerr := r.Ledger(ctx, "r", "h")
		require.NoError(t, lerr)
		assert.Equal(t, stock.StateExpired, e.State)
		assert.Equal(t, stock.Levels{Available: 5, Loaded: 5}, check(t, r, "r", 5))
		rc2, err2 := r.Restore(ctx, "r", "h")
		t.Logf("again: %+v %v", rc2, err2)
		assert.Equal(t, stock.Levels{Available: 5, Loaded: 5}, check(t, r, "r", 5))
		// The user's units came back once: u may hold 2 again, not 4.
		require.NoError(t, testkit.Err(r.Deduct(ctx, req("r", "d", "u", 2))))
		_, err = r.Deduct(ctx, req("r", "d2", "u", 1))
		assert.ErrorIs(t, err, stock.ErrUserLimit)
	})
}

// Promise (Sweep doc): "releases the holds of sku past their deadline, in bounded steps, and
// returns the units released" — all of them, with 600 due; SweepAll likewise over items; live
// holds stay.
func TestSweepManyDue(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		c, r := clientReserver(t, b)
		const ttl = 2 * time.Second
		start := time.Now()
		for _, sku := range []string{"s1", "s2"} {
			require.NoError(t, r.Load(ctx, sku, 700))
			for i := range 600 {
				require.NoError(t, testkit.Err(r.Hold(ctx, req(sku, fmt.Sprint("h", i), "", 1), ttl)))
			}
			require.NoError(t, testkit.Err(r.Hold(ctx, req(sku, "live", "", 2), time.Hour)))
		}
		// On a slow machine the first holds may fall due while the last are taken, and those
		// takes release them: the exact counts hold only when taking them all was quick.
		exact := time.Since(start) < ttl*3/4
		redistest.Sleep(c, ttl+200*time.Millisecond)
		n := must(stockops.Sweep(ctx, r, "s1"))(t)
		if exact {
			assert.Equal(t, int64(600), n)
		}
		n = must(stockops.Sweep(ctx, r))(t)
		if exact {
			assert.Equal(t, int64(600), n)
		} else {
			t.Logf("taking the holds took %v: counts not checked, levels are", time.Since(start))
		}
		for _, sku := range []string{"s1", "s2"} {
			assert.Equal(t, stock.Levels{Available: 698, Held: 2, Loaded: 700}, check(t, r, sku, 700), sku)
		}
	})
}

// Promise (WithUserLimit: "restores, cancels and expiries give units back"; Hold: expired holds
// are released by the item's next Deduct): a user whose only hold expired, among more than 64
// holds due, is not refused with ErrUserLimit. Found with TestDeductAfterManyHoldsDue's
// cause: only 64 due holds are released per call, the user's is not among them.
func TestUserLimitAfterManyHoldsDue(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		c, r := clientReserver(t, b, stock.WithUserLimit(1))
		require.NoError(t, r.Load(ctx, "h", 1000))
		holdsDue(t, c, r, stock.Request{SKU: "h", Qty: 1}, numbered("h", 200), 300*time.Millisecond, numbered("user", 200)...)
		assert.NoError(t, testkit.Err(r.Deduct(ctx, req("h", "again", "user199", 1))), "user199's only hold expired")
		check(t, r, "h", 1000)
	})
}

// "Without one [Store], and without a Publisher, Run only sweeps holds and recovers carts" (so
// both nil is valid); "a negative interval turns its loop off"; Run returns "ctx's error when none
// did [meet an error]".
func TestRunBothNilSweeps(t *testing.T) {
	e := stocktest.New(t)
	r := e.Reserver
	require.NoError(t, r.Load(ctx, "h", 10))
	require.NoError(t, testkit.Err(r.Hold(ctx, req("h", "a", "", 3), time.Minute)))
	cancel, done := runAsync(r, stock.RunOptions{SweepInterval: 10 * time.Millisecond})
	e.Advance(2 * time.Minute)
	ok := eventually(3*time.Second, func() bool { return testkit.Levels(t, r, "h").Held == 0 })
	assert.True(t, ok, "Run's sweeper released the due hold: %+v", testkit.Levels(t, r, "h"))
	stopRunWithin(t, cancel, done, 5*time.Second)

	// A negative SweepInterval turns the sweeper off: the due hold stays until something sweeps.
	require.NoError(t, testkit.Err(r.Hold(ctx, req("h", "b", "", 2), time.Minute)))
	cancel, done = runAsync(r, stock.RunOptions{SweepInterval: -1})
	e.Advance(2 * time.Minute)
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, int64(2), testkit.Levels(t, r, "h").Held, "a negative SweepInterval turns the sweeper off")
	stopRunWithin(t, cancel, done, 5*time.Second)
}

// Levels and Sweep on unknown and invalid SKUs: "Bad input is refused with ErrInvalid before
// anything is sent to Redis"; Levels "returns ErrNotLoaded, never zero counters, for an item
// Redis does not know"; "No name may contain a brace".
func TestLevelsSweepBadSKUs(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		r := testkit.NewReserver(t, c)
		require.NoError(t, r.Load(ctx, "ok", 1))
		_, err := r.Levels(ctx, "nope")
		assert.ErrorIs(t, err, stock.ErrNotLoaded)
		for _, bad := range []string{"", "a{b", "a}b", "{a}", "a b", "a\nb", "a\x00b", strings.Repeat("x", stock.MaxNameLen+1)} {
			assert.ErrorIs(t, testkit.Err(r.Levels(ctx, bad)), stock.ErrInvalid, "Levels(%q)", bad)
			assert.ErrorIs(t, testkit.Err(stockops.Sweep(ctx, r, bad)), stock.ErrInvalid, "Sweep(%q)", bad)
			err = r.CloseItem(ctx, bad)
			assert.ErrorIs(t, err, stock.ErrInvalid, "CloseItem(%q)", bad)
			err = r.ReopenItem(ctx, bad)
			assert.ErrorIs(t, err, stock.ErrInvalid, "ReopenItem(%q)", bad)
		}
		_, err = r.Levels(ctx, strings.Repeat("x", stock.MaxNameLen))
		assert.ErrorIs(t, err, stock.ErrNotLoaded, "a name of MaxNameLen bytes is valid")
		// "An item that fails does not stop the others": a bad SKU beside a good one.
		require.NoError(t, testkit.Err(r.Hold(ctx, req("ok", "h", "", 1), time.Millisecond)))
		redistest.Sleep(c, 20*time.Millisecond)
		n, err := stockops.Sweep(ctx, r, "ok", "nope")
		t.Logf("Sweep(ok, nope) = %d, %v", n, err)
		assert.Equal(t, int64(1), n, "the good item was swept")
		assert.Equal(t, int64(0), testkit.Levels(t, r, "ok").Held)
		// CloseItem: "ErrNotLoaded for an unknown item."
		assert.ErrorIs(t, r.CloseItem(ctx, "nope"), stock.ErrNotLoaded)
		// Closing a closed item does nothing; ReopenItem lets it sell again.
		require.NoError(t, r.Load(ctx, "cl", 5))
		require.NoError(t, r.CloseItem(ctx, "cl"))
		require.NoError(t, r.CloseItem(ctx, "cl"))
		assert.True(t, testkit.Levels(t, r, "cl").Closed)
		assert.ErrorIs(t, testkit.Err(r.Deduct(ctx, req("cl", "x", "", 1))), stock.ErrClosed)
		require.NoError(t, r.ReopenItem(ctx, "cl"))
		assert.False(t, testkit.Levels(t, r, "cl").Closed)
		_, err = r.Deduct(ctx, req("cl", "x", "", 1))
		assert.NoError(t, err, "a deduct refused while closed recorded nothing")
		// "A delisted item cannot be reopened (ReopenItem returns ErrClosed)".
		require.NoError(t, r.Delist(ctx, "cl"))
		assert.ErrorIs(t, r.ReopenItem(ctx, "cl"), stock.ErrClosed)
		assert.True(t, testkit.Levels(t, r, "cl").Closed)
	})
}

// Many holds due at once: "Sweep releases the holds past their deadline of the given items, or of
// every item in the registry when none is given, in bounded steps, and returns the units
// released."
func TestSweepManyDueHolds(t *testing.T) {
	e := stocktest.New(t)
	r := e.Reserver
	skus := []string{"m:1", "m:2", "m~3"}
	const per = 700
	for _, s := range skus {
		require.NoError(t, r.Load(ctx, s, 10*per))
		for i := range per {
			require.NoError(t, testkit.Err(r.Hold(ctx, req(s, fmt.Sprint("h", i), "", 2), time.Minute)))
		}
	}
	e.Advance(time.Minute + time.Millisecond)
	assert.Equal(t, int64(len(skus)*per*2), must(stockops.Sweep(ctx, r))(t), "every due hold of every item released")
	for _, s := range skus {
		l := testkit.Levels(t, r, s)
		assert.Equal(t, int64(0), l.Held, s)
		assert.Equal(t, int64(10*per), l.Available, s)
	}
	assert.Equal(t, int64(0), must(stockops.Sweep(ctx, r))(t), "a second sweep finds nothing")
}

// The same on a real server, through Run's sweeper.
func TestRunSweepsManyDueHolds(t *testing.T) {
	testkit.ParallelOnMiniredis(t)
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		r := testkit.NewReserver(t, c)
		const n = 3000
		require.NoError(t, r.Load(ctx, "many", n))
		parallel(4, func(w int) {
			for i := w; i < n; i += 4 {
				assert.NoError(t, testkit.Err(r.Hold(ctx, req("many", fmt.Sprint("h", i), "", 1), 300*time.Millisecond)))
			}
		})
		redistest.Sleep(c, time.Second)
		cancel, done := runAsync(r, stock.RunOptions{SweepInterval: 20 * time.Millisecond})
		ok := eventually(10*time.Second, func() bool { return testkit.Levels(t, r, "many").Held == 0 })
		cancel()
		<-done
		assert.True(t, ok, "Run's sweeper released every due hold: %+v", testkit.Levels(t, r, "many"))
		assert.Equal(t, int64(n), testkit.Levels(t, r, "many").Available)
	})
}

// Sweep: "A corrupt ledger entry is an error that names its id, and that step releases nothing
// (the scripts check everything they read before their first write)", and "An item that fails
// does not stop the others: the errors of all items are joined." The corruption is made through
// the documented key layout (stock:{sku}:l is the ledger hash).
func TestSweepCorruptEntry(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		r := testkit.NewReserver(t, c)
		for _, s := range []string{"bad", "good"} {
			require.NoError(t, r.Load(ctx, s, 10))
			for _, id := range []string{"h1", "h2"} {
				require.NoError(t, testkit.Err(r.Hold(ctx, req(s, id, "", 1), 50*time.Millisecond)))
			}
		}
		require.NoError(t, c.Do(ctx, c.B().Hset().Key("stock:{bad}:l").FieldValue().FieldValue("h1", "garbage").Build()).Error())
		redistest.Sleep(c, 200*time.Millisecond)
		before := testkit.Levels(t, r, "bad")
		n, err := stockops.Sweep(ctx, r)
		require.Error(t, err, "a corrupt entry is an error")
		assert.Contains(t, err.Error(), "h1", "the error names the id")
		assert.Equal(t, int64(0), testkit.Levels(t, r, "good").Held, "the other item was swept")
		assert.GreaterOrEqual(t, n, int64(2), "the good item's units are counted")
		assert.Equal(t, before, testkit.Levels(t, r, "bad"), "that step released nothing")
		t.Logf("Sweep: %d, %v", n, err)
		// What a corrupt due hold does to the item's sales (nothing is promised; recorded here).
		_, err = r.Deduct(ctx, req("bad", "d", "", 1))
		t.Logf("Deduct on the item with a corrupt due hold: %v", err)
		_, err = r.Deduct(ctx, req("bad", "d", "", 1))
		t.Logf("again: %v", err)
		testkit.CheckLedger(t, r, "good", 10)
	})
}

// Sweep with no items in the registry: nothing to do.
func TestSweepEmpty(t *testing.T) {
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		r := testkit.NewReserver(t, c)
		assert.Equal(t, int64(0), must(stockops.Sweep(context.Background(), r))(t))
	})
}

// Hold: "A Deduct or Hold that would otherwise be refused for stock or for the per-user limit
// first releases up to 10,000 due holds, so a refusal does not depend on how many holds are due."
func TestDeductReleasesManyDueHolds(t *testing.T) {
	testkit.ParallelOnMiniredis(t)
	e := stocktest.New(t)
	r := e.Reserver
	const n = 2500
	require.NoError(t, r.Load(ctx, "due", n))
	for i := range n {
		require.NoError(t, testkit.Err(r.Hold(ctx, req("due", fmt.Sprint("h", i), "", 1), time.Minute)))
	}
	assert.ErrorIs(t, testkit.Err(r.Deduct(ctx, req("due", "early", "", 1))), stock.ErrSoldOut)
	e.Advance(2 * time.Minute)
	assert.Equal(t, int64(0), must(r.Deduct(ctx, req("due", "all", "", n)))(t, "every due hold released before the refusal").Remaining)
	l := testkit.Levels(t, r, "due")
	assert.Equal(t, int64(0), l.Held)
	assert.Equal(t, int64(n), l.Sold)
}

// Sweep of one item named twice counts its units once: "returns the units released".
func TestSweepDuplicateSKUs(t *testing.T) {
	e := stocktest.New(t)
	r := e.Reserver
	require.NoError(t, r.Load(ctx, "dup", 10))
	require.NoError(t, testkit.Err(r.Hold(ctx, req("dup", "h", "", 4), time.Minute)))
	e.Advance(2 * time.Minute)
	assert.Equal(t, int64(4), must(stockops.Sweep(ctx, r, "dup", "dup", "dup"))(t))
	assert.Equal(t, int64(10), testkit.Levels(t, r, "dup").Available)
}

// TestTwoRunsHoldsAcrossKill9: two service instances (two clients, two Reservers, each
// with its own Run) share one Sentinel deployment and one store; they sell, and take holds of
// 1.5 s of which half are confirmed, while the primary is killed with -9 (two replicas,
// min-replicas-to-write 1, WithReplicaAck(1, 1s)). Both must fence; one pass lifts both; after
// the holds' deadlines, a sweep, a drain and a pass: no live hold is left, every acknowledged
// sale and confirm is in the ledger or the store, nothing is applied twice, the store agrees.
func TestTwoRunsHoldsAcrossKill9(t *testing.T) {
	d, ctx, opts := safeDeployment(t)
	r1 := reserver(t, d.Client(t), opts...)
	r2 := reserver(t, d.Client(t), opts...)
	st := memstore.New()
	const sku = "k9-two"
	faultLoad(t, ctx, r1, st, sku, 1_000_000)
	rec := must(stockops.NewReconciler(r1, st, nil))(t)
	faultPass(t, ctx, rec, 10*time.Second)
	runCtx, stopRun := context.WithCancel(ctx)
	var runs sync.WaitGroup
	for _, r := range []*stock.Reserver{r1, r2} {
		runs.Go(func() {
			_ = r.Run(runCtx, stock.RunOptions{Store: st, GuardInterval: 100 * time.Millisecond, SweepInterval: 200 * time.Millisecond,
				Reconcile: &stock.ReconcileOptions{Interval: time.Hour},
				Relay:     &stock.RelayOptions{Batch: 16, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Lease: 3 * time.Second}})
		})
	}
	acked := &acked{}
	var replayAcks, fenced1, fenced2 atomic.Int64
	stop1 := trafficOfFaults(ctx, r1, sku, "one", 2, acked, &replayAcks, &fenced1)
	stop2 := trafficOfFaults(ctx, r2, sku, "two", 1, acked, &replayAcks, &fenced2)
	// Holds on r2: confirm the even ones, let the odd ones expire.
	hctx, stopHolds := context.WithCancel(ctx)
	holdsDone := make(chan struct{})
	var confirmed, heldAcked atomic.Int64
	go func() {
		defer close(holdsDone)
		for i := 0; hctx.Err() == nil; i++ {
			id := fmt.Sprintf("hold-%d", i)
			_, err := r2.Hold(hctx, req(sku, id, "", 1), 1500*time.Millisecond)
			if err != nil {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			heldAcked.Add(1)
			if i%2 == 0 {
				if _, err := r2.Confirm(hctx, sku, id); err == nil {
					confirmed.Add(1)
					acked.add(sku, id, 1)
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	time.Sleep(2500 * time.Millisecond)
	old := must(d.Primary())(t)
	before1, before2 := fenced1.Load(), fenced2.Load()
	old.Kill()
	d.ReplicaProxy().ResetAll()
	require.NoError(t, testkit.Err(d.WaitPrimary(old, 20*time.Second)), "no failover after kill -9")
	time.Sleep(1500 * time.Millisecond)
	if fenced1.Load() == before1 || fenced2.Load() == before2 {
		t.Errorf("after the failover, ErrFailover answers: instance one %d, instance two %d: both must fence",
			fenced1.Load()-before1, fenced2.Load()-before2)
	}
	faultPass(t, ctx, rec, 15*time.Second)
	// Both instances sell again after the one pass.
	for i, r := range []*stock.Reserver{r1, r2} {
		ok := false
		for start := time.Now(); time.Since(start) < 5*time.Second; {
			_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("after-%d-%d", i, start.UnixNano()), Qty: 1})
			if err == nil {
				ok = true
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		assert.True(t, ok, "instance %d still does not sell 5 s after a pass recorded the epoch", i+1)
	}
	stopHolds()
	<-holdsDone
	stop1()
	stop2()
	time.Sleep(2 * time.Second) // every remaining hold past its deadline; the sweepers release them
	stopRun()
	runs.Wait()
	assert.NoError(t, testkit.Err(stockops.Sweep(ctx, r1, sku)), "sweep")
	faultDrain(t, ctx, r1, st, sku)
	faultPass(t, ctx, rec, 15*time.Second)
	assert.Zero(t, must(r1.Levels(ctx, sku))(t).Held, "units still held after every hold's deadline and a sweep")
	t.Logf("acknowledged %d (holds %d, confirmed %d), bare replays after ErrNotReplicated %d, fenced answers %d/%d",
		acked.count(), heldAcked.Load(), confirmed.Load(), replayAcks.Load(), fenced1.Load(), fenced2.Load())
	audit(t, ctx, r1, st, acked)
}

// Holds on the queue path: holds confirmed, cancelled and expired (by Sweep), mixed with deducts
// and restores, published through a batch publisher and consumed with duplicates by concurrent
// consumers. The store must count confirmed holds as sold and nothing else of a hold.
func TestHoldsOnQueuePath(t *testing.T) {
	ctx, e, st, rng := setup(t, 13)
	skus := []string{"h:1", "h:2"}
	initial := map[string]int64{}
	for _, sku := range skus {
		initial[sku] = 200
		loadBoth(t, e.Reserver, st, sku, 200)
	}
	sold := map[string]int64{}
	var expiring []struct{ sku, id string }
	for i := 0; i < 200; i++ {
		sku := skus[rng.IntN(len(skus))]
		id := fmt.Sprintf("h%d", i)
		q := int64(1 + rng.IntN(3))
		switch p := rng.IntN(5); p {
		case 0: // a deduct
			must(e.Reserver.Deduct(ctx, req(sku, id, "", q)))(t)
			sold[sku] += q
		case 1, 2: // a hold, confirmed
			must(e.Reserver.Hold(ctx, req(sku, id, "", q), time.Hour))(t)
			must(e.Reserver.Confirm(ctx, sku, id))(t)
			sold[sku] += q
			if p == 2 { // then given back
				must(e.Reserver.Restore(ctx, sku, id))(t)
				sold[sku] -= q
			}
		case 3: // a hold, cancelled
			must(e.Reserver.Hold(ctx, req(sku, id, "", q), time.Hour))(t)
			must(e.Reserver.Cancel(ctx, sku, id))(t)
		case 4: // a hold left to expire
			must(e.Reserver.Hold(ctx, req(sku, id, "", q), time.Minute))(t)
			expiring = append(expiring, struct{ sku, id string }{sku, id})
		}
	}
	e.Advance(2 * time.Minute)
	require.NoError(t, testkit.Err(stockops.Sweep(ctx, e.Reserver)))
	for _, x := range expiring { // a late confirm of an expired hold changes nothing
		assert.Error(t, testkit.Err(e.Reserver.Confirm(ctx, x.sku, x.id)), "Confirm of expired hold %s/%s", x.sku, x.id)
	}
	q := &relayQueue{}
	rl := must(stockops.NewRelay(e.Reserver, nil, q, &stock.RelayOptions{Batch: 8}))(t)
	drain(t, ctx, e, rl, skus)
	concurrentConsume(t, ctx, e.Reserver, st, q.take(), 2, 6, rng)
	rec := must(stockops.NewReconciler(e.Reserver, st.Store, &stock.ReconcileOptions{DryRun: true}))(t)
	for _, sku := range skus {
		lv, _ := e.Reserver.Levels(ctx, sku)
		rem, _ := st.Remaining(ctx, sku)
		if want := initial[sku] - sold[sku]; rem != want || lv.Available != want || lv.Held != 0 {
			t.Errorf("item %q: store %d, Redis available %d held %d, acknowledged answers %d", sku, rem, lv.Available, lv.Held, want)
		}
		rp := must(rec.Item(ctx, sku))(t)
		if rp.Pending != 0 || rp.Published != 0 || rp.InFlight != 0 || rp.Drift != 0 {
			t.Errorf("item %q: %s", sku, rp)
		}
	}
	assert.LessOrEqual(t, st.MaxApplications(), 1, "an event changed the store more than once")
	st.checkOrder(t)
}

// Items loaded after Run started, names with ':' '~' and unicode, many holds due at once on
// many items (more than one sweep step), deducts, restores and confirms: every event reaches
// the store once, every hold is released at its deadline without any further call, and Run
// returns after its ctx ends with the outbox drained.
func TestRunLateItemsManyHoldsDue(t *testing.T) {
	soldOutBackends(t, func(t *testing.T, real bool, c1, c2 rueidis.Client) {
		r := testkit.NewReserver(t, c1)
		other := testkit.NewReserver(t, c2)
		store := memstore.New()
		stop := requestRun(t, r, stock.RunOptions{Store: store, SweepInterval: 50 * time.Millisecond,
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
			_, err := r.Deduct(ctx, req(skus[0], "probe", "", 1))
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
				require.NoError(t, testkit.Err(w.Hold(ctx, req(sku, fmt.Sprintf("h%d", h), "u", 1), ttl)))
				holdsTaken++
			}
			// Before the deadline nothing is released. Checked per item, right after its holds:
			// all 40 items' calls can take longer than one TTL on a loaded machine, and an
			// item whose check comes too late to mean anything is not judged.
			if l := testkit.Levels(t, r, sku); time.Since(start) < ttl-200*time.Millisecond {
				assert.Equal(t, int64(8), l.Held, "%s: held before the deadline", sku)
				checked++
			}
			require.NoError(t, testkit.Err(w.Hold(ctx, req(sku, "keep", "", 2), time.Hour)))
			require.NoError(t, testkit.Err(w.Confirm(ctx, sku, "keep")))
			for d := range 3 {
				require.NoError(t, testkit.Err(w.Deduct(ctx, req(sku, fmt.Sprintf("d%d", d), "", 1))))
			}
			require.NoError(t, testkit.Err(w.Restore(ctx, sku, "d0")))
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
		eventuallyRemaining(t, store, 15*time.Second, 26, skus...)
		// A last sale, then stop: Drain delivers it.
		for _, sku := range skus {
			require.NoError(t, testkit.Err(other.Deduct(ctx, req(sku, "last", "", 1))))
		}
		require.NoError(t, ignoreCanceled(stop()))
		for _, sku := range skus {
			assert.Equal(t, int64(25), testkit.Levels(t, r, sku).Available, sku)
			assert.Equal(t, int64(25), must(store.Remaining(ctx, sku))(t), "%s: the store after Run's drain", sku)
			p, _, err := stockops.Pending(ctx, r, sku)
			require.NoError(t, err)
			assert.Zero(t, p, "%s: outbox after Run returned", sku)
			for h := range 8 {
				assert.Equal(t, stock.StateExpired, must(r.Ledger(ctx, sku, fmt.Sprintf("h%d", h)))(t).State)
			}
		}
		assert.LessOrEqual(t, store.MaxApplications(), 1)
		_ = holdsTaken
	})
}

// TestDueHoldsReleasedByNextTake: "a hold past its deadline is released ... also by the
// item's next Deduct, Hold, Confirm or Extend (at most 64 holds per call ...), so expiry is
// prompt even with no sweeper". On a split item a take in another bucket, with stock to spare,
// must release the due holds as on a plain item.
func TestDueHoldsReleasedByNextTake(t *testing.T) {
	each(t, []stock.Option{split(4)}, func(t *testing.T, e *requestEnv) {
		for _, sku := range []string{"plain-due", "split-due"} {
			require.NoError(t, e.r.Load(ctx, sku, 100))
			for i := range 8 {
				require.NoError(t, testkit.Err(e.r.Hold(ctx, req(sku, fmt.Sprintf("h%d", i), fmt.Sprintf("holder%d", i), 1), time.Second)))
			}
		}
		e.advance(2500 * time.Millisecond)
		for _, sku := range []string{"plain-due", "split-due"} {
			testkit.Sell(t, e.r, sku, "d", "buyer", 4)
			l := levels(t, e.r, sku)
			assert.Equal(t, int64(0), l.Held, "%s: the due holds are released by the item's next takes: %+v", sku, l)
		}
	})
}

// TestHoldsExpireUnderRun: holds on a split item expire by Run's sweeper alone.
func TestHoldsExpireUnderRun(t *testing.T) {
	each(t, []stock.Option{split(3)}, func(t *testing.T, e *requestEnv) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		require.NoError(t, e.r.Load(ctx, "hrun", 30))
		for i := range 12 {
			require.NoError(t, testkit.Err(e.r.Hold(ctx, req("hrun", fmt.Sprintf("h%d", i), fmt.Sprintf("u%d", i%4), 2), time.Second)))
		}
		done := make(chan error, 1)
		go func() { done <- e.r.Run(ctx, stock.RunOptions{SweepInterval: 100 * time.Millisecond}) }()
		e.advance(2 * time.Second)
		require.Eventually(t, func() bool {
			l, err := e.r.Levels(context.Background(), "hrun")
			return err == nil && l.Held == 0
		}, 20*time.Second, 50*time.Millisecond)
		cancel()
		<-done
		assert.Equal(t, stock.Levels{Available: 30, Loaded: 30}, levels(t, e.r, "hrun"))
		for i := range 12 {
			assert.Equal(t, stock.StateExpired, must(e.r.Ledger(context.Background(), "hrun", fmt.Sprintf("h%d", i)))(t).State)
		}
	})
}
