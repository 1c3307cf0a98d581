// Package redistest gives tests rueidis clients on several Redis backends.
//
// Every test gets an in-process miniredis. When the environment variable
// STOCK_REDIS_SERVER is set, tests also get real redis-server processes: its
// value is the path of a redis-server binary, or the word "path" to look
// redis-server up on $PATH. If the variable is set but the binary is missing
// or a server cannot start, the test fails; it is never skipped. With
// STOCK_TEST_SENTINEL=1 as well, tests also run on a Sentinel deployment (a
// primary, a replica and three sentinels) through a rueidis Sentinel client.
//
// Real servers listen on free 127.0.0.1 ports and keep their data and their
// log (redis.log) in a temporary directory. The servers behind [Backends] are
// shared by all tests of a test binary: they start on first use and stop when
// [Run] returns, so a package using Backends must have
//
//	func TestMain(m *testing.M) { os.Exit(redistest.Run(m)) }
//
// Tests of a package run one at a time against the shared servers, and each
// [Backend.Client] call empties them first with FLUSHALL. [StartServer] and
// [StartCluster] and [StartSentinel] start private servers, owned by one test,
// for fault tests.
package redistest

import (
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"
)

// EnvServer names the environment variable holding the redis-server binary.
const EnvServer = "STOCK_REDIS_SERVER"

// ServerBinary returns the redis-server binary named by STOCK_REDIS_SERVER,
// or "" when the variable is unset. It fails t when the variable is set but
// names no executable.
func ServerBinary(t testing.TB) string {
	t.Helper()
	v := os.Getenv(EnvServer)
	if v == "" {
		return ""
	}
	name := v
	if v == "path" {
		name = "redis-server"
	}
	bin, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("redistest: %s=%q: %v", EnvServer, v, err)
	}
	return bin
}

// requireBinary is ServerBinary for callers that cannot work without one.
func requireBinary(t testing.TB) string {
	t.Helper()
	bin := ServerBinary(t)
	if bin == "" {
		t.Fatalf("redistest: %s is not set; check ServerBinary before starting servers", EnvServer)
	}
	return bin
}

// Backend is one kind of Redis deployment a test can run against.
type Backend struct {
	// Name is "miniredis", "standalone", "cluster" or "sentinel".
	Name string
	// DisableCache turns off rueidis client-side caching in clients made by
	// Client on real servers. Miniredis clients never cache, since miniredis
	// has no CLIENT TRACKING.
	DisableCache bool

	server   *Server
	cluster  *Cluster
	sentinel *Sentinel
}

// Backends returns the backends to run a test against: "miniredis" always,
// plus "standalone" and "cluster" (three masters) when STOCK_REDIS_SERVER is
// set, plus "sentinel" (a primary, a replica and three sentinels, reached by a
// rueidis Sentinel client) when STOCK_TEST_SENTINEL=1 too. The real servers
// are shared by the test binary and started on first use; see [Run].
func Backends(t testing.TB) []Backend {
	t.Helper()
	bs := []Backend{{Name: "miniredis"}}
	bin := ServerBinary(t)
	if bin == "" {
		SentinelEnabled(t) // fails t when STOCK_TEST_SENTINEL=1 asks for Sentinel without a binary
		return bs
	}
	s, c := sharedServers(t, bin)
	bs = append(bs, Backend{Name: "standalone", server: s}, Backend{Name: "cluster", cluster: c})
	if SentinelEnabled(t) {
		bs = append(bs, Backend{Name: "sentinel", sentinel: sharedSentinel(t, bin)})
	}
	return bs
}

// SentinelEnabled reports whether STOCK_TEST_SENTINEL=1 asks for tests on Sentinel. It fails t
// when the variable has another value than "" or "1", or when it is set and
// STOCK_REDIS_SERVER is not.
func SentinelEnabled(t testing.TB) bool {
	t.Helper()
	switch v := os.Getenv(EnvSentinel); v {
	case "":
		return false
	case "1":
		if ServerBinary(t) == "" {
			t.Fatalf("redistest: %s=1 needs %s (the redis-server binary that runs the sentinels)", EnvSentinel, EnvServer)
		}
		return true
	default:
		t.Fatalf("redistest: %s=%q: want 1 or nothing", EnvSentinel, v)
		return false
	}
}

