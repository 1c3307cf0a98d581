package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/rueidis"
)

// clockPoll is how often Run's loops look at a clock given with WithClock: a loop's step is due
// when its interval has passed in real time or on that clock, so that a test clock moved
// forward (stocktest's Env.Advance) runs the loops without waiting for their real intervals.
const clockPoll = 50 * time.Millisecond

// Run is stock.Reserver.Run.
func (r *Reserver) Run(ctx context.Context, opts RunOptions) error {
	every := func(d, def time.Duration) time.Duration {
		if d == 0 {
			return def
		}
		return d
	}
	sweep := every(opts.SweepInterval, time.Second)
	guardEvery := every(opts.GuardInterval, time.Second)
	cartAge := every(opts.RecoverCartsAfter, 5*time.Minute)
	drain := every(opts.Drain, 5*time.Second)
	rl, rc, err := r.runParts(opts)
	if err != nil {
		return err
	}
	if err := r.enter(); err != nil {
		return err
	}
	defer r.calls.Leave()
	if !r.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: one Run per Reserver at a time; this call started nothing", ErrRunning)
	}
	defer r.running.Store(false)
	ctx, stop, err := r.startRun(ctx) // Close stops Run through ctx
	if err != nil {
		return err
	}
	defer stop()
	if err := r.awaitPolicy(ctx); err != nil {
		return err
	}

	var mu sync.Mutex
	var first error
	fail := func(what string, err error) {
		if err == nil || ctx.Err() != nil {
			return
		}
		level := r.opts.logger.WarnContext
		if errors.Is(err, ErrRegistryLost) {
			level = r.opts.logger.ErrorContext
		}
		level(ctx, "stock: "+what, "err", err)
		mu.Lock()
		if first == nil {
			first = err
		}
		mu.Unlock()
	}
	var wg sync.WaitGroup
	loop := func(interval time.Duration, step func() error, what string) {
		if interval < 0 {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// With WithClock, a step is also due when that clock has moved by interval (a test's
			// clock moved forward), looked at every clockPoll of real time.
			tick := interval
			if r.opts.clockSet {
				tick = min(interval, clockPoll)
			}
			t := time.NewTicker(tick)
			defer t.Stop()
			for ctx.Err() == nil {
				started, clock := time.Now(), r.opts.now()
				fail(what, step())
				for due := false; !due && ctx.Err() == nil; {
					select {
					case <-ctx.Done():
					case <-t.C:
						due = time.Since(started) >= interval || r.opts.now().Sub(clock) >= interval
					}
				}
			}
		}()
	}
	var walk registryWalk
	loop(sweep, func() error { _, err := r.sweepDue(ctx, &walk); return err }, "sweep")
	cartEvery := max(cartAge/2, time.Millisecond) // a ticker needs a positive interval
	if cartAge < 0 {
		cartEvery = -1
	}
	loop(cartEvery, func() error { _, err := r.recoverCarts(ctx, cartAge); return err }, "recover carts")
	if rc != nil {
		if guardEvery > 0 {
			// The guard needs INFO. A server that refuses it (miniredis, an ACL without it)
			// turns the guard off; an error that says nothing of the server (unreachable, or
			// ctx ended) leaves the question to the next check, with no guard meanwhile: a
			// guard that cannot read INFO would fail every reconcile pass for good.
			var g *FailoverGuard
			off := false
			check := func() error {
				if off {
					return nil
				}
				if g == nil {
					if _, err := r.topology(ctx); err != nil {
						if isRedisErr(err) {
							off = true
							r.opts.logger.ErrorContext(ctx, "stock: failover guard off: Redis does not answer INFO", "err", err)
						}
						return nil
					}
					g = r.newFailoverGuard()
				}
				_, err := g.Check(ctx)
				return err
			}
			fail("failover guard", check()) // before the first pass, which may lift what it finds
			loop(guardEvery, check, "failover guard")
		}
		loop(rc.interval, func() error {
			res, err := rc.Pass(ctx) // a pass that records the primaries lifts g's fence at once
			rc.log(ctx, res.Reports)
			return err
		}, "reconcile")
	}
	if rl != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rl.run(ctx, func(err error) { fail("relay", err) }, false)
		}()
	}
	<-ctx.Done() // with every loop off, Run still lasts until ctx ends
	ended := time.Now()
	// Run returns at the latest limit after ctx ended, even when a Store or Publisher call
	// ignores its context: the loops and the drain run in a goroutine Run stops waiting for.
	limit := drain
	if limit <= 0 {
		limit = r.opts.timeout
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		wg.Wait()
		// The drain's time runs from the end of ctx, not from the end of the loops.
		if rl != nil && drain > 0 && time.Since(ended) < drain {
			dctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), ended.Add(drain))
			defer cancel()
			for {
				st, err := rl.Once(dctx)
				if err != nil {
					r.opts.logger.WarnContext(dctx, "stock: relay: events left in the outbox for the next start", "err", err)
					break
				}
				if st.Claimed == 0 {
					break
				}
			}
		}
	}()
	var stuck error
	t := time.NewTimer(time.Until(ended.Add(limit)))
	select {
	case <-done:
		t.Stop()
	case <-t.C:
		stuck = fmt.Errorf("stock: Run: a Store or Publisher call was still running %v after ctx ended; it goes on in the background, and its event stays in the outbox until it is applied", limit)
		r.opts.logger.ErrorContext(context.WithoutCancel(ctx), stuck.Error())
	}
	// The hints of the last calls are written before Run returns, for the next relay.
	r.hints.Flush()
	mu.Lock()
	defer mu.Unlock()
	if first != nil {
		return errors.Join(first, stuck)
	}
	if cause := context.Cause(ctx); errors.Is(cause, ErrReserverClosed) {
		return errors.Join(cause, stuck)
	}
	return errors.Join(ctx.Err(), stuck)
}

