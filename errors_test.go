package stock_test

// What the errors say: a conflict names what differs, a reply not understood is an unknown
// outcome, and every outcome has its label.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/redis/rueidis/mock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// corruptReplies is a client whose script calls run in Redis but answer reply instead, as a
// garbled reply would: the script ran, its answer is not understood.
type corruptReplies struct {
	rueidis.Client
	reply rueidis.RedisMessage
}

func (c corruptReplies) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	name := cmd.Commands()[0] // before Do, which recycles cmd
	res := c.Client.Do(ctx, cmd)
	if (name == "EVALSHA" || name == "EVAL" || name == "FCALL") && res.Error() == nil {
		return mock.Result(c.reply)
	}
	return res
}

// TestMalformedReplyIsUnknownOutcome: a script reply this package does not understand comes
// after the script ran, so it may have written: the error is ErrUnknownOutcome, never
// ErrInvalid (whose doc says nothing changed). Before, every such reply was ErrInvalid, and a
// caller that trusted it gave up on a sale Redis had made.
func TestMalformedReplyIsUnknownOutcome(t *testing.T) {
	replies := map[string]rueidis.RedisMessage{
		"too many values":  mock.RedisArray(mock.RedisInt64(0), mock.RedisInt64(9), mock.RedisInt64(1), mock.RedisInt64(0)),
		"not an integer":   mock.RedisArray(mock.RedisInt64(0), mock.RedisString("nine"), mock.RedisInt64(1)),
		"unknown code":     mock.RedisArray(mock.RedisInt64(99), mock.RedisInt64(9), mock.RedisInt64(1)),
		"not an array":     mock.RedisString("OK"),
		"nil":              mock.RedisNil(),
		"pair, not triple": mock.RedisArray(mock.RedisInt64(0), mock.RedisInt64(9)),
	}
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		honest := newReserver(t, c)
		require.NoError(t, honest.Load(ctx, "A", 100))
		n := 0
		for name, reply := range replies {
			for _, coalescing := range []int{0, 4} {
				n++
				id := fmt.Sprintf("o%d", n)
				r := newReserver(t, corruptReplies{Client: c, reply: reply}, stock.WithCoalescing(coalescing))
				_, err := r.Deduct(ctx, stock.Request{SKU: "A", ID: id, Qty: 1})
				require.ErrorIs(t, err, stock.ErrUnknownOutcome, "%s (coalescing %d)", name, coalescing)
				require.NotErrorIs(t, err, stock.ErrInvalid, "%s: ErrInvalid says nothing changed, but the script ran", name)
				require.Equal(t, "error", stock.Outcome(err), "%s", name)
				// The script did run: the retry the error asks for is a replay.
				rc := must(t)(honest.Deduct(ctx, stock.Request{SKU: "A", ID: id, Qty: 1, Retry: true}))
				require.True(t, rc.Replayed, "%s: the deduct was made", name)

				_, err = r.Restore(ctx, "A", id)
				require.ErrorIs(t, err, stock.ErrUnknownOutcome, "restore, %s", name)
				require.NotErrorIs(t, err, stock.ErrInvalid)
				if name != "pair, not triple" { // the shape of close.lua's reply
					err = r.CloseItem(ctx, "A")
					require.ErrorIs(t, err, stock.ErrUnknownOutcome, "close, %s", name)
					require.NotErrorIs(t, err, stock.ErrInvalid)
					require.NoError(t, honest.ReopenItem(ctx, "A"))
				}
			}
		}
	})
}

