package stock_test

import (
	"context"
	"errors"
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

// TestRun: one call does the background work. While it runs, sales reach the Store and due
// holds go back; when its context ends, it delivers what the last sales left in the outbox
// and returns the context's error.
func TestRun(t *testing.T) {
	eachReserver(t, nil, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		db := loadBoth(t, r, map[string]int64{"A": 10})

		run, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- r.Run(run, stock.RunOptions{Store: db, SweepInterval: 10 * time.Millisecond,
				Relay: &stock.RelayOptions{Poll: 5 * time.Millisecond}})
		}()
		// On a real Redis, a guard added to a live deployment fences sales until Run's first
		// reconcile pass has compared Redis with the Store (see FailoverGuard).
		// The guard's first check runs beside the first sales, so a sale may pass before it
		// fences: retry both until the fence is lifted (a retry of o1 is a replay).
		var err error
		require.Eventually(t, func() bool {
			if _, err = r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 2}); err != nil {
				return !errors.Is(err, stock.ErrFailover)
			}
			_, err = r.Hold(ctx, stock.Request{SKU: "A", ID: "h1", Qty: 3}, 20*time.Millisecond)
			return !errors.Is(err, stock.ErrFailover)
		}, 10*time.Second, 5*time.Millisecond)
		require.NoError(t, err)
		redistest.Sleep(c, 30*time.Millisecond) // past the hold's deadline
		require.Eventually(t, func() bool {
			lv, err := r.Levels(ctx, "A")
			n, _ := db.Remaining(ctx, "A")
			return err == nil && lv.Held == 0 && lv.Available == 8 && n == 8
		}, 10*time.Second, 10*time.Millisecond, "the relay applies the sale and the sweeper releases the hold")

		// Sales just before the end are delivered by the drain. On a loaded machine o1 and h1
		// can both pass before the guard's first check fences, so these sales may meet the
		// fence too: each is retried (a repeat of its id is a replay) until the pass lifts it.
		for _, id := range []string{"o2", "o3", "o4"} {
			require.Eventually(t, func() bool {
				_, err = r.Deduct(ctx, stock.Request{SKU: "A", ID: id, Qty: 1})
				return !errors.Is(err, stock.ErrFailover)
			}, 10*time.Second, 5*time.Millisecond)
			require.NoError(t, err)
		}
		stop()
		select {
		case err := <-done:
			assert.ErrorIs(t, err, context.Canceled)
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return after its context ended")
		}
		assert.Equal(t, int64(5), remaining(t, db, "A"), "every sale reached the store")
		pending, dead, err := stockops.Pending(ctx, r, "A")
		require.NoError(t, err)
		assert.Zero(t, pending+dead)
	})
}

// failingStore refuses every Apply with a transport error.
type failingStore struct {
	stock.Store
	calls atomic.Int64
}

var errDown = errors.New("database down")

func (s *failingStore) Apply(context.Context, stock.Event) error {
	s.calls.Add(1)
	return errDown
}

// TestRunReturnsFirstError: a loop's error is logged and retried while Run runs, and returned
// when its context ends; bad options are an ErrInvalid error at once.
func TestRunReturnsFirstError(t *testing.T) {
	_, c := redistest.Miniredis(t)
	r := newReserver(t, c)
	st := &failingStore{Store: memstore.New()}
	require.NoError(t, r.Load(ctx, "A", 3))
	must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1}))

	run, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	defer stop()
	go func() { // the miniredis clock stands still: move it, so that the relay's backoff passes
		for run.Err() == nil {
			redistest.Sleep(c, 10*time.Millisecond)
			time.Sleep(time.Millisecond)
		}
	}()
	err := r.Run(run, stock.RunOptions{Store: st, Drain: -1, Reconcile: &stock.ReconcileOptions{Items: []string{"A"}},
		Relay: &stock.RelayOptions{Poll: time.Millisecond, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond}})
	assert.ErrorIs(t, err, errDown)
	assert.Greater(t, st.calls.Load(), int64(1), "the relay retried while Run ran")

	for _, o := range []stock.RunOptions{
		{Store: st, Relay: &stock.RelayOptions{Batch: -1}},
		{Store: st, Reconcile: &stock.ReconcileOptions{RepairLimit: -1}},
		{Publisher: stock.PublisherFunc(func(context.Context, stock.Event) error { return nil }), Relay: &stock.RelayOptions{Items: []string{"a{b}"}}},
	} {
		start := time.Now()
		err := r.Run(ctx, o)
		assert.ErrorIs(t, err, stock.ErrInvalid)
		assert.Less(t, time.Since(start), 5*time.Second)
	}
}

