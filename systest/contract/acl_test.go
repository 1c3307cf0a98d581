package contract_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
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

// aclKeys are the key patterns of one prefix: the items' keys (every one starts with
// "<prefix>:{", a brace no prefix may hold, so no other prefix's keys match), the registry, the
// failover guard's epoch, the cart log, and the key the sold-out fast path reads once to see
// whether client-side caching works.
func aclKeys(prefix string) []string {
	return []string{"~" + prefix + ":{*", "~" + prefix + ":items", "~" + prefix + ":epoch",
		"~" + prefix + ":carts{~}", "~" + prefix + ":carts{~}:p", "~" + prefix + ":carts{~}:w", "~" + prefix + ":probe",
		"~" + prefix + ":due{~*", "~" + prefix + ":holdsdue{~*"}
}

// aclCommands are the commands the library sends, and those its scripts run (Redis checks the
// user's ACL on every command a script runs). Connection: rueidis's keep-alive (PING) and the
// client-side caching of the sold-out fast path (CLIENT TRACKING at connect, then CLIENT
// CACHING, MULTI, PTTL, the read, EXEC); HELLO and AUTH need no grant. Cluster: the slot map
// (CLUSTER SLOTS; CLUSTER SHARDS on Redis 8 and later). Sentinel: a rueidis Sentinel client
// checks with ROLE that the server the sentinels announce is the primary.
var aclCommands = []string{
	"-@all",
	// connection, client-side caching, cluster slot map, Sentinel's primary check
	"+ping", "+client|tracking", "+client|caching", "+multi", "+exec", "+pttl",
	"+cluster|slots", "+cluster|shards", "+role",
	// scripts
	"+evalsha", "+eval",
	// reads and writes of the library and its scripts
	"+get", "+getrange", "+set", "+del", "+exists", "+pexpire", "+setbit", "+time",
	"+hget", "+hmget", "+hset", "+hsetnx", "+hdel", "+hexists", "+hincrby", "+hscan",
	"+zadd", "+zrem", "+zcard", "+zcount", "+zrange", "+zrangebyscore", "+zscore",
	"+sadd", "+srem", "+scard", "+sscan", "+sismember",
	// WithReplicaAck, and the failover guard's view of the primaries
	"+wait", "+info",
}

// aclSetUser returns the ACL SETUSER arguments of a user of one prefix.
func aclSetUser(user, password, prefix string) []string {
	args := []string{user, "reset", "on", ">" + password, "resetchannels"}
	args = append(args, aclKeys(prefix)...)
	return append(args, aclCommands...)
}