// TestOutcomeLabels: ErrFailover (nothing sent) and ErrNotReplicated (written) have their own
// labels; before, both were "error", the label of an unknown outcome. An unknown outcome is
// "timeout" when the time ran out, "error" otherwise.
func TestOutcomeLabels(t *testing.T) {
	for err, want := range map[error]string{
		stock.ErrFailover:      "failover",
		stock.ErrNotReplicated: "not_replicated",
		fmt.Errorf("%w: WAIT: 0 of 1 replicas", stock.ErrNotReplicated):                                  "not_replicated",
		fmt.Errorf("%w: %w", stock.ErrUnknownOutcome, errors.New("EOF")):                                 "error",
		fmt.Errorf("%w: %w (%w)", stock.ErrUnknownOutcome, errors.New("dial"), context.DeadlineExceeded): "timeout",
		fmt.Errorf("%w: %w", stock.ErrUnknownOutcome, context.Canceled):                                  "canceled",
	} {
		assert.Equal(t, want, stock.Outcome(err), "%v", err)
	}
}

// TestFailoverAndNotReplicatedObserved: a fenced Deduct and a Deduct no replica acknowledged
// are observed with their own outcomes, and the second's receipt is valid.
func TestFailoverAndNotReplicatedObserved(t *testing.T) {
	if os.Getenv(redistest.EnvServer) == "" {
		t.Skip("needs a real redis-server (INFO for the guard, WAIT): set " + redistest.EnvServer)
	}
	srv := redistest.StartServer(t)
	var mu sync.Mutex
	seen := map[string]int{}
	obs := stock.ObserverFunc(func(_ context.Context, o stock.Observation) {
		mu.Lock()
		defer mu.Unlock()
		seen[o.Op+"/"+o.Outcome]++
	})

	// No replica: WAIT answers 0, the deduct is made and reported ErrNotReplicated.
	ra := newReserver(t, srv.Client(t), stock.WithReplicaAck(1, 10*time.Millisecond), stock.WithObserver(obs))
	require.NoError(t, ra.Load(ctx, "A", 10))
	rc := mustFail(t, stock.ErrNotReplicated)(ra.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 2}))
	assert.Equal(t, int64(2), rc.Qty)
	assert.Equal(t, int64(8), rc.Remaining)

	// Items but no recorded epoch (the first Load's is lost): the guard fences; Deduct sends
	// nothing.
	c := srv.Client(t)
	require.NoError(t, c.Do(ctx, c.B().Del().Key("stock:epoch").Build()).Error())
	r := newReserver(t, c, stock.WithObserver(obs))
	checkFenced(t, stockops.NewFailoverGuard(r), true)
	mustFail(t, stock.ErrFailover)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", Qty: 1}))
	assert.Equal(t, int64(8), levels(t, r, "A").Available, "a fenced deduct takes nothing")

	assert.Equal(t, map[string]int{"deduct/not_replicated": 1, "deduct/failover": 1}, seen)
}

// conflictSays asserts that err is ErrConflict and that its message says each of says, and
// none of not.
func conflictSays(t *testing.T, err error, says []string, not ...string) {
	t.Helper()
	require.ErrorIs(t, err, stock.ErrConflict)
	for _, s := range says {
		assert.Contains(t, err.Error(), s)
	}
	for _, s := range not {
		assert.NotContains(t, err.Error(), s)
	}
}

