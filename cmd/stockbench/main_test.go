package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/protocol"
	"github.com/stockres/stock/internal/redistest"
)

// runReport runs stockbench with args (and -json) and returns its report.
func runReport(t *testing.T, args ...string) Report {
	t.Helper()
	var out, errOut bytes.Buffer
	require.NoError(t, run(context.Background(), append(args, "-json"), &out, &errOut), errOut.String())
	var rep Report
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep), out.String())
	return rep
}

// runTable runs stockbench with args and returns the table it printed.
func runTable(t *testing.T, args ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	require.NoError(t, run(context.Background(), args, &out, &errOut), errOut.String())
	return out.String()
}

// checksHold asserts that every check of rep holds, and returns the names of its checks, as
// "phase: name".
func checksHold(t *testing.T, rep Report) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	for _, c := range rep.Checks {
		assert.True(t, c.OK, "%s: %s: %s", c.Phase, c.Name, c.Detail)
		names[c.Phase+": "+c.Name] = true
	}
	return names
}

// TestRunJSON runs every phase briefly on the embedded miniredis (and PostgreSQL when
// STOCK_TEST_POSTGRES names one) and checks the JSON report.
func TestRunJSON(t *testing.T) {
	// Half the deducts repeat an earlier id (5% by default), so that the replay check has
	// replays to count even when a loaded machine makes few requests in 200ms.
	args := []string{"-duration", "200ms", "-g", "8", "-retry", "0.5"}
	want := []string{phDeduct, phDeductNoUser, phSoldOut, phFastPath, phRestore, phLedgerHash, phOnePerUser, phNoLedger, phWatch}
	if dsn := os.Getenv("STOCK_TEST_POSTGRES"); dsn != "" {
		args = append(args, "-pg", dsn)
		want = append(want, phPGHotRow)
	}
	rep := runReport(t, args...)
	assert.True(t, rep.OK)
	assert.Equal(t, 8, rep.Goroutines)
	require.Len(t, rep.Phases, len(want))
	for i, p := range rep.Phases {
		assert.Equal(t, want[i], p.Name)
		assert.Positive(t, p.Ops, p.Name)
		assert.Positive(t, p.OpsPerSec, p.Name)
		assert.Zero(t, p.Errors, "%s: %s", p.Name, p.FirstErr)
		assert.Positive(t, p.P50us, p.Name)
		assert.LessOrEqual(t, p.P50us, p.P999us, p.Name)
		assert.Nil(t, p.RedisCPU, "miniredis has no INFO cpu")
		assert.Nil(t, p.RedisUsPerOp)
	}
	assert.Positive(t, rep.Phases[0].Replayed, "the deduct phase retries earlier ids")
	assert.Equal(t, rep.Phases[2].Ops, rep.Phases[2].SoldOut)

	names := checksHold(t, rep)
	for _, n := range []string{
		"deduct: loaded = available + held + sold",
		"deduct: sold = successful fresh deducts",
		"deduct: no id applied twice (ledger entries = successful ids)",
		"deduct: replays repeat the original receipt",
	} {
		assert.True(t, names[n], "missing check %q", n)
	}
	require.Len(t, rep.Ratios, 9)
	for _, r := range rep.Ratios {
		if r.Den == phPGHotRow && len(want) == 9 {
			assert.Nil(t, r.Value)
			continue
		}
		if assert.NotNil(t, r.Value, "%s / %s", r.Num, r.Den) {
			assert.Positive(t, *r.Value)
		}
	}
}

// TestRunTableRounds runs two phases in interleaved rounds and prints the table.
func TestRunTableRounds(t *testing.T) {
	s := runTable(t, "-duration", "200ms", "-g", "4", "-items", "3", "-rounds", "2", "-phases", "soldout,deduct")
	assert.Contains(t, s, "in 2 round(s)")
	assert.Regexp(t, `deduct / raw-ledger\s+n/a\s+n/a`, s)
	assert.Contains(t, s, "soldout / deduct")
	assert.Contains(t, s, "all invariants hold")
	assert.Regexp(t, `(?m)^  deduct\s+4\s+\d+`, s)
}