// awaitPolicy is Run's memory policy check, before it starts anything: ErrEvictionPolicy when
// Redis may evict this package's keys, nil once the policy is known to be safe (or allowed, or
// hidden). A Redis that cannot be reached is asked again every policyRecheck until ctx ends
// (whose error it then returns): Run does not fail because Redis is down when it starts.
func (r *Reserver) awaitPolicy(ctx context.Context) error {
	for {
		err := r.checkEviction(ctx)
		if err == nil || errors.Is(err, ErrEvictionPolicy) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.opts.logger.WarnContext(ctx, "stock: Run waits for Redis to check its maxmemory-policy", "err", err)
		t := time.NewTimer(policyRecheck)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Validate is stock.RunOptions.Validate.
func (o RunOptions) Validate() error {
	var r Reserver // the checks read no setting of a Reserver
	_, _, err := r.runParts(o)
	return err
}

// runParts makes the relay (with a Store or a Publisher) and the reconciler (with a Store) that
// Run runs for opts; nil for a part opts does not ask for.
func (r *Reserver) runParts(opts RunOptions) (rl *Relay, rc *Reconciler, err error) {
	if opts.Store != nil || opts.Publisher != nil {
		if rl, err = r.newRelay(opts.Store, opts.Publisher, opts.Relay); err != nil {
			return nil, nil, err
		}
	}
	if opts.Store != nil {
		if rc, err = r.newReconciler(opts.Store, opts.Reconcile); err != nil {
			return nil, nil, err
		}
	}
	return rl, rc, nil
}

// isRedisErr reports whether err wraps an error reply of Redis.
func isRedisErr(err error) bool {
	var re *rueidis.RedisError
	return errors.As(err, &re)
}

// RunOptions is stock.RunOptions (documented there; package stock converts one to the other).
type RunOptions struct {
	Store             Store
	Publisher         Publisher
	Relay             *RelayOptions
	Reconcile         *ReconcileOptions
	SweepInterval     time.Duration
	GuardInterval     time.Duration
	RecoverCartsAfter time.Duration
	Drain             time.Duration
}