// TestLeastPrivilegeACL runs a Reserver, a relay, a reconciler, a failover guard, carts and the
// sold-out fast path as a Redis user that has only the documented ACL, on a real standalone
// Redis and a cluster (and Sentinel with STOCK_TEST_SENTINEL=1), and checks that this user can neither read nor write another prefix's
// keys, nor reach them through the library.
func TestLeastPrivilegeACL(t *testing.T) {
	real := 0
	for _, b := range redistest.Backends(t) {
		if !b.Real() {
			continue
		}
		real++
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			admin := b.Client(t)
			for addr, node := range admin.Nodes() {
				args := aclSetUser("shop-svc", "s3cret", "shop")
				require.NoError(t, node.Do(ctx, node.B().Arbitrary("ACL", "SETUSER").Args(args...).Build()).Error(), addr)
			}
			// Another service's keys, under the prefixes "other" and "shop:eu" (which starts
			// like "shop").
			for _, p := range []string{"other", "shop:eu"} {
				require.NoError(t, testkit.NewReserver(t, admin, stock.WithPrefix(p)).Load(ctx, "A", 5))
			}

			opt := b.Option()
			opt.Username, opt.Password = "shop-svc", "s3cret"
			c := must(rueidis.NewClient(opt))(t)
			defer c.Close()

			var local atomic.Int64
			obs := stock.ObserverFunc(func(_ context.Context, o stock.Observation) {
				if o.Local {
					local.Add(1)
				}
			})
			r := testkit.NewReserver(t, c, stock.WithPrefix("shop"), stock.WithOutbox(true), stock.WithUserLimit(2),
				stock.WithSoldOutCache(time.Minute), stock.WithReplicaAck(0, time.Second), stock.WithObserver(obs))
			guard := stockops.NewFailoverGuard(r) // first, on a prefix with no item: it records the epoch
			require.False(t, must(guard.Check(ctx))(t))
			require.NoError(t, r.Load(ctx, "A", 3))
			require.NoError(t, r.Load(ctx, "B", 3))
			require.NoError(t, testkit.Err(r.Deduct(ctx, req("A", "o1", "u", 1))))
			require.NoError(t, testkit.Err(r.Deduct(ctx, req("A", "o1", "u", 1))))
			require.NoError(t, testkit.Err(r.Hold(ctx, req("A", "h1", "", 1), time.Minute)))
			require.NoError(t, testkit.Err(r.Extend(ctx, "A", "h1", time.Minute)))
			require.NoError(t, testkit.Err(r.Confirm(ctx, "A", "h1")))
			require.NoError(t, testkit.Err(r.Restore(ctx, "A", "o1")))
			require.NoError(t, testkit.Err(r.Restock(ctx, "A", "r1", 2)))
			_, err := r.DeductMany(ctx, stock.Cart{ID: "c1", User: "u", Lines: []stock.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 1}}})
			require.NoError(t, err)
			_, err = r.HoldMany(ctx, stock.Cart{ID: "c2", Lines: []stock.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 9}}}, time.Minute)
			require.ErrorIs(t, err, stock.ErrInsufficient)
			require.NoError(t, testkit.Err(stockops.RecoverCarts(ctx, r, 0)))
			require.NoError(t, testkit.Err(stockops.Sweep(ctx, r)))
			// Sell B out, then ask again: the fast path reads the sold-out filter through the
			// client-side cache.
			require.NoError(t, testkit.Err(r.Deduct(ctx, req("B", "o2", "", 2))))
			refuseSoldOut(t, r, "B", numbered("o3-", 20)...)
			if !assert.Positive(t, local.Load(), "the sold-out fast path answered in-process: client-side caching works under the ACL") {
				aclLog(t, admin)
			}
			// Another process restocks B: the invalidation reaches the cache (CLIENT CACHING), so
			// the next deduct is not refused from a stale cached state.
			ra := testkit.NewReserver(t, admin, stock.WithPrefix("shop"), stock.WithOutbox(true))
			require.NoError(t, testkit.Err(ra.Restock(ctx, "B", "r2", 1)))
			require.Eventually(t, func() bool {
				_, err := r.Deduct(ctx, req("B", "o4", "", 1))
				return err == nil
			}, 5*time.Second, 10*time.Millisecond, "a restock by another client reaches the fast path")
			require.NoError(t, testkit.Err(r.Levels(ctx, "A")))
			_, err = r.Ledger(ctx, "A", "o1")
			require.NoError(t, err)
			for _, err := range stockops.Entries(ctx, r, "A") {
				require.NoError(t, err)
			}
			assert.ElementsMatch(t, []string{"A", "B"}, itemsOf(t, r))
			_, _, err = stockops.Pending(ctx, r, "A")
			require.NoError(t, err)
			require.NoError(t, r.CloseItem(ctx, "B"))
			require.NoError(t, r.ReopenItem(ctx, "B"))

			assert.False(t, must(guard.Check(ctx))(t), "the primaries did not change")

			store := memstore.New()
			require.NoError(t, store.Load(ctx, "A", 3))
			require.NoError(t, store.Load(ctx, "B", 3))
			relay := must(stockops.NewRelay(r, store, nil, nil))(t)
			testkit.Drain(t, relay)
			rec := must(stockops.NewReconciler(r, store, nil))(t)
			reps := must(rec.Once(ctx))(t)
			for _, rp := range reps {
				assert.Zero(t, rp.Drift, rp.String())
			}
			require.NoError(t, r.Delist(ctx, "B"))

			// Nothing of another prefix, directly or through the library.
			for _, k := range []string{"other:{A}", "other:items", "shop:eu:{A}", "shop:eu:items", "shopx:{A}"} {
				err := c.Do(ctx, c.B().Get().Key(k).Build()).Error()
				assert.ErrorContains(t, err, "NOPERM", "GET %s", k)
				err = c.Do(ctx, c.B().Set().Key(k).Value("x").Build()).Error()
				assert.ErrorContains(t, err, "NOPERM", "SET %s", k)
			}
			for _, p := range []string{"other", "shop:eu"} {
				ro := testkit.NewReserver(t, c, stock.WithPrefix(p))
				_, err := ro.Deduct(ctx, req("A", "x1", "", 1))
				assert.ErrorContains(t, err, "NOPERM", p)
				_, err = ro.Levels(ctx, "A")
				assert.ErrorContains(t, err, "NOPERM", p)
				lv := must(testkit.NewReserver(t, admin, stock.WithPrefix(p)).Levels(ctx, "A"))(t)
				assert.Equal(t, stock.Levels{Available: 5, Loaded: 5}, lv, "%s is untouched", p)
			}
			// Commands outside the list are refused.
			assert.ErrorContains(t, c.Do(ctx, c.B().Flushall().Build()).Error(), "NOPERM")
			assert.ErrorContains(t, c.Do(ctx, c.B().Keys().Pattern("*").Build()).Error(), "NOPERM")
		})
	}
	if real == 0 {
		t.Skip("STOCK_REDIS_SERVER is not set: ACLs need a real Redis")
	}
}

