package redistest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { os.Exit(Run(m)) }

// requireServer skips t when STOCK_REDIS_SERVER is unset (and fails it when
// the variable names no binary).
func requireServer(t *testing.T) {
	t.Helper()
	if ServerBinary(t) == "" {
		t.Skip(EnvServer + " is not set")
	}
}

func noErr(t *testing.T, err error, what string) {
	t.Helper()
	require.NoError(t, err, "%s", what)
}

func eq[T comparable](t *testing.T, got, want T, what string) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

func get(t *testing.T, c rueidis.Client, key string) string {
	t.Helper()
	v, err := c.Do(context.Background(), c.B().Get().Key(key).Build()).ToString()
	noErr(t, err, "GET "+key)
	return v
}

func set(t *testing.T, c rueidis.Client, key, value string) {
	t.Helper()
	noErr(t, c.Do(context.Background(), c.B().Set().Key(key).Value(value).Build()).Error(), "SET "+key)
}

func TestBackends(t *testing.T) {
	ctx := context.Background()
	bs := Backends(t)
	var names []string
	for _, b := range bs {
		names = append(names, b.Name)
	}
	want := []string{"miniredis"}
	if ServerBinary(t) != "" {
		want = append(want, "standalone", "cluster")
	}
	if SentinelEnabled(t) {
		want = append(want, "sentinel")
	}
	if !slices.Equal(names, want) {
		t.Fatalf("backends %v, want %v", names, want)
	}

	for _, b := range bs {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			eq(t, b.Real(), b.Name != "miniredis", "Real()")
			eq(t, len(b.Addrs()), map[string]int{"miniredis": 0, "standalone": 1, "cluster": 3, "sentinel": 3}[b.Name], "len(Addrs())")

			c := b.Client(t)
			set(t, c, "k", "v")
			eq(t, get(t, c, "k"), "v", "GET k")

			// A new client sees an empty database.
			c = b.Client(t)
			if err := c.Do(ctx, c.B().Get().Key("k").Build()).Error(); !rueidis.IsRedisNil(err) {
				t.Errorf("GET k on a new client: %v, want nil reply", err)
			}

			// Keys in many slots, written in one DoMulti.
			const n = 300
			var cmds rueidis.Commands
			for i := range n {
				cmds = append(cmds, c.B().Set().Key("key:"+strconv.Itoa(i)).Value(strconv.Itoa(i)).Build())
			}
			for _, r := range c.DoMulti(ctx, cmds...) {
				noErr(t, r.Error(), "DoMulti SET")
			}
			for i := range n {
				eq(t, get(t, c, "key:"+strconv.Itoa(i)), strconv.Itoa(i), "GET key:"+strconv.Itoa(i))
			}

			// A script on two keys sharing the hash tag {x}.
			script := rueidis.NewLuaScript(`
				redis.call('SET', KEYS[1], ARGV[1])
				redis.call('SET', KEYS[2], ARGV[2])
				return redis.call('GET', KEYS[1]) .. redis.call('GET', KEYS[2])`)
			got, err := script.Exec(ctx, c, []string{"{x}a", "{x}b"}, []string{"1", "2"}).ToString()
			noErr(t, err, "script")
			eq(t, got, "12", "script result")

			// Client-side caching is on for real servers unless disabled.
			cacheHit := func(c rueidis.Client) bool {
				set(t, c, "{x}a", "1")
				var r rueidis.RedisResult
				for range 3 {
					r = c.DoCache(ctx, c.B().Get().Key("{x}a").Cache(), time.Minute)
					noErr(t, r.Error(), "DoCache")
				}
				return r.IsCacheHit()
			}
			eq(t, cacheHit(c), b.Real(), "cache hit")
			b.DisableCache = true
			eq(t, cacheHit(b.Client(t)), false, "cache hit with DisableCache")
		})
	}
}

