package systest_test

// Attacks on the public API as changed by the API change: Reserver.Run and RunOptions, the option
// structs of NewRelay and NewReconciler, Levels, Sweep, CloseItem/ReopenItem, Record.Status, and
// the stocktest kit (New/Advance, TestStore). Every test asserts a sentence of the package docs;
// each names it.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
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
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
	"github.com/stockres/stock/stocktest"
)

// runAsync starts r.Run(ctx, opts) and returns its cancel and a channel with its result.
func runAsync(r *stock.Reserver, opts stock.RunOptions) (context.CancelFunc, <-chan error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, opts) }()
	return cancel, done
}

// waitRun waits up to d for Run's result.
func waitRun(t *testing.T, done <-chan error, d time.Duration) (error, bool) {
	t.Helper()
	select {
	case err := <-done:
		return err, true
	case <-time.After(d):
		return nil, false
	}
}

// eventually polls cond every 10ms for up to d.
func eventually(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if cond() {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return cond()
}

// "Options that are out of range are an ErrInvalid error at once." RelayOptions.Batch is "at
// most 10,000".
func TestAttack14RunOutOfRangeOptionsInvalidAtOnce(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		r := newReserver(t, c)
		st := memstore.New()
		for name, o := range map[string]stock.RunOptions{
			"batch 10001": {Store: st, Relay: &stock.RelayOptions{Batch: 10001}},
			"batch -1":    {Store: st, Relay: &stock.RelayOptions{Batch: -1}},
			"lease -1s":   {Store: st, Relay: &stock.RelayOptions{Lease: -time.Second}},
		} {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			start := time.Now()
			err := r.Run(ctx, o)
			cancel()
			assert.ErrorIs(t, err, stock.ErrInvalid, "%s", name)
			assert.Less(t, time.Since(start), time.Second, "%s: an ErrInvalid error at once", name)
		}
	})
}

// NewRelay: "Either may be nil, not both." RelayOptions.Batch: "at most 10,000".
func TestAttack14NewRelayBounds(t *testing.T) {
	e := stocktest.New(t)
	st := memstore.New()
	_, err := stockops.NewRelay(e.Reserver, nil, nil, nil)
	assert.Error(t, err, "NewRelay with neither Store nor Publisher")
	_, err = stockops.NewRelay(e.Reserver, st, nil, &stock.RelayOptions{Batch: 10001})
	assert.Error(t, err, "Batch above 10,000")
	_, err = stockops.NewRelay(e.Reserver, st, nil, &stock.RelayOptions{Batch: 10000})
	assert.NoError(t, err, "Batch of 10,000")
	_, err = stockops.NewRelay(e.Reserver, st, nil, &stock.RelayOptions{})
	assert.NoError(t, err, "zero options take the defaults")
	_, err = stockops.NewReconciler(e.Reserver, st, &stock.ReconcileOptions{Retention: -1})
	assert.NoError(t, err, "a negative Retention never trims: it is valid")
	_, err = stockops.NewReconciler(e.Reserver, st, nil)
	assert.NoError(t, err)
}

// "Without one [Store], and without a Publisher, Run only sweeps holds and recovers carts" (so
// both nil is valid); "a negative interval turns its loop off"; Run returns "ctx's error when none
// did [meet an error]".
func TestAttack14RunBothNilSweeps(t *testing.T) {
	e := stocktest.New(t)
	ctx := context.Background()
	r := e.Reserver
	require.NoError(t, r.Load(ctx, "h", 10))
	_, err := r.Hold(ctx, stock.Request{SKU: "h", ID: "a", Qty: 3}, time.Minute)
	require.NoError(t, err)
	cancel, done := runAsync(r, stock.RunOptions{SweepInterval: 10 * time.Millisecond})
	e.Advance(2 * time.Minute)
	ok := eventually(3*time.Second, func() bool { return levels(t, r, "h").Held == 0 })
	assert.True(t, ok, "Run's sweeper released the due hold: %+v", levels(t, r, "h"))
	cancel()
	err, ok = waitRun(t, done, 5*time.Second)
	require.True(t, ok, "Run returned after ctx ended")
	assert.ErrorIs(t, err, context.Canceled)

	// A negative SweepInterval turns the sweeper off: the due hold stays until something sweeps.
	_, err = r.Hold(ctx, stock.Request{SKU: "h", ID: "b", Qty: 2}, time.Minute)
	require.NoError(t, err)
	cancel, done = runAsync(r, stock.RunOptions{SweepInterval: -1})
	e.Advance(2 * time.Minute)
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, int64(2), levels(t, r, "h").Held, "a negative SweepInterval turns the sweeper off")
	cancel()
	err, ok = waitRun(t, done, 5*time.Second)
	require.True(t, ok)
	assert.ErrorIs(t, err, context.Canceled)
}

// "When ctx ends, Run stops the loops, lets the relay deliver what is due (see RunOptions.Drain),
// and returns ... ctx's error": with a ctx cancelled before the call, the events already in the
// outbox are still delivered.
func TestAttack14RunCancelledCtxStillDrains(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		st := memstore.New()
		require.NoError(t, r.Load(ctx, "cc", 10))
		require.NoError(t, st.Load(ctx, "cc", 10))
		for i := range 5 {
			_, err := r.Deduct(ctx, stock.Request{SKU: "cc", ID: fmt.Sprint("d", i), Qty: 1})
			require.NoError(t, err)
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		start := time.Now()
		err := r.Run(cctx, stock.RunOptions{Store: st})
		assert.ErrorIs(t, err, context.Canceled)
		assert.Less(t, time.Since(start), 7*time.Second, "bounded by Drain (5s)")
		assert.Equal(t, int64(0), outboxLen(t, c, "cc"), "what was due was delivered")
		rem, err := st.Remaining(ctx, "cc")
		require.NoError(t, err)
		assert.Equal(t, int64(5), rem)
	})
}

// Sales made right up to the moment ctx ends are delivered by the drain: "Run delivers the
// events that are due until none is left or Drain has passed." Items with ':' and '~' in their
// names, and names of the non-item keys, take part.
func TestAttack14RunDrainsLastSales(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		st := memstore.New()
		skus := []string{"a:b", "a", "~", "~carts", "carts", "items", "epoch", "x:l", "x", "a:b:o"}
		// Run first, on an empty Redis, so that its guard does not fence the sales (see
		// TestAttack14RunStartOnLiveDeploymentFenceLifts).
		cancel, done := runAsync(r, stock.RunOptions{Store: st, Drain: 10 * time.Second})
		time.Sleep(200 * time.Millisecond)
		for _, s := range skus {
			require.NoError(t, r.Load(ctx, s, 1000))
			require.NoError(t, st.Load(ctx, s, 1000))
		}
		var wg sync.WaitGroup
		stop := make(chan struct{})
		var n atomic.Int64
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					s := skus[(i+w)%len(skus)]
					if _, err := r.Deduct(ctx, stock.Request{SKU: s, ID: fmt.Sprintf("w%d-%d", w, i), Qty: 1}); err == nil {
						n.Add(1)
					}
				}
			}()
		}
		time.Sleep(500 * time.Millisecond)
		close(stop)
		wg.Wait()
		cancel() // right after the last sale
		err, ok := waitRun(t, done, 15*time.Second)
		require.True(t, ok, "Run returned")
		assert.ErrorIs(t, err, context.Canceled)
		var sold int64
		for _, s := range skus {
			l := levels(t, r, s)
			sold += l.Sold
			assert.Equal(t, int64(0), outboxLen(t, c, s), "%s: outbox drained", s)
			rem, err := st.Remaining(ctx, s)
			require.NoError(t, err)
			assert.Equal(t, l.Available, rem, "%s: the Store got every sale", s)
		}
		assert.Equal(t, n.Load(), sold)
		assert.LessOrEqual(t, st.MaxApplications(), 1)
		t.Logf("%d sales", sold)
	})
}

// blockingStore blocks in Apply until its context ends (a hung database honouring ctx). It is a
// plain stock.Store (memstore's ApplyBatch is not promoted), so the relay calls its Apply.
type blockingStore struct {
	onlyStore
	calls atomic.Int64
}

func (s *blockingStore) Apply(ctx context.Context, ev stock.Event) error {
	s.calls.Add(1)
	<-ctx.Done()
	return ctx.Err()
}

// "Drain bounds the relay's last delivery after ctx ends: Run delivers the events that are due
// until none is left or Drain has passed." With a Store that hangs (honouring its context), Run
// returns about Drain after ctx ends, and returns the error a loop met.
func TestAttack14RunHungStoreDrainBounded(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		st := &blockingStore{onlyStore: onlyStore{s: memstore.New()}}
		require.NoError(t, r.Load(ctx, "hung", 10))
		require.NoError(t, st.s.Load(ctx, "hung", 10))
		_, err := r.Deduct(ctx, stock.Request{SKU: "hung", ID: "d1", Qty: 1})
		require.NoError(t, err)
		cancel, done := runAsync(r, stock.RunOptions{Store: st, Drain: 500 * time.Millisecond,
			Relay: &stock.RelayOptions{Lease: time.Hour}})
		require.True(t, eventually(3*time.Second, func() bool { return st.calls.Load() > 0 }), "the relay called Apply")
		cancel()
		start := time.Now()
		err, ok := waitRun(t, done, 10*time.Second)
		require.True(t, ok, "Run returned after ctx ended with a hung Store")
		assert.Less(t, time.Since(start), 3*time.Second, "Run returned about Drain (500ms) after ctx ended")
		assert.Error(t, err)
		// The event is not lost: it is still in the outbox.
		assert.Equal(t, int64(1), outboxLen(t, c, "hung"))
	})
}

// sleepyStore ignores ctx and sleeps in Apply (a database call with no deadline); a plain
// stock.Store.
type sleepyStore struct {
	onlyStore
	d      time.Duration
	calls  atomic.Int64
	mu     sync.Mutex
	starts []time.Time // when each Apply call began
}

func (s *sleepyStore) Apply(ctx context.Context, ev stock.Event) error {
	s.calls.Add(1)
	s.mu.Lock()
	s.starts = append(s.starts, time.Now())
	s.mu.Unlock()
	time.Sleep(s.d)
	return s.s.Apply(ctx, ev)
}

// A slow store with many events due: the drain stops at Drain, not when the outbox is empty.
func TestAttack14RunDrainBoundedManyEvents(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		st := &sleepyStore{onlyStore: onlyStore{s: memstore.New()}, d: 5 * time.Millisecond}
		require.NoError(t, r.Load(ctx, "slow", 5000))
		require.NoError(t, st.s.Load(ctx, "slow", 5000))
		for i := range 1500 {
			_, err := r.Deduct(ctx, stock.Request{SKU: "slow", ID: fmt.Sprint("d", i), Qty: 1})
			require.NoError(t, err)
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		start := time.Now()
		err := r.Run(cctx, stock.RunOptions{Store: st, Drain: 300 * time.Millisecond, Relay: &stock.RelayOptions{Lease: time.Second}})
		took := time.Since(start)
		assert.ErrorIs(t, err, context.Canceled)
		assert.Less(t, took, 3*time.Second, "Drain (300ms) bounds the last delivery")
		left := outboxLen(t, c, "slow")
		rem, err := st.Remaining(ctx, "slow")
		require.NoError(t, err)
		assert.LessOrEqual(t, 1500-left, 5000-rem, "every event left the outbox only after the Store applied it")
		t.Logf("took %v, %d applied, %d left", took, st.calls.Load(), left)
		// What is left is delivered later (after the lease of the events Run claimed), once in
		// effect.
		redistest.Sleep(c, 1100*time.Millisecond)
		rl, err := stockops.NewRelay(r, st.s, nil, nil)
		require.NoError(t, err)
		drain(t, rl)
		rem, err = st.s.Remaining(ctx, "slow")
		require.NoError(t, err)
		assert.Equal(t, int64(3500), rem)
		assert.LessOrEqual(t, st.s.MaxApplications(), 1)
	})
}