// aclLog logs what the ACL refused, from every node's ACL LOG.
func aclLog(t *testing.T, admin rueidis.Client) {
	t.Helper()
	for addr, node := range admin.Nodes() {
		entries, err := node.Do(context.Background(), node.B().AclLog().Count(20).Build()).ToArray()
		if err != nil {
			t.Logf("%s: ACL LOG: %v", addr, err)
			continue
		}
		for _, e := range entries {
			m, _ := e.AsStrMap()
			t.Logf("%s: ACL LOG: %s %s %s (%s)", addr, m["reason"], m["object"], m["context"], m["username"])
		}
	}
}

// docs/operating.md documents the same ACL as the test runs.
func TestACLDocumented(t *testing.T) {
	readme := must(os.ReadFile("../../docs/operating.md"))(t)
	doc := strings.Join(strings.Fields(string(readme)), " ")
	want := "ACL SETUSER " + strings.Join(aclSetUser("shop-svc", "PASSWORD", "shop"), " ")
	assert.Contains(t, doc, want)
}

// acl is the README's least-privilege user for prefix shop (password "pw"), plus extra.
func acl(t *testing.T, admin rueidis.Client, user, extra string) {
	t.Helper()
	args := append([]string{"ACL", "SETUSER"}, aclSetUser(user, "pw", "shop")...)
	require.NoError(t, faultDo(t, admin, append(args, strings.Fields(extra)...)...).Error())
}

// ops runs every exported operation once and asserts their answers.
func ops(t *testing.T, r *stock.Reserver, tag string, between func()) {
	t.Helper()
	sku := "acl-" + tag
	require.NoError(t, r.Load(ctx, sku, 10), "Load")
	between()
	assert.Equal(t, int64(8), must(r.Deduct(ctx, req(sku, "d1", "", 2)))(t, "Deduct").Remaining)
	between()
	assert.True(t, must(r.Deduct(ctx, stock.Request{SKU: sku, ID: "d1", Qty: 2, Retry: true}))(t, "Deduct replay").Replayed)
	between()
	require.NoError(t, testkit.Err(r.Hold(ctx, req(sku, "h1", "", 1), time.Minute)), "Hold")
	between()
	require.NoError(t, testkit.Err(r.Confirm(ctx, sku, "h1")), "Confirm")
	between()
	require.NoError(t, testkit.Err(r.Restore(ctx, sku, "d1")), "Restore")
	between()
	require.ErrorIs(t, testkit.Err(r.Deduct(ctx, req(sku, "d1", "", 2))), stock.ErrRestored)
	between()
	require.NoError(t, r.Load(ctx, sku+"b", 3))
	between()
	_, err := r.DeductMany(ctx, stock.Cart{ID: "cart-" + tag, Lines: []stock.Line{{SKU: sku, Qty: 1}, {SKU: sku + "b", Qty: 1}}})
	require.NoError(t, err, "DeductMany")
	between()
	l := testkit.Levels(t, r, sku)
	assert.Equal(t, int64(8), l.Available, "%+v", l)
	assert.True(t, must(r.Ledger(ctx, sku, "h1"))(t).Taken())
}

