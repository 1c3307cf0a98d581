package redistest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/stockres/stock/internal/faultproxy"
)

// EnvSentinel names the environment variable that adds the "sentinel" backend to [Backends]:
// "1" turns it on (STOCK_REDIS_SERVER must be set too).
const EnvSentinel = "STOCK_TEST_SENTINEL"

// MasterSet is the name under which the sentinels of a [Sentinel] deployment monitor its
// primary.
const MasterSet = "stock"

const sentinelTimeout = 30 * time.Second // for a new deployment to be ready

// SentinelConfig describes a Sentinel deployment for [StartSentinel].
type SentinelConfig struct {
	// Replicas is the number of replicas of the first primary: 1 or 2 (0 means 1).
	Replicas int
	// Args are extra redis-server arguments of the primary and the replicas, appended to
	// "--appendonly yes --repl-diskless-sync yes --repl-diskless-sync-delay 0", e.g.
	// "--min-replicas-to-write", "1".
	Args []string
	// DownAfter is the sentinels' down-after-milliseconds: how long a primary must fail to
	// answer before they fail over. 0 means 1s.
	DownAfter time.Duration
	// FailoverTimeout is the sentinels' failover-timeout. 0 means 3s.
	FailoverTimeout time.Duration
	// ProxyPrimary puts a [faultproxy.Proxy] in front of the first primary: the sentinels
	// monitor it at the proxy's address, its replicas replicate through the proxy, and the
	// Sentinel clients reach it through the proxy. A blackhole on the proxy is then a
	// partition that cuts the first primary off from the sentinels, the replicas and the
	// Sentinel clients, while clients pinned to its own address still reach it.
	ProxyPrimary bool
	// ReplicaLatency, when not 0, makes the replicas replicate from the first primary through a
	// [faultproxy.Proxy] that delays every chunk by this much each way: replicas that lag
	// behind, so that a primary killed under traffic takes acknowledged writes with it (reset
	// the proxy's connections at the kill). The sentinels and the clients reach the primary
	// directly. The sentinels repoint such replicas to the primary's own address after
	// failover-timeout: give FailoverTimeout more than the test lasts.
	ReplicaLatency time.Duration
}

// Sentinel is a Redis Sentinel deployment: a primary, its replicas and three sentinels, each a
// redis-server process on 127.0.0.1 ("redis-server sentinel.conf --sentinel" for the
// sentinels). The data nodes run with AOF (appendfsync everysec).
type Sentinel struct {
	data      []*Server // the first primary, then the replicas
	sentinels []*Server
	proxy     *faultproxy.Proxy // in front of data[0]; nil unless ProxyPrimary
	replProxy *faultproxy.Proxy // between data[0] and its replicas; nil unless ReplicaLatency
}

// StartSentinel starts a private Sentinel deployment for t and waits until every sentinel
// agrees on the primary, knows every replica (their links up) and the two other sentinels.
// Everything is stopped when t ends. StartSentinel fails t when STOCK_REDIS_SERVER is unset.
func StartSentinel(t testing.TB, cfg SentinelConfig) *Sentinel {
	t.Helper()
	bin := requireBinary(t)
	d, err := newSentinel(bin, func(string) string { return t.TempDir() }, cfg)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	for _, s := range d.all() {
		s.tb = t
	}
	t.Cleanup(d.kill)
	return d
}

// newSentinel starts a deployment, each process in dir(name). On error no process is left
// running.
func newSentinel(bin string, dir func(name string) string, cfg SentinelConfig) (*Sentinel, error) {
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.Replicas < 1 || cfg.Replicas > 2 {
		return nil, fmt.Errorf("a Sentinel deployment has 1 or 2 replicas, not %d", cfg.Replicas)
	}
	if cfg.DownAfter == 0 {
		cfg.DownAfter = time.Second
	}
	if cfg.FailoverTimeout == 0 {
		cfg.FailoverTimeout = 3 * time.Second
	}
	d := &Sentinel{}
	err := func() error {
		args := append([]string{"--appendonly", "yes", "--appendfsync", "everysec",
			"--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"}, cfg.Args...)
		primary, err := newServer(bin, dir("primary"), args, false)
		if err != nil {
			return err
		}
		d.data = append(d.data, primary)
		addr := primary.Addr()
		if cfg.ProxyPrimary {
			if d.proxy, err = faultproxy.Start(addr); err != nil {
				return err
			}
			addr = d.proxy.Addr()
		}
		host, port, _ := net.SplitHostPort(addr)
		rhost, rport := host, port
		if cfg.ReplicaLatency > 0 {
			if d.replProxy, err = faultproxy.Start(addr); err != nil {
				return err
			}
			d.replProxy.SetLatency(cfg.ReplicaLatency)
			rhost, rport, _ = net.SplitHostPort(d.replProxy.Addr())
		}
		for i := range cfg.Replicas {
			r, err := newServer(bin, dir(fmt.Sprintf("replica%d", i+1)), append(slices.Clone(args), "--replicaof", rhost, rport), false)
			if err != nil {
				return err
			}
			d.data = append(d.data, r)
		}
		conf := fmt.Sprintf("sentinel monitor %s %s %s 2\n"+
			"sentinel down-after-milliseconds %s %d\n"+
			"sentinel failover-timeout %s %d\n"+
			"sentinel parallel-syncs %s 1\n",
			MasterSet, host, port, MasterSet, cfg.DownAfter.Milliseconds(), MasterSet, cfg.FailoverTimeout.Milliseconds(), MasterSet)
		for i := range 3 {
			sdir := dir(fmt.Sprintf("sentinel%d", i+1))
			if err := os.MkdirAll(sdir, 0o755); err != nil {
				return err
			}
			path := filepath.Join(sdir, "sentinel.conf")
			if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
				return err
			}
			s := &Server{bin: bin, dir: sdir, conf: path}
			if err := s.launch(false); err != nil {
				return err
			}
			d.sentinels = append(d.sentinels, s)
		}
		return d.WaitReady(sentinelTimeout)
	}()
	if err != nil {
		d.kill()
		return nil, fmt.Errorf("starting a Sentinel deployment: %w", err)
	}
	return d, nil
}