// TestConflictSaysWhatDiffers: a request id reused with other parameters is ErrConflict whose
// message names what differs from the id's first use (the kind, the quantity, the user, for a
// cart its lines), never a field that is the same, on plain and split items and for carts.
func TestConflictSaysWhatDiffers(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		r := newReserver(t, c, splitSAndGroupG...)
		for _, sku := range []string{"A", "B", "S", "G1", "G2"} {
			require.NoError(t, r.Load(ctx, sku, 100))
		}
		deduct := func(sku, id, user string, qty int64) error {
			_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: user, Qty: qty})
			return err
		}
		hold := func(sku, id, user string, qty int64) error {
			_, err := r.Hold(ctx, stock.Request{SKU: sku, ID: id, User: user, Qty: qty}, time.Minute)
			return err
		}
		for _, sku := range []string{"A", "S"} {
			t.Run(sku, func(t *testing.T) {
				require.NoError(t, deduct(sku, "d1", "u1", 1))
				conflictSays(t, deduct(sku, "d1", "u2", 1), []string{sku + "/d1 was used by another user"}, "units", "quantity", "u1")
				conflictSays(t, deduct(sku, "d1", "u1", 3), []string{"with quantity 1, not 3"}, "user")
				conflictSays(t, deduct(sku, "d1", "", 1), []string{"by a user, not without one"}, "units")
				conflictSays(t, hold(sku, "d1", "u1", 1), []string{"was used for a deduct, not a hold"}, "units", "user")
				conflictSays(t, hold(sku, "d1", "u1", 2), []string{"was used for a deduct, not a hold; with quantity 1, not 2"}, "user")

				require.NoError(t, hold(sku, "h1", "u1", 2))
				conflictSays(t, deduct(sku, "h1", "u1", 2), []string{"was used for a hold, not a deduct"}, "units", "user")

				require.NoError(t, deduct(sku, "d2", "", 1))
				conflictSays(t, deduct(sku, "d2", "u3", 1), []string{"was used without a user, not by u3"}, "units")

				_, err := r.Confirm(ctx, sku, "d1")
				conflictSays(t, err, []string{"was used for a deduct, not a hold"}, "units")
				_, err = r.Extend(ctx, sku, "d1", time.Minute)
				conflictSays(t, err, []string{"was used for a deduct, not a hold"}, "units")
				_, err = r.Cancel(ctx, sku, "d1")
				conflictSays(t, err, []string{"was used for a deduct, not a hold"}, "units")

				must(t)(r.Restock(ctx, sku, "r1", 5))
				conflictSays(t, deduct(sku, "r1", "u1", 5), []string{"was used for a restock, not a deduct"}, "units")
				_, err = r.Restock(ctx, sku, "r1", 6)
				conflictSays(t, err, []string{"with quantity 5, not 6"}, "restock, not")
				_, err = r.Restock(ctx, sku, "d1", 1)
				conflictSays(t, err, []string{"was used for a deduct, not a restock"}, "units")
				if sku == "A" { // a split item's restock goes to a bucket the restore does not look in
					_, err = r.Restore(ctx, sku, "r1")
					conflictSays(t, err, []string{"was used for a restock, which cannot be given back"})
				}
			})
		}

		t.Run("saga cart", func(t *testing.T) {
			lines := []stock.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 1}}
			mustCart(t)(r.DeductMany(ctx, stock.Cart{ID: "c1", User: "u1", Lines: lines}))
			_, err := r.DeductMany(ctx, stock.Cart{ID: "c1", User: "u2", Lines: lines})
			conflictSays(t, err, []string{"cart c1 was used by another user"}, "lines", "u1")
			_, err = r.HoldMany(ctx, stock.Cart{ID: "c1", User: "u1", Lines: lines}, time.Minute)
			conflictSays(t, err, []string{"cart c1 was used for a deduct cart, not a hold cart"}, "user", "lines")
			_, err = r.DeductMany(ctx, stock.Cart{ID: "c1", User: "u1", Lines: []stock.Line{{SKU: "A", Qty: 2}}})
			conflictSays(t, err, []string{"with other lines (item A: quantity 1, not 2; item B in it too)"}, "user")
		})
		t.Run("one-slot cart", func(t *testing.T) {
			lines := []stock.Line{{SKU: "G1", Qty: 1}, {SKU: "G2", Qty: 1}}
			mustCart(t)(r.DeductMany(ctx, stock.Cart{ID: "c2", User: "u1", Lines: lines}))
			_, err := r.DeductMany(ctx, stock.Cart{ID: "c2", User: "u2", Lines: lines})
			conflictSays(t, err, []string{"G1/c2 was used by another user"}, "units")
			var ce *stock.CartError
			assert.ErrorAs(t, err, &ce)
		})
		l, _ := checkLedger(t, r, "A", 100)
		assert.Equal(t, int64(105), l.Loaded, "the conflicts changed nothing: only the restock added")
	})
}

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
			return testkit.Err(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", Qty: 1}))
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
				{"Deduct", true, func() error { return testkit.Err(r.Deduct(ctx, stock.Request{SKU: "A0", ID: "o2", Qty: 1})) }},
				{"Deduct coalesced", true, func() error { return testkit.Err(rc.Deduct(ctx, stock.Request{SKU: "A4", ID: "o2", Qty: 1})) }},
				{"Restore", true, func() error { return testkit.Err(r.Restore(ctx, "A0", "o1")) }},
				{"Hold", true, func() error { return testkit.Err(r.Hold(ctx, stock.Request{SKU: "A0", ID: "h1", Qty: 1}, time.Minute)) }},
				{"Confirm", true, func() error { return testkit.Err(r.Confirm(ctx, "A0", "h1")) }},
				{"Restock", true, func() error { return testkit.Err(r.Restock(ctx, "A0", "s1", 1)) }},
				{"Available", true, func() error { return testkit.Err(available(r.Levels(ctx, "A0"))) }},
				{"Levels", true, func() error { return testkit.Err(r.Levels(ctx, "A0")) }},
				{"Ledger", true, func() error { return testkit.Err(r.Ledger(ctx, "A0", "o1")) }},
				{"Load", false, func() error { return r.Load(ctx, "B", 1) }},
				{"DeductMany", false, func() error {
					return testkit.Err(r.DeductMany(ctx, stock.Cart{ID: "c1", Lines: []stock.Line{{SKU: "A0", Qty: 1}, {SKU: "A4", Qty: 1}}}))
				}},
				{"FailoverGuard.Check", false, func() error { return testkit.Err(guard.Check(ctx)) }},
				{"Reconciler.Once", false, func() error { return testkit.Err(rec.Once(ctx)) }},
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
		assert.ErrorIs(t, testkit.Err(stock.New(c, stock.WithTimeout(d))), stock.ErrInvalid, "WithTimeout(%v)", d)
	}
	assert.NoError(t, testkit.Err(stock.New(c, stock.WithTimeout(time.Millisecond))))
}

