package contract_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
	"github.com/stockres/stock/stocktest"
)

// settledSale loads "ret" with 10 units in Redis and in st, deducts one unit of it as "d1" and
// relays the sale to st: a settled ledger entry for a retention to trim.
func settledSale(t *testing.T, r *stock.Reserver, st *memstore.Store) {
	t.Helper()
	loadBoth(t, r, st, "ret", 10)
	deductEach(t, r, stock.Request{SKU: "ret", Qty: 1}, "d1")
	rl := newRelay(t, r, st, nil, nil)
	testkit.Drain(t, rl)
}

// retentionPass makes one pass of a new Reconciler with retention over the one item there is,
// and returns its report.
func retentionPass(t *testing.T, r *stock.Reserver, st stock.Store, retention time.Duration) stockops.Report {
	t.Helper()
	rec := newReconciler(t, r, st, &stock.ReconcileOptions{Retention: retention})
	reps, err := rec.Once(context.Background())
	require.NoError(t, err)
	require.Len(t, reps, 1)
	return reps[0]
}

// ReconcileOptions.Retention: "The default is 24h; a negative Retention never trims." Under
// stocktest, whose "one clock moves everything the Reserver depends on", a pass after Advance past
// the retention trims the settled entry, and not before. (It once did not: the retention was
// measured on the process's clock, which Advance did not reach; stocktest now passes its clock
// to the Reserver with stock.WithClock.)
func TestRetentionBounds(t *testing.T) {
	for _, tc := range []struct {
		name      string
		retention time.Duration
		advance   time.Duration
		trimmed   bool
	}{
		{"default before 24h", 0, 23 * time.Hour, false},
		{"default after 24h", 0, 25 * time.Hour, true},
		{"negative never", -1, 1000 * time.Hour, false},
		{"1h after 2h", time.Hour, 2 * time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := stocktest.New(t)
			r := e.Reserver
			st := memstore.New()
			settledSale(t, r, st)
			e.Advance(tc.advance)
			rep := retentionPass(t, r, st, tc.retention)
			_, err := r.Ledger(context.Background(), "ret", "d1")
			if tc.trimmed {
				assert.Equal(t, 1, rep.Trimmed, "%s", rep)
				assert.ErrorIs(t, err, stock.ErrUnknownID)
			} else {
				assert.Equal(t, 0, rep.Trimmed, "%s", rep)
				assert.NoError(t, err)
			}
		})
	}
}

// Retention on real time: a pass after the retention trims the settled entry.
func TestRetentionRealTime(t *testing.T) {
	testkit.ParallelOnMiniredis(t)
	testkit.EachBackend(t, func(t *testing.T, c rueidis.Client) {
		r := testkit.NewReserver(t, c)
		st := memstore.New()
		settledSale(t, r, st)
		time.Sleep(1500 * time.Millisecond)
		rep := retentionPass(t, r, st, -1)
		assert.Equal(t, 0, rep.Trimmed, "a negative Retention never trims: %s", rep)
		rep = retentionPass(t, r, st, time.Second)
		assert.Equal(t, 1, rep.Trimmed, "%s", rep)
		_, err := r.Ledger(context.Background(), "ret", "d1")
		assert.ErrorIs(t, err, stock.ErrUnknownID)
	})
}