func (d *Sentinel) all() []*Server { return append(slices.Clone(d.data), d.sentinels...) }

func (d *Sentinel) kill() {
	for _, s := range d.all() {
		s.Kill()
	}
	for _, p := range []*faultproxy.Proxy{d.proxy, d.replProxy} {
		if p != nil {
			p.Close()
		}
	}
}

// Addrs returns the sentinels' addresses.
func (d *Sentinel) Addrs() []string {
	var addrs []string
	for _, s := range d.sentinels {
		addrs = append(addrs, s.Addr())
	}
	return addrs
}

// Servers returns the data nodes: the first primary, then its replicas. Which one is the
// primary now is [Sentinel.Primary]'s answer.
func (d *Sentinel) Servers() []*Server { return d.data }

// Sentinels returns the sentinel processes.
func (d *Sentinel) Sentinels() []*Server { return d.sentinels }

// Proxy returns the proxy in front of the first primary (SentinelConfig.ProxyPrimary), or nil.
func (d *Sentinel) Proxy() *faultproxy.Proxy { return d.proxy }

// ReplicaProxy returns the proxy between the first primary and its replicas
// (SentinelConfig.ReplicaLatency), or nil.
func (d *Sentinel) ReplicaProxy() *faultproxy.Proxy { return d.replProxy }

// Option returns the options of a rueidis Sentinel client of d.
func (d *Sentinel) Option() rueidis.ClientOption {
	return rueidis.ClientOption{InitAddress: d.Addrs(), Sentinel: rueidis.SentinelOption{MasterSet: MasterSet}}
}

// Client returns a new rueidis Sentinel client of d, closed when t ends. It follows the
// primary the sentinels announce (+switch-master). Client-side caching is enabled.
func (d *Sentinel) Client(t testing.TB) rueidis.Client {
	t.Helper()
	return newClient(t, d.Option())
}

// server returns the data node at addr (the proxy's address is the first primary's).
func (d *Sentinel) server(addr string) *Server {
	if d.proxy != nil && addr == d.proxy.Addr() {
		return d.data[0]
	}
	for _, s := range d.data {
		if s.Addr() == addr {
			return s
		}
	}
	return nil
}