// A Store that fails every event: Run "returns the first error a loop met" when ctx ends.
func TestAttack14RunReturnsLoopError(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		st := memstore.New()
		require.NoError(t, r.Load(ctx, "down", 10))
		require.NoError(t, st.Load(ctx, "down", 10))
		st.FailWith(memstore.Down)
		_, err := r.Deduct(ctx, stock.Request{SKU: "down", ID: "d1", Qty: 1})
		require.NoError(t, err)
		cancel, done := runAsync(r, stock.RunOptions{Store: st, Drain: 200 * time.Millisecond})
		time.Sleep(700 * time.Millisecond)
		cancel()
		err, ok := waitRun(t, done, 10*time.Second)
		require.True(t, ok)
		assert.ErrorIs(t, err, memstore.ErrDown, "the first error a loop met")
		assert.Equal(t, int64(1), outboxLen(t, c, "down"), "the failed event stays in the outbox")
	})
}

// "the first pass runs at once": Run's reconciler repairs drift right away, even with a long
// Interval.
func TestAttack14RunFirstReconcilePassAtOnce(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		st := memstore.New()
		require.NoError(t, r.Load(ctx, "drift", 10))
		require.NoError(t, st.Load(ctx, "drift", 10))
		st.Set("drift", 7) // the database of record has 3 fewer
		cancel, done := runAsync(r, stock.RunOptions{Store: st, Reconcile: &stock.ReconcileOptions{Interval: time.Hour}})
		defer func() { cancel(); <-done }()
		ok := eventually(5*time.Second, func() bool { return levels(t, r, "drift").Available == 7 })
		assert.True(t, ok, "the first reconcile pass ran at once: %+v", levels(t, r, "drift"))
	})
}

// Two Reservers sharing one Redis, each with its own Run on one Store: "more relays and
// reconcilers, in this process or others, may run beside it." Every sale reaches the Store once.
func TestAttack14TwoRunsShareRedis(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c1, c2 := b.Pair(t)
			r1, r2 := newReserver(t, c1), newReserver(t, c2)
			st := memstore.New()
			skus := []string{"p1", "p2", "p3"}
			opts := stock.RunOptions{Store: st, Reconcile: &stock.ReconcileOptions{Interval: 50 * time.Millisecond},
				Relay: &stock.RelayOptions{Poll: 5 * time.Millisecond, Batch: 3}}
			cancel1, done1 := runAsync(r1, opts)
			cancel2, done2 := runAsync(r2, opts)
			time.Sleep(200 * time.Millisecond)
			for _, s := range skus {
				require.NoError(t, r1.Load(ctx, s, 300))
				require.NoError(t, st.Load(ctx, s, 300))
			}
			var sold atomic.Int64
			var wg sync.WaitGroup
			for w, r := range []*stock.Reserver{r1, r2, r1, r2} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 120 {
						id := fmt.Sprintf("w%d-%d", w, i)
						s := skus[i%len(skus)]
						if _, err := r.Deduct(ctx, stock.Request{SKU: s, ID: id, Qty: 1}); err != nil {
							continue
						}
						sold.Add(1)
						if i%5 == 0 {
							_, _ = r.Restore(ctx, s, id)
						}
					}
				}()
			}
			wg.Wait()
			cancel1()
			cancel2()
			for _, d := range []<-chan error{done1, done2} {
				err, ok := waitRun(t, d, 15*time.Second)
				require.True(t, ok)
				assert.ErrorIs(t, err, context.Canceled)
			}
			for _, s := range skus {
				l := levels(t, r1, s)
				assert.Equal(t, int64(0), outboxLen(t, c1, s), "%s drained", s)
				rem, err := st.Remaining(ctx, s)
				require.NoError(t, err)
				assert.Equal(t, l.Available, rem, "%s: Redis and the Store agree", s)
			}
			assert.LessOrEqual(t, st.MaxApplications(), 1, "no event applied twice")
			t.Logf("%d sales", sold.Load())
		})
	}
}

// The queue path through Run: "With no Store it is the queue path: consumers apply the events
// through Consume." Every published event, applied through Consume, makes the Store agree.
func TestAttack14RunPublisherOnly(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		st := memstore.New()
		require.NoError(t, r.Load(ctx, "q:1", 20))
		require.NoError(t, st.Load(ctx, "q:1", 20))
		var mu sync.Mutex
		var got []stock.Event
		pub := stock.PublisherFunc(func(_ context.Context, ev stock.Event) error {
			mu.Lock()
			got = append(got, ev)
			mu.Unlock()
			return nil
		})
		cancel, done := runAsync(r, stock.RunOptions{Publisher: pub})
		for i := range 6 {
			_, err := r.Deduct(ctx, stock.Request{SKU: "q:1", ID: fmt.Sprint("d", i), Qty: 2})
			require.NoError(t, err)
		}
		_, err := r.Restore(ctx, "q:1", "d0")
		require.NoError(t, err)
		cancel()
		err, ok := waitRun(t, done, 10*time.Second)
		require.True(t, ok)
		assert.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, int64(0), outboxLen(t, c, "q:1"))
		mu.Lock()
		evs := append([]stock.Event(nil), got...)
		mu.Unlock()
		require.Len(t, evs, 7)
		// Deliver in reverse: Consume keeps the item's order.
		for i := len(evs) - 1; i >= 0; i-- {
			require.NoError(t, stock.Consume(ctx, r, st, evs[i]))
		}
		rem, err := st.Remaining(ctx, "q:1")
		require.NoError(t, err)
		assert.Equal(t, levels(t, r, "q:1").Available, rem)
		assert.Equal(t, int64(10), rem)
	})
}

// Levels and Sweep on unknown and invalid SKUs: "Bad input is refused with ErrInvalid before
// anything is sent to Redis"; Levels "returns ErrNotLoaded, never zero counters, for an item
// Redis does not know"; "No name may contain a brace".
func TestAttack14LevelsSweepBadSKUs(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		require.NoError(t, r.Load(ctx, "ok", 1))
		_, err := r.Levels(ctx, "nope")
		assert.ErrorIs(t, err, stock.ErrNotLoaded)
		for _, bad := range []string{"", "a{b", "a}b", "{a}", "a b", "a\nb", "a\x00b", strings.Repeat("x", stock.MaxNameLen+1)} {
			_, err := r.Levels(ctx, bad)
			assert.ErrorIs(t, err, stock.ErrInvalid, "Levels(%q)", bad)
			_, err = stockops.Sweep(ctx, r, bad)
			assert.ErrorIs(t, err, stock.ErrInvalid, "Sweep(%q)", bad)
			err = r.CloseItem(ctx, bad)
			assert.ErrorIs(t, err, stock.ErrInvalid, "CloseItem(%q)", bad)
			err = r.ReopenItem(ctx, bad)
			assert.ErrorIs(t, err, stock.ErrInvalid, "ReopenItem(%q)", bad)
		}
		_, err = r.Levels(ctx, strings.Repeat("x", stock.MaxNameLen))
		assert.ErrorIs(t, err, stock.ErrNotLoaded, "a name of MaxNameLen bytes is valid")
		// "An item that fails does not stop the others": a bad SKU beside a good one.
		_, err = r.Hold(ctx, stock.Request{SKU: "ok", ID: "h", Qty: 1}, time.Millisecond)
		require.NoError(t, err)
		redistest.Sleep(c, 20*time.Millisecond)
		n, err := stockops.Sweep(ctx, r, "ok", "nope")
		t.Logf("Sweep(ok, nope) = %d, %v", n, err)
		assert.Equal(t, int64(1), n, "the good item was swept")
		assert.Equal(t, int64(0), levels(t, r, "ok").Held)
		// CloseItem: "ErrNotLoaded for an unknown item."
		assert.ErrorIs(t, r.CloseItem(ctx, "nope"), stock.ErrNotLoaded)
		// Closing a closed item does nothing; ReopenItem lets it sell again.
		require.NoError(t, r.Load(ctx, "cl", 5))
		require.NoError(t, r.CloseItem(ctx, "cl"))
		require.NoError(t, r.CloseItem(ctx, "cl"))
		assert.True(t, levels(t, r, "cl").Closed)
		_, err = r.Deduct(ctx, stock.Request{SKU: "cl", ID: "x", Qty: 1})
		assert.ErrorIs(t, err, stock.ErrClosed)
		require.NoError(t, r.ReopenItem(ctx, "cl"))
		assert.False(t, levels(t, r, "cl").Closed)
		_, err = r.Deduct(ctx, stock.Request{SKU: "cl", ID: "x", Qty: 1})
		assert.NoError(t, err, "a deduct refused while closed recorded nothing")
		// "A delisted item cannot be reopened (ReopenItem returns ErrClosed)".
		require.NoError(t, r.Delist(ctx, "cl"))
		assert.ErrorIs(t, r.ReopenItem(ctx, "cl"), stock.ErrClosed)
		assert.True(t, levels(t, r, "cl").Closed)
	})
}

// child runs this test binary again with only TestAttack14Child, which runs the case named by
// A14_CHILD, so that a panic or a hang is seen from outside. It returns the combined output and
// the exit error.
func child(t *testing.T, name string, timeout time.Duration) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestAttack14Child$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "A14_CHILD="+name)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return string(out), fmt.Errorf("child %s did not end within %v", name, timeout)
	}
	return string(out), err
}

// childRunOptions are the option sets TestAttack14Child runs through Run on miniredis.
var childRunOptions = map[string]stock.RunOptions{
	"sweep-negative":      {SweepInterval: -1},
	"guard-negative":      {GuardInterval: -1},
	"carts-negative":      {RecoverCartsAfter: -1},
	"drain-negative":      {Drain: -1},
	"reconcile-negative":  {Reconcile: &stock.ReconcileOptions{Interval: -1}},
	"all-negative":        {SweepInterval: -1, GuardInterval: -1, RecoverCartsAfter: -1, Drain: -1},
	"carts-1ns":           {RecoverCartsAfter: time.Nanosecond},
	"sweep-1ns":           {SweepInterval: time.Nanosecond},
	"reconcile-1ns":       {Reconcile: &stock.ReconcileOptions{Interval: time.Nanosecond}},
	"poll-1ns":            {Relay: &stock.RelayOptions{Poll: time.Nanosecond}},
	"huge":                {SweepInterval: math.MaxInt64, GuardInterval: math.MaxInt64, RecoverCartsAfter: math.MaxInt64, Drain: math.MaxInt64},
	"huge-reconcile":      {Reconcile: &stock.ReconcileOptions{Interval: math.MaxInt64}},
	"huge-relay":          {Relay: &stock.RelayOptions{Lease: math.MaxInt64, MinBackoff: math.MaxInt64, MaxBackoff: math.MaxInt64, Poll: math.MaxInt64}},
	"backoff-min-gt-max":  {Relay: &stock.RelayOptions{MinBackoff: time.Minute, MaxBackoff: time.Second}},
	"retention-negative":  {Reconcile: &stock.ReconcileOptions{Retention: -1}},
	"retention-1ns":       {Reconcile: &stock.ReconcileOptions{Retention: time.Nanosecond}},
	"items-unknown-relay": {Relay: &stock.RelayOptions{Items: []string{"nope", "a{b"}}},
}

