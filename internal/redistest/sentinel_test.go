package redistest

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

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
	if !strings.Contains(info, "role:slave") {
		t.Errorf("the old primary did not become a replica:\n%s", info)
	}

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