func TestBackendClusterSpreadsKeys(t *testing.T) {
	requireServer(t)
	b := Backends(t)[2]
	eq(t, b.Name, "cluster", "Backends(t)[2].Name")
	c := b.Client(t)
	for i := range 100 {
		set(t, c, "key:"+strconv.Itoa(i), "v")
	}
	for _, addr := range b.Addrs() {
		n, err := do(addr, "DBSIZE")
		noErr(t, err, "DBSIZE")
		if n == "0" {
			t.Errorf("no keys on %s", addr)
		}
	}
}

func TestMiniredis(t *testing.T) {
	ctx := context.Background()
	m, c := Miniredis(t)
	noErr(t, c.Do(ctx, c.B().Set().Key("k").Value("v").Ex(10*time.Second).Build()).Error(), "SET")
	m.FastForward(11 * time.Second)
	eq(t, m.Exists("k"), false, "k exists after expiry")
	if err := c.Do(ctx, c.B().Get().Key("k").Build()).Error(); !rueidis.IsRedisNil(err) {
		t.Errorf("GET after expiry: %v, want nil reply", err)
	}
}

func TestServerKillRestart(t *testing.T) {
	t.Parallel() // private servers
	requireServer(t)
	s := StartServer(t, "--appendonly", "yes", "--appendfsync", "always")
	addr, dir := s.Addr(), s.Dir()
	eq(t, addr, fmt.Sprintf("127.0.0.1:%d", s.Port()), "Addr()")
	if _, err := os.Stat(filepath.Join(dir, "redis.log")); err != nil {
		t.Error(err)
	}

	set(t, s.Client(t), "k", "before crash")
	s.Kill()
	if _, err := do(addr, "PING"); err == nil {
		t.Fatal("server still answers after Kill")
	}
	s.Kill() // no-op when not running

	s.Restart()
	eq(t, s.Addr(), addr, "Addr() after restart")
	eq(t, s.Dir(), dir, "Dir() after restart")
	c := s.Client(t)
	eq(t, get(t, c, "k"), "before crash", "GET k after Kill and Restart")

	set(t, c, "k2", "before stop")
	s.Stop()
	s.Start()
	eq(t, get(t, s.Client(t), "k2"), "before stop", "GET k2 after Stop and Start")

	s.Restart() // of a running server
	_, err := do(addr, "PING")
	noErr(t, err, "PING after restart")
}

func TestServerDefaults(t *testing.T) {
	requireServer(t)
	s := StartServer(t)
	set(t, s.Client(t), "k", "v")
	_, err := do(s.Addr(), "DEBUG", "SLEEP", "0")
	noErr(t, err, "DEBUG SLEEP")
	s.Restart() // no persistence: the data is gone
	n, err := do(s.Addr(), "DBSIZE")
	noErr(t, err, "DBSIZE")
	eq(t, n, "0", "DBSIZE after restart")
}

func TestServerStartFailureShowsLog(t *testing.T) {
	requireServer(t)
	ft := runFake(t, func(tb testing.TB) { StartServer(tb, "--no-such-option", "x") })
	eq(t, ft.failed, true, "failed")
	for _, s := range []string{"redis.log", "no-such-option"} {
		assert.Contains(t, ft.msg, s, "failure message lacks %q:\n%s", s, ft.msg)
	}
}

func TestStartCluster(t *testing.T) {
	t.Parallel() // private servers
	requireServer(t)
	cl := StartCluster(t, 3)
	eq(t, len(cl.Addrs()), 3, "len(Addrs())")
	eq(t, len(cl.Servers()), 3, "len(Servers())")
	c := cl.Client(t)
	eq(t, len(c.Nodes()), 3, "len(Nodes())")

	keys := []string{"{x}a", "{}a", "a{b}c{d}", "{{x}}", "x}{y", "{x", ""}
	for i := range 50 {
		keys = append(keys, "key:"+strconv.Itoa(i))
	}
	for _, key := range keys {
		set(t, c, key, "v")
		slot, err := do(cl.Addrs()[0], "CLUSTER", "KEYSLOT", key)
		noErr(t, err, "CLUSTER KEYSLOT")
		eq(t, slot, strconv.Itoa(keySlot(key)), "slot of "+key)
	}
	for i, addr := range cl.Addrs() {
		key := keyInSlots(cl.slotRange(i))
		set(t, c, key, "v")
		v, err := do(addr, "GET", key) // the key lives on the i-th master
		noErr(t, err, "GET on "+addr)
		eq(t, v, "v", "GET "+key+" on "+addr)
	}
}

