package stock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
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

// setPolicy sets maxmemory-policy on every node of c, and back to noeviction when t ends.
func setPolicy(t *testing.T, c rueidis.Client, policy string) {
	t.Helper()
	for addr, n := range c.Nodes() {
		require.NoError(t, n.Do(context.Background(), n.B().ConfigSet().ParameterValue().ParameterValue("maxmemory-policy", policy).Build()).Error(), addr)
	}
	t.Cleanup(func() {
		for _, n := range c.Nodes() {
			_ = n.Do(context.Background(), n.B().ConfigSet().ParameterValue().ParameterValue("maxmemory-policy", "noeviction").Build()).Error()
		}
	})
}

// dbsize is the number of keys on every node of c.
func dbsize(t *testing.T, c rueidis.Client) int64 {
	t.Helper()
	var total int64
	for addr, n := range c.Nodes() {
		k, err := n.Do(context.Background(), n.B().Dbsize().Build()).AsInt64()
		require.NoError(t, err, addr)
		total += k
	}
	return total
}

// eachPolicyBackend is eachBackend, with a miniredis that has CONFIG GET and SET of
// maxmemory-policy (noeviction to begin with; see redistest.MiniredisConfig).
func eachPolicyBackend(t *testing.T, f func(t *testing.T, c rueidis.Client)) {
	t.Helper()
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		if b.Real() {
			f(t, b.Client(t))
			return
		}
		m, c := redistest.Miniredis(t)
		require.NoError(t, redistest.MiniredisConfig(m, map[string]string{"maxmemory-policy": "noeviction"}))
		f(t, c)
	})
}

// TestEvictingPolicyRefusesWrites: on a Redis whose maxmemory-policy can evict keys, every
// method that writes is refused with ErrEvictionPolicy, whose message names the setting and the
// fix, and nothing is written; Run returns the error at once. A pass that finds the policy
// fixed lifts the refusal.
func TestEvictingPolicyRefusesWrites(t *testing.T) {
	eachPolicyBackend(t, func(t *testing.T, c rueidis.Client) {
		for _, policy := range []string{"allkeys-lru", "volatile-ttl"} {
			setPolicy(t, c, policy)
			r := newReserver(t, c) // New does not fail: it sends nothing
			_, err := r.Deduct(ctx, stock.Request{SKU: "x", ID: "a", Qty: 1})
			require.ErrorIs(t, err, stock.ErrEvictionPolicy)
			assert.Contains(t, err.Error(), "maxmemory-policy is "+policy)
			assert.Contains(t, err.Error(), "CONFIG SET maxmemory-policy noeviction")
			assert.Contains(t, err.Error(), "WithEvictionAllowed")
			assert.NotErrorIs(t, err, stock.ErrUnknownOutcome, "nothing was sent: the outcome is known")
		}

		// Concurrent first writes share one check, and every one is refused.
		r := newReserver(t, c)
		var wg sync.WaitGroup
		errs := make([]error, 32)
		for i := range errs {
			wg.Go(func() { _, errs[i] = r.Deduct(ctx, stock.Request{SKU: "x", ID: strconv.Itoa(i), Qty: 1}) })
		}
		wg.Wait()
		for _, err := range errs {
			assert.ErrorIs(t, err, stock.ErrEvictionPolicy)
		}

		req := stock.Request{SKU: "x", ID: "a", User: "u", Qty: 1}
		cart := stock.Cart{ID: "c", Lines: []stock.Line{{SKU: "x", Qty: 1}, {SKU: "y", Qty: 1}}}
		writes := map[string]func() error{
			"Load":        func() error { return r.Load(ctx, "x", 10) },
			"Deduct":      func() error { return testkit.Err(r.Deduct(ctx, req)) },
			"Hold":        func() error { return testkit.Err(r.Hold(ctx, req, time.Minute)) },
			"DeductMany":  func() error { return testkit.Err(r.DeductMany(ctx, cart)) },
			"HoldMany":    func() error { return testkit.Err(r.HoldMany(ctx, cart, time.Minute)) },
			"Restore":     func() error { return testkit.Err(r.Restore(ctx, "x", "a")) },
			"Cancel":      func() error { return testkit.Err(r.Cancel(ctx, "x", "a")) },
			"Confirm":     func() error { return testkit.Err(r.Confirm(ctx, "x", "a")) },
			"Extend":      func() error { return testkit.Err(r.Extend(ctx, "x", "a", time.Minute)) },
			"ConfirmMany": func() error { return testkit.Err(r.ConfirmMany(ctx, "c", "x", "y")) },
			"CancelMany":  func() error { return testkit.Err(r.CancelMany(ctx, "c", "x", "y")) },
			"Restock":     func() error { return testkit.Err(r.Restock(ctx, "x", "r", 5)) },
			"CloseItem":   func() error { return r.CloseItem(ctx, "x") },
			"ReopenItem":  func() error { return r.ReopenItem(ctx, "x") },
			"Delist":      func() error { return r.Delist(ctx, "x") },
			"Refuse":      func() error { return testkit.Err(stockops.Refuse(ctx, r, "x", "a")) },
		}
		for name, write := range writes {
			assert.ErrorIs(t, write(), stock.ErrEvictionPolicy, name)
		}
		assert.Equal(t, int64(0), dbsize(t, c), "a refused write writes nothing")

		// Run refuses at once and starts nothing (a Run that started would last until ctx ends).
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		err := r.Run(rctx, stock.RunOptions{Store: memstore.New()})
		require.ErrorIs(t, err, stock.ErrEvictionPolicy)
		assert.NoError(t, rctx.Err(), "Run returned before its context ended")
		assert.Equal(t, int64(0), dbsize(t, c))

		// Fixed, and seen so by a reconcile pass: the Reserver writes again at once.
		setPolicy(t, c, "noeviction")
		rec := newReconciler(t, r, memstore.New(), nil)
		res, err := rec.Pass(ctx)
		require.NoError(t, err)
		assert.Empty(t, res.NeedsHuman)
		require.NoError(t, r.Load(ctx, "x", 10))
		must(t)(r.Deduct(ctx, req))
	})
}