// Real reports whether b runs on real redis-server processes.
func (b Backend) Real() bool { return b.server != nil || b.cluster != nil || b.sentinel != nil }

// Addrs returns the addresses b's clients are given: one server for
// "standalone", every master for "cluster", the three sentinels for
// "sentinel", and nil for "miniredis", which gets a new server for each
// client. [Backend.Option] gives the whole client option.
func (b Backend) Addrs() []string {
	switch {
	case b.server != nil:
		return []string{b.server.Addr()}
	case b.cluster != nil:
		return b.cluster.Addrs()
	case b.sentinel != nil:
		return b.sentinel.Addrs()
	}
	return nil
}

// Option returns the rueidis client option of b's clients (without DisableCache): a single
// client for "standalone", a cluster client for "cluster", a Sentinel client for "sentinel".
// It is empty for "miniredis".
func (b Backend) Option() rueidis.ClientOption {
	switch {
	case b.server != nil:
		return rueidis.ClientOption{InitAddress: b.Addrs(), ForceSingleClient: true}
	case b.cluster != nil:
		return rueidis.ClientOption{InitAddress: b.Addrs()}
	case b.sentinel != nil:
		return b.sentinel.Option()
	}
	return rueidis.ClientOption{}
}

// Sentinel returns the deployment of the "sentinel" backend, nil for the others.
func (b Backend) Sentinel() *Sentinel { return b.sentinel }

// Client returns a new client on an empty database, closed when t ends. For
// miniredis it starts a new miniredis; for real servers it runs FLUSHALL on
// every master first.
func (b Backend) Client(t testing.TB) rueidis.Client {
	t.Helper()
	switch {
	case b.server != nil:
		if err := b.server.flushAll(); err != nil {
			t.Fatalf("redistest: %s: %v", b.Name, err)
		}
		return newClient(t, rueidis.ClientOption{InitAddress: b.Addrs(), ForceSingleClient: true, DisableCache: b.DisableCache})
	case b.cluster != nil:
		if err := b.cluster.flushAll(); err != nil {
			t.Fatalf("redistest: %s: %v", b.Name, err)
		}
		return newClient(t, rueidis.ClientOption{InitAddress: b.Addrs(), DisableCache: b.DisableCache})
	case b.sentinel != nil:
		if err := b.sentinel.flushAll(); err != nil {
			t.Fatalf("redistest: %s: %v", b.Name, err)
		}
		opt := b.sentinel.Option()
		opt.DisableCache = b.DisableCache
		return newClient(t, opt)
	}
	_, c := Miniredis(t)
	return c
}

// Pair returns two clients on one empty database: two processes sharing a Redis.
func (b Backend) Pair(t testing.TB) (rueidis.Client, rueidis.Client) {
	t.Helper()
	if !b.Real() {
		m, c := Miniredis(t)
		return c, newClient(t, rueidis.ClientOption{InitAddress: []string{m.Addr()}, DisableCache: true})
	}
	c := b.Client(t)
	opt := b.Option()
	opt.DisableCache = b.DisableCache
	return c, newClient(t, opt)
}

// Miniredis starts a miniredis for t and returns it with a client on it, for
// tests that need the server handle (FastForward and the like). Both are
// closed when t ends.
func Miniredis(t testing.TB) (*miniredis.Miniredis, rueidis.Client) {
	t.Helper()
	m := miniredis.RunT(t)
	c := newClient(t, rueidis.ClientOption{InitAddress: []string{m.Addr()}, DisableCache: true})
	now := time.Now()
	m.SetTime(now)
	minis.Store(c, &miniClock{m: m, now: now})
	t.Cleanup(func() { minis.Delete(c) })
	return m, c
}

// minis maps the clients made by Miniredis to their server and its clock, for Sleep.
var minis sync.Map

type miniClock struct {
	mu  sync.Mutex
	m   *miniredis.Miniredis
	now time.Time
}