// TestChecksCatchAStrayDeduct takes stock behind the workers' back, on a plain item and on one
// split over 3 buckets (the checks count every bucket's ledger): the checks must say so. The
// phase's keys cover every key of every bucket.
func TestChecksCatchAStrayDeduct(t *testing.T) {
	for _, buckets := range []int{1, 3} {
		t.Run(fmt.Sprint("buckets ", buckets), func(t *testing.T) {
			ctx := context.Background()
			cfg, err := parseFlags([]string{"-duration", "100ms", "-g", "4", "-phases", "deduct", "-buckets", fmt.Sprint(buckets)}, io.Discard)
			require.NoError(t, err)
			b, err := newBench(cfg, io.Discard)
			require.NoError(t, err)
			defer b.close()

			p, err := b.newPhase(phDeduct)
			require.NoError(t, err)
			require.NoError(t, p.setup(ctx))
			for i := range cfg.g {
				p.ws = append(p.ws, newWorker(i, cfg.items, 1))
			}
			b.measure(ctx, p, cfg.duration)

			r, err := stock.New(b.client, stock.WithPrefix(b.prefix(phDeduct)), stock.WithBuckets(func(string) int { return buckets }))
			require.NoError(t, err)
			for i := range buckets { // in whichever buckets they land
				_, err = r.Deduct(ctx, stock.Request{SKU: "item-0", ID: fmt.Sprint("stray-", i), Qty: 1})
				require.NoError(t, err)
			}

			res := p.result()
			checks, err := p.finish(ctx, &res, p.ws)
			require.NoError(t, err)
			failed := map[string]bool{}
			for _, c := range checks {
				if !c.OK {
					failed[c.Name] = true
				}
			}
			assert.Equal(t, map[string]bool{
				"sold = successful fresh deducts":                       true,
				"no id applied twice (ledger entries = successful ids)": true,
			}, failed)

			// The stray Reserver writes its due-work hints a moment after its calls returned
			// (from a goroutine of its own), so a hint set may come back after a deletion: a key
			// the deletion misses stays whatever the tries, one written late is gone after the
			// next.
			var left []string
			for try := 0; try < 5; try++ {
				b.deleteKeys(p.keys)
				left = left[:0]
				for _, k := range b.mini.Keys() {
					if strings.HasPrefix(k, b.prefix(phDeduct)+":") {
						left = append(left, k)
					}
				}
				if len(left) == 0 {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			assert.Empty(t, left)
		})
	}
}

// Bad flags are usage errors; good ones are read in canonical order, with their defaults.
func TestFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-retry", "1"},
		{"-g", "0"},
		{"-g", "1,x"},
		{"-items", "0"},
		{"-duration", "0s"},
		{"-phases", "deduct,nope"},
		{"-phases", "pg-hotrow"}, // needs -pg
		{"-redis", "a:1", "-cluster", "b:1"},
		{"-rounds", "0"},
		{"extra"},
		{"-buckets", "0"},
		{"-buckets", "65"},
		{"-stock", "0"},
		{"-stock", "1000000000001"},
	} {
		_, err := parseFlags(args, io.Discard)
		assert.ErrorIs(t, err, errUsage, "%q", args)
	}
	cfg, err := parseFlags([]string{"-phases", "watch-multi, deduct", "-cluster", "a:1, b:2"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, []string{phDeduct, phWatch}, cfg.phases, "canonical order")
	assert.Equal(t, []string{"a:1", "b:2"}, cfg.cluster)

	cfg, err = parseFlags(nil, io.Discard)
	require.NoError(t, err)
	assert.NotContains(t, cfg.phases, phPGHotRow, "pg-hotrow only with -pg")
	assert.Equal(t, 256, cfg.g)
	assert.Equal(t, 1, cfg.buckets, "not split by default")
	assert.EqualValues(t, bigStock, cfg.stock)
	assert.Equal(t, 1443, protocol.Slot("item-0|0"), "CRC16/XMODEM of Redis Cluster")

	cfg, err = parseFlags([]string{"-g", "1, 16,256"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 16, 256}, cfg.gs)
	assert.Equal(t, 5*time.Second, cfg.duration)
}

// The histogram's buckets are narrow, its quantiles within 3%, and merge adds counts.
func TestHistogram(t *testing.T) {
	for _, v := range []int64{0, 1, 63, 64, 65, 127, 128, 1000, 123456789, 1 << 40, 1<<62 + 12345} {
		low, width := bucketRange(bucketOf(v))
		assert.True(t, low <= v && v < low+width, "%d in [%d, %d)", v, low, low+width)
		assert.LessOrEqual(t, width, max(v/16, 1), "%d: bucket too wide", v)
	}
	var h histogram
	assert.Zero(t, h.quantile(0.5))
	for i := 1; i <= 100000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	for _, q := range []float64{0.5, 0.99, 0.999} {
		want := q * 100000 * float64(time.Microsecond)
		assert.InEpsilon(t, want, float64(h.quantile(q)), 0.03, "q=%v", q)
	}
	assert.Equal(t, 100000*time.Microsecond, h.quantile(1))

	var m histogram
	m.record(time.Second)
	m.merge(&h)
	assert.Equal(t, time.Second, m.quantile(1))
	assert.Equal(t, uint64(100001), m.n)
}

// stockbench -h prints what the tool does and its usage, and exits 0.
func TestHelp(t *testing.T) {
	var buf bytes.Buffer
	_, err := parseFlags([]string{"-h"}, &buf)
	assert.ErrorIs(t, err, flag.ErrHelp)
	assert.Equal(t, 0, exitCode(err))
	assert.Contains(t, buf.String(), "stockbench measures the throughput")
	assert.Contains(t, buf.String(), "Usage: stockbench [flags]")
	assert.Contains(t, buf.String(), "-duration")
	assert.Equal(t, 2, exitCode(errUsage))
	assert.Equal(t, 1, exitCode(errChecks))
	assert.Equal(t, 0, exitCode(nil))
}

// TestPrintNodeCPU checks the per-node block of the table without a server: one row per phase
// that measured several nodes, addresses ordered by port as a number, replicas marked, and
// nothing printed for a single node.
func TestPrintNodeCPU(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	rep := Report{Target: "cluster x", OK: true, Phases: []PhaseResult{
		{Name: phDeduct, Ops: 1000, Seconds: 1, RedisCPU: f(0.95), RedisUsPerOp: f(950),
			RedisCPUPerNode:     map[string]float64{"127.0.0.1:7000": 0.93, "127.0.0.1:10000": 0.01, "127.0.0.1:7001": 0.01},
			RedisUsPerOpPerNode: map[string]float64{"127.0.0.1:7000": 930, "127.0.0.1:10000": 10, "127.0.0.1:7001": 10},
			RedisNodeRoles:      map[string]string{"127.0.0.1:7000": "master", "127.0.0.1:10000": "replica", "127.0.0.1:7001": "master"}},
		{Name: phPGHotRow, Ops: 10, Seconds: 1}, // not on Redis: no row
	}}
	var buf bytes.Buffer
	require.NoError(t, printTable(&buf, rep))
	s := buf.String()
	block := nodeBlock(t, s)
	assert.Regexp(t, `(?m)^  phase\s+127\.0\.0\.1:7000\s+127\.0\.0\.1:7001\s+127\.0\.0\.1:10000 \(replica\)\s*$`, block)
	assert.Regexp(t, `(?m)^  deduct\s+93% \(930\.0\)\s+1% \(10\.0\)\s+1% \(10\.0\)\s*$`, block)
	assert.NotContains(t, block, "pg-hotrow")
	assert.Less(t, strings.Index(s, "  pg-hotrow"), strings.Index(s, "redis cpu per node"), "after the phase table")

	rep.Phases[0].RedisCPUPerNode, rep.Phases[0].RedisUsPerOpPerNode, rep.Phases[0].RedisNodeRoles = nil, nil, nil
	buf.Reset()
	require.NoError(t, printTable(&buf, rep))
	assert.NotContains(t, buf.String(), "per node", "one node: nothing new")
	js, err := json.Marshal(rep.Phases[0])
	require.NoError(t, err)
	assert.NotContains(t, string(js), "per_node")
	assert.NotContains(t, string(js), "node_roles")
}

// TestRunBuckets runs the Reserver phases with every item split over 3 buckets on the embedded
// miniredis: every check holds, over every bucket, and the fast-path phase says it is moot.
// Then a deduct phase with little stock sells out: stock moves between the buckets, no transfer
// is left in flight, and nothing is refused while a bucket still has stock.
func TestRunBuckets(t *testing.T) {
	rep := runReport(t, "-duration", "200ms", "-g", "8", "-retry", "0.5", "-buckets", "3", "-items", "2",
		"-phases", "deduct,deduct-nouser,soldout,soldout-fast,restore")
	assert.True(t, rep.OK)
	assert.Equal(t, 3, rep.Buckets)
	require.Len(t, rep.Phases, 5)
	for _, p := range rep.Phases {
		assert.Positive(t, p.Ops, p.Name)
		assert.Zero(t, p.Errors, "%s: %s", p.Name, p.FirstErr)
		assert.NotNil(t, p.Transfers, p.Name)
	}
	names := checksHold(t, rep)
	for _, ph := range []string{phDeduct, phDeductNoUser, phSoldOut, phFastPath, phRestore} {
		assert.True(t, names[ph+": no id applied twice (ledger entries = successful ids)"], ph)
		assert.True(t, names[ph+": no transfer between buckets left in flight"], ph)
	}
	assert.Positive(t, rep.Phases[0].OK)
	assert.Positive(t, rep.Phases[0].Replayed)
	assert.True(t, slicesContainsSubstr(rep.Notes, "fast path answers an item split over buckets with one round trip"), "%v", rep.Notes)

	// A phase may see its buckets run dry at the same moment, and on a loaded machine both
	// phases of one run did once: a run that moved no stock is tried again, up to 5 runs.
	var transfers int64
	for attempt := 0; attempt < 5 && transfers == 0; attempt++ {
		rep := runReport(t, "-duration", "1s", "-g", "8", "-buckets", "3", "-stock", "60", "-phases", "deduct,deduct-nouser")
		assert.True(t, rep.OK)
		assert.EqualValues(t, 60, rep.Stock)
		checksHold(t, rep)
		for _, p := range rep.Phases {
			assert.EqualValues(t, 60, p.OK, "%s sells the whole stock", p.Name)
			assert.Positive(t, p.SoldOut, "%s sells out", p.Name)
			if assert.NotNil(t, p.Transfers, p.Name) {
				transfers += *p.Transfers
			}
		}
	}
	assert.Positive(t, transfers, "the last units of a bucket come from the others")
}

// nodeBlock returns the per-node block of a table: from its title to the ratios.
func nodeBlock(t *testing.T, table string) string {
	t.Helper()
	i := strings.Index(table, "redis cpu per node, % of a core (µs/op):")
	j := strings.Index(table, "ratios:")
	require.True(t, i >= 0 && i < j, "no per-node block before the ratios:\n%s", table)
	return table[i:j]
}

// TestRunCluster runs on a private 3-master cluster. Two phases: the report splits the Redis
// CPU by master, and the parts sum to the total, in the JSON and in the table. The deduct phase
// on one hot item split over 3 buckets: its buckets fall on the three masters (one each), each
// carries the Redis CPU of the phase, and every check holds.
func TestRunCluster(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skipf("needs a real Redis Cluster: set %s to the path of redis-server", redistest.EnvServer)
	}
	cluster := redistest.StartCluster(t, 3)
	addrs := cluster.Addrs()
	seeds := strings.Join(addrs, ",")
	t.Run("per node", func(t *testing.T) {
		rep := runReport(t, "-cluster", seeds, "-duration", "300ms", "-g", "16", "-items", "16", "-phases", "deduct,raw-ledger")
		require.Len(t, rep.Phases, 2)
		for _, p := range rep.Phases {
			require.NotNil(t, p.RedisCPU, p.Name)
			require.NotNil(t, p.RedisUsPerOp, p.Name)
			require.Len(t, p.RedisCPUPerNode, 3, p.Name)
			var sum, sumUs float64
			for _, a := range addrs {
				cores, ok := p.RedisCPUPerNode[a]
				require.True(t, ok, "%s: no %s in %v", p.Name, a, p.RedisCPUPerNode)
				assert.GreaterOrEqual(t, cores, 0.0, "%s: %s", p.Name, a)
				sum += cores
				sumUs += p.RedisUsPerOpPerNode[a]
				assert.Equal(t, "master", p.RedisNodeRoles[a], "%s: %s", p.Name, a)
			}
			assert.InDelta(t, *p.RedisCPU, sum, 1e-9, p.Name)
			assert.InDelta(t, *p.RedisUsPerOp, sumUs, 1e-6, p.Name)
		}

		// The table: one row per phase, its percentages summing to the total's within rounding.
		s := runTable(t, "-cluster", seeds, "-duration", "300ms", "-g", "16", "-items", "1", "-phases", "deduct")
		block := nodeBlock(t, s)
		for _, a := range addrs {
			assert.Contains(t, block, a)
		}
		row := regexp.MustCompile(`(?m)^  deduct\s+(\d+)% \([0-9.]+\)\s+(\d+)% \([0-9.]+\)\s+(\d+)% \([0-9.]+\)\s*$`).FindStringSubmatch(block)
		require.NotNil(t, row, s)
		// The phase table's row: the first "N%  x.x  N%" is redis cpu, its µs/op and client cpu.
		total := regexp.MustCompile(`(?m)^  deduct\s+16\s.*?\s(\d+)%\s+[0-9.]+\s+\d+%`).FindStringSubmatch(s)
		require.NotNil(t, total, s)
		var parts int
		for _, v := range row[1:] {
			n, _ := strconv.Atoi(v)
			parts += n
		}
		want, _ := strconv.Atoi(total[1])
		assert.InDelta(t, want, parts, 2, "per-node percentages sum to the total within rounding:\n%s", s)
	})
	t.Run("buckets", func(t *testing.T) {
		rep := runReport(t, "-cluster", seeds, "-duration", "500ms", "-g", "32", "-items", "1", "-buckets", "3", "-phases", "deduct,restore")
		assert.True(t, rep.OK)
		checksHold(t, rep)
		assert.True(t, slicesContainsSubstr(rep.Notes, "buckets: item-0 on "), "%v", rep.Notes)
		d := rep.Phases[0]
		require.Equal(t, phDeduct, d.Name)
		require.NotNil(t, d.RedisCPU)
		require.Len(t, d.RedisCPUPerNode, 3)
		busy := 0
		for addr, cores := range d.RedisCPUPerNode {
			if cores >= 0.1**d.RedisCPU {
				busy++
			}
			t.Logf("deduct: %s %.0f%% of a core", addr, cores*100)
		}
		assert.Equal(t, 3, busy, "one item over 3 buckets, one per master: every master carries the deduct phase: %v", d.RedisCPUPerNode)
		assert.True(t, slicesContainsSubstr(rep.Notes, "item-0 on 3 of 3 masters"), "%v", rep.Notes)
	})
}