// TestAttack14Child is run by child in a process of its own; it does nothing in a normal run.
func TestAttack14Child(t *testing.T) {
	name := os.Getenv("A14_CHILD")
	if name == "" {
		return
	}
	if strings.HasPrefix(name, "store:") {
		stocktest.TestStore(t, func(t *testing.T) stock.Store { return newMutant(strings.TrimPrefix(name, "store:")) })
		return
	}
	switch name {
	case "stocktest-bad-option":
		stocktest.New(t, stock.WithPrefix("a{b"))
		t.Log("CHILD-RESULT stocktest.New accepted a bad option")
		return
	case "panic-store":
		e := stocktest.New(t)
		ctx := context.Background()
		require.NoError(t, e.Reserver.Load(ctx, "k", 10))
		_, err := e.Reserver.Deduct(ctx, stock.Request{SKU: "k", ID: "d", Qty: 1})
		require.NoError(t, err)
		cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		err = e.Reserver.Run(cctx, stock.RunOptions{Store: panicStore{}})
		t.Logf("CHILD-RESULT Run with a panicking Store returned %v", err)
		return
	}
	o, ok := childRunOptions[name]
	require.True(t, ok, name)
	for _, withStore := range []bool{false, true} {
		e := stocktest.New(t)
		ctx := context.Background()
		require.NoError(t, e.Reserver.Load(ctx, "k", 10))
		_, err := e.Reserver.Deduct(ctx, stock.Request{SKU: "k", ID: "d", Qty: 1})
		require.NoError(t, err)
		st := memstore.New()
		require.NoError(t, st.Load(ctx, "k", 10))
		if withStore {
			o.Store = st
		}
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err = e.Reserver.Run(cctx, o)
		cancel()
		if !errors.Is(err, stock.ErrInvalid) {
			require.ErrorIs(t, err, context.DeadlineExceeded, "Run returns ctx's error (store %v)", withStore)
		}
		t.Logf("CHILD-RESULT store=%v err=%v", withStore, err)
	}
}

// "A zero field takes its default; a negative interval turns its loop off", "Options that are out
// of range are an ErrInvalid error at once": whatever the options, Run neither panics nor hangs;
// it returns ErrInvalid at once or runs until ctx ends and returns ctx's error.
func TestAttack14RunOddOptionsNoPanic(t *testing.T) {
	for name := range childRunOptions {
		t.Run(name, func(t *testing.T) {
			t.Parallel() // a process of its own each, on its own miniredis
			out, err := child(t, name, 60*time.Second)
			if err != nil {
				i := strings.Index(out, "panic:")
				if i >= 0 {
					out = out[i:min(len(out), i+600)]
				} else if len(out) > 1500 {
					out = out[len(out)-1500:]
				}
			}
			assert.NoError(t, err, "Run with %s: %s", name, out)
		})
	}
}

// mutant is a Store written against the stock.Store contract, with one rule broken on purpose
// (named by its knob; "correct" breaks none): the conformance suite stocktest.TestStore must fail
// every mutant but "correct".
type mutant struct {
	knob  string
	mu    sync.Mutex
	items map[string]int64
	recs  map[string]*stock.Record // key: sku + "\x00" + id ("scope-by-id": id only)
}

func newMutant(knob string) stock.Store {
	m := &mutant{knob: knob, items: map[string]int64{}, recs: map[string]*stock.Record{}}
	if strings.HasPrefix(knob, "batch-") {
		return &batchMutant{m}
	}
	return m
}

func (m *mutant) key(sku, id string) string {
	if m.knob == "scope-by-id" {
		return id
	}
	return sku + "\x00" + id
}

func (m *mutant) Load(_ context.Context, sku string, qty int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.items[sku]; ok {
		return stock.ErrLoaded
	}
	m.items[sku] = qty
	return nil
}

func (m *mutant) Apply(_ context.Context, ev stock.Event) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := m.key(ev.SKU, ev.ID)
	rec := m.recs[k]
	newRec := func(st stock.State) {
		m.recs[k] = &stock.Record{SKU: ev.SKU, ID: ev.ID, User: ev.User, Type: ev.Type, Qty: ev.Qty, Status: st, At: time.Now()}
	}
	switch ev.Type {
	case stock.EventDeducted, stock.EventConfirmed:
		if ev.Type == stock.EventConfirmed && m.knob == "confirm-ignored" {
			return nil
		}
		if rec != nil && !(m.knob == "restock-twice" && rec.Type == stock.EventRestocked) {
			if m.knob == "repeat-applied-error" && rec.Status == stock.StateApplied {
				return errors.New("mutant: duplicate key")
			}
			switch rec.Status {
			case stock.StateRefused:
				if m.knob == "repeat-refusal-nil" {
					return nil
				}
				return fmt.Errorf("mutant: %w", stock.ErrRefused)
			default:
				return nil
			}
		}
		rem, known := m.items[ev.SKU]
		if !known {
			if m.knob == "unknown-item-deduct-ok" {
				newRec(stock.StateApplied)
				return nil
			}
			return fmt.Errorf("mutant: unknown item: %w", stock.ErrNotLoaded) // nothing recorded
		}
		covers := rem >= ev.Qty
		if m.knob == "off-by-one" {
			covers = rem > ev.Qty
		}
		switch m.knob {
		case "racy":
			m.mu.Unlock()
			time.Sleep(time.Millisecond)
			m.mu.Lock()
			rem = m.items[ev.SKU]
		case "racy-same-id": // rechecks the stock after the pause, not the id
			m.mu.Unlock()
			time.Sleep(time.Millisecond)
			m.mu.Lock()
			rem = m.items[ev.SKU]
			covers = rem >= ev.Qty
		case "racy-oversell": // rechecks the id after the pause, not the stock
			m.mu.Unlock()
			time.Sleep(time.Millisecond)
			m.mu.Lock()
			if m.recs[k] != nil {
				return nil
			}
			rem = m.items[ev.SKU]
		}
		if !covers {
			if m.knob != "refusal-not-recorded" {
				newRec(stock.StateRefused)
			}
			return fmt.Errorf("mutant: %w", stock.ErrRefused)
		}
		m.items[ev.SKU] = rem - ev.Qty
		st := stock.StateApplied
		newRec(st)
		return nil
	case stock.EventRestored, stock.EventRefused:
		if rec == nil {
			if m.knob == "no-tombstone" || (m.knob == "refused-no-tombstone" && ev.Type == stock.EventRefused) {
				return nil
			}
			newRec(stock.StateRestored)
			return nil
		}
		if m.knob == "restore-refused-gives" && rec.Status == stock.StateRefused {
			m.items[ev.SKU] += rec.Qty
			rec.Status = stock.StateRestored
			return nil
		}
		if m.knob == "restore-repeat-error" && (rec.Type == stock.EventRestored || rec.Type == stock.EventRefused || rec.Status == stock.StateRestored) {
			return errors.New("mutant: already restored")
		}
		if rec.Status == stock.StateApplied && (rec.Type == stock.EventDeducted || rec.Type == stock.EventConfirmed) {
			back := rec.Qty
			if m.knob == "restore-one" {
				back = 1
			}
			m.items[ev.SKU] += back
			if m.knob != "restore-twice" {
				rec.Status = stock.StateRestored
			}
		}
		return nil
	case stock.EventRestocked:
		if _, known := m.items[ev.SKU]; !known {
			if m.knob == "restock-unknown-nil" {
				return nil
			}
			return fmt.Errorf("mutant: %w", stock.ErrNotLoaded)
		}
		if rec != nil && m.knob == "restock-repeat-error" {
			return errors.New("mutant: duplicate restock")
		}
		if rec != nil && m.knob != "restock-twice" {
			return nil
		}
		m.items[ev.SKU] += ev.Qty
		newRec(stock.StateApplied)
		return nil
	case stock.EventCancelled, stock.EventExpired:
		if m.knob == "cancelled-increments" {
			m.items[ev.SKU] += ev.Qty
		}
		if m.knob == "other-types-error" {
			return fmt.Errorf("mutant: %w", stock.ErrInvalid)
		}
		return nil
	case stock.EventHeld:
		if m.knob == "other-types-error" {
			return fmt.Errorf("mutant: %w", stock.ErrInvalid)
		}
		if m.knob == "held-decrements" {
			if m.items[ev.SKU] >= ev.Qty {
				m.items[ev.SKU] -= ev.Qty
			}
		}
		return nil
	}
	return nil
}

func (m *mutant) Remaining(_ context.Context, sku string) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rem, ok := m.items[sku]
	if !ok && m.knob == "unknown-remaining-plain" {
		return 0, errors.New("mutant: no such item")
	}
	if !ok && m.knob != "unknown-remaining-zero" {
		return 0, fmt.Errorf("mutant: %w", stock.ErrNotLoaded)
	}
	if ok && rem == 0 && m.knob == "zero-remaining-notloaded" {
		return 0, fmt.Errorf("mutant: %w", stock.ErrNotLoaded)
	}
	return rem, nil
}

func (m *mutant) Records(_ context.Context, sku string, ids []string) (map[string]stock.Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]stock.Record{}
	for _, id := range ids {
		rec := m.recs[m.key(sku, id)]
		if rec == nil {
			if m.knob == "records-extra" {
				out[id] = stock.Record{SKU: sku, ID: id}
			}
			continue
		}
		r := *rec
		switch m.knob {
		case "records-refused-as-applied":
			if r.Status == stock.StateRefused {
				r.Status = stock.StateApplied
			}
		case "records-qty-zero":
			r.Qty = 0
		case "records-user-dropped":
			r.User = ""
		case "records-type-deducted":
			r.Type = stock.EventDeducted
		case "records-sku-empty":
			r.SKU = ""
		}
		out[id] = r
	}
	return out, nil
}

// batchMutant adds ApplyBatch: "batch-correct" stops at the first error that is not a refusal;
// "batch-no-stop" applies the events after it; "batch-nil-errors" answers nil for every event.
type batchMutant struct{ *mutant }

func (b *batchMutant) ApplyBatch(ctx context.Context, evs []stock.Event) []error {
	errs := make([]error, len(evs))
	stopped := false
	for i, ev := range evs {
		if stopped {
			if b.knob != "batch-unapplied-nil" {
				errs[i] = errors.New("mutant: not applied")
			}
			continue
		}
		errs[i] = b.Apply(ctx, ev)
		if errs[i] != nil && !errors.Is(errs[i], stock.ErrRefused) && b.knob != "batch-no-stop" {
			stopped = true
		}
		if b.knob == "batch-nil-errors" {
			errs[i] = nil
		}
	}
	return errs
}

// The control: a Store that keeps every rule passes stocktest.TestStore.
func TestAttack14TestStoreControl(t *testing.T) {
	for _, knob := range []string{"correct", "batch-correct"} {
		out, err := child(t, "store:"+knob, 2*time.Minute)
		assert.NoError(t, err, "the correct store %s fails the suite:\n%s", knob, out)
	}
}