// PrimaryAddr returns the primary's address as the first sentinel that answers announces it
// (the proxy's address for the first primary under ProxyPrimary).
func (d *Sentinel) PrimaryAddr() (string, error) {
	var errs []error
	for _, s := range d.sentinels {
		v, err := query(s.Addr(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MasterSet)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if a, ok := v.([]any); ok && len(a) == 2 {
			return net.JoinHostPort(fmt.Sprint(a[0]), fmt.Sprint(a[1])), nil
		}
		errs = append(errs, fmt.Errorf("%s: GET-MASTER-ADDR-BY-NAME: %v", s.Addr(), v))
	}
	return "", errors.Join(errs...)
}

// Primary returns the data node the sentinels announce as the primary.
func (d *Sentinel) Primary() (*Server, error) {
	addr, err := d.PrimaryAddr()
	if err != nil {
		return nil, err
	}
	if s := d.server(addr); s != nil {
		return s, nil
	}
	return nil, fmt.Errorf("the sentinels announce %s, which is no data node of the deployment", addr)
}

// Failover asks a sentinel for a failover (SENTINEL FAILOVER), retrying for up to 10s while
// the sentinels have no replica they consider good (-NOGOODSLAVE) or a failover is under way
// (-INPROG). It returns once the sentinel has accepted; [Sentinel.WaitPrimary] waits for the
// switch.
func (d *Sentinel) Failover() error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := query(d.sentinels[0].Addr(), "SENTINEL", "FAILOVER", MasterSet)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || !(strings.HasPrefix(err.Error(), "NOGOODSLAVE") || strings.HasPrefix(err.Error(), "INPROG")) {
			return fmt.Errorf("SENTINEL FAILOVER: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitPrimary waits until every sentinel announces a primary other than old (nil: any) and that
// server answers as a primary (role:master), and returns it.
func (d *Sentinel) WaitPrimary(old *Server, timeout time.Duration) (*Server, error) {
	deadline := time.Now().Add(timeout)
	for {
		s, err := d.agreed()
		if err == nil && s == old {
			err = fmt.Errorf("the sentinels still announce %s", old.Addr())
		}
		if err == nil {
			var info string
			if info, err = do(s.Addr(), "INFO", "replication"); err == nil && !strings.Contains(info, "role:master") {
				err = fmt.Errorf("%s is announced but is not a primary yet", s.Addr())
			}
		}
		if err == nil {
			return s, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no new primary after %v: %w", timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// agreed returns the primary every sentinel announces.
func (d *Sentinel) agreed() (*Server, error) {
	var addr string
	for _, s := range d.sentinels {
		v, err := query(s.Addr(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MasterSet)
		if err != nil {
			return nil, err
		}
		a, ok := v.([]any)
		if !ok || len(a) != 2 {
			return nil, fmt.Errorf("%s: GET-MASTER-ADDR-BY-NAME: %v", s.Addr(), v)
		}
		got := net.JoinHostPort(fmt.Sprint(a[0]), fmt.Sprint(a[1]))
		if addr != "" && got != addr {
			return nil, fmt.Errorf("the sentinels disagree: %s, %s", addr, got)
		}
		addr = got
	}
	if s := d.server(addr); s != nil {
		return s, nil
	}
	return nil, fmt.Errorf("the sentinels announce %s, which is no data node of the deployment", addr)
}

// WaitReady waits until every sentinel agrees on the primary, sees it up, knows every other
// data node as a replica with its link up, and knows the two other sentinels: the state in
// which a failover can run. A data node that is down (killed, not restarted) is not waited for.
func (d *Sentinel) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := d.ready()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the Sentinel deployment is not ready after %v: %w", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (d *Sentinel) ready() error {
	p, err := d.agreed()
	if err != nil {
		return err
	}
	up := 0
	for _, s := range d.data {
		if s == p || !s.running() {
			continue
		}
		up++
		info, err := do(s.Addr(), "INFO", "replication")
		if err != nil {
			return err
		}
		if !strings.Contains(info, "role:slave") || !strings.Contains(info, "master_link_status:up") {
			return fmt.Errorf("%s is not a replica with its link up yet", s.Addr())
		}
	}
	for _, s := range d.sentinels {
		v, err := query(s.Addr(), "SENTINEL", "MASTER", MasterSet)
		if err != nil {
			return err
		}
		m := fields(v)
		if m["flags"] != "master" || m["num-other-sentinels"] != "2" {
			return fmt.Errorf("sentinel %s: master %s flags %q, %s other sentinels", s.Addr(), m["ip"]+":"+m["port"], m["flags"], m["num-other-sentinels"])
		}
		v, err = query(s.Addr(), "SENTINEL", "REPLICAS", MasterSet)
		if err != nil {
			return err
		}
		ok := 0
		list, _ := v.([]any)
		for _, r := range list {
			f := fields(r)
			if f["flags"] == "slave" && f["master-link-status"] == "ok" {
				ok++
			}
		}
		if ok < up {
			return fmt.Errorf("sentinel %s knows %d healthy replicas, want %d", s.Addr(), ok, up)
		}
	}
	return nil
}

// running reports whether the server's process is running.
func (s *Server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// fields turns a flat array of names and values into a map.
func fields(v any) map[string]string {
	m := map[string]string{}
	a, _ := v.([]any)
	for i := 0; i+1 < len(a); i += 2 {
		m[fmt.Sprint(a[i])] = fmt.Sprint(a[i+1])
	}
	return m
}

// flushAll empties the primary (the replicas follow).
func (d *Sentinel) flushAll() error {
	p, err := d.Primary()
	if err != nil {
		return err
	}
	return p.flushAll()
}

// Rejoin starts the stopped or killed data node s again and makes it a replica of the current
// primary at once (REPLICAOF), as the sentinels would after a while (a restarted node comes
// back as the primary its configuration names: itself), then waits until the deployment is
// ready. What s had that the primary lacks is discarded by the resynchronization.
func (d *Sentinel) Rejoin(s *Server, timeout time.Duration) error {
	p, err := d.agreed()
	if err != nil {
		return err
	}
	if p == s {
		return fmt.Errorf("%s is still the primary the sentinels announce", s.Addr())
	}
	s.Start()
	if _, err := do(s.Addr(), "REPLICAOF", "127.0.0.1", strconv.Itoa(p.Port())); err != nil {
		return fmt.Errorf("REPLICAOF on %s: %w", s.Addr(), err)
	}
	return d.WaitReady(timeout)
}
