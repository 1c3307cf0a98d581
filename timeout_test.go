package stock_test

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// returnsWithin runs call and fails t if it has not returned after limit: a call that would
// block forever fails the test instead of hanging it. The limit is a guard, not a measure.
func returnsWithin(t *testing.T, limit time.Duration, what string, call func() error) error {
	t.Helper()
	err := callWithin(limit, call)
	require.NotErrorIs(t, err, errDidNotReturn, "%s with a background context, while Redis is down, after %v", what, limit)
	return err
}

// errDidNotReturn is callWithin's answer for a call still running at its limit.
var errDidNotReturn = errors.New("did not return in time")

// callWithin is returnsWithin for other goroutines than the test's: it answers errDidNotReturn
// when call is still running after limit.
func callWithin(limit time.Duration, call func() error) error {
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		return errDidNotReturn
	}
}

// transportErr reports whether err wraps an error of the connection to Redis.
func transportErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}

// TestCallsBoundedWhileRedisDown stops redis-server under a Reserver and calls it with
// context.Background(). Before every command was bounded, Deduct blocked forever (rueidis
// resends a retryable script until the context ends) and, given a deadline, returned the bare
// dial error. Every call must now return, with an error wrapping ErrUnknownOutcome and the
// transport error, and context.DeadlineExceeded when it ran out of time.
func TestCallsBoundedWhileRedisDown(t *testing.T) {
	if os.Getenv(redistest.EnvServer) == "" {
		t.Skip("needs a real redis-server to stop: set " + redistest.EnvServer)
	}
	// Private servers only, and most of its time waits for bounds to run out: it runs beside
	// the other parallel tests, its subtests beside each other, and each deployment's calls at
	// once (each one's bound is its own).
	t.Parallel()

	t.Run("default", func(t *testing.T) {
		t.Parallel()
		srv := redistest.StartServer(t)
		r := newReserver(t, srv.Client(t))
		require.NoError(t, r.Load(ctx, "A", 10))
		must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1}))
		srv.Stop()
		err := returnsWithin(t, stock.DefaultTimeout+30*time.Second, "Deduct", func() error {
			return errOf(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", Qty: 1}))
		})
		require.ErrorIs(t, err, stock.ErrUnknownOutcome)
		require.ErrorIs(t, err, context.DeadlineExceeded, "the call ran out of time: %v", err)
		require.True(t, transportErr(err), "the transport error is wrapped: %v", err)
		require.Equal(t, "timeout", stock.Outcome(err))
		t.Logf("Deduct with the default timeout: %v", err)

		// The caller's own deadline, shorter than the bound: rueidis gives up resending just
		// before it and returns its dial error, which used to come back as is.
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err = r.Deduct(dctx, stock.Request{SKU: "A", ID: "o3", Qty: 1})
		require.ErrorIs(t, err, stock.ErrUnknownOutcome)
		require.ErrorIs(t, err, context.DeadlineExceeded, "%v", err)
		require.True(t, transportErr(err), "the transport error is wrapped: %v", err)
	})

	// Every kind of call, on each deployment, with a short bound.
	servers := map[string]func(t *testing.T) (rueidis.Client, func()){
		"standalone": func(t *testing.T) (rueidis.Client, func()) {
			srv := redistest.StartServer(t)
			return srv.Client(t), srv.Stop
		},
		"cluster": func(t *testing.T) (rueidis.Client, func()) {
			cl := redistest.StartCluster(t, 3)
			return cl.Client(t), func() {
				for _, s := range cl.Servers() {
					s.Stop()
				}
			}
		},
	}
	for _, name := range []string{"standalone", "cluster"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c, stop := servers[name](t)
			for _, coalescing := range []int{0, 4} {
				r := newReserver(t, c, stock.WithTimeout(time.Second), stock.WithCoalescing(coalescing))
				sku := "A" + string(rune('0'+coalescing))
				require.NoError(t, r.Load(ctx, sku, 10))
				must(t)(r.Deduct(ctx, stock.Request{SKU: sku, ID: "o1", Qty: 1}))
			}
			r := newReserver(t, c, stock.WithTimeout(time.Second), stock.WithCoalescing(0))
			rc := newReserver(t, c, stock.WithTimeout(time.Second))
			guard := stockops.NewFailoverGuard(r)
			rec := newReconciler(t, r, memstore.New(), nil)
			stop()
			calls := []struct {
				name     string
				retrying bool // rueidis resends it until the time runs out
				call     func() error
			}{
				{"Deduct", true, func() error { return errOf(r.Deduct(ctx, stock.Request{SKU: "A0", ID: "o2", Qty: 1})) }},
				{"Deduct coalesced", true, func() error { return errOf(rc.Deduct(ctx, stock.Request{SKU: "A4", ID: "o2", Qty: 1})) }},
				{"Restore", true, func() error { return errOf(r.Restore(ctx, "A0", "o1")) }},
				{"Hold", true, func() error { return errOf(r.Hold(ctx, stock.Request{SKU: "A0", ID: "h1", Qty: 1}, time.Minute)) }},
				{"Confirm", true, func() error { return errOf(r.Confirm(ctx, "A0", "h1")) }},
				{"Restock", true, func() error { return errOf(r.Restock(ctx, "A0", "s1", 1)) }},
				{"Available", true, func() error { return errOf(available(r.Levels(ctx, "A0"))) }},
				{"Levels", true, func() error { return errOf(r.Levels(ctx, "A0")) }},
				{"Ledger", true, func() error { return errOf(r.Ledger(ctx, "A0", "o1")) }},
				{"Load", false, func() error { return r.Load(ctx, "B", 1) }},
				{"DeductMany", false, func() error {
					return errOf(r.DeductMany(ctx, stock.Cart{ID: "c1", Lines: []stock.Line{{SKU: "A0", Qty: 1}, {SKU: "A4", Qty: 1}}}))
				}},
				{"FailoverGuard.Check", false, func() error { return errOf(guard.Check(ctx)) }},
				{"Reconciler.Once", false, func() error { return errOf(rec.Once(ctx)) }},
			}
			errs := make([]error, len(calls))
			var wg sync.WaitGroup
			for i, k := range calls {
				wg.Go(func() { errs[i] = callWithin(60*time.Second, k.call) })
			}
			wg.Wait()
			for i, k := range calls {
				err := errs[i]
				require.NotErrorIs(t, err, errDidNotReturn, "%s with a background context, while Redis is down", k.name)
				if !assert.ErrorIs(t, err, stock.ErrUnknownOutcome, "%s", k.name) {
					continue
				}
				assert.True(t, transportErr(err), "%s: the transport error is wrapped: %v", k.name, err)
				if k.retrying {
					assert.ErrorIs(t, err, context.DeadlineExceeded, "%s", k.name)
				}
				t.Logf("%s: %v", k.name, err)
			}
		})
	}
}

// TestWithTimeoutRange checks WithTimeout's bounds.
func TestWithTimeoutRange(t *testing.T) {
	_, c := redistest.Miniredis(t)
	for _, d := range []time.Duration{0, -time.Second, time.Microsecond, 2 * time.Hour} {
		assert.ErrorIs(t, errOf(stock.New(c, stock.WithTimeout(d))), stock.ErrInvalid, "WithTimeout(%v)", d)
	}
	assert.NoError(t, errOf(stock.New(c, stock.WithTimeout(time.Millisecond))))
}