// "TestStore checks that the stores newStore returns keep the contract of stock.Store (and of
// stock.BatchStore, when they implement it)". Each mutant breaks one rule the suite's doc lists;
// the suite must fail it.
func TestAttack14TestStoreCatchesMutants(t *testing.T) {
	for _, knob := range []string{
		"repeat-refusal-nil",         // "then and on every repeat"
		"unknown-remaining-zero",     // "Remaining of an unknown item wraps stock.ErrNotLoaded"
		"no-tombstone",               // "before any deduct leaves a tombstone"
		"refused-no-tombstone",       // "a restore or refusal ... leaves a tombstone"
		"racy",                       // "concurrent deducts of distinct ids never oversell"
		"records-extra",              // "leaves out unknown ids"
		"held-decrements",            // "held, cancelled and expired events change nothing"
		"restock-twice",              // "a restock adds once"
		"scope-by-id",                // "ids are scoped per item"
		"unknown-item-deduct-ok",     // "a deduct or confirm of an item the store does not know is not refused but answered stock.ErrNotLoaded"
		"restore-twice",              // "gives back what its id took, once"
		"restore-one",                // "gives back what its id took"
		"refusal-not-recorded",       // "then and on every repeat"
		"restock-unknown-nil",        // "refused with stock.ErrNotLoaded for an unknown item"
		"confirm-ignored",            // "a deduct or confirm decrements"
		"off-by-one",                 // "decrements only when the remaining stock covers it"
		"records-refused-as-applied", // "Records lists what was recorded"
		"records-qty-zero",           // "Records lists what was recorded"
		"racy-same-id",               // "concurrent applies of one id apply it once"
		"racy-oversell",              // "concurrent deducts of distinct ids never oversell"
		"repeat-applied-error",       // "a repeat answers as the first application did"
		"restore-refused-gives",      // "give back what the id's decrement took, if it was applied"
		"cancelled-increments",       // "held, cancelled and expired events change nothing"
		"other-types-error",          // "Other event types are accepted and ignored"
		"unknown-remaining-plain",    // "Remaining of an unknown item wraps stock.ErrNotLoaded"
		"records-user-dropped",       // "Records lists what was recorded"
		"records-type-deducted",      // "Records lists what was recorded"
		"records-sku-empty",          // "Records lists what was recorded"
		"restore-repeat-error",       // "a repeat answers as the first application did"
		"restock-repeat-error",       // "a repeat answers as the first application did"
		"zero-remaining-notloaded",   // Remaining: "ErrNotLoaded if it has no row", not when it is 0
		"batch-unapplied-nil",        // BatchStore: "unapplied events get an error"
		"batch-no-stop",              // BatchStore: "stops at the first error that is not a refusal"
		"batch-nil-errors",           // BatchStore: "one error (or nil) per event ... same meaning as Store.Apply's"
	} {
		t.Run(knob, func(t *testing.T) {
			out, err := child(t, "store:"+knob, 2*time.Minute)
			assert.Error(t, err, "stocktest.TestStore passed a Store that breaks a rule (%s)", knob)
			if err != nil {
				assert.Contains(t, out, "--- FAIL", "the suite failed it (not a crash)")
			}
		})
	}
}

// Cart recovery racing live carts. RunOptions.RecoverCartsAfter "must be well above the longest
// DeductMany or HoldMany call"; here it is barely above it, so recovery meets carts still in their
// saga. What must hold whatever the timing: "A cart id has one outcome, decided once by whichever
// copy of the cart gets there first, and every copy, concurrent or later, answers it", and
// DeductMany "takes every line of a cart or none".
func TestAttack14CartRecoveryRacesLiveCarts(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		st := memstore.New()
		skus := []string{"~", "carts", "c:1", "~carts"}
		// Run first, on an empty Redis: its guard records a new deployment and does not fence
		// (see TestAttack14RunStartOnLiveDeploymentFenceLifts for the other order).
		cancel, done := runAsync(r, stock.RunOptions{Store: st, RecoverCartsAfter: 4 * time.Millisecond})
		time.Sleep(200 * time.Millisecond)
		for _, s := range skus {
			require.NoError(t, r.Load(ctx, s, 150))
			require.NoError(t, st.Load(ctx, s, 150))
		}
		type result struct {
			id  string
			err error
		}
		var mu sync.Mutex
		var results []result
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 50 {
					id := fmt.Sprintf("cart-%d-%d", w, i)
					lines := []stock.Line{{SKU: skus[i%4], Qty: 1}, {SKU: skus[(i+1)%4], Qty: 1}, {SKU: skus[(i+2)%4], Qty: 1}}
					_, err := r.DeductMany(ctx, stock.Cart{ID: id, User: "u", Lines: lines})
					mu.Lock()
					results = append(results, result{id, err})
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		cancel()
		err, ok := waitRun(t, done, 15*time.Second)
		require.True(t, ok)
		assert.ErrorIs(t, err, context.Canceled)
		_, err = stockops.RecoverCarts(ctx, r, 0)
		require.NoError(t, err)

		var okCarts, undone int
		taken := map[string]int64{}
		for _, res := range results {
			var n int
			for _, s := range skus {
				e, err := r.Ledger(ctx, s, res.id)
				if errors.Is(err, stock.ErrUnknownID) {
					continue
				}
				require.NoError(t, err)
				if e.Taken() {
					n++
					taken[s]++
				}
			}
			i := 0
			fmt.Sscanf(res.id[strings.LastIndex(res.id, "-")+1:], "%d", &i)
			lines := []stock.Line{{SKU: skus[i%4], Qty: 1}, {SKU: skus[(i+1)%4], Qty: 1}, {SKU: skus[(i+2)%4], Qty: 1}}
			_, again := r.DeductMany(ctx, stock.Cart{ID: res.id, User: "u", Lines: lines})
			if res.err == nil {
				okCarts++
				assert.Equal(t, 3, n, "cart %s answered taken: every line taken", res.id)
				assert.NoError(t, again, "cart %s: a retry answers the cart's outcome (taken)", res.id)
			} else {
				undone++
				assert.Equal(t, 0, n, "cart %s answered %v: no line taken", res.id, res.err)
				assert.Error(t, again, "cart %s: a retry answers the cart's outcome (undone)", res.id)
			}
		}
		for _, s := range skus {
			l := levels(t, r, s)
			assert.Equal(t, taken[s], l.Sold, "%s: sold = the lines of taken carts", s)
		}
		t.Logf("%d carts taken, %d undone", okCarts, undone)
	})
}

// Many holds due at once: "Sweep releases the holds past their deadline of the given items, or of
// every item in the registry when none is given, in bounded steps, and returns the units
// released."
func TestAttack14SweepManyDueHolds(t *testing.T) {
	e := stocktest.New(t)
	ctx := context.Background()
	r := e.Reserver
	skus := []string{"m:1", "m:2", "m~3"}
	const per = 700
	for _, s := range skus {
		require.NoError(t, r.Load(ctx, s, 10*per))
		for i := range per {
			_, err := r.Hold(ctx, stock.Request{SKU: s, ID: fmt.Sprint("h", i), Qty: 2}, time.Minute)
			require.NoError(t, err)
		}
	}
	e.Advance(time.Minute + time.Millisecond)
	n, err := stockops.Sweep(ctx, r)
	require.NoError(t, err)
	assert.Equal(t, int64(len(skus)*per*2), n, "every due hold of every item released")
	for _, s := range skus {
		l := levels(t, r, s)
		assert.Equal(t, int64(0), l.Held, s)
		assert.Equal(t, int64(10*per), l.Available, s)
	}
	n, err = stockops.Sweep(ctx, r)
	require.NoError(t, err)
	assert.Equal(t, int64(0), n, "a second sweep finds nothing")
}

// The same on a real server, through Run's sweeper.
func TestAttack14RunSweepsManyDueHolds(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		const n = 3000
		require.NoError(t, r.Load(ctx, "many", n))
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < n; i += 4 {
					_, err := r.Hold(ctx, stock.Request{SKU: "many", ID: fmt.Sprint("h", i), Qty: 1}, 300*time.Millisecond)
					assert.NoError(t, err)
				}
			}()
		}
		wg.Wait()
		redistest.Sleep(c, time.Second)
		cancel, done := runAsync(r, stock.RunOptions{SweepInterval: 20 * time.Millisecond})
		ok := eventually(10*time.Second, func() bool { return levels(t, r, "many").Held == 0 })
		cancel()
		<-done
		assert.True(t, ok, "Run's sweeper released every due hold: %+v", levels(t, r, "many"))
		assert.Equal(t, int64(n), levels(t, r, "many").Available)
	})
}

// ReconcileOptions.Retention: "The default is 24h; a negative Retention never trims." Under
// stocktest, whose "one clock moves everything the Reserver depends on", a pass after Advance past
// the retention trims the settled entry, and not before. (It once did not: the retention was
// measured on the process's clock, which Advance did not reach; stocktest now passes its clock
// to the Reserver with stock.WithClock.)
func TestAttack14RetentionBounds(t *testing.T) {
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
			ctx := context.Background()
			r := e.Reserver
			st := memstore.New()
			require.NoError(t, r.Load(ctx, "ret", 10))
			require.NoError(t, st.Load(ctx, "ret", 10))
			_, err := r.Deduct(ctx, stock.Request{SKU: "ret", ID: "d1", Qty: 1})
			require.NoError(t, err)
			rl, err := stockops.NewRelay(r, st, nil, nil)
			require.NoError(t, err)
			drain(t, rl)
			e.Advance(tc.advance)
			rec, err := stockops.NewReconciler(r, st, &stock.ReconcileOptions{Retention: tc.retention})
			require.NoError(t, err)
			reps, err := rec.Once(ctx)
			require.NoError(t, err)
			require.Len(t, reps, 1)
			_, err = r.Ledger(ctx, "ret", "d1")
			if tc.trimmed {
				assert.Equal(t, 1, reps[0].Trimmed, "%s", reps[0])
				assert.ErrorIs(t, err, stock.ErrUnknownID)
			} else {
				assert.Equal(t, 0, reps[0].Trimmed, "%s", reps[0])
				assert.NoError(t, err)
			}
		})
	}
}

// RelayOptions.Batch: Once "claims their due events, a batch at a time, until none is due": a
// Batch of 1 still delivers everything in one Once.
func TestAttack14RelayBatchOneDrainsInOnce(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		st := memstore.New()
		for _, s := range []string{"b1", "b:2"} {
			require.NoError(t, r.Load(ctx, s, 100))
			require.NoError(t, st.Load(ctx, s, 100))
			for i := range 40 {
				_, err := r.Deduct(ctx, stock.Request{SKU: s, ID: fmt.Sprint("d", i), Qty: 1})
				require.NoError(t, err)
			}
		}
		rl, err := stockops.NewRelay(r, st, nil, &stock.RelayOptions{Batch: 1})
		require.NoError(t, err)
		stats, err := rl.Once(ctx)
		require.NoError(t, err)
		assert.Equal(t, 80, stats.Delivered, "%+v", stats)
		for _, s := range []string{"b1", "b:2"} {
			assert.Equal(t, int64(0), outboxLen(t, c, s))
		}
		// RelayOptions.Items: "limits the relay to these items".
		_, err = r.Deduct(ctx, stock.Request{SKU: "b1", ID: "x", Qty: 1})
		require.NoError(t, err)
		_, err = r.Deduct(ctx, stock.Request{SKU: "b:2", ID: "x", Qty: 1})
		require.NoError(t, err)
		rl, err = stockops.NewRelay(r, st, nil, &stock.RelayOptions{Items: []string{"b:2"}})
		require.NoError(t, err)
		stats, err = rl.Once(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, stats.Delivered)
		assert.Equal(t, int64(1), outboxLen(t, c, "b1"), "b1 is not the relay's")
	})
}

