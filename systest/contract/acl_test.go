package contract_test

import (
	"context"
	"fmt"
	"os"
	"strings"
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
			fenced := must(guard.Check(ctx))(t)
			require.False(t, fenced)
			require.NoError(t, r.Load(ctx, "A", 3))
			require.NoError(t, r.Load(ctx, "B", 3))
			require.NoError(t, errOf(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", User: "u", Qty: 1})))
			require.NoError(t, errOf(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", User: "u", Qty: 1})))
			require.NoError(t, errOf(r.Hold(ctx, stock.Request{SKU: "A", ID: "h1", Qty: 1}, time.Minute)))
			require.NoError(t, errOf(r.Extend(ctx, "A", "h1", time.Minute)))
			require.NoError(t, errOf(r.Confirm(ctx, "A", "h1")))
			require.NoError(t, errOf(r.Restore(ctx, "A", "o1")))
			require.NoError(t, errOf(r.Restock(ctx, "A", "r1", 2)))
			_, err := r.DeductMany(ctx, stock.Cart{ID: "c1", User: "u", Lines: []stock.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 1}}})
			require.NoError(t, err)
			_, err = r.HoldMany(ctx, stock.Cart{ID: "c2", Lines: []stock.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 9}}}, time.Minute)
			require.ErrorIs(t, err, stock.ErrInsufficient)
			require.NoError(t, errOf(stockops.RecoverCarts(ctx, r, 0)))
			require.NoError(t, errOf(stockops.Sweep(ctx, r)))
			// Sell B out, then ask again: the fast path reads the sold-out filter through the
			// client-side cache.
			require.NoError(t, errOf(r.Deduct(ctx, stock.Request{SKU: "B", ID: "o2", Qty: 2})))
			refuseSoldOut(t, r, "B", numbered("o3-", 20)...)
			if !assert.Positive(t, local.Load(), "the sold-out fast path answered in-process: client-side caching works under the ACL") {
				aclLog(t, admin)
			}
			// Another process restocks B: the invalidation reaches the cache (CLIENT CACHING), so
			// the next deduct is not refused from a stale cached state.
			ra := testkit.NewReserver(t, admin, stock.WithPrefix("shop"), stock.WithOutbox(true))
			_, err = ra.Restock(ctx, "B", "r2", 1)
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				_, err := r.Deduct(ctx, stock.Request{SKU: "B", ID: "o4", Qty: 1})
				return err == nil
			}, 5*time.Second, 10*time.Millisecond, "a restock by another client reaches the fast path")
			require.NoError(t, errOf(r.Levels(ctx, "A")))
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

			fenced = must(guard.Check(ctx))(t)
			assert.False(t, fenced, "the primaries did not change")

			store := memstore.New()
			require.NoError(t, store.Load(ctx, "A", 3))
			require.NoError(t, store.Load(ctx, "B", 3))
			relay := must(stockops.NewRelay(r, store, nil, nil))(t)
			testkit.Drain(t, relay)
			rec := must(stockops.NewReconciler(r, store, nil))(t)
			reps, err := rec.Once(ctx)
			require.NoError(t, err)
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
				_, err := ro.Deduct(ctx, stock.Request{SKU: "A", ID: "x1", Qty: 1})
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
	rc := must(r.Deduct(ctx, stock.Request{SKU: sku, ID: "d1", Qty: 2}))(t, "Deduct")
	assert.Equal(t, int64(8), rc.Remaining)
	between()
	rc = must(r.Deduct(ctx, stock.Request{SKU: sku, ID: "d1", Qty: 2, Retry: true}))(t, "Deduct replay")
	assert.True(t, rc.Replayed)
	between()
	require.NoError(t, errOf(r.Hold(ctx, stock.Request{SKU: sku, ID: "h1", Qty: 1}, time.Minute)), "Hold")
	between()
	require.NoError(t, errOf(r.Confirm(ctx, sku, "h1")), "Confirm")
	between()
	require.NoError(t, errOf(r.Restore(ctx, sku, "d1")), "Restore")
	between()
	require.ErrorIs(t, errOf(r.Deduct(ctx, stock.Request{SKU: sku, ID: "d1", Qty: 2})), stock.ErrRestored)
	between()
	require.NoError(t, r.Load(ctx, sku+"b", 3))
	between()
	_, err := r.DeductMany(ctx, stock.Cart{ID: "cart-" + tag, Lines: []stock.Line{{SKU: sku, Qty: 1}, {SKU: sku + "b", Qty: 1}}})
	require.NoError(t, err, "DeductMany")
	between()
	l := testkit.Levels(t, r, sku)
	assert.Equal(t, int64(8), l.Available, "%+v", l)
	e := must(r.Ledger(ctx, sku, "h1"))(t)
	assert.True(t, e.Taken())
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
