package redistest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

const (
	numSlots       = 16384
	clusterTimeout = 20 * time.Second // for a new cluster to become usable
)

// Cluster is a Redis Cluster of masters without replicas, each a Server,
// with the slots split evenly among them.
type Cluster struct {
	servers []*Server
}

// StartCluster starts a private cluster of the given number of masters for
// t and waits until a client can use every master. The servers are killed
// when t ends. StartCluster fails t when STOCK_REDIS_SERVER is unset.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	bin := requireBinary(t)
	dirs := make([]string, masters)
	for i := range dirs {
		dirs[i] = t.TempDir()
	}
	c, err := newCluster(bin, dirs)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	for _, s := range c.servers {
		s.tb = t
		t.Cleanup(s.Kill)
	}
	return c
}

// Addrs returns the addresses of the masters, in slot order.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.servers))
	for i, s := range c.servers {
		addrs[i] = s.Addr()
	}
	return addrs
}

// Servers returns the masters, in slot order, for fault tests.
func (c *Cluster) Servers() []*Server { return c.servers }

// Client returns a new cluster client on c, closed when t ends. Client-side
// caching is enabled.
func (c *Cluster) Client(t testing.TB) rueidis.Client {
	t.Helper()
	return newClient(t, rueidis.ClientOption{InitAddress: c.Addrs()})
}

// newCluster starts one server in each dir and joins them into a cluster
// without redis-cli: each node takes its share of the slots, all meet the
// first, and then we wait until every node sees a healthy cluster. On error
// no process is left running.
func newCluster(bin string, dirs []string) (*Cluster, error) {
	if len(dirs) == 0 {
		return nil, fmt.Errorf("a cluster needs at least one master")
	}
	c := &Cluster{}
	err := func() error {
		args := []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "5000",
			"--cluster-announce-ip", "127.0.0.1",
			"--appendonly", "no",
		}
		for _, dir := range dirs {
			s, err := newServer(bin, dir, args, true)
			if err != nil {
				return err
			}
			c.servers = append(c.servers, s)
		}
		first := c.servers[0]
		for i, s := range c.servers {
			lo, hi := c.slotRange(i)
			cmds := [][]string{
				{"CLUSTER", "SET-CONFIG-EPOCH", strconv.Itoa(i + 1)},
				{"CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(lo), strconv.Itoa(hi)},
			}
			if i > 0 {
				cmds = append(cmds, []string{"CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(first.port), strconv.Itoa(first.busPort)})
			}
			for _, cmd := range cmds {
				if _, err := do(s.Addr(), cmd...); err != nil {
					return fmt.Errorf("%s on %s: %w", strings.Join(cmd, " "), s.Addr(), err)
				}
			}
		}
		if err := c.wait(); err != nil {
			return err
		}
		return c.flushAll()
	}()
	if err != nil {
		c.kill()
		return nil, fmt.Errorf("starting a cluster of %d: %w", len(dirs), err)
	}
	return c, nil
}

// slotRange returns the slots of the i-th master.
func (c *Cluster) slotRange(i int) (lo, hi int) {
	n := len(c.servers)
	return i * numSlots / n, (i+1)*numSlots/n - 1
}

// wait polls until every node reports a healthy cluster of all masters and
// a cluster client can write and read a key on every master.
func (c *Cluster) wait() error {
	deadline := time.Now().Add(clusterTimeout)
	for {
		err := c.check()
		if err == nil {
			err = c.probe()
		}
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster not ready after %v: %w", clusterTimeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// check asks every node for CLUSTER INFO.
func (c *Cluster) check() error {
	n := strconv.Itoa(len(c.servers))
	want := map[string]string{
		"cluster_state":       "ok",
		"cluster_slots_ok":    strconv.Itoa(numSlots),
		"cluster_known_nodes": n,
		"cluster_size":        n,
	}
	for _, s := range c.servers {
		info, err := do(s.Addr(), "CLUSTER", "INFO")
		if err != nil {
			return fmt.Errorf("CLUSTER INFO on %s: %w", s.Addr(), err)
		}
		got := map[string]string{}
		for _, line := range strings.Split(info, "\r\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				got[k] = v
			}
		}
		for k, v := range want {
			if got[k] != v {
				return fmt.Errorf("%s: %s is %q, want %q", s.Addr(), k, got[k], v)
			}
		}
	}
	return nil
}

// probe writes and reads a key in each master's slots through a new
// cluster client, as tests will.
func (c *Cluster) probe() error {
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: c.Addrs(), DisableCache: true})
	if err != nil {
		return err
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for i := range c.servers {
		key := keyInSlots(c.slotRange(i))
		if err := client.Do(ctx, client.B().Set().Key(key).Value("ok").Build()).Error(); err != nil {
			return fmt.Errorf("SET %s: %w", key, err)
		}
		if v, err := client.Do(ctx, client.B().Get().Key(key).Build()).ToString(); err != nil || v != "ok" {
			return fmt.Errorf("GET %s: %q, %v", key, v, err)
		}
	}
	return nil
}

// flushAll empties every master.
func (c *Cluster) flushAll() error {
	for _, s := range c.servers {
		if err := s.flushAll(); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) kill() {
	for _, s := range c.servers {
		s.Kill()
	}
}

// keyInSlots returns a key whose slot is in [lo, hi].
func keyInSlots(lo, hi int) string {
	for i := 0; ; i++ {
		key := "redistest:probe:" + strconv.Itoa(i)
		if s := keySlot(key); lo <= s && s <= hi {
			return key
		}
	}
}

// keySlot returns the cluster slot of key: CRC16 (XMODEM) of the key, or of
// its hash tag if it has one, modulo 16384.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % numSlots
}