func TestObserver(t *testing.T) {
	_, c := redistest.Miniredis(t)
	var mu sync.Mutex
	seen := map[string]int{}
	var relayed int64
	obs := stock.ObserverFunc(func(_ context.Context, o stock.Observation) {
		mu.Lock()
		defer mu.Unlock()
		seen[o.Op+"/"+o.Outcome]++
		if o.Replayed {
			seen[o.Op+"/replayed"]++
		}
		if o.Op == "relay" {
			relayed += o.Units
		}
		assert.Positive(t, o.Duration+o.Lag+1)
	})
	r := newReserver(t, c, stock.WithObserver(obs))
	require.NoError(t, r.Load(ctx, "A", 2))
	for i := range 3 {
		_, _ = r.Deduct(ctx, stock.Request{SKU: "A", ID: fmt.Sprint("o", i), Qty: 1})
	}
	_, _ = r.Deduct(ctx, stock.Request{SKU: "A", ID: "o0", Qty: 1})
	_, _ = r.Deduct(ctx, stock.Request{SKU: "A", ID: "", Qty: 1})
	_, _ = r.Restore(ctx, "A", "o1")
	store := memstore.New()
	require.NoError(t, store.Load(ctx, "A", 2))
	rl := newRelay(t, r, store, nil, nil)
	drain(t, rl)
	rec := newReconciler(t, r, store, nil)
	require.NoError(t, testkit.Err(rec.Once(ctx)))
	assert.Equal(t, map[string]int{
		"deduct/ok": 3, "deduct/replayed": 1, "deduct/sold_out": 1, "deduct/invalid": 1,
		"restore/ok": 1, "relay/ok": 1, "reconcile/ok": 1,
	}, seen)
	assert.Equal(t, int64(3), relayed)
	assert.Equal(t, "error", stock.Outcome(errors.New("boom")))
	assert.Equal(t, "sold_out", stock.Outcome(fmt.Errorf("x: %w", stock.ErrSoldOut)))
}

// startRecorder is a StartObserver that checks the contract: every Start is followed by one
// Observe of the same op, on the context Start returned.
type startRecorder struct {
	mu       sync.Mutex
	started  map[int]string // token -> op, until observed
	next     int
	observed []string
	bad      []string
}

