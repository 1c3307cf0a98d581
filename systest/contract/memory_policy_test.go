package contract_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// TestOOM: maxmemory below the used memory with noeviction. FCALL is refused (OOM) before
// it runs; the script path answers. Replays and sold-out answers still work; new takes fail
// with an error (not an acknowledgement). Then memory is raised and retries take exactly once.
func TestOOM(t *testing.T) {
	admin, r := serverReserver(t, nil, stock.WithTimeout(3*time.Second))
	require.NoError(t, r.Load(ctx, "m", 300))
	require.NoError(t, r.Load(ctx, "z", 1))
	require.NoError(t, errOf(r.Deduct(ctx, stock.Request{SKU: "z", ID: "z1", Qty: 1})))
	st := newStats()
	st.acked["z1"] = "z"
	faultTraffic([]*stock.Reserver{r}, st, "pre", []string{"m"}, 4, 25, 1)
	require.Empty(t, st.raw)
	goOOM(t, admin)
	// A flushed library must be loaded again: FUNCTION LOAD is itself refused under OOM.
	require.NoError(t, faultDo(t, admin, "FUNCTION", "FLUSH").Error())
	// Replays: on the sold-out item they answer; on the item with stock, see TestOOMReplay.
	rc, err := r.Deduct(ctx, stock.Request{SKU: "z", ID: "z1", Qty: 1, Retry: true})
	if assert.NoError(t, err, "replay of z1 under OOM") {
		assert.True(t, rc.Replayed)
	}
	// Sold out answers (without Retry: no write).
	_, err = r.Deduct(ctx, stock.Request{SKU: "z", ID: "z2", Qty: 1})
	assert.ErrorIs(t, err, stock.ErrSoldOut, "sold out under OOM")
	l := testkit.Levels(t, r, "m")
	// New takes fail, and are retried later.
	var failed []string
	for i := 0; i < 20; i++ {
		id := fmt.Sprintf("oom-%d", i)
		start := time.Now()
		_, err := r.Deduct(ctx, stock.Request{SKU: "m", ID: id, Qty: 1})
		st.dur(time.Since(start))
		if err == nil {
			st.mu.Lock()
			st.acked[id] = "m"
			st.mu.Unlock()
			continue
		}
		t.Logf("deduct under OOM: %v", err)
		assert.NotErrorIs(t, err, stock.ErrSoldOut)
		failed = append(failed, id)
		st.mu.Lock()
		st.unknown[id] = "m"
		st.mu.Unlock()
	}
	_, err = r.Hold(ctx, stock.Request{SKU: "m", ID: "oomhold", Qty: 1}, time.Minute)
	t.Logf("hold under OOM: %v", err)
	assert.Equal(t, l.Sold, testkit.Levels(t, r, "m").Sold+0, "nothing taken under OOM")
	require.NoError(t, faultDo(t, admin, "CONFIG", "SET", "maxmemory", "0").Error())
	for _, id := range failed {
		deduct(r, st, "m", id, 3)
	}
	require.NoError(t, errOf(r.Hold(ctx, stock.Request{SKU: "m", ID: "oomhold", Qty: 1, Retry: true}, time.Minute)))
	_, err = r.Confirm(ctx, "m", "oomhold")
	require.NoError(t, err)
	st.mu.Lock()
	st.acked["oomhold"] = "m"
	st.mu.Unlock()
	t.Logf("raw %v max %v", st.raw, st.maxDur)
	assert.Empty(t, st.unknown)
	faultCheck(t, r, st, map[string]int64{"m": 300, "z": 1})
	assert.NotEmpty(t, faultLibs(t, admin), "library loaded again after the OOM")
}

// TestOOMReplay: scripts.go (refusedFcall) says an FCALL refused for OOM falls back to the
// script because "a script runs and is refused at its first write (replays and refusals still
// answer)". A replay of an acknowledged deduct (Retry set, after an unknown outcome) on an item
// that still has stock, under OOM: does it answer Replayed?
func TestOOMReplay(t *testing.T) {
	admin, r := serverReserver(t, nil)
	require.NoError(t, r.Load(ctx, "p", 10))
	require.NoError(t, errOf(r.Deduct(ctx, stock.Request{SKU: "p", ID: "o1", Qty: 1})))
	goOOM(t, admin)
	defer faultDo(t, admin, "CONFIG", "SET", "maxmemory", "0")
	rc := must(r.Deduct(ctx, stock.Request{SKU: "p", ID: "o1", Qty: 1, Retry: true}))(t, "replay of an acknowledged deduct under OOM")
	assert.True(t, rc.Replayed)
}

// goOOM puts a server out of memory under noeviction: it fills it with a big value, then caps
// memory below the use.
func goOOM(t *testing.T, admin rueidis.Client) {
	t.Helper()
	require.NoError(t, faultDo(t, admin, "SET", "ballast", strings.Repeat("x", 4<<20)).Error())
	require.NoError(t, faultDo(t, admin, "CONFIG", "SET", "maxmemory-policy", "noeviction").Error())
	require.NoError(t, faultDo(t, admin, "CONFIG", "SET", "maxmemory", "1mb").Error())
}