// TestACL: a user with the README's ACL (no +fcall), with +fcall but no
// +function|load, with both, and a user whose +fcall is taken away mid-run. Every operation
// must work in each case, with the library flushed between calls.
func TestACL(t *testing.T) {
	faultReal(t)
	s := redistest.StartServer(t)
	admin := s.Client(t)
	userClient := func(user string) rueidis.Client {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr()}, ForceSingleClient: true, Username: user, Password: "pw"})
		require.NoError(t, err)
		t.Cleanup(c.Close)
		return c
	}
	cases := []struct{ user, extra string }{
		{"nofcall", ""},
		{"fcallonly", "+fcall"},
		{"loadonly", "+function|load"},
		{"full", "+fcall +function|load"},
		{"fcallro", "+fcall_ro +function|load"},
	}
	for _, cs := range cases {
		t.Run(cs.user, func(t *testing.T) {
			acl(t, admin, cs.user, cs.extra)
			for i, between := range []func(){
				func() {}, // nothing between the calls
				func() { faultDo(t, admin, "FUNCTION", "FLUSH", "SYNC") },
				// The library loaded by an admin, the user may only call it.
				func() {
					ra := testkit.NewReserver(t, admin, stock.WithPrefix("other"))
					_ = ra.Load(context.Background(), "x", 1) // loads the library as admin
				},
			} {
				r := testkit.NewReserver(t, userClient(cs.user), stock.WithPrefix("shop"))
				ops(t, r, fmt.Sprint(cs.user, i+1), between)
			}
		})
	}
	t.Run("revoked", func(t *testing.T) {
		acl(t, admin, "rev", "+fcall +function|load")
		r := testkit.NewReserver(t, userClient("rev"), stock.WithPrefix("shop"), stock.WithTimeout(3*time.Second))
		require.NoError(t, r.Load(ctx, "rev", 500))
		st := newStats()
		stop := make(chan struct{})
		rounds := chaos(stop, func(i int) {
			switch i % 4 {
			case 0:
				faultDo(t, admin, "ACL", "SETUSER", "rev", "-fcall")
			case 1:
				faultDo(t, admin, "FUNCTION", "FLUSH")
			case 2:
				faultDo(t, admin, "ACL", "SETUSER", "rev", "+fcall", "-function|load")
			case 3:
				faultDo(t, admin, "ACL", "SETUSER", "rev", "+fcall", "+function|load")
			}
			time.Sleep(3 * time.Millisecond)
		})
		faultTraffic([]*stock.Reserver{r}, st, "v", []string{"rev"}, 4, 80, 3)
		close(stop)
		<-rounds
		t.Logf("raw %v", st.raw)
		assert.Empty(t, st.raw)
		faultCheck(t, r, st, map[string]int64{"rev": 500})
	})
}