type tokenKey struct{}

func (s *startRecorder) Start(ctx context.Context, op, sku string) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	s.started[s.next] = op
	return context.WithValue(ctx, tokenKey{}, s.next)
}

func (s *startRecorder) Observe(ctx context.Context, o stock.Observation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tok, _ := ctx.Value(tokenKey{}).(int)
	if op, ok := s.started[tok]; !ok || op != o.Op {
		s.bad = append(s.bad, fmt.Sprintf("%s/%s observed on a context Start did not return for it (token %d, %q)", o.Op, o.Outcome, tok, op))
	}
	delete(s.started, tok)
	s.observed = append(s.observed, o.Op+"/"+o.Outcome)
}

// TestStartObserver: a StartObserver is told when each operation starts, the operation runs on
// the context it returns, and Observe gets that context once, on success, refusal, invalid
// input and failure alike.
func TestStartObserver(t *testing.T) {
	_, c := redistest.Miniredis(t)
	rec := &startRecorder{started: map[int]string{}}
	r := newReserver(t, c, stock.WithObserver(rec), stock.WithOutbox(true))
	require.NoError(t, r.Load(ctx, "A", 2))
	require.NoError(t, r.Load(ctx, "B", 2))
	_, _ = r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1})
	_, _ = r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1})   // replay
	_, _ = r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", Qty: 5})   // insufficient
	_, _ = r.Deduct(ctx, stock.Request{SKU: "A b", ID: "o3", Qty: 1}) // invalid
	_, _ = r.Hold(ctx, stock.Request{SKU: "B", ID: "h1", Qty: 1}, 0)  // invalid ttl
	_, _ = r.Hold(ctx, stock.Request{SKU: "B", ID: "h1", Qty: 1}, time.Minute)
	_, _ = r.Extend(ctx, "B", "h1", time.Minute)
	_, _ = r.Confirm(ctx, "B", "h1")
	_, _ = r.Cancel(ctx, "B", "nobody")
	_, _ = r.Restore(ctx, "A", "o1")
	_, _ = r.Restock(ctx, "A", "r1", 1)
	_, _ = r.DeductMany(ctx, stock.Cart{ID: "c1", Lines: []stock.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 1}}})
	_, _ = r.DeductMany(ctx, stock.Cart{ID: "c2", Lines: []stock.Line{{SKU: "A", Qty: 9}}}) // refused
	_, _ = r.HoldMany(ctx, stock.Cart{ID: "c3", Lines: []stock.Line{{SKU: "B", Qty: 1}}}, -time.Second)
	store := memstore.New()
	require.NoError(t, store.Load(ctx, "A", 2))
	require.NoError(t, store.Load(ctx, "B", 2))
	relay := newRelay(t, r, store, nil, nil)
	require.NoError(t, testkit.Err(relay.Once(ctx)))
	rc := newReconciler(t, r, store, &stock.ReconcileOptions{DryRun: true})
	require.NoError(t, testkit.Err(rc.Once(ctx)))
	dead, cancel := context.WithCancel(ctx)
	cancel() // every call now fails before its outcome is known
	_, _ = r.Deduct(dead, stock.Request{SKU: "A", ID: "o9", Qty: 1})
	_, _ = r.Confirm(dead, "B", "h9")

	rec.mu.Lock()
	defer rec.mu.Unlock()
	assert.Empty(t, rec.bad)
	assert.Empty(t, rec.started, "every Start was observed")
	for _, want := range []string{"deduct/ok", "deduct/insufficient", "deduct/invalid", "hold/invalid", "hold/ok",
		"extend/ok", "confirm/ok", "cancel/unknown_id", "restore/ok", "restock/ok", "deduct_many/ok",
		"deduct_many/insufficient", "hold_many/invalid", "relay/ok", "reconcile/ok", "deduct/canceled", "confirm/canceled"} {
		assert.Contains(t, rec.observed, want)
	}
}