// miniWithPolicy starts a miniredis whose maxmemory-policy reads policy and returns a client
// without caching and the server's address.
func miniWithPolicy(t *testing.T, policy string) (rueidis.Client, string) {
	t.Helper()
	m := miniredis.RunT(t)
	require.NoError(t, redistest.MiniredisConfig(m, map[string]string{"maxmemory-policy": policy}))
	c := must(rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{m.Addr()}, DisableCache: true}))(t)
	t.Cleanup(c.Close)
	return c, m.Addr()
}

// serverReserver starts a real redis-server with args (skipping without STOCK_REDIS_SERVER) and
// returns an admin client of it and a Reserver with opts on a client of its own, closed when the
// test ends.
func serverReserver(t *testing.T, args []string, opts ...stock.Option) (admin rueidis.Client, r *stock.Reserver) {
	t.Helper()
	faultReal(t)
	s := redistest.StartServer(t, args...)
	r = testkit.NewReserver(t, s.Client(t), opts...)
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	return s.Client(t), r
}

func outsideKeys(t *testing.T, c rueidis.Client) []string {
	t.Helper()
	ks := must(c.Do(context.Background(), c.B().Keys().Pattern("*").Build()).AsStrSlice())(t)
	return ks
}

func outsideConfigSet(t *testing.T, c rueidis.Client, policy string) {
	t.Helper()
	require.NoError(t, c.Do(context.Background(), c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory-policy", policy).Build()).Error())
}

// every write of the Reserver, with the results wanted.
func outsideAllWrites(ctx context.Context, r *stock.Reserver) map[string]error {
	out := map[string]error{}
	out["Load"] = r.Load(ctx, "a", 10)
	_, out["Deduct"] = r.Deduct(ctx, stock.Request{SKU: "a", ID: "d1", User: "u", Qty: 1})
	_, out["Hold"] = r.Hold(ctx, stock.Request{SKU: "a", ID: "h1", User: "u", Qty: 1}, time.Minute)
	_, out["DeductMany"] = r.DeductMany(ctx, stock.Cart{ID: "c1", User: "u", Lines: []stock.Line{{SKU: "a", Qty: 1}, {SKU: "b", Qty: 1}}})
	_, out["HoldMany"] = r.HoldMany(ctx, stock.Cart{ID: "c2", User: "u", Lines: []stock.Line{{SKU: "a", Qty: 1}, {SKU: "b", Qty: 1}}}, time.Minute)
	_, out["Restore"] = r.Restore(ctx, "a", "unknown")
	_, out["Cancel"] = r.Cancel(ctx, "a", "unknown2")
	_, out["Confirm"] = r.Confirm(ctx, "a", "h1")
	_, out["Extend"] = r.Extend(ctx, "a", "h1", time.Minute)
	_, out["Restock"] = r.Restock(ctx, "a", "r1", 1)
	out["CloseItem"] = r.CloseItem(ctx, "a")
	out["ReopenItem"] = r.ReopenItem(ctx, "a")
	out["Delist"] = r.Delist(ctx, "a")
	_, out["ConfirmMany"] = r.ConfirmMany(ctx, "c2", "a", "b")
	_, out["CancelMany"] = r.CancelMany(ctx, "c2", "a", "b")
	_, out["Refuse"] = stockops.Refuse(ctx, r, "a", "d1")
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	out["Run"] = r.Run(rctx, stock.RunOptions{Store: memstore.New()})
	out["RunNoStore"] = r.Run(rctx, stock.RunOptions{})
	return out
}

func outsideEvictingServers(t *testing.T) map[string]rueidis.Client {
	out := map[string]rueidis.Client{}
	out["miniredis-volatile-lru"], _ = miniWithPolicy(t, "volatile-lru")
	if redistest.ServerBinary(t) != "" {
		for _, p := range []string{"allkeys-lru", "volatile-ttl", "allkeys-random", "volatile-lfu"} {
			s := redistest.StartServer(t, "--maxmemory-policy", p)
			out["standalone-"+p] = s.Client(t)
		}
	}
	return out
}

func TestEvictionPolicyRefusesEveryWriteAndRun(t *testing.T) {
	for name, c := range outsideEvictingServers(t) {
		t.Run(name, func(t *testing.T) {
			r := testkit.NewReserver(t, c)
			defer r.Close(context.Background())
			start := time.Now()
			for op, err := range outsideAllWrites(context.Background(), r) {
				if !errors.Is(err, stock.ErrEvictionPolicy) {
					t.Errorf("%s on an evicting policy: %v, want ErrEvictionPolicy", op, err)
				} else if stock.Outcome(err) != "eviction_policy" {
					t.Errorf("%s: Outcome %q", op, stock.Outcome(err))
				}
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("refusals took %v (Run should return at once)", d)
			}
			if ks := outsideKeys(t, c); len(ks) != 0 {
				t.Errorf("keys written on an evicting policy: %v", ks)
			}
		})
	}
}

func TestEvictionPolicyErrorNamesNodePolicyAndFix(t *testing.T) {
	c, addr := miniWithPolicy(t, "allkeys-lfu")
	r, _ := stock.New(c)
	defer r.Close(context.Background())
	err := r.Load(context.Background(), "a", 1)
	msg := fmt.Sprint(err)
	if !strings.Contains(msg, "allkeys-lfu") || !strings.Contains(msg, addr) || !strings.Contains(msg, "noeviction") {
		t.Errorf("error %q does not name the node %s, its policy and the fix", msg, addr)
	}
}

func TestEvictionAllowedWrites(t *testing.T) {
	for name, c := range outsideEvictingServers(t) {
		t.Run(name, func(t *testing.T) {
			r := testkit.NewReserver(t, c, stock.WithEvictionAllowed())
			defer r.Close(context.Background())
			require.NoError(t, r.Load(context.Background(), "a", 3))
			require.NoError(t, errOf(r.Deduct(context.Background(), stock.Request{SKU: "a", ID: "d", Qty: 1})))
		})
	}
}

func TestEvictionPolicyFixedAtRuntimeWritesAgain(t *testing.T) {
	c, r := serverReserver(t, []string{"--maxmemory-policy", "allkeys-lru"})
	require.ErrorIs(t, r.Load(context.Background(), "a", 3), stock.ErrEvictionPolicy, "Load")
	outsideConfigSet(t, c, "noeviction")
	deadline := time.Now().Add(3 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		if err = r.Load(context.Background(), "a", 3); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	require.NoError(t, err, "Load after the policy was fixed")
}

func TestEvictionPolicyTurnedEvictingReportedAndRefused(t *testing.T) {
	c, r := serverReserver(t, nil)
	store := memstore.New()
	loadRedisAndStore(t, r, store, 3, "a")
	outsideConfigSet(t, c, "volatile-lru")
	rec, err := stockops.NewReconciler(r, store, nil)
	require.NoError(t, err)
	res, _ := rec.Pass(ctx)
	if res.NeedsHuman == "" {
		t.Errorf("a pass after the policy turned evicting reports nothing: %+v", res)
	}
	if _, err := r.Deduct(ctx, stock.Request{SKU: "a", ID: "d", Qty: 1}); !errors.Is(err, stock.ErrEvictionPolicy) {
		t.Errorf("deduct after a pass saw an evicting policy: %v, want ErrEvictionPolicy", err)
	}
	lv, _ := r.Levels(ctx, "a")
	if lv.Available != 3 {
		t.Errorf("levels %+v", lv)
	}
}

func TestEvictedKeysReportedByPass(t *testing.T) {
	c, r := serverReserver(t, nil, stock.WithEvictionAllowed())
	store := memstore.New()
	loadRedisAndStore(t, r, store, 3, "a")
	rec, _ := stockops.NewReconciler(r, store, nil)
	if res, _ := rec.Pass(ctx); res.NeedsHuman != "" {
		t.Fatalf("first pass needs a human: %s", res.NeedsHuman)
	}
	// Fill a small maxmemory with volatile keys of our own until Redis evicts some.
	outsideConfigSet(t, c, "volatile-random")
	used, _ := c.Do(ctx, c.B().Info().Section("memory").Build()).ToString()
	var usedBytes int64
	for _, l := range strings.Split(used, "\r\n") {
		if strings.HasPrefix(l, "used_memory:") {
			fmt.Sscan(strings.TrimPrefix(l, "used_memory:"), &usedBytes)
		}
	}
	require.NoError(t, c.Do(ctx, c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", fmt.Sprint(usedBytes+200000)).Build()).Error())
	big := strings.Repeat("x", 10000)
	for i := 0; i < 100; i++ {
		_ = c.Do(ctx, c.B().Set().Key(fmt.Sprintf("filler:%d", i)).Value(big).ExSeconds(3600).Build()).Error()
	}
	_ = c.Do(ctx, c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", "0").Build()).Error()
	info, _ := c.Do(ctx, c.B().Info().Section("stats").Build()).ToString()
	if !strings.Contains(info, "evicted_keys:") || strings.Contains(info, "evicted_keys:0\r\n") {
		t.Fatalf("nothing evicted: %s", info)
	}
	res, _ := rec.Pass(ctx)
	if !strings.Contains(strings.ToLower(res.NeedsHuman), "evict") {
		t.Errorf("a pass after evictions: NeedsHuman %q", res.NeedsHuman)
	}
}

// One master of a cluster with an evicting policy refuses the Reserver's writes everywhere.
func TestEvictionPolicyOnOneClusterMasterRefused(t *testing.T) {
	faultReal(t)
	cl := redistest.StartCluster(t, 3)
	last := cl.Servers()[2].Client(t)
	outsideConfigSet(t, last, "allkeys-lru")
	c := cl.Client(t)
	r, _ := stock.New(c)
	defer r.Close(context.Background())
	for op, err := range outsideAllWrites(context.Background(), r) {
		assert.ErrorIs(t, err, stock.ErrEvictionPolicy, "%s with one master evicting: %v, want ErrEvictionPolicy", op, err)
	}
	for i, s := range cl.Servers() {
		if ks := outsideKeys(t, s.Client(t)); len(ks) != 0 {
			t.Errorf("master %d has keys: %v", i, ks)
		}
	}
}