// writeLogged makes a Reserver on c with opts that logs to a logRecords, loads an item and
// sells three units, and returns what it logged.
func writeLogged(t *testing.T, c rueidis.Client, opts ...stock.Option) *logRecords {
	t.Helper()
	w := &logRecords{}
	r := newReserver(t, c, append(opts, stock.WithLogger(slog.New(w)))...)
	require.NoError(t, r.Load(ctx, "x", 10))
	for i := range 3 {
		must(t)(r.Deduct(ctx, stock.Request{SKU: "x", ID: strconv.Itoa(i), Qty: 1}))
	}
	return w
}

// TestEvictionAllowedWarnsOnce: WithEvictionAllowed accepts an evicting policy and says so once,
// loudly, through the Reserver's logger.
func TestEvictionAllowedWarnsOnce(t *testing.T) {
	eachPolicyBackend(t, func(t *testing.T, c rueidis.Client) {
		setPolicy(t, c, "allkeys-lru")
		w := writeLogged(t, c, stock.WithEvictionAllowed())
		assert.Equal(t, 1, w.count("WithEvictionAllowed"), "one warning: %q", w.msgs)
		assert.Equal(t, 1, w.count("maxmemory-policy is allkeys-lru"), "it names the policy: %q", w.msgs)
	})
}

// TestNoevictionAccepted: a Redis with maxmemory-policy noeviction is written to with no warning;
// one that hides its config (miniredis has no CONFIG; a real server with CONFIG renamed away) is
// written to with one warning that says so.
func TestNoevictionAccepted(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			w := writeLogged(t, b.Client(t))
			if b.Real() {
				assert.Empty(t, w.msgs)
			} else {
				assert.Equal(t, 1, w.count("does not tell its maxmemory-policy"), "%q", w.msgs)
			}
		})
	}
	if redistest.ServerBinary(t) == "" {
		return
	}
	t.Run("CONFIG renamed", func(t *testing.T) {
		s := redistest.StartServer(t, "--maxmemory-policy", "allkeys-lru", "--rename-command", "CONFIG", "")
		w := writeLogged(t, s.Client(t))
		assert.Equal(t, 1, w.count("does not tell its maxmemory-policy"), "%q", w.msgs)
	})
}

