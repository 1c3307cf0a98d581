package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
	"github.com/stockres/stock/internal/protocol"
)

// cleanupTimeout bounds the deletion of a phase's keys, which runs even after an interrupt.
const cleanupTimeout = 30 * time.Second

// infoFields returns the "name:value" fields of an INFO section, summed over every node.
func (b *bench) infoFields(ctx context.Context, section string, names ...string) ([]float64, error) {
	perNode, err := b.nodeInfoFields(ctx, section, names...)
	if err != nil {
		return nil, err
	}
	sums := make([]float64, len(names))
	for _, v := range perNode {
		for i := range v {
			sums[i] += v[i]
		}
	}
	return sums, nil
}

// nodeInfo returns the text of an INFO section of every node the client knows (replicas
// included when the cluster client reports them), by address.
func (b *bench) nodeInfo(ctx context.Context, section string) (map[string]string, error) {
	nodes := b.client.Nodes()
	out := make(map[string]string, len(nodes))
	for addr, node := range nodes {
		info, err := node.Do(ctx, node.B().Info().Section(section).Build()).ToString()
		if err != nil {
			return nil, fmt.Errorf("INFO %s on %s: %w", section, addr, err)
		}
		out[addr] = info
	}
	return out, nil
}

// nodeInfoFields returns the "name:value" fields of an INFO section of every node, by address.
func (b *bench) nodeInfoFields(ctx context.Context, section string, names ...string) (map[string][]float64, error) {
	infos, err := b.nodeInfo(ctx, section)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]float64, len(infos))
	for addr, info := range infos {
		vals := make([]float64, len(names))
		found := 0
		for line := range strings.SplitSeq(info, "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if !ok {
				continue
			}
			for i, name := range names {
				if k == name {
					f, err := strconv.ParseFloat(v, 64)
					if err != nil {
						return nil, fmt.Errorf("INFO %s on %s: %s: %w", section, addr, k, err)
					}
					vals[i] += f
					found++
				}
			}
		}
		if found != len(names) {
			return nil, fmt.Errorf("INFO %s on %s: no %v", section, addr, names)
		}
		out[addr] = vals
	}
	return out, nil
}

// redisCPU returns the CPU seconds (user + system) used so far by the Redis servers, summed.
func (b *bench) redisCPU(ctx context.Context) (float64, error) {
	v, err := b.infoFields(ctx, "cpu", "used_cpu_sys", "used_cpu_user")
	if err != nil {
		return 0, err
	}
	return v[0] + v[1], nil
}

// nodeCPU returns the CPU seconds (user + system) used so far by each Redis server, by address.
func (b *bench) nodeCPU(ctx context.Context) (map[string]float64, error) {
	perNode, err := b.nodeInfoFields(ctx, "cpu", "used_cpu_sys", "used_cpu_user")
	if err != nil {
		return nil, err
	}
	out := make(map[string]float64, len(perNode))
	for addr, v := range perNode {
		out[addr] = v[0] + v[1]
	}
	return out, nil
}

// nodeRoles returns the role of each node, "master" or "replica", by address (INFO replication,
// which commandCalls does not count).
func (b *bench) nodeRoles(ctx context.Context) (map[string]string, error) {
	infos, err := b.nodeInfo(ctx, "replication")
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(infos))
	for addr, info := range infos {
		for line := range strings.SplitSeq(info, "\n") {
			if role, ok := strings.CutPrefix(strings.TrimSpace(line), "role:"); ok {
				if role == "slave" {
					role = "replica"
				}
				out[addr] = role
			}
		}
	}
	return out, nil
}

// serverSample is what the Redis servers had done at one moment, summed over the nodes: the
// commands they ran (commandCalls's all, scripts and scriptUsec) and the CPU seconds they used.
type serverSample struct {
	all, scripts, scriptUsec float64
	cpu                      float64
}