// Levels is "read atomically": Loaded = Available + Held + Sold in every read under concurrent
// deducts, holds, restores and sweeps.
func TestAttack14LevelsAtomicUnderLoad(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		require.NoError(t, r.Load(ctx, "lv", 200))
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					id := fmt.Sprintf("w%d-%d", w, i)
					switch i % 3 {
					case 0:
						_, _ = r.Deduct(ctx, stock.Request{SKU: "lv", ID: id, Qty: 2})
						_, _ = r.Restore(ctx, "lv", id)
					case 1:
						_, _ = r.Hold(ctx, stock.Request{SKU: "lv", ID: id, Qty: 1}, time.Millisecond)
					case 2:
						_, _ = stockops.Sweep(ctx, r, "lv")
					}
				}
			}()
		}
		for range 300 {
			l, err := r.Levels(ctx, "lv")
			require.NoError(t, err)
			require.Equal(t, l.Loaded, l.Available+l.Held+l.Sold, "%+v", l)
			require.Equal(t, int64(200), l.Loaded)
			require.GreaterOrEqual(t, l.Available, int64(0))
		}
		close(stop)
		wg.Wait()
	})
}

// stocktest: "Advance moves ... the TIME command the scripts read (hold deadlines) and every
// key's TTL (relay leases, backoff) move by d", "and stand still otherwise"; "A negative d is a
// test bug and panics."
func TestAttack14StocktestClock(t *testing.T) {
	e := stocktest.New(t)
	ctx := context.Background()
	r := e.Reserver
	t0 := e.Now()
	time.Sleep(20 * time.Millisecond)
	assert.Equal(t, t0, e.Now(), "the clock stands still")
	require.NoError(t, r.Load(ctx, "clk", 5))
	_, err := r.Hold(ctx, stock.Request{SKU: "clk", ID: "h", Qty: 1}, 10*time.Minute)
	require.NoError(t, err)
	e.Advance(10*time.Minute - time.Millisecond)
	assert.Equal(t, t0.Add(10*time.Minute-time.Millisecond), e.Now())
	_, err = r.Extend(ctx, "clk", "h", time.Minute)
	require.NoError(t, err, "the hold is live 1ms before its deadline")
	e.Advance(time.Minute)
	_, err = r.Confirm(ctx, "clk", "h")
	assert.ErrorIs(t, err, stock.ErrExpired)
	assert.Panics(t, func() { e.Advance(-time.Nanosecond) })

	// Backoff moves with Advance: a failed event waits MinBackoff (and no more than its jitter).
	st := memstore.New()
	require.NoError(t, st.Load(ctx, "clk", 5))
	_, err = r.Deduct(ctx, stock.Request{SKU: "clk", ID: "d", Qty: 1})
	require.NoError(t, err)
	rl, err := stockops.NewRelay(r, st, nil, &stock.RelayOptions{MinBackoff: time.Hour, MaxBackoff: 2 * time.Hour})
	require.NoError(t, err)
	st.FailWith(memstore.Down)
	_, err = rl.Once(ctx)
	assert.Error(t, err)
	st.FailWith(nil)
	stats, err := rl.Once(ctx)
	require.NoError(t, err)
	assert.Equal(t, 0, stats.Delivered, "backing off for an hour")
	time.Sleep(50 * time.Millisecond)
	stats, err = rl.Once(ctx)
	require.NoError(t, err)
	assert.Equal(t, 0, stats.Delivered, "still backing off: the clock stands still")
	e.Advance(2 * time.Hour)
	stats, err = rl.Once(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, stats.Delivered, "due after Advance")
}

// Retention on real time: a pass after the retention trims the settled entry.
func TestAttack14RetentionRealTime(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		st := memstore.New()
		require.NoError(t, r.Load(ctx, "ret", 10))
		require.NoError(t, st.Load(ctx, "ret", 10))
		_, err := r.Deduct(ctx, stock.Request{SKU: "ret", ID: "d1", Qty: 1})
		require.NoError(t, err)
		rl, err := stockops.NewRelay(r, st, nil, nil)
		require.NoError(t, err)
		drain(t, rl)
		time.Sleep(1500 * time.Millisecond)
		never, err := stockops.NewReconciler(r, st, &stock.ReconcileOptions{Retention: -1})
		require.NoError(t, err)
		reps, err := never.Once(ctx)
		require.NoError(t, err)
		require.Len(t, reps, 1)
		assert.Equal(t, 0, reps[0].Trimmed, "a negative Retention never trims: %s", reps[0])
		rec, err := stockops.NewReconciler(r, st, &stock.ReconcileOptions{Retention: time.Second})
		require.NoError(t, err)
		reps, err = rec.Once(ctx)
		require.NoError(t, err)
		require.Len(t, reps, 1)
		assert.Equal(t, 1, reps[0].Trimmed, "%s", reps[0])
		_, err = r.Ledger(ctx, "ret", "d1")
		assert.ErrorIs(t, err, stock.ErrUnknownID)
	})
}

// Run started on a live deployment (items loaded, sales made, no guard ever ran): the guard fences
// the Reserver ("a guard added to a live deployment ... fences until a complete repairing
// Reconciler pass records the primaries"), and Run's reconciler, whose "first pass runs at once",
// is the pass that lifts it: ErrFailover lasts only as long as that first pass (and the next
// guard check). Without a pass that can complete, the fence would last a whole Interval (5
// minutes by default).
func TestAttack14RunStartOnLiveDeploymentFenceLifts(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		if !b.Real() {
			continue // the guard is off on miniredis
		}
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := b.Client(t)
			r := newReserver(t, c)
			st := memstore.New()
			skus := []string{"f1", "f:2", "f~3"}
			for _, s := range skus {
				require.NoError(t, r.Load(ctx, s, 100000))
				require.NoError(t, st.Load(ctx, s, 100000))
				_, err := r.Deduct(ctx, stock.Request{SKU: s, ID: "before", Qty: 1})
				require.NoError(t, err)
			}
			cancel, done := runAsync(r, stock.RunOptions{Store: st, GuardInterval: 10 * time.Millisecond})
			defer func() { cancel(); <-done }()
			start := time.Now()
			var fenced, sold int
			var firstFence, lastFence time.Duration
			for i := 0; time.Since(start) < 4*time.Second; i++ {
				_, err := r.Deduct(ctx, stock.Request{SKU: skus[i%3], ID: fmt.Sprint("d", i), Qty: 1})
				switch {
				case errors.Is(err, stock.ErrFailover):
					if fenced == 0 {
						firstFence = time.Since(start)
					}
					fenced++
					lastFence = time.Since(start)
				case err == nil:
					sold++
				default:
					t.Fatalf("deduct: %v", err)
				}
				time.Sleep(2 * time.Millisecond)
			}
			t.Logf("ErrFailover %d times (first at %v, last at %v), %d sold", fenced, firstFence, lastFence, sold)
			assert.Less(t, lastFence, 2*time.Second, "the fence lifted after Run's first reconcile pass")
			_, err := r.Deduct(ctx, stock.Request{SKU: "f1", ID: "after", Qty: 1})
			assert.NoError(t, err, "selling after Run's first pass")
		})
	}
}

// ErrFailover "is returned by Deduct, Hold and DeductMany while a FailoverGuard has seen the Redis
// primaries change and no reconcile pass has run since". Run's guard fences the Reserver (Run
// started on a live deployment), Run ends before its reconciler completes a pass, then a complete
// repairing pass records the primaries: the Reserver must sell again.
func TestAttack14FenceAfterRunEndsLiftedByPass(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		if !b.Real() {
			continue // the guard is off on miniredis
		}
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := b.Client(t)
			r := newReserver(t, c)
			st := memstore.New()
			require.NoError(t, r.Load(ctx, "g", 1000))
			require.NoError(t, st.Load(ctx, "g", 1000))
			_, err := r.Deduct(ctx, stock.Request{SKU: "g", ID: "before", Qty: 1})
			require.NoError(t, err)
			// A Store slow enough that Run's first pass cannot finish before Run ends.
			slow := &onlyStore{s: st, delay: 300 * time.Millisecond}
			cancel, done := runAsync(r, stock.RunOptions{Store: slow, GuardInterval: time.Millisecond, Drain: time.Millisecond})
			fenced := eventually(2*time.Second, func() bool {
				_, err := r.Deduct(ctx, stock.Request{SKU: "g", ID: "probe", Qty: 1})
				return errors.Is(err, stock.ErrFailover)
			})
			cancel()
			<-done
			if !fenced {
				t.Logf("the guard never fenced (the first pass won the race)")
			}
			rec, err := stockops.NewReconciler(r, st, nil)
			require.NoError(t, err)
			pr, err := rec.Pass(ctx)
			require.NoError(t, err)
			require.True(t, pr.Complete && pr.EpochRecorded, "%+v", pr)
			_, err = r.Deduct(ctx, stock.Request{SKU: "g", ID: "after-pass", Qty: 1})
			assert.NoError(t, err, "a complete repairing pass ran since the guard fenced (fenced: %v)", fenced)
			// What lifts it: a guard's next check.
			f, err := stockops.NewFailoverGuard(r).Check(ctx)
			t.Logf("a new guard's Check: fenced=%v err=%v", f, err)
			_, err = r.Deduct(ctx, stock.Request{SKU: "g", ID: "after-check", Qty: 1})
			t.Logf("deduct after a new guard's check: %v", err)
		})
	}
}

// onlyStore is a stock.Store and nothing more (no BatchStore, RecordLister or ItemLister), whose
// Records and Remaining wait delay.
type onlyStore struct {
	s     *memstore.Store
	delay time.Duration
}

func (o *onlyStore) Apply(ctx context.Context, ev stock.Event) error { return o.s.Apply(ctx, ev) }
func (o *onlyStore) Remaining(ctx context.Context, sku string) (int64, error) {
	time.Sleep(o.delay)
	return o.s.Remaining(ctx, sku)
}
func (o *onlyStore) Records(ctx context.Context, sku string, ids []string) (map[string]stock.Record, error) {
	time.Sleep(o.delay)
	return o.s.Records(ctx, sku, ids)
}

// Redis restarts under a running Run (AOF with fsync always: nothing is lost). The guard fences:
// ErrFailover "while a FailoverGuard has seen the Redis primaries change and no reconcile pass has
// run since". This test records how long sales are refused with Run's defaults (a pass every 5
// minutes) and with a short Reconcile.Interval, and asserts what is promised: while fenced,
// nothing is sold; once a pass has run, sales resume.
func TestAttack14RunRedisRestartFenceWindow(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Log("needs STOCK_REDIS_SERVER; nothing to check on miniredis (the guard is off there)")
		return
	}
	for _, interval := range []time.Duration{0, 200 * time.Millisecond} {
		t.Run(fmt.Sprint("interval=", interval), func(t *testing.T) {
			ctx := context.Background()
			srv := redistest.StartServer(t, "--appendonly", "yes", "--appendfsync", "always")
			c := srv.Client(t)
			r := newReserver(t, c)
			st := memstore.New()
			cancel, done := runAsync(r, stock.RunOptions{Store: st, GuardInterval: 10 * time.Millisecond,
				Reconcile: &stock.ReconcileOptions{Interval: interval}})
			defer func() { cancel(); <-done }()
			time.Sleep(100 * time.Millisecond)
			require.NoError(t, r.Load(ctx, "rs", 100000))
			require.NoError(t, st.Load(ctx, "rs", 100000))
			_, err := r.Deduct(ctx, stock.Request{SKU: "rs", ID: "before", Qty: 1})
			require.NoError(t, err)
			srv.Restart()
			start := time.Now()
			var fenced int
			var lifted time.Duration
			for i := 0; time.Since(start) < 8*time.Second; i++ {
				_, err := r.Deduct(ctx, stock.Request{SKU: "rs", ID: fmt.Sprint("d", i), Qty: 1})
				if err == nil && fenced > 0 {
					lifted = time.Since(start)
					break
				}
				if errors.Is(err, stock.ErrFailover) {
					fenced++
				}
				time.Sleep(5 * time.Millisecond)
			}
			t.Logf("Reconcile.Interval %v: %d deducts refused with ErrFailover after the restart; sales resumed after %v (0: not within 8s)", interval, fenced, lifted)
			switch {
			case interval == 0:
				// No pass comes (the first one ran before the restart): the fence holds.
				assert.Greater(t, fenced, 0, "the guard fenced after the restart")
			case fenced > 0:
				assert.NotZero(t, lifted, "sales resume after the next pass (Interval %v)", interval)
			default:
				// A pass that began after the restart recorded the new primaries before the
				// guard's check saw them: no deduct was refused, and none needed to be.
				t.Logf("a pass recorded the restarted primary before any deduct met the fence")
			}
			l := levels(t, r, "rs")
			rem, err := st.Remaining(ctx, "rs")
			require.NoError(t, err)
			assert.GreaterOrEqual(t, rem, l.Available, "Redis never offers more than the Store has")
		})
	}
}