// TestMemoryPolicyCheckedAgainAfterRedisWasDown: New and a write while Redis is down do not
// decide the policy; the next write, once Redis is back, checks it and is refused.
func TestMemoryPolicyCheckedAgainAfterRedisWasDown(t *testing.T) {
	check := func(t *testing.T, c rueidis.Client, down, up func()) {
		down()
		r := newReserver(t, c, stock.WithTimeout(300*time.Millisecond))
		req := stock.Request{SKU: "x", ID: "a", Qty: 1}
		_, err := r.Deduct(context.Background(), req)
		require.Error(t, err)
		assert.NotErrorIs(t, err, stock.ErrEvictionPolicy)
		assert.ErrorIs(t, err, stock.ErrUnknownOutcome)
		up()
		_, err = r.Deduct(context.Background(), req)
		if errors.Is(err, stock.ErrUnknownOutcome) { // the first command on a connection broken by the restart
			_, err = r.Deduct(context.Background(), req)
		}
		assert.ErrorIs(t, err, stock.ErrEvictionPolicy)
	}
	t.Run("miniredis", func(t *testing.T) {
		m, c := redistest.Miniredis(t)
		config := func() {
			require.NoError(t, redistest.MiniredisConfig(m, map[string]string{"maxmemory-policy": "allkeys-lru"}))
		}
		check(t, c, m.Close, func() { require.NoError(t, m.Restart()); config() })
	})
	if redistest.ServerBinary(t) == "" {
		return
	}
	t.Run("standalone", func(t *testing.T) {
		s := redistest.StartServer(t, "--maxmemory-policy", "allkeys-lru")
		check(t, s.Client(t), s.Kill, s.Start)
	})
}

// TestReconcileReportsEvictingPolicy: a policy turned evicting after the Reserver checked it is
// reported by the next reconcile pass as needing a human, and the Reserver's writes are refused
// from then on.
func TestReconcileReportsEvictingPolicy(t *testing.T) {
	eachPolicyBackend(t, func(t *testing.T, c rueidis.Client) {
		w := &logRecords{}
		r := newReserver(t, c, stock.WithLogger(slog.New(w)))
		require.NoError(t, r.Load(ctx, "x", 10))
		must(t)(r.Deduct(ctx, stock.Request{SKU: "x", ID: "a", Qty: 1}))

		setPolicy(t, c, "allkeys-lru")
		rec := newReconciler(t, r, memstore.New(), &stock.ReconcileOptions{DryRun: true})
		res, _ := rec.Pass(ctx) // the store does not know the item: its report says so
		assert.Contains(t, res.NeedsHuman, "maxmemory-policy is allkeys-lru")
		assert.Equal(t, 1, w.count("NEEDS A HUMAN"), "the pass logs it: %q", w.msgs)
		mustFail(t, stock.ErrEvictionPolicy)(r.Deduct(ctx, stock.Request{SKU: "x", ID: "b", Qty: 1}))
	})
}

// TestReconcileReportsEvictedKeys: a pass on a Redis that evicted keys reports what that may
// have cost, once per eviction seen.
func TestReconcileReportsEvictedKeys(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skip("needs a real redis-server (STOCK_REDIS_SERVER): miniredis does not evict")
	}
	s := redistest.StartServer(t)
	c := s.Client(t)
	admin := func(args ...string) rueidis.RedisResult {
		return c.Do(ctx, c.B().Arbitrary(args...).Build())
	}
	// Evict: a maxmemory just above what is used, an evicting policy, and keys to fill it.
	info, err := admin("INFO", "memory").ToString()
	require.NoError(t, err)
	var used int64
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			used, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	require.Positive(t, used)
	require.NoError(t, admin("CONFIG", "SET", "maxmemory-policy", "allkeys-random").Error())
	require.NoError(t, admin("CONFIG", "SET", "maxmemory", strconv.FormatInt(used+1<<20, 10)).Error())
	big := strings.Repeat("x", 16<<10)
	for i := 0; ; i++ {
		require.Less(t, i, 1000, "no eviction after 16 MB")
		require.NoError(t, admin("SET", fmt.Sprint("junk", i), big).Error())
		if i%16 == 0 {
			info, err := admin("INFO", "stats").ToString()
			require.NoError(t, err)
			if !strings.Contains(info, "evicted_keys:0\r") {
				break
			}
		}
	}
	require.NoError(t, admin("CONFIG", "SET", "maxmemory", "0").Error())
	require.NoError(t, admin("CONFIG", "SET", "maxmemory-policy", "noeviction").Error())

	r := newReserver(t, c)
	rec := newReconciler(t, r, memstore.New(), nil)
	res, err := rec.Pass(ctx)
	require.NoError(t, err)
	assert.Contains(t, res.NeedsHuman, "evicted")
	assert.Contains(t, res.NeedsHuman, "idempotency records")
	assert.Contains(t, res.NeedsHuman, "per-user counts")
	res, err = rec.Pass(ctx)
	require.NoError(t, err)
	assert.Empty(t, res.NeedsHuman, "the same evictions are reported once")
}