// TestRelayOptionsDefaults: a zero field takes its default, and one backoff bound given alone
// moves the other's default rather than failing.
func TestRelayOptionsDefaults(t *testing.T) {
	_, c := redistest.Miniredis(t)
	r := newReserver(t, c)
	db := memstore.New()
	for _, o := range []*stock.RelayOptions{nil, {}, {MinBackoff: 2 * time.Minute}, {MaxBackoff: time.Millisecond}, {Lease: time.Millisecond}} {
		assert.NoError(t, testkit.Err(stockops.NewRelay(r, db, nil, o)), "%+v", o)
	}
	for _, o := range []*stock.RelayOptions{{Batch: 10001}, {Lease: time.Microsecond}, {MinBackoff: time.Second, MaxBackoff: time.Millisecond}, {Poll: -1}} {
		assert.ErrorIs(t, testkit.Err(stockops.NewRelay(r, db, nil, o)), stock.ErrInvalid, "%+v", o)
	}
	for _, o := range []*stock.ReconcileOptions{nil, {}, {Retention: -1}, {Interval: time.Second}, {Interval: -1}} {
		assert.NoError(t, testkit.Err(stockops.NewReconciler(r, db, o)), "%+v", o)
	}
	for _, o := range []*stock.ReconcileOptions{{RepairLimit: -5}, {Items: []string{""}}} {
		assert.ErrorIs(t, testkit.Err(stockops.NewReconciler(r, db, o)), stock.ErrInvalid, "%+v", o)
	}
	rc := newReconciler(t, r, db, &stock.ReconcileOptions{Interval: -1})
	assert.ErrorIs(t, rc.Run(context.Background()), stock.ErrInvalid, "Reconciler.Run needs a positive interval")
}

// TestRunReconcileOff: a negative ReconcileOptions.Interval turns Run's reconcile passes off, as
// a negative interval of RunOptions turns its loop off; the relay still delivers.
func TestRunReconcileOff(t *testing.T) {
	_, c := redistest.Miniredis(t)
	var passes atomic.Int64
	r := newReserver(t, c, stock.WithObserver(stock.ObserverFunc(func(_ context.Context, o stock.Observation) {
		if o.Op == "reconcile" {
			passes.Add(1)
		}
	})))
	db := loadBoth(t, r, map[string]int64{"A": 10})
	must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1}))
	for _, interval := range []time.Duration{-1, 0} {
		run, stop := context.WithTimeout(ctx, 300*time.Millisecond)
		err := r.Run(run, stock.RunOptions{Store: db, Reconcile: &stock.ReconcileOptions{Interval: interval},
			Relay: &stock.RelayOptions{Poll: 5 * time.Millisecond}})
		stop()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		if interval < 0 {
			assert.Zero(t, passes.Load(), "no pass with a negative interval")
			assert.Equal(t, int64(9), remaining(t, db, "A"), "the relay delivered the sale")
		} else {
			assert.Positive(t, passes.Load(), "the default runs a pass at once")
		}
	}
}

// stuckStore is a Store whose Apply ignores its context and returns only when release is
// closed, as a database driver stuck on a dead connection may.
type stuckStore struct {
	*memstore.Store
	entered chan struct{}
	release chan struct{}
	once    atomic.Bool
}

func (s *stuckStore) Apply(ctx context.Context, ev stock.Event) error {
	if s.once.CompareAndSwap(false, true) {
		close(s.entered)
	}
	<-s.release
	return s.Store.Apply(ctx, ev)
}

// TestRunBoundedWithStuckStore: Run returns at the latest Drain after its context ends even
// when a Store call ignores its context, and says so; the event stays in the outbox.
func TestRunBoundedWithStuckStore(t *testing.T) {
	_, c := redistest.Miniredis(t)
	r := newReserver(t, c)
	db := &stuckStore{Store: memstore.New(), entered: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(func() { close(db.release) })
	require.NoError(t, db.Load(ctx, "A", 10))
	require.NoError(t, r.Load(ctx, "A", 10))
	_, err := r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1})
	require.NoError(t, err)

	run, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- r.Run(run, stock.RunOptions{Store: db, Drain: 100 * time.Millisecond,
			Relay: &stock.RelayOptions{Poll: 5 * time.Millisecond}})
	}()
	select {
	case <-db.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the relay never called the Store")
	}
	stop()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second): // far above Drain: a hang, not a slow machine
		t.Fatal("Run did not return while a Store call ignored its context")
	}
	require.ErrorIs(t, err, context.Canceled)
	assert.ErrorContains(t, err, "still running")
	pending, _, err := stockops.Pending(ctx, r, "A")
	require.NoError(t, err)
	assert.Equal(t, int64(1), pending, "the event stays in the outbox")
}

// touchStore counts every call made to it.
type touchStore struct{ calls atomic.Int64 }

func (s *touchStore) Apply(context.Context, stock.Event) error {
	s.calls.Add(1)
	return nil
}