// Run with Reconcile.DryRun on a live deployment (items, no epoch): a dry run "repairs nothing" and does not record
// the primaries, so the guard's fence stays (a hazard worth knowing: such a Run refuses every sale
// with ErrFailover until another process makes a complete repairing pass).
func TestAttack14RunDryRunKeepsFence(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		if !b.Real() {
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := b.Client(t)
			r := newReserver(t, c)
			st := memstore.New()
			require.NoError(t, r.Load(ctx, "dr", 10))
			require.NoError(t, st.Load(ctx, "dr", 10))
			// Live, not new: the epoch the first Load recorded is gone (lost with the data).
			require.NoError(t, c.Do(ctx, c.B().Del().Key("stock:epoch").Build()).Error())
			cancel, done := runAsync(r, stock.RunOptions{Store: st, GuardInterval: 10 * time.Millisecond,
				Reconcile: &stock.ReconcileOptions{DryRun: true, Interval: 50 * time.Millisecond}})
			time.Sleep(time.Second)
			_, err := r.Deduct(ctx, stock.Request{SKU: "dr", ID: "x", Qty: 1})
			assert.ErrorIs(t, err, stock.ErrFailover, "no complete repairing pass: still fenced")
			// Another process's complete repairing pass lifts the fence at the guard's next check.
			r2 := newReserver(t, c)
			rec, err := stockops.NewReconciler(r2, st, nil)
			require.NoError(t, err)
			pr, err := rec.Pass(ctx)
			require.NoError(t, err)
			require.True(t, pr.EpochRecorded, "%+v", pr)
			ok := eventually(2*time.Second, func() bool {
				_, err := r.Deduct(ctx, stock.Request{SKU: "dr", ID: "y", Qty: 1})
				return err == nil
			})
			assert.True(t, ok, "the fence lifted at the guard's next check")
			cancel()
			<-done
		})
	}
}

// "Run may be called once per Reserver at a time": a second concurrent Run on the same Reserver.
// Nothing promises what it answers; whatever it does, the Reserver's data stay right.
func TestAttack14SecondRunSameReserver(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		st := memstore.New()
		require.NoError(t, r.Load(ctx, "two", 100))
		require.NoError(t, st.Load(ctx, "two", 100))
		cancel1, done1 := runAsync(r, stock.RunOptions{Store: st})
		cancel2, done2 := runAsync(r, stock.RunOptions{Store: st})
		// One of the two runs; the other is refused at once (ErrRunning), whichever came second.
		var refused error
		select {
		case refused = <-done1:
			done1 = done2
		case refused = <-done2:
		case <-time.After(10 * time.Second):
			t.Fatal("neither Run was refused")
		}
		assert.ErrorIs(t, refused, stock.ErrRunning)
		for i := range 50 {
			_, _ = r.Deduct(ctx, stock.Request{SKU: "two", ID: fmt.Sprint("d", i), Qty: 1})
		}
		cancel1()
		cancel2()
		err1, ok := waitRun(t, done1, 10*time.Second)
		require.True(t, ok)
		assert.ErrorIs(t, err1, context.Canceled)
		l := levels(t, r, "two")
		rem, err := st.Remaining(ctx, "two")
		require.NoError(t, err)
		assert.Equal(t, l.Available, rem)
		assert.LessOrEqual(t, st.MaxApplications(), 1)
	})
}

// Sweep: "A corrupt ledger entry is an error that names its id, and that step releases nothing
// (the scripts check everything they read before their first write)", and "An item that fails
// does not stop the others: the errors of all items are joined." The corruption is made through
// the documented key layout (stock:{sku}:l is the ledger hash).
func TestAttack14SweepCorruptEntry(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		for _, s := range []string{"bad", "good"} {
			require.NoError(t, r.Load(ctx, s, 10))
			for _, id := range []string{"h1", "h2"} {
				_, err := r.Hold(ctx, stock.Request{SKU: s, ID: id, Qty: 1}, 50*time.Millisecond)
				require.NoError(t, err)
			}
		}
		require.NoError(t, c.Do(ctx, c.B().Hset().Key("stock:{bad}:l").FieldValue().FieldValue("h1", "garbage").Build()).Error())
		redistest.Sleep(c, 200*time.Millisecond)
		before := levels(t, r, "bad")
		n, err := stockops.Sweep(ctx, r)
		require.Error(t, err, "a corrupt entry is an error")
		assert.Contains(t, err.Error(), "h1", "the error names the id")
		assert.Equal(t, int64(0), levels(t, r, "good").Held, "the other item was swept")
		assert.GreaterOrEqual(t, n, int64(2), "the good item's units are counted")
		after := levels(t, r, "bad")
		assert.Equal(t, before, after, "that step released nothing")
		t.Logf("Sweep: %d, %v", n, err)
		// What a corrupt due hold does to the item's sales (nothing is promised; recorded here).
		_, err = r.Deduct(ctx, stock.Request{SKU: "bad", ID: "d", Qty: 1})
		t.Logf("Deduct on the item with a corrupt due hold: %v", err)
		_, err = r.Deduct(ctx, stock.Request{SKU: "bad", ID: "d", Qty: 1})
		t.Logf("again: %v", err)
		checkLedger(t, r, "good", 10)
	})
}

// Run with a Store and a Publisher that fails: "an event is removed from the outbox only after
// the Store applied it and the Publisher accepted it"; once the Publisher recovers, each event
// reaches it and the Store applies it once in effect.
func TestAttack14RunStoreAndFailingPublisher(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		st := memstore.New()
		require.NoError(t, r.Load(ctx, "sp", 10))
		require.NoError(t, st.Load(ctx, "sp", 10))
		var down atomic.Bool
		down.Store(true)
		var mu sync.Mutex
		seen := map[string]int{}
		pub := stock.PublisherFunc(func(_ context.Context, ev stock.Event) error {
			if down.Load() {
				return errors.New("queue down")
			}
			mu.Lock()
			seen[string(ev.Type)+":"+ev.ID]++
			mu.Unlock()
			return nil
		})
		for i := range 3 {
			_, err := r.Deduct(ctx, stock.Request{SKU: "sp", ID: fmt.Sprint("d", i), Qty: 1})
			require.NoError(t, err)
		}
		relay := &stock.RelayOptions{MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}
		cancel, done := runAsync(r, stock.RunOptions{Store: st, Publisher: pub, Relay: relay, Drain: 200 * time.Millisecond})
		time.Sleep(300 * time.Millisecond)
		cancel()
		err, ok := waitRun(t, done, 5*time.Second)
		require.True(t, ok)
		assert.Error(t, err)
		assert.False(t, errors.Is(err, context.Canceled) && !strings.Contains(err.Error(), "queue down"), "the loop's error, not only ctx's: %v", err)
		assert.Equal(t, int64(3), outboxLen(t, c, "sp"), "nothing left the outbox while the Publisher refused")

		down.Store(false)
		redistest.Sleep(c, 100*time.Millisecond)
		cancel, done = runAsync(r, stock.RunOptions{Store: st, Publisher: pub, Relay: relay})
		ok = eventually(5*time.Second, func() bool { return outboxLen(t, c, "sp") == 0 })
		cancel()
		<-done
		assert.True(t, ok, "delivered once the Publisher is back")
		mu.Lock()
		for i := range 3 {
			assert.GreaterOrEqual(t, seen["deducted:"+fmt.Sprint("d", i)], 1)
		}
		mu.Unlock()
		rem, err := st.Remaining(ctx, "sp")
		require.NoError(t, err)
		assert.Equal(t, int64(7), rem)
		assert.LessOrEqual(t, st.MaxApplications(), 1)
	})
}

// Two Reservers with different prefixes on one Redis, each with its own Run and Store: "WithPrefix
// sets the prefix of every key the Reserver writes": neither sees the other's items.
func TestAttack14RunTwoPrefixes(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		ra := newReserver(t, c)
		rb := newReserver(t, c, stock.WithPrefix("stock:carts"))
		sa, sb := memstore.New(), memstore.New()
		// Runs first, on an empty Redis, so that their guards do not fence (see
		// TestAttack14RunStartOnLiveDeploymentFenceLifts).
		ca, da := runAsync(ra, stock.RunOptions{Store: sa})
		cb, db := runAsync(rb, stock.RunOptions{Store: sb})
		time.Sleep(200 * time.Millisecond)
		require.NoError(t, ra.Load(ctx, "~", 10))
		require.NoError(t, sa.Load(ctx, "~", 10))
		require.NoError(t, rb.Load(ctx, "~", 20))
		require.NoError(t, sb.Load(ctx, "~", 20))
		_, err := ra.DeductMany(ctx, stock.Cart{ID: "c1", Lines: []stock.Line{{SKU: "~", Qty: 2}}})
		require.NoError(t, err)
		_, err = rb.DeductMany(ctx, stock.Cart{ID: "c1", Lines: []stock.Line{{SKU: "~", Qty: 5}}})
		require.NoError(t, err, "the same cart id under another prefix is another cart")
		ok := eventually(5*time.Second, func() bool {
			a, _ := sa.Remaining(ctx, "~")
			b, _ := sb.Remaining(ctx, "~")
			return a == 8 && b == 15
		})
		ca()
		cb()
		<-da
		<-db
		assert.True(t, ok, "each Run delivered its own prefix's sale")
		assert.Equal(t, int64(8), levels(t, ra, "~").Available)
		assert.Equal(t, int64(15), levels(t, rb, "~").Available)
		var items []string
		for s, err := range stockops.Items(ctx, rb) {
			require.NoError(t, err)
			items = append(items, s)
		}
		assert.Equal(t, []string{"~"}, items)
	})
}

// Levels "returns ErrNotLoaded, never zero counters, for an item Redis does not know", also when
// the item's hash was lost (a deleted key); CloseItem then answers ErrNotLoaded too.
func TestAttack14LevelsLostHash(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		require.NoError(t, r.Load(ctx, "lost", 10))
		_, err := r.Deduct(ctx, stock.Request{SKU: "lost", ID: "d", Qty: 1})
		require.NoError(t, err)
		require.NoError(t, c.Do(ctx, c.B().Del().Key("stock:{lost}").Build()).Error())
		l, err := r.Levels(ctx, "lost")
		assert.ErrorIs(t, err, stock.ErrNotLoaded, "%+v", l)
		assert.ErrorIs(t, r.CloseItem(ctx, "lost"), stock.ErrNotLoaded)
		_, err = r.Deduct(ctx, stock.Request{SKU: "lost", ID: "d2", Qty: 1})
		assert.ErrorIs(t, err, stock.ErrNotLoaded)
		n, err := stockops.Sweep(ctx, r, "lost")
		t.Logf("Sweep of a lost item: %d, %v", n, err)
		assert.Equal(t, int64(0), n)
	})
}