// sample reads the servers' commandCalls, then their redisCPU.
func (b *bench) sample(ctx context.Context) (serverSample, error) {
	var s serverSample
	var err error
	if s.all, s.scripts, s.scriptUsec, err = b.commandCalls(ctx); err != nil {
		return s, err
	}
	s.cpu, err = b.redisCPU(ctx)
	return s, err
}

// commandCalls returns how many commands the Redis servers have run so far, summed over every
// node: all of them (those scripts run included), the script calls (EVALSHA, EVAL, FCALL) and the
// microseconds of Redis CPU those script calls took (INFO commandstats usec, the commands they
// ran included).
func (b *bench) commandCalls(ctx context.Context) (all, scripts, scriptUsec float64, err error) {
	for addr, node := range b.client.Nodes() {
		info, err := node.Do(ctx, node.B().Info().Section("commandstats").Build()).ToString()
		if err != nil {
			return 0, 0, 0, fmt.Errorf("INFO commandstats on %s: %w", addr, err)
		}
		for line := range strings.SplitSeq(info, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
			if !ok || !strings.HasPrefix(name, "cmdstat_") {
				continue
			}
			calls, rest, _ := strings.Cut(rest, ",")
			n, err := strconv.ParseFloat(calls, 64)
			if err != nil {
				return 0, 0, 0, fmt.Errorf("INFO commandstats on %s: %q: %w", addr, line, err)
			}
			switch name {
			case "cmdstat_info", "cmdstat_client|caching":
				continue // the tool's own reads, and rueidis's tracking opt-in
			case "cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall", "cmdstat_fcall_ro":
				scripts += n
				if v, ok := strings.CutPrefix(rest, "usec="); ok {
					v, _, _ = strings.Cut(v, ",")
					u, err := strconv.ParseFloat(v, 64)
					if err != nil {
						return 0, 0, 0, fmt.Errorf("INFO commandstats on %s: %q: %w", addr, line, err)
					}
					scriptUsec += u
				}
			}
			all += n
		}
	}
	return all, scripts, scriptUsec, nil
}

// ledgerStats returns the number of entries of each ledger hash, and their Redis memory per
// entry (MEMORY USAGE with 1000 samples of each hash), nil when no ledger has an entry or the
// server has no MEMORY USAGE.
func (b *bench) ledgerStats(ctx context.Context, keys []string) ([]int64, *float64, error) {
	c := b.client
	lens := make([]int64, len(keys))
	var entries int64
	for i, k := range keys {
		n, err := c.Do(ctx, c.B().Hlen().Key(k).Build()).AsInt64()
		if err != nil {
			return nil, nil, fmt.Errorf("HLEN %s: %w", k, err)
		}
		lens[i] = n
		entries += n
	}
	if entries == 0 {
		return lens, nil, nil
	}
	var bytes int64
	for i, k := range keys {
		if lens[i] == 0 {
			continue
		}
		n, err := c.Do(ctx, c.B().MemoryUsage().Key(k).Samples(1000).Build()).AsInt64()
		if err != nil {
			return lens, nil, nil // miniredis: no MEMORY USAGE
		}
		bytes += n
	}
	per := float64(bytes) / float64(entries)
	return lens, &per, nil
}

// requestBytes returns the Redis memory of keys (MEMORY USAGE with 1000 samples of each) per
// ledger entry, entries in all: nil without entries or without MEMORY USAGE (miniredis). Keys
// that do not exist count nothing.
func (b *bench) requestBytes(ctx context.Context, keys []string, entries int64) *float64 {
	if entries == 0 {
		return nil
	}
	c := b.client
	var bytes int64
	for _, k := range keys {
		res := c.Do(ctx, c.B().MemoryUsage().Key(k).Samples(1000).Build())
		if rueidis.IsRedisNil(res.Error()) {
			continue
		}
		n, err := res.AsInt64()
		if err != nil {
			return nil
		}
		bytes += n
	}
	per := float64(bytes) / float64(entries)
	return &per
}