func slicesContainsSubstr(ss []string, sub string) bool {
	for _, s := range ss {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// TestLayouts: every candidate of -layouts takes one unit, writes one entry and one event per
// call (the report checks it and fails otherwise), and the table has a row for each.
func TestLayouts(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"-layouts", "100", "-g", "1"}, &out, &errOut)
	require.ErrorContains(t, err, "real Redis 7", "miniredis has no Redis functions")
	if redistest.ServerBinary(t) == "" {
		t.Skipf("the rest needs a real redis-server: set %s to its path", redistest.EnvServer)
	}
	srv := redistest.StartServer(t)
	out.Reset()
	err = run(context.Background(), []string{"-redis", srv.Addr(), "-layouts", "400", "-g", "4", "-rounds", "2", "-json"}, &out, &errOut)
	require.NoError(t, err, errOut.String())
	var rows []LayoutResult
	require.NoError(t, json.Unmarshal(out.Bytes(), &rows), out.String())
	require.Len(t, rows, len(layouts))
	for _, x := range rows {
		assert.Equal(t, int64(400), x.Calls, x.Name)
		assert.Positive(t, x.UsPerCall, x.Name)
		require.NotNil(t, x.BytesPerOp, x.Name)
		assert.Positive(t, *x.BytesPerOp, x.Name)
	}
	assert.InDelta(t, 1.0, rows[len(rows)-1].VsLedgerHash, 1e-9, "the ledger-hash row is its own baseline")

	_, err = parseFlags([]string{"-layouts", "3", "-g", "2", "-rounds", "2"}, io.Discard)
	assert.ErrorIs(t, err, errUsage, "fewer calls than goroutines times rounds")
}