// CloseItem under Run: "Deduct and Hold are refused with ErrClosed, while Restore, Confirm,
// Cancel, expiry, the relay and the reconciler go on, so the item's pipeline finishes."
func TestAttack14RunClosedItemPipelineFinishes(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		st := memstore.New()
		require.NoError(t, r.Load(ctx, "shut", 10))
		require.NoError(t, st.Load(ctx, "shut", 10))
		_, err := r.Deduct(ctx, stock.Request{SKU: "shut", ID: "d", Qty: 2})
		require.NoError(t, err)
		_, err = r.Hold(ctx, stock.Request{SKU: "shut", ID: "h1", Qty: 1}, time.Hour)
		require.NoError(t, err)
		_, err = r.Hold(ctx, stock.Request{SKU: "shut", ID: "h2", Qty: 1}, 100*time.Millisecond)
		require.NoError(t, err)
		require.NoError(t, r.CloseItem(ctx, "shut"))
		_, err = r.Hold(ctx, stock.Request{SKU: "shut", ID: "h3", Qty: 1}, time.Hour)
		assert.ErrorIs(t, err, stock.ErrClosed)
		_, err = r.Confirm(ctx, "shut", "h1")
		require.NoError(t, err)
		_, err = r.Restore(ctx, "shut", "d")
		require.NoError(t, err)
		redistest.Sleep(c, 200*time.Millisecond)
		cancel, done := runAsync(r, stock.RunOptions{Store: st, SweepInterval: 10 * time.Millisecond})
		ok := eventually(5*time.Second, func() bool {
			rem, _ := st.Remaining(ctx, "shut")
			return levels(t, r, "shut").Held == 0 && outboxLen(t, c, "shut") == 0 && rem == 9
		})
		cancel()
		<-done
		assert.True(t, ok, "the closed item's pipeline finished: %+v", levels(t, r, "shut"))
		l := levels(t, r, "shut")
		assert.Equal(t, int64(9), l.Available)
		assert.True(t, l.Closed)
	})
}

// panicStore panics in every call.
type panicStore struct{}

func (panicStore) Apply(context.Context, stock.Event) error { panic("store bug") }
func (panicStore) Remaining(context.Context, string) (int64, error) {
	panic("store bug")
}
func (panicStore) Records(context.Context, string, []string) (map[string]stock.Record, error) {
	panic("store bug")
}

// stocktest.New "fails t if stock.New refuses opts".
func TestAttack14StocktestNewBadOption(t *testing.T) {
	out, err := child(t, "stocktest-bad-option", time.Minute)
	assert.Error(t, err, "the child test failed")
	assert.NotContains(t, out, "CHILD-RESULT", "New stopped the test")
	assert.Contains(t, out, "--- FAIL")
}

// A Store that panics under Run. Nothing is promised about a panicking Store; this records what
// happens (a crash of the process, or Run returning) and asserts only that the process does not
// hang.
func TestAttack14RunPanickingStore(t *testing.T) {
	out, err := child(t, "panic-store", time.Minute)
	assert.NotContains(t, fmt.Sprint(err), "did not end", "the process ended")
	if i := strings.Index(out, "panic:"); i >= 0 {
		t.Logf("a panicking Store crashes the process running Run: %s", out[i:min(len(out), i+400)])
	} else if i := strings.Index(out, "CHILD-RESULT"); i >= 0 {
		t.Logf("%s", out[i:min(len(out), i+300)])
	}
}

// Sweep with no items in the registry: nothing to do.
func TestAttack14SweepEmpty(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		r := newReserver(t, c)
		n, err := stockops.Sweep(context.Background(), r)
		assert.NoError(t, err)
		assert.Equal(t, int64(0), n)
	})
}

// Hold: "A Deduct or Hold that would otherwise be refused for stock or for the per-user limit
// first releases up to 10,000 due holds, so a refusal does not depend on how many holds are due."
func TestAttack14DeductReleasesManyDueHolds(t *testing.T) {
	e := stocktest.New(t)
	ctx := context.Background()
	r := e.Reserver
	const n = 2500
	require.NoError(t, r.Load(ctx, "due", n))
	for i := range n {
		_, err := r.Hold(ctx, stock.Request{SKU: "due", ID: fmt.Sprint("h", i), Qty: 1}, time.Minute)
		require.NoError(t, err)
	}
	_, err := r.Deduct(ctx, stock.Request{SKU: "due", ID: "early", Qty: 1})
	assert.ErrorIs(t, err, stock.ErrSoldOut)
	e.Advance(2 * time.Minute)
	rc, err := r.Deduct(ctx, stock.Request{SKU: "due", ID: "all", Qty: n})
	require.NoError(t, err, "every due hold released before the refusal")
	assert.Equal(t, int64(0), rc.Remaining)
	l := levels(t, r, "due")
	assert.Equal(t, int64(0), l.Held)
	assert.Equal(t, int64(n), l.Sold)
}

// Record.Status is a State: StateApplied, StateRestored (given back, or a tombstone) or
// StateRefused, as recorded by memstore through the relay.
func TestAttack14RecordStatusStates(t *testing.T) {
	e := stocktest.New(t)
	ctx := context.Background()
	r := e.Reserver
	st := memstore.New()
	require.NoError(t, r.Load(ctx, "rs", 10))
	require.NoError(t, st.Load(ctx, "rs", 2))
	_, err := r.Deduct(ctx, stock.Request{SKU: "rs", ID: "ok", Qty: 1})
	require.NoError(t, err)
	_, err = r.Deduct(ctx, stock.Request{SKU: "rs", ID: "back", Qty: 1})
	require.NoError(t, err)
	_, err = r.Restore(ctx, "rs", "back")
	require.NoError(t, err)
	_, err = r.Deduct(ctx, stock.Request{SKU: "rs", ID: "refused", Qty: 2}) // the Store has 1 left
	require.NoError(t, err)
	rl, err := stockops.NewRelay(r, st, nil, nil)
	require.NoError(t, err)
	drain(t, rl)
	drain(t, rl)
	recs, err := st.Records(ctx, "rs", []string{"ok", "refused", "back", "never"})
	require.NoError(t, err)
	assert.Equal(t, stock.StateApplied, recs["ok"].Status)
	assert.Equal(t, stock.StateRefused, recs["refused"].Status)
	assert.Equal(t, stock.StateRestored, recs["back"].Status)
	_, has := recs["never"]
	assert.False(t, has)
	e2, err := r.Ledger(ctx, "rs", "refused")
	require.NoError(t, err)
	assert.Equal(t, stock.StateRefused, e2.State)
	assert.Equal(t, int64(9), levels(t, r, "rs").Available, "only the applied sale stays sold")
	rem, err := st.Remaining(ctx, "rs")
	require.NoError(t, err)
	assert.Equal(t, int64(1), rem)
}

// The queue path drains on a cancelled ctx too: "lets the relay deliver what is due".
func TestAttack14RunPublisherDrainsOnCancelledCtx(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		require.NoError(t, r.Load(ctx, "qd", 10))
		for i := range 4 {
			_, err := r.Deduct(ctx, stock.Request{SKU: "qd", ID: fmt.Sprint("d", i), Qty: 1})
			require.NoError(t, err)
		}
		var n atomic.Int64
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		err := r.Run(cctx, stock.RunOptions{Publisher: stock.PublisherFunc(func(context.Context, stock.Event) error {
			n.Add(1)
			return nil
		})})
		assert.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, int64(4), n.Load())
		assert.Equal(t, int64(0), outboxLen(t, c, "qd"))
		pending, dead, err := stockops.Pending(ctx, r, "qd")
		require.NoError(t, err)
		assert.Equal(t, int64(0), pending)
		assert.Equal(t, int64(0), dead)
	})
}

// Delist under Run: "once the retention has passed (ReconcileOptions.Retention...) and a
// reconcile pass finds Redis and the Store in agreement with nothing pending, that pass retires
// the item ... A retired item answers ErrNotLoaded and may be loaded again."
func TestAttack14RunRetiresDelistedItem(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		st := memstore.New()
		cancel, done := runAsync(r, stock.RunOptions{Store: st,
			Reconcile: &stock.ReconcileOptions{Retention: 10 * time.Millisecond, Interval: 50 * time.Millisecond}})
		time.Sleep(200 * time.Millisecond)
		require.NoError(t, r.Load(ctx, "old:1", 10))
		require.NoError(t, st.Load(ctx, "old:1", 10))
		for i := range 5 {
			_, err := r.Deduct(ctx, stock.Request{SKU: "old:1", ID: fmt.Sprint("d", i), Qty: 1})
			require.NoError(t, err)
		}
		require.NoError(t, r.Delist(ctx, "old:1"))
		require.NoError(t, r.Delist(ctx, "old:1"), "delisting twice does nothing")
		assert.ErrorIs(t, r.ReopenItem(ctx, "old:1"), stock.ErrClosed)
		ok := eventually(10*time.Second, func() bool {
			redistest.Sleep(c, 50*time.Millisecond)
			_, err := r.Levels(ctx, "old:1")
			return errors.Is(err, stock.ErrNotLoaded)
		})
		assert.True(t, ok, "the delisted item was retired")
		_, err := r.Ledger(ctx, "old:1", "d0")
		assert.ErrorIs(t, err, stock.ErrUnknownID, "ledger included")
		require.NoError(t, r.Load(ctx, "old:1", 3), "a retired item may be loaded again")
		assert.Equal(t, int64(3), levels(t, r, "old:1").Available)
		cancel()
		err, _ = waitRun(t, done, 10*time.Second)
		assert.ErrorIs(t, err, context.Canceled)
	})
}

// Sweep of one item named twice counts its units once: "returns the units released".
func TestAttack14SweepDuplicateSKUs(t *testing.T) {
	e := stocktest.New(t)
	ctx := context.Background()
	r := e.Reserver
	require.NoError(t, r.Load(ctx, "dup", 10))
	_, err := r.Hold(ctx, stock.Request{SKU: "dup", ID: "h", Qty: 4}, time.Minute)
	require.NoError(t, err)
	e.Advance(2 * time.Minute)
	n, err := stockops.Sweep(ctx, r, "dup", "dup", "dup")
	require.NoError(t, err)
	assert.Equal(t, int64(4), n)
	assert.Equal(t, int64(10), levels(t, r, "dup").Available)
}

// A Store whose calls ignore their context and take longer than Drain. "Drain bounds the relay's
// last delivery after ctx ends: Run delivers the events that are due until none is left or Drain
// has passed." The call in flight when ctx ends cannot be cut short, but no new delivery may begin
// once Drain has passed; and no event is applied twice.
func TestAttack14RunStoreIgnoringCtx(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		st := &sleepyStore{onlyStore: onlyStore{s: memstore.New()}, d: time.Second}
		require.NoError(t, r.Load(ctx, "ig", 10))
		require.NoError(t, st.s.Load(ctx, "ig", 10))
		for i := range 4 {
			_, err := r.Deduct(ctx, stock.Request{SKU: "ig", ID: fmt.Sprint("d", i), Qty: 1})
			require.NoError(t, err)
		}
		cancel, done := runAsync(r, stock.RunOptions{Store: st, Drain: 100 * time.Millisecond})
		require.True(t, eventually(3*time.Second, func() bool { return st.calls.Load() > 0 }))
		cancel()
		start := time.Now()
		err, ok := waitRun(t, done, 10*time.Second)
		require.True(t, ok, "Run returned")
		t.Logf("Run returned %v after ctx ended (Drain 100ms, a Store call takes 1s, 4 events): %v", time.Since(start), err)
		st.mu.Lock()
		starts := append([]time.Time(nil), st.starts...)
		st.mu.Unlock()
		for i, at := range starts {
			t.Logf("Apply call %d began %v after ctx ended", i, at.Sub(start))
		}
		// "Run delivers the events that are due until none is left or Drain has passed": no new
		// delivery begins once Drain has passed.
		for i, at := range starts {
			assert.Less(t, at.Sub(start), 100*time.Millisecond+50*time.Millisecond, "Apply call %d began after Drain had passed", i)
		}
		rem, err := st.s.Remaining(ctx, "ig")
		require.NoError(t, err)
		assert.GreaterOrEqual(t, rem, int64(6))
		assert.LessOrEqual(t, st.s.MaxApplications(), 1)
	})
}