// Old messages come back after their ledger entries were trimmed (a queue that redelivers a dead
// consumer's messages a day late, after the reconciler's retention): they are repeats of events the
// store applied. Consume must answer them without changing anything: no store change, nothing
// dead-lettered or held back forever, and no item left for an operator.
func TestRedeliveryAfterRetention(t *testing.T) {
	ctx, e, st, rng := setup(t, 14)
	skus := []string{"ret:1", "ret:2"}
	_, msgs := consumedTraffic(t, ctx, e, st, rng, skus, 120)
	// The retention is measured on a clock Advance does not move (30h of Advance with a 1h
	// Retention trims nothing), so a tiny Retention and a few real milliseconds stand for a day.
	rec := newReconciler(t, e.Reserver, st.Store, &stock.ReconcileOptions{Retention: time.Millisecond})
	e.Advance(time.Second)
	time.Sleep(5 * time.Millisecond)
	trimmed := 0
	for i := 0; i < 3; i++ {
		reps, err := rec.Once(ctx)
		require.NoError(t, err)
		for _, rp := range reps {
			trimmed += rp.Trimmed
		}
	}
	require.NotZero(t, trimmed, "the reconciler trimmed no ledger entry: the scenario did not happen")
	before := map[string]int64{}
	for _, sku := range skus {
		before[sku], _ = st.Remaining(ctx, sku)
	}
	rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	answers := map[string]int{}
	for _, ev := range msgs {
		err := stock.Consume(ctx, e.Reserver, st, ev)
		switch {
		case err == nil:
			answers["nil"]++
		case errors.Is(err, stock.ErrHeldBack):
			answers["held back"]++
		case errors.Is(err, stock.ErrInvalid):
			answers["invalid"]++
		default:
			answers[err.Error()]++
		}
	}
	assert.EqualValues(t, len(msgs), answers["nil"], "redeliveries of %d applied events after the retention answered %v; want nil for every one", len(msgs), answers)
	dry := newReconciler(t, e.Reserver, st.Store, &stock.ReconcileOptions{DryRun: true})
	for _, sku := range skus {
		rem, _ := st.Remaining(ctx, sku)
		assert.EqualValues(t, before[sku], rem, "item %q: stale redeliveries moved the store from %d to %d", sku, before[sku], rem)
		lv, _ := e.Reserver.Levels(ctx, sku)
		assert.EqualValues(t, rem, lv.Available, "item %q: Redis %d, store %d", sku, lv.Available, rem)
		rp, err := dry.Item(ctx, sku)
		require.NoError(t, err)
		assert.False(t, rp.Pending != 0 || rp.Published != 0 || rp.DeadLetters != 0 || rp.InFlight != 0 || rp.Drift != 0 || rp.NeedsHuman != "", "item %q after the stale redeliveries: %s", sku, rp)
	}
	assert.LessOrEqual(t, st.MaxApplications(), 1, "an event changed the store more than once")
}

var outsideRet = &stock.ReconcileOptions{Retention: 24 * time.Hour}