// TestOOM: maxmemory below the used memory with noeviction. FCALL is refused (OOM) before
// it runs; the script path answers. Replays and sold-out answers still work; new takes fail
// with an error (not an acknowledgement). Then memory is raised and retries take exactly once.
func TestOOM(t *testing.T) {
	admin, r := serverReserver(t, nil, stock.WithTimeout(3*time.Second))
	require.NoError(t, r.Load(ctx, "m", 300))
	require.NoError(t, r.Load(ctx, "z", 1))
	require.NoError(t, testkit.Err(r.Deduct(ctx, req("z", "z1", "", 1))))
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
	assert.ErrorIs(t, testkit.Err(r.Deduct(ctx, req("z", "z2", "", 1))), stock.ErrSoldOut, "sold out under OOM")
	l := testkit.Levels(t, r, "m")
	// New takes fail, and are retried later.
	var failed []string
	for i := 0; i < 20; i++ {
		id := fmt.Sprintf("oom-%d", i)
		start := time.Now()
		_, err := r.Deduct(ctx, req("m", id, "", 1))
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
	_, err = r.Hold(ctx, req("m", "oomhold", "", 1), time.Minute)
	t.Logf("hold under OOM: %v", err)
	assert.Equal(t, l.Sold, testkit.Levels(t, r, "m").Sold+0, "nothing taken under OOM")
	require.NoError(t, faultDo(t, admin, "CONFIG", "SET", "maxmemory", "0").Error())
	for _, id := range failed {
		deduct(r, st, "m", id, 3)
	}
	require.NoError(t, testkit.Err(r.Hold(ctx, stock.Request{SKU: "m", ID: "oomhold", Qty: 1, Retry: true}, time.Minute)))
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
	require.NoError(t, testkit.Err(r.Deduct(ctx, req("p", "o1", "", 1))))
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

func outsideConfigSet(t *testing.T, c rueidis.Client, policy string) {
	t.Helper()
	require.NoError(t, c.Do(context.Background(), c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory-policy", policy).Build()).Error())
}

// every write of the Reserver, with the results wanted.
func outsideAllWrites(ctx context.Context, r *stock.Reserver) map[string]error {
	out := map[string]error{}
	out["Load"] = r.Load(ctx, "a", 10)
	_, out["Deduct"] = r.Deduct(ctx, req("a", "d1", "u", 1))
	_, out["Hold"] = r.Hold(ctx, req("a", "h1", "u", 1), time.Minute)
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

// On a server with an evicting maxmemory-policy every write and Run is ErrEvictionPolicy,
// at once, and no key is written.
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
			assert.Less(t, time.Since(start), 2*time.Second, "refusals took that long (Run should return at once)")
			assert.Empty(t, outsideKeys(t, c), "keys written on an evicting policy")
		})
	}
}

// ErrEvictionPolicy names the node, its policy and the fix (noeviction).
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

// WithEvictionAllowed lets a Reserver write on an evicting server.
func TestEvictionAllowedWrites(t *testing.T) {
	for name, c := range outsideEvictingServers(t) {
		t.Run(name, func(t *testing.T) {
			r := testkit.NewReserver(t, c, stock.WithEvictionAllowed())
			defer r.Close(context.Background())
			require.NoError(t, r.Load(context.Background(), "a", 3))
			require.NoError(t, testkit.Err(r.Deduct(context.Background(), req("a", "d", "", 1))))
		})
	}
}

// Once the policy is set to noeviction, the refused Reserver writes again.
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

// A policy turned evicting under a running Reserver is reported by a pass and refuses writes.
func TestEvictionPolicyTurnedEvictingReportedAndRefused(t *testing.T) {
	c, r := serverReserver(t, nil)
	store := memstore.New()
	loadRedisAndStore(t, r, store, 3, "a")
	outsideConfigSet(t, c, "volatile-lru")
	rec := must(stockops.NewReconciler(r, store, nil))(t)
	res, _ := rec.Pass(ctx)
	assert.NotEmpty(t, res.NeedsHuman, "a pass after the policy turned evicting reports nothing: %+v", res)
	assert.ErrorIs(t, testkit.Err(r.Deduct(ctx, req("a", "d", "", 1))), stock.ErrEvictionPolicy, "deduct after a pass saw an evicting policy")
	lv, _ := r.Levels(ctx, "a")
	assert.Equal(t, int64(3), lv.Available, "levels %+v", lv)
}

// Keys evicted under WithEvictionAllowed are reported by the next reconcile pass.
func TestEvictedKeysReportedByPass(t *testing.T) {
	c, r := serverReserver(t, nil, stock.WithEvictionAllowed())
	store := memstore.New()
	loadRedisAndStore(t, r, store, 3, "a")
	rec, _ := stockops.NewReconciler(r, store, nil)
	res, _ := rec.Pass(ctx)
	require.EqualValues(t, "", res.NeedsHuman, "first pass needs a human: %s", res.NeedsHuman)
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
	res, _ = rec.Pass(ctx)
	assert.Contains(t, strings.ToLower(res.NeedsHuman), "evict", "a pass after evictions")
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
		assert.Empty(t, outsideKeys(t, s.Client(t)), "master %d has keys", i)
	}
}