// Carts cut short by their caller's context (the closest the exported API gets to a process that
// died mid-saga), then recovered by two Runs on two Reservers sharing the Redis and by concurrent
// RecoverCarts calls: "Carts whose process died mid-saga and that nobody retries are undone by
// RecoverCarts", "concurrent calls add up to the carts undone", and every cart ends with every line
// or none; "a late retry of such a cart returns ErrRestored".
func TestAttack14RecoverCutCarts(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c1, c2 := b.Pair(t)
			r1, r2 := newReserver(t, c1), newReserver(t, c2)
			var skus []string
			for i := range 30 {
				s := fmt.Sprintf("cut:%d", i)
				skus = append(skus, s)
				require.NoError(t, r1.Load(ctx, s, 1000))
			}
			lines := make([]stock.Line, len(skus))
			for i, s := range skus {
				lines[i] = stock.Line{SKU: s, Qty: 1}
			}
			const carts = 40
			errs := make([]error, carts)
			for i := range carts {
				cctx, cancel := context.WithTimeout(ctx, time.Duration(i%8)*300*time.Microsecond)
				_, errs[i] = r1.DeductMany(cctx, stock.Cart{ID: fmt.Sprint("cart", i), User: "u", Lines: lines})
				cancel()
			}
			// Two Runs (no Store: sweeping and cart recovery only) and two direct calls.
			opts := stock.RunOptions{RecoverCartsAfter: 100 * time.Millisecond}
			cancel1, done1 := runAsync(r1, opts)
			cancel2, done2 := runAsync(r2, opts)
			redistest.Sleep(c1, 150*time.Millisecond)
			if b.Name == "miniredis" {
				time.Sleep(150 * time.Millisecond) // redistest.Sleep moves only miniredis's clock
			}
			var wg sync.WaitGroup
			var undone atomic.Int64
			for _, r := range []*stock.Reserver{r1, r2} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					n, err := stockops.RecoverCarts(ctx, r, 100*time.Millisecond)
					assert.NoError(t, err)
					undone.Add(int64(n))
				}()
			}
			wg.Wait()
			time.Sleep(time.Second) // undoing carts on miniredis's Lua takes a while
			cancel1()
			cancel2()
			t.Logf("Runs returned: %v / %v", <-done1, <-done2)
			var cut int
			for i := range carts {
				id := fmt.Sprint("cart", i)
				taken := 0
				for _, s := range skus {
					e, err := r1.Ledger(ctx, s, id)
					if err == nil && e.Taken() {
						taken++
					}
				}
				assert.True(t, taken == 0 || taken == len(skus), "cart %s (first answer %v): %d of %d lines taken", id, errs[i], taken, len(skus))
				if errs[i] != nil {
					cut++
					_, again := r1.DeductMany(ctx, stock.Cart{ID: id, User: "u", Lines: lines})
					if taken == 0 && again != nil {
						assert.ErrorIs(t, again, stock.ErrRestored, "cart %s", id)
					}
					if taken == len(skus) {
						assert.NoError(t, again, "cart %s was taken: a retry answers its receipts", id)
					}
				}
			}
			for _, s := range skus {
				checkLedger(t, r1, s, 1000)
			}
			t.Logf("%d carts cut short; the direct RecoverCarts calls undid %d", cut, undone.Load())
		})
	}
}

// Cart recovery under stocktest's one clock ("moves everything the Reserver depends on ... and
// stand still otherwise"): carts cut short are undone by RecoverCarts(olderThan) once Advance has
// moved the clock past olderThan, and not before.
func TestAttack14StocktestClockCartRecovery(t *testing.T) {
	e := stocktest.New(t)
	ctx := context.Background()
	r := e.Reserver
	var skus []string
	for i := range 30 {
		s := fmt.Sprintf("sc:%d", i)
		skus = append(skus, s)
		require.NoError(t, r.Load(ctx, s, 1000))
	}
	lines := make([]stock.Line, len(skus))
	for i, s := range skus {
		lines[i] = stock.Line{SKU: s, Qty: 1}
	}
	partial := func() (n int) {
		for i := range 40 {
			taken := 0
			for _, s := range skus {
				if en, err := r.Ledger(ctx, s, fmt.Sprint("cart", i)); err == nil && en.Taken() {
					taken++
				}
			}
			if taken != 0 && taken != len(skus) {
				n++
			}
		}
		return n
	}
	for i := range 40 {
		cctx, cancel := context.WithTimeout(ctx, time.Duration(i%8)*300*time.Microsecond)
		_, _ = r.DeductMany(cctx, stock.Cart{ID: fmt.Sprint("cart", i), User: "u", Lines: lines})
		cancel()
	}
	time.Sleep(500 * time.Millisecond) // real time passes; the stocktest clock stands still
	before := partial()
	n0, err := stockops.RecoverCarts(ctx, r, 30*time.Minute)
	require.NoError(t, err)
	assert.Equal(t, 0, n0, "no cart is 30 minutes old: the clock stood still")
	e.Advance(time.Hour)
	n1, err := stockops.RecoverCarts(ctx, r, 30*time.Minute)
	require.NoError(t, err)
	after := partial()
	t.Logf("%d carts half done before; RecoverCarts undid %d before Advance, %d after; %d still half done", before, n0, n1, after)
	assert.Equal(t, 0, after, "after Advance(1h), RecoverCarts(30m) undid every cart cut short")
	n2, err := stockops.RecoverCarts(ctx, r, 100*time.Millisecond)
	t.Logf("RecoverCarts(100ms), 500ms of real time after the carts: undid %d (%v); %d still half done", n2, err, partial())
}

// Run alone recovers carts cut short: "RecoverCartsAfter is the age past which a cart whose saga
// never ended is undone (see RecoverCarts); carts are looked at every half of it." With
// RecoverCartsAfter 100ms, none is left half done after one second of real time (and of the
// server's clock), or within 30 s on a loaded machine.
func TestAttack14RunAloneRecoversCutCarts(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		var skus []string
		for i := range 30 {
			s := fmt.Sprintf("ra:%d", i)
			skus = append(skus, s)
			require.NoError(t, r.Load(ctx, s, 1000))
		}
		lines := make([]stock.Line, len(skus))
		for i, s := range skus {
			lines[i] = stock.Line{SKU: s, Qty: 1}
		}
		partial := func() (n int) {
			for i := range 40 {
				taken := 0
				for _, s := range skus {
					if en, err := r.Ledger(ctx, s, fmt.Sprint("cart", i)); err == nil && en.Taken() {
						taken++
					}
				}
				if taken != 0 && taken != len(skus) {
					n++
				}
			}
			return n
		}
		for i := range 40 {
			cctx, cancel := context.WithTimeout(ctx, time.Duration(i%8)*300*time.Microsecond)
			_, _ = r.DeductMany(cctx, stock.Cart{ID: fmt.Sprint("cart", i), User: "u", Lines: lines})
			cancel()
		}
		before := partial()
		cancel, done := runAsync(r, stock.RunOptions{RecoverCartsAfter: 100 * time.Millisecond})
		// One second of both clocks, then as long again as a loaded machine needs (a bound,
		// not a wait: a CI run under load had 6 carts left after the first second).
		after := before
		for i := 0; i < 10 || (after != 0 && i < 300); i++ {
			redistest.Sleep(c, 100*time.Millisecond)
			time.Sleep(100 * time.Millisecond)
			if i >= 9 {
				after = partial()
			}
		}
		cancel()
		err := <-done
		assert.ErrorIs(t, err, context.Canceled)
		t.Logf("%d carts half done before Run, %d after", before, after)
		assert.Equal(t, 0, after, "Run undid every cart cut short")
	})
}

// logBuffer collects log records.
type logBuffer struct {
	mu   sync.Mutex
	msgs []string
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.msgs = append(b.msgs, string(p))
	return len(p), nil
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.msgs, "")
}

// RunOptions.GuardInterval: the guard runs "only on a Redis that answers INFO (not miniredis ...:
// Run then logs that the guard is off)". With a Store on miniredis, the log says so, and sales go
// on (no fence).
func TestAttack14RunLogsGuardOffOnMiniredis(t *testing.T) {
	var buf logBuffer
	e := stocktest.New(t, stock.WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
	ctx := context.Background()
	r := e.Reserver
	st := memstore.New()
	require.NoError(t, r.Load(ctx, "lg", 10))
	require.NoError(t, st.Load(ctx, "lg", 10))
	cancel, done := runAsync(r, stock.RunOptions{Store: st})
	time.Sleep(300 * time.Millisecond)
	_, err := r.Deduct(ctx, stock.Request{SKU: "lg", ID: "d", Qty: 1})
	assert.NoError(t, err, "no fence on miniredis")
	cancel()
	<-done
	out := buf.String()
	assert.Contains(t, strings.ToLower(out), "guard", "Run logged that the guard is off:\n%s", out)
}

// ConfirmMany: "A hold that expired makes it return ErrExpired after cancelling the others: a
// cart is confirmed whole or not at all", with Run's sweeper releasing the expired line meanwhile.
func TestAttack14ConfirmManyPartlyExpiredUnderRun(t *testing.T) {
	e := stocktest.New(t)
	ctx := context.Background()
	r := e.Reserver
	skus := []string{"cm:a", "cm:b", "cm:c"}
	for _, s := range skus {
		require.NoError(t, r.Load(ctx, s, 5))
	}
	cancel, done := runAsync(r, stock.RunOptions{SweepInterval: time.Millisecond})
	defer func() { cancel(); <-done }()
	for i := range 20 {
		id := fmt.Sprint("cart", i)
		_, err := r.HoldMany(ctx, stock.Cart{ID: id, Lines: []stock.Line{{SKU: "cm:a", Qty: 1}, {SKU: "cm:b", Qty: 1}, {SKU: "cm:c", Qty: 1}}}, time.Minute)
		require.NoError(t, err)
		_, err = r.Extend(ctx, skus[i%3], id, 10*time.Minute) // one line lives longer
		require.NoError(t, err)
		e.Advance(2 * time.Minute)
		time.Sleep(time.Duration(i%4) * time.Millisecond) // let the sweeper run, or not
		_, err = r.ConfirmMany(ctx, id, skus...)
		assert.ErrorIs(t, err, stock.ErrExpired, "cart %s", id)
		for _, s := range skus {
			en, err := r.Ledger(ctx, s, id)
			require.NoError(t, err)
			assert.False(t, en.Taken(), "cart %s: line %s is %s, want given back", id, s, en.State)
		}
		_, err = r.ConfirmMany(ctx, id, skus...)
		assert.ErrorIs(t, err, stock.ErrExpired, "a retry answers ErrExpired again")
	}
	for _, s := range skus {
		l := levels(t, r, s)
		assert.Equal(t, int64(5), l.Available, s)
	}
}