// ReconcileOptions.Retention counts from when an entry was settled, not from when it was made: a
// pass keeps an entry that a late cancel, expiry, restore, refusal or extension settled less than
// the retention ago, so that a repeat of its id still gets the answer it got (ErrRestored,
// ErrExpired, a replay), and trims it once the retention has passed since then. Each case runs its
// steps on a moved clock up to the first pass (inside the retention), checks that the kept ids are
// not trimmed and that their repeats answer as before, then (where later is set) moves the clock
// past the retention, passes again and checks that they are trimmed; and checks the levels.
func TestRetentionKeepsLateSettledEntries(t *testing.T) {
	cart := stock.Cart{ID: "c1", User: "u", Lines: []stock.Line{{SKU: "a", Qty: 1}, {SKU: "b", Qty: 2}}}
	for _, tc := range []struct {
		name string
		// before (when set), then steps (for outsideEnv.run), run up to the first pass, which
		// opts (outsideRet when nil) makes.
		before func(t *testing.T, e *outsideEnv)
		steps  string
		opts   *stock.ReconcileOptions
		// kept are the ids of item "a" the first pass must not trim (and the pass after later
		// must).
		kept []string
		// repeats are the calls made within the retention, after the first pass (see
		// outsideEnv.expect), and more (when set) after them.
		repeats string
		more    func(t *testing.T, e *outsideEnv)
		later   time.Duration
		want    []outsideLevels
	}{
		{
			// At 71 h: 23 h past the deadline; later, 25 h past it.
			name:    "long hold cancelled late",
			steps:   "load a 10; hold a h1 1 48h; advance 30h; cancel a h1; relay; advance 41h",
			kept:    []string{"h1"},
			repeats: "restored hold a h1 1",
			later:   2 * time.Hour,
			want:    []outsideLevels{{"a", 10, 0, 0}},
		},
		{
			// At 71 h: 23 h past the deadline; later, 25 h past it.
			name:    "expired long hold",
			steps:   "load a 10; hold a h1 1 48h; advance 49h; sweep; relay; advance 22h",
			kept:    []string{"h1"},
			repeats: "expired hold a h1 1; expired confirm a h1",
			later:   2 * time.Hour,
			want:    []outsideLevels{{"a", 10, 0, 0}},
		},
		{
			// At 43 h: 20 h after the restore; later, 25 h after it.
			name:    "late restore",
			steps:   "load a 10; deduct a d1 2; relay; advance 23h; restore a d1; relay; advance 20h",
			kept:    []string{"d1"},
			repeats: "restored deduct a d1 2; replay restore a d1",
			later:   5 * time.Hour,
			want:    []outsideLevels{{"a", 10, 0, 0}},
		},
		{
			// 20 h after the restore; later, 25 h after it.
			name:    "confirmed hold restored late",
			steps:   "load a 10; hold a h1 3; confirm a h1; relay; advance 30h; restore a h1; relay; advance 20h",
			kept:    []string{"h1"},
			repeats: "restored hold a h1 3; restored confirm a h1; replay restore a h1",
			later:   5 * time.Hour,
			want:    []outsideLevels{{"a", 10, 0, 0}},
		},
		{
			// The store refuses the sale, given back at 23 h; the pass 20 h after the refusal.
			name: "store refusal given back late",
			before: func(t *testing.T, e *outsideEnv) {
				require.NoError(t, e.r.Load(e.ctx, "a", 10))
				require.NoError(t, e.store.Load(e.ctx, "a", 1))
				e.run("deduct a d1 2; advance 23h")
				st := e.relay()
				require.EqualValues(t, 1, st.Refused, "relay stats %+v, want one refusal", st)
			},
			steps:   "relay; advance 20h",
			opts:    &stock.ReconcileOptions{Retention: 24 * time.Hour, RepairLimit: 1000},
			kept:    []string{"d1"},
			repeats: "restored deduct a d1 2",
		},
		{
			name: "tombstone and retry refusal",
			before: func(t *testing.T, e *outsideEnv) {
				e.run("load a 1; deduct a d0 1")
				require.ErrorIs(t, testkit.Err(e.r.Restore(e.ctx, "a", "t1")), stock.ErrUnknownID, "restore of unknown")
				require.ErrorIs(t, testkit.Err(e.r.Deduct(e.ctx, stock.Request{SKU: "a", ID: "x1", User: "u", Qty: 1, Retry: true})), stock.ErrSoldOut, "retry on sold out")
			},
			steps: "relay; advance 23h",
			kept:  []string{"t1", "x1"},
			// The tombstoned id, then the refused retry once a unit is free again.
			repeats: "restored deduct a t1 1 u; ok restore a d0; soldout deduct a x1 1 u; ok relay",
			later:   2 * time.Hour,
			want:    []outsideLevels{{"a", 1, 0, 0}},
		},
		{
			// At 90.5 h: 18 h past the extended deadline.
			name:    "extended hold cancelled",
			steps:   "load a 10; hold a h1 1; advance 30m; extend a h1 72h; advance 50h; cancel a h1; relay; advance 40h",
			kept:    []string{"h1"},
			repeats: "restored hold a h1 1",
			want:    []outsideLevels{{"a", 10, 0, 0}},
		},
		{
			name: "long hold cart cancelled",
			before: func(t *testing.T, e *outsideEnv) {
				e.run("load a 10; load b 10")
				e.mustCart(e.r.HoldMany(e.ctx, cart, 48*time.Hour))
				e.advance(30 * time.Hour)
				require.NoError(t, testkit.Err(e.r.CancelMany(e.ctx, "c1", "a", "b")))
			},
			steps: "relay; advance 41h",
			more: func(t *testing.T, e *outsideEnv) {
				require.NoError(t, testkit.Err(stockops.RecoverCarts(e.ctx, e.r, 5*time.Minute)))
				_, err := e.r.HoldMany(e.ctx, cart, time.Hour)
				var ce *stock.CartError
				assert.False(t, !errors.As(err, &ce) || !errors.Is(err, stock.ErrRestored), "repeat of a cancelled hold cart within retention: %v, want a *CartError wrapping ErrRestored", err)
			},
			want: []outsideLevels{{"a", 10, 0, 0}, {"b", 10, 0, 0}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := outsideMini(t)
			opts := tc.opts
			if opts == nil {
				opts = outsideRet
			}
			if tc.before != nil {
				tc.before(t, e)
			}
			e.run(tc.steps)
			e.pass(opts)
			for _, id := range tc.kept {
				require.False(t, e.trimmed("a", id), "%s trimmed within the retention", id)
			}
			e.expect(tc.repeats)
			if tc.more != nil {
				tc.more(t, e)
			}
			if tc.later > 0 {
				e.advance(tc.later)
				e.pass(opts)
				for _, id := range tc.kept {
					assert.True(t, e.trimmed("a", id), "%s kept past the retention", id)
				}
			}
			e.wantAll(tc.want)
		})
	}
}