func TestKeySlot(t *testing.T) {
	eq(t, keySlot("123456789"), 12739, "slot")
	eq(t, keySlot("foo"), 12182, "slot")
	eq(t, keySlot("{x}a"), keySlot("x"), "slot")
	eq(t, keySlot("{x}b"), keySlot("x"), "slot")
}

func TestServerBinaryMissingFails(t *testing.T) {
	t.Setenv(EnvServer, "/nonexistent/redis-server")
	ft := runFake(t, func(tb testing.TB) { ServerBinary(tb) })
	eq(t, ft.failed, true, "failed")
	assert.Contains(t, ft.msg, "/nonexistent/redis-server", "message %q lacks the path", ft.msg)
	t.Setenv(EnvServer, "")
	eq(t, ServerBinary(t), "", "ServerBinary with the variable empty")
}

// fakeTB records a fatal failure instead of failing the real test.
type fakeTB struct {
	testing.TB
	failed bool
	msg    string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed, f.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// runFake runs fn with a fakeTB on a goroutine of its own, which Fatalf ends.
func runFake(t *testing.T, fn func(testing.TB)) *fakeTB {
	ft := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(ft)
	}()
	<-done
	return ft
}

// requireSentinel skips t unless STOCK_REDIS_SERVER is set and STOCK_TEST_SENTINEL=1.
func requireSentinel(t *testing.T) {
	t.Helper()
	if !SentinelEnabled(t) { // fails t when it is 1 and STOCK_REDIS_SERVER is not set
		t.Skip(EnvSentinel + " is not 1: the Sentinel deployment tests are off")
	}
}

// follows waits until c's primary is p (it switches on the sentinels' +switch-master) and
// returns how long that took.
func follows(t *testing.T, c rueidis.Client, p *Server) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		if _, ok := c.Nodes()[p.Addr()]; ok {
			return time.Since(start)
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("the Sentinel client did not switch to %s in 30s: %v", p.Addr(), c.Nodes())
		}
		time.Sleep(time.Millisecond)
	}
}