// IsMiniredis reports whether c is a client of a miniredis made by Miniredis (whose clock
// Sleep moves).
func IsMiniredis(c rueidis.Client) bool {
	_, ok := minis.Load(c)
	return ok
}

// Sleep lets d pass for c's server. On a real server it sleeps. A miniredis made by Miniredis
// runs on a clock that stands still (its TIME command and its TTLs), so that tests of deadlines
// do not depend on how fast gopher-lua runs under -race; Sleep moves that clock forward by d at
// once, without sleeping.
func Sleep(c rueidis.Client, d time.Duration) {
	v, ok := minis.Load(c)
	if !ok {
		time.Sleep(d)
		return
	}
	mc := v.(*miniClock)
	mc.mu.Lock()
	defer mc.mu.Unlock()
	mc.now = mc.now.Add(d)
	mc.m.SetTime(mc.now)
	mc.m.FastForward(d)
}

func newClient(t testing.TB, opt rueidis.ClientOption) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatalf("redistest: client for %v: %v", opt.InitAddress, err)
	}
	t.Cleanup(c.Close)
	return c
}

// Run runs the tests and then stops the shared servers and removes their
// directories. Use it as
//
//	func TestMain(m *testing.M) { os.Exit(redistest.Run(m)) }
func Run(m *testing.M) int {
	// A Reserver logs to slog.Default() unless given WithLogger: the suites' hundreds of
	// Reservers stay quiet (their faults are injected on purpose) unless STOCK_TEST_LOG is set.
	if os.Getenv("STOCK_TEST_LOG") == "" {
		slog.SetDefault(slog.New(slog.DiscardHandler))
	}
	running.Store(true)
	defer stopShared()
	return m.Run()
}

var (
	running atomic.Bool // Run is active
	shared  struct {
		once       sync.Once
		err        error
		root       string
		standalone *Server
		cluster    *Cluster

		sentinelOnce sync.Once
		sentinelErr  error
		sentinel     *Sentinel
	}
)

// sharedSentinel starts the shared Sentinel deployment once and returns it. Its sentinels wait
// 30s before they call the primary down: the shared deployment is not for failovers, and a
// loaded test machine must not cause one.
func sharedSentinel(t testing.TB, bin string) *Sentinel {
	t.Helper()
	shared.sentinelOnce.Do(func() {
		shared.sentinel, shared.sentinelErr = newSentinel(bin, func(name string) string {
			return filepath.Join(shared.root, "sentinel", name)
		}, SentinelConfig{Replicas: 1, DownAfter: 30 * time.Second, FailoverTimeout: 60 * time.Second})
	})
	if shared.sentinelErr != nil {
		t.Fatalf("redistest: starting the shared Sentinel deployment: %v", shared.sentinelErr)
	}
	return shared.sentinel
}

// sharedServers starts the shared servers once and returns them.
func sharedServers(t testing.TB, bin string) (*Server, *Cluster) {
	t.Helper()
	if !running.Load() {
		t.Fatalf("redistest: %s is set but the tests do not run under redistest.Run; "+
			"add func TestMain(m *testing.M) { os.Exit(redistest.Run(m)) }", EnvServer)
	}
	shared.once.Do(func() {
		shared.root, shared.err = os.MkdirTemp("", "redistest-")
		if shared.err != nil {
			return
		}
		shared.standalone, shared.err = newServer(bin, filepath.Join(shared.root, "standalone"), nil, false)
		if shared.err != nil {
			return
		}
		var dirs []string
		for _, n := range []string{"cluster0", "cluster1", "cluster2"} {
			dirs = append(dirs, filepath.Join(shared.root, n))
		}
		shared.cluster, shared.err = newCluster(bin, dirs)
	})
	if shared.err != nil {
		t.Fatalf("redistest: starting shared servers: %v", shared.err)
	}
	return shared.standalone, shared.cluster
}

func stopShared() {
	if shared.standalone != nil {
		shared.standalone.Kill()
	}
	if shared.cluster != nil {
		shared.cluster.kill()
	}
	if shared.sentinel != nil {
		shared.sentinel.kill()
	}
	if shared.root != "" {
		os.RemoveAll(shared.root)
	}
}