// flushDB empties every node: only for a private Redis (embedded, or -flush).
func (b *bench) flushDB(ctx context.Context) error {
	for addr, node := range b.client.Nodes() {
		if err := node.Do(ctx, node.B().Flushdb().Build()).Error(); err != nil {
			return fmt.Errorf("FLUSHDB on %s: %w", addr, err)
		}
	}
	return nil
}

// deleteKeys UNLINKs keys one by one (they may live in different cluster slots), then waits for
// Redis to free them in the background, so that the next phase does not share the CPU with the
// freeing of a large ledger.
func (b *bench) deleteKeys(keys []string) {
	if len(keys) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	c := b.client
	cmds := make(rueidis.Commands, 0, len(keys))
	for _, k := range keys {
		cmds = append(cmds, c.B().Unlink().Key(k).Build())
	}
	for _, r := range c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			fmt.Fprintf(b.stderr, "stockbench: cleanup: %v\n", err)
			return
		}
	}
	for ctx.Err() == nil {
		v, err := b.infoFields(ctx, "memory", "lazyfree_pending_objects")
		if err != nil || v[0] == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cleanupAll scans every node for keys of this run that are left and deletes them. It returns
// how many it found.
func (b *bench) cleanupAll() int {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	left := map[string]bool{}
	for addr, node := range b.client.Nodes() {
		var cursor uint64
		for {
			se, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match(b.runPrefix()+"*").Count(1000).Build()).AsScanEntry()
			if err != nil {
				fmt.Fprintf(b.stderr, "stockbench: cleanup: SCAN on %s: %v\n", addr, err)
				break
			}
			for _, k := range se.Elements {
				left[k] = true
			}
			if se.Cursor == 0 {
				break
			}
			cursor = se.Cursor
		}
	}
	keys := make([]string, 0, len(left))
	for k := range left {
		keys = append(keys, k)
	}
	b.deleteKeys(keys)
	return len(keys)
}

// bucketPlacement describes, on a cluster with -buckets N > 1, which master holds each bucket of
// the first items of the Reserver phases: the buckets of an item are N hash tags, and two of
// them may fall in the slots of the same master. "" when not on a cluster or not split.
func (b *bench) bucketPlacement(ctx context.Context) string {
	if len(b.cfg.cluster) == 0 || b.cfg.buckets <= 1 {
		return ""
	}
	c := b.client
	slots, err := c.Do(ctx, c.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return ""
	}
	type rng struct {
		lo, hi int64
		addr   string
	}
	var ranges []rng
	masters := map[string]bool{}
	for _, s := range slots {
		v, err := s.ToArray()
		if err != nil || len(v) < 3 {
			continue
		}
		lo, _ := v[0].AsInt64()
		hi, _ := v[1].AsInt64()
		m, err := v[2].ToArray()
		if err != nil || len(m) < 2 {
			continue
		}
		host, _ := m[0].ToString()
		port, _ := m[1].AsInt64()
		addr := host + ":" + strconv.FormatInt(port, 10)
		ranges = append(ranges, rng{lo, hi, addr})
		masters[addr] = true
	}
	var parts []string
	for _, sku := range skus(min(b.cfg.items, 4)) {
		on := map[string]bool{}
		var bs []string
		for i := range b.cfg.buckets {
			slot := int64(protocol.Slot(protocol.BucketBase("p", sku, i, b.cfg.buckets)))
			addr := "?"
			for _, r := range ranges {
				if slot >= r.lo && slot <= r.hi {
					addr = r.addr
				}
			}
			on[addr] = true
			bs = append(bs, fmt.Sprintf("%d: slot %d on %s", i, slot, addr))
		}
		parts = append(parts, fmt.Sprintf("%s on %d of %d masters (bucket %s)", sku, len(on), len(masters), strings.Join(bs, ", ")))
	}
	if b.cfg.items > 4 {
		parts = append(parts, "…")
	}
	return "buckets: " + strings.Join(parts, "; ")
}