// retryWrite writes key=value through c until it succeeds (a failover under way refuses or
// breaks writes for a while) and returns how long that took.
func retryWrite(t *testing.T, c rueidis.Client, key, value string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Do(ctx, c.B().Set().Key(key).Value(value).Build()).Error()
		cancel()
		if err == nil {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("SET %s through the Sentinel client: still failing after %v: %v", key, within, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSentinelFailover starts a deployment, writes through a Sentinel client, fails over with
// SENTINEL FAILOVER and then with a kill -9 of the primary, and checks each time that the
// sentinels agree on another primary, that the client follows it and reads what was written
// (replicated before the switch), and that the old primary rejoins as a replica.
func TestSentinelFailover(t *testing.T) {
	t.Parallel() // private servers
	requireSentinel(t)
	d := StartSentinel(t, SentinelConfig{Replicas: 2})
	eq(t, len(d.Addrs()), 3, "sentinels")
	eq(t, len(d.Servers()), 3, "data nodes")
	p, err := d.Primary()
	noErr(t, err, "Primary")
	eq(t, p, d.Servers()[0], "the first primary")
	for _, s := range d.Sentinels() {
		if _, err := os.Stat(s.Dir() + "/sentinel.conf"); err != nil {
			t.Errorf("sentinel %s: %v", s.Addr(), err)
		}
	}

	c := d.Client(t)
	set(t, c, "k", "1")
	noErr(t, c.Do(context.Background(), c.B().Wait().Numreplicas(2).Timeout(5000).Build()).Error(), "WAIT")

	// SENTINEL FAILOVER.
	noErr(t, d.Failover(), "Failover")
	p2, err := d.WaitPrimary(p, 30*time.Second)
	noErr(t, err, "WaitPrimary after SENTINEL FAILOVER")
	sw := follows(t, c, p2)
	t.Logf("SENTINEL FAILOVER: %s -> %s; the client switched %v after the sentinels agreed, wrote again after %v",
		p.Addr(), p2.Addr(), sw, retryWrite(t, c, "k2", "2", 30*time.Second))
	eq(t, get(t, c, "k"), "1", "GET k after the failover")
	noErr(t, d.WaitReady(30*time.Second), "WaitReady after SENTINEL FAILOVER")
	info, err := do(p.Addr(), "INFO", "replication")
	noErr(t, err, "INFO on the old primary")
	assert.Contains(t, info, "role:slave", "the old primary did not become a replica:\n%s", info)

	// kill -9 of the primary.
	noErr(t, c.Do(context.Background(), c.B().Wait().Numreplicas(2).Timeout(5000).Build()).Error(), "WAIT")
	p2.Kill()
	p3, err := d.WaitPrimary(p2, 30*time.Second)
	noErr(t, err, "WaitPrimary after kill -9")
	sw = follows(t, c, p3)
	t.Logf("kill -9: %s -> %s; the client switched %v after the sentinels agreed, wrote again after %v",
		p2.Addr(), p3.Addr(), sw, retryWrite(t, c, "k3", "3", 30*time.Second))
	eq(t, get(t, c, "k2"), "2", "GET k2 after the kill")
	noErr(t, d.Rejoin(p2, 30*time.Second), "Rejoin")
}

// TestSentinelPartition cuts the first primary off from the sentinels, its replica and the
// Sentinel clients (a blackhole on its proxy): the sentinels fail over, a client pinned to the
// old primary still writes there, and after the partition heals the old primary rejoins as a
// replica and loses what it took meanwhile.
func TestSentinelPartition(t *testing.T) {
	t.Parallel() // private servers
	requireSentinel(t)
	d := StartSentinel(t, SentinelConfig{Replicas: 1, ProxyPrimary: true})
	old := d.Servers()[0]
	c := d.Client(t)
	pinned := old.Client(t)
	set(t, c, "k", "1")
	noErr(t, c.Do(context.Background(), c.B().Wait().Numreplicas(1).Timeout(5000).Build()).Error(), "WAIT")

	d.Proxy().Blackhole(time.Hour)
	p, err := d.WaitPrimary(old, 30*time.Second)
	noErr(t, err, "WaitPrimary after the partition")
	follows(t, c, p)
	set(t, pinned, "lost", "1") // the old primary still takes writes
	retryWrite(t, c, "k2", "2", 30*time.Second)

	d.Proxy().ResetAll()
	d.Proxy().Heal()
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := do(old.Addr(), "INFO", "replication")
		if err == nil && strings.Contains(info, "role:slave") && strings.Contains(info, "master_port:"+p.Addr()[strings.LastIndexByte(p.Addr(), ':')+1:]) && strings.Contains(info, "master_link_status:up") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the old primary did not rejoin as a replica of %s in 30s: %v\n%s", p.Addr(), err, info)
		}
		time.Sleep(50 * time.Millisecond)
	}
	v, err := do(old.Addr(), "GET", "lost")
	noErr(t, err, "GET lost on the old primary")
	eq(t, v, "", "the old primary's write after the partition, after it rejoined")
	eq(t, get(t, c, "k2"), "2", "GET k2")
}