func (s *touchStore) Remaining(context.Context, string) (int64, error) {
	s.calls.Add(1)
	return 0, stock.ErrNotLoaded
}

func (s *touchStore) Records(context.Context, string, []string) (map[string]stock.Record, error) {
	s.calls.Add(1)
	return nil, nil
}

// TestRunOneAtATime: of the Run calls of one Reserver made at once, one runs and every other is
// refused at once with ErrRunning; a Run called while one runs is refused too, and starts
// nothing (its Store is never called, though a reconciler's first pass runs at once). Once the
// running Run returned, Run runs again.
func TestRunOneAtATime(t *testing.T) {
	eachReserver(t, nil, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		opts := stock.RunOptions{SweepInterval: 10 * time.Millisecond}
		const callers = 8
		for round := range 2 {
			run, stop := context.WithCancel(ctx)
			results := make(chan error, callers)
			for range callers {
				go func() { results <- r.Run(run, opts) }()
			}
			for range callers - 1 {
				select {
				case err := <-results:
					require.ErrorIs(t, err, stock.ErrRunning, "round %d", round)
					assert.ErrorContains(t, err, "running")
				case <-time.After(20 * time.Second):
					stop()
					t.Fatalf("round %d: a Run called while another runs did not return", round)
				}
			}
			var st touchStore
			late, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := r.Run(late, stock.RunOptions{Store: &st})
			cancel()
			require.ErrorIs(t, err, stock.ErrRunning, "round %d: a Run called while another runs", round)
			stop()
			select {
			case err := <-results:
				assert.ErrorIs(t, err, context.Canceled, "round %d: the one Run that ran", round)
			case <-time.After(30 * time.Second):
				t.Fatalf("round %d: Run did not return after its context ended", round)
			}
			assert.Zero(t, st.calls.Load(), "round %d: the refused Run started nothing", round)
		}
	})
}

// TestRunOptionsValidate: Validate answers what Run answers at once, for options Run refuses
// (an ErrInvalid, before anything runs) and for options it accepts (nil, where Run runs until
// its context ends).
func TestRunOptionsValidate(t *testing.T) {
	_, c := redistest.Miniredis(t)
	r := newReserver(t, c)
	db := memstore.New()
	pub := stock.PublisherFunc(func(context.Context, stock.Event) error { return nil })
	for _, tc := range []struct {
		name    string
		opts    stock.RunOptions
		invalid bool
	}{
		{"zero", stock.RunOptions{}, false},
		{"store", stock.RunOptions{Store: db}, false},
		{"store, every option", stock.RunOptions{Store: db, Publisher: pub,
			Relay:     &stock.RelayOptions{Items: []string{"a"}, Batch: 10, Lease: time.Second, Poll: time.Millisecond},
			Reconcile: &stock.ReconcileOptions{Items: []string{"a"}, Retention: -1, Interval: -1}}, false},
		{"relay batch", stock.RunOptions{Store: db, Relay: &stock.RelayOptions{Batch: 10001}}, true},
		{"relay poll", stock.RunOptions{Publisher: pub, Relay: &stock.RelayOptions{Poll: -1}}, true},
		{"relay backoff", stock.RunOptions{Store: db, Relay: &stock.RelayOptions{MinBackoff: time.Second, MaxBackoff: time.Millisecond}}, true},
		{"relay item", stock.RunOptions{Store: db, Relay: &stock.RelayOptions{Items: []string{"a{b}"}}}, true},
		{"repair limit", stock.RunOptions{Store: db, Reconcile: &stock.ReconcileOptions{RepairLimit: -1}}, true},
		{"reconcile item", stock.RunOptions{Store: db, Reconcile: &stock.ReconcileOptions{Items: []string{""}}}, true},
		// Run makes no reconciler without a Store, so it reads no reconcile option; nor relay
		// options without a Store or a Publisher.
		{"reconcile options without a store", stock.RunOptions{Publisher: pub, Reconcile: &stock.ReconcileOptions{RepairLimit: -1}}, false},
		{"relay options without a relay", stock.RunOptions{Relay: &stock.RelayOptions{Batch: -1}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			verr := tc.opts.Validate()
			ctx, cancel := context.WithCancel(context.Background())
			if !tc.invalid {
				cancel() // a valid Run lasts until its context ends
			}
			rerr := r.Run(ctx, tc.opts)
			cancel()
			if tc.invalid {
				assert.ErrorIs(t, verr, stock.ErrInvalid)
				assert.ErrorIs(t, rerr, stock.ErrInvalid)
				assert.Equal(t, verr.Error(), rerr.Error(), "Validate and Run give the same error")
			} else {
				assert.NoError(t, verr)
				assert.True(t, errors.Is(rerr, context.Canceled) && !errors.Is(rerr, stock.ErrInvalid), "Run accepted the options: %v", rerr)
			}
		})
	}
}
