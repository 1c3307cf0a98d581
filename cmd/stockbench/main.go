// Command stockbench measures, in one run, the throughput and latency of stock.Reserver.Deduct
// against baselines on the same Redis: a common idempotent deduct script that keeps a ledger hash
// (HEXISTS the operation id, GET/SET the stock, HSET a JSON entry) and a ledger-less GET/DECRBY
// script, both driven by raw pipelined EVALSHA, WATCH/MULTI/EXEC, and optionally a PostgreSQL hot-row update.
// It prints ratios between them, never absolute claims: numbers from one machine, especially one
// where the client and Redis share the cores, only mean something against each other.
//
// Usage:
//
//	stockbench [flags]
//
//	# embedded miniredis (a smoke test: miniredis runs in this process, one Lua state per call)
//	go run ./cmd/stockbench -duration 1s
//
//	# a real Redis; keys get a unique prefix per phase and are deleted at the end
//	go run ./cmd/stockbench -redis 127.0.0.1:6379 -duration 5s
//
//	# a Redis Cluster, 64 items spread over the slots, plus the PostgreSQL baseline
//	go run ./cmd/stockbench -cluster 127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002 -items 64 \
//	    -pg 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//
//	# only some phases, as JSON
//	go run ./cmd/stockbench -redis 127.0.0.1:6379 -phases deduct,raw-ledger -json
//
// Phases, each run for -duration with -g goroutines on a freshly loaded item set:
//
//	deduct        Reserver.Deduct with unique ids, each request by a buyer of its own, under
//	              stock.WithUserLimit(2); a share -retry of requests repeats an earlier request
//	deduct-nouser the same without buyers (Request.User empty)
//	soldout       Reserver.Deduct on items loaded with 0, the sold-out fast path off
//	soldout-fast  the same with the fast path on (a client with client-side caching)
//	restore       Reserver.Deduct then Reserver.Restore of the same id (ops counted per call)
//	raw-ledger    the ledger-hash deduct script (HEXISTS, GET, checks, SET, TIME, HSET of a cjson entry)
//	raw-oneperuser a one-purchase-per-user script: SISMEMBER the buyer, GET, check, DECR, SADD
//	raw-noledger  a GET + check + DECRBY script, no ledger
//	watch-multi   WATCH/GET then MULTI/DECRBY/EXEC on dedicated connections, min(g, 64) goroutines
//	pg-hotrow     with -pg: UPDATE … WHERE remain >= 1 plus a ledger INSERT in one transaction,
//	              min(g, 64) connections, in a schema created for the run and dropped after it
//
// Flags: -redis addr | -cluster addr,addr,... (default: embedded miniredis), -g goroutines (256;
// a list such as 1,16,256 makes one report per count, each with its own baselines; with -json
// they are printed as an array),
// -items K (1: one hot item), -duration per phase (5s), -retry share (0.05), -pg dsn, -json,
// -phases list, -rounds N (1), -flush, -outbox (true: stock.WithOutbox for the Reserver phases),
// -coalesce N (4: stock.WithCoalescing for the Reserver phases; 0 = off), -buckets N (1: each
// item of the Reserver phases in one slot; N > 1 splits it over N buckets in slots of their own
// with stock.WithBuckets, so that one hot item is served by several masters of a cluster),
// -stock N (10^12: units loaded per item in deduct, deduct-nouser and restore; little stock
// makes the items sell out during the phase, and with -buckets, a bucket that runs short draws
// stock from the others: the cost of those transfers shows in the phase's figures).
//
// With -buckets N the checks cover every bucket: Levels sums them, the ledger entries are
// counted with stockops.Entries (every bucket's ledger) and must match the keys stockbench
// reads for the memory per entry, no transfer between buckets may be left in flight, and the
// keys of every bucket ("<prefix>:{sku|i|k}…", bucket i's keys in the i-th of N equal slot
// ranges) are deleted. The sold-out fast path answers a split item with one round trip (the
// claim of the request's id), not in-process: soldout-fast then measures that (a note says so).
//
// For each phase it reports ops/s, latency quantiles (p50, p99, p99.9), allocations per op in
// this process (the load generator's own id string included; with the embedded miniredis, the
// server's too), Redis memory per ledger entry (MEMORY USAGE / HLEN of the ledger hashes) and
// per request once its event is delivered (B/req: the ledgers, the buyers' counts and the items'
// hashes, or the baselines' stock keys, per ledger entry; the outbox is left out), Redis
// commands and script calls per op (INFO commandstats, the commands scripts run included), the
// Redis CPU of the script calls per call and per request (INFO commandstats usec), and
// the CPU used by redis-server (INFO cpu, summed over the nodes) and by this process, as a share
// of one core and as microseconds per op; with more than one node (a cluster), also the Redis CPU
// of each node, to see how the load spreads over the masters. CPU per op depends much less than
// ops/s on what else the machine runs. Then the ratios, and the invariants of the deduct phase (loaded = available
// + held + sold; sold = successful fresh deducts; ledger entries = successful ids; every retry
// answered as a replay of its original receipt) and of the other phases. Operations that fail
// with a transport error are counted as errors, not ops; each widens the tolerance of the checks
// by one, since it may or may not have run. The exit status is 1 when a check fails or the run
// is interrupted, 2 on bad flags.
//
// With -rounds N, every phase is set up first and the phases then take turns, N slices of
// duration/N each, so that a change in the background load of a shared machine weighs on every
// phase alike; the default, one round, runs each phase on its own and deletes its keys before the
// next one starts.
//
// stockbench never flushes a Redis it was pointed at unless -flush is given (then FLUSHDB runs
// before the phases): it writes under prefixes unique to the run ("sb-<run>-<phase>"), deletes
// what it wrote after the phases, and at the end scans for anything left with the run's prefix.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"
)

// Phase names, in the order they run.
const (
	phDeduct       = "deduct"        // distinct buyers, a per-user limit of 2
	phDeductNoUser = "deduct-nouser" // the same without buyers
	phOnePerUser   = "raw-oneperuser"
	phSoldOut      = "soldout"      // a sold-out item, the fast path off: every request runs the script
	phFastPath     = "soldout-fast" // the same with the sold-out fast path (a client that caches)
	phRestore      = "restore"
	phLedgerHash   = "raw-ledger"
	phNoLedger     = "raw-noledger"
	phWatch        = "watch-multi"
	phPGHotRow     = "pg-hotrow"
	defaultMaxG    = 64 // goroutines of the connection-bound phases (watch-multi, pg-hotrow)
	maxBuckets     = 64 // the most buckets stock.WithBuckets splits an item into
)

var allPhases = []string{phDeduct, phDeductNoUser, phSoldOut, phFastPath, phRestore, phLedgerHash, phOnePerUser, phNoLedger, phWatch, phPGHotRow}

// errChecks is returned by run when an invariant check failed.
var errChecks = errors.New("stockbench: an invariant check failed")

// errUsage marks bad flags (exit status 2).
var errUsage = errors.New("stockbench: usage")

type config struct {
	redis      string
	cluster    []string
	g          int   // goroutines of the report being made
	gs         []int // -g: the goroutine counts, one report each
	items      int
	duration   time.Duration
	retry      float64
	pg         string
	json       bool
	phases     []string
	flush      bool
	outbox     bool
	coalesce   int
	rounds     int
	idle       []int  // -idle: catalogue sizes of the idle report
	layouts    int    // -layouts: calls per candidate layout of the layouts report
	cpuprofile string // -cpuprofile: where to write a CPU profile of the client
	buckets    int    // -buckets: buckets per item of the Reserver phases (stock.WithBuckets); 1 = not split
	stock      int64  // -stock: units loaded per item in the deduct, deduct-nouser and restore phases
}

// Report is the outcome of a run, printed as a table or, with -json, as this structure.
type Report struct {
	Target     string        `json:"target"`
	Goroutines int           `json:"goroutines"`
	Items      int           `json:"items"`
	Duration   string        `json:"duration"` // per phase
	Rounds     int           `json:"rounds"`
	Retry      float64       `json:"retry"`
	Outbox     bool          `json:"outbox"`
	Coalesce   int           `json:"coalesce"`
	Buckets    int           `json:"buckets"` // buckets per item of the Reserver phases (1: not split)
	Stock      int64         `json:"stock"`   // units loaded per item in deduct, deduct-nouser and restore
	Phases     []PhaseResult `json:"phases"`
	Ratios     []Ratio       `json:"ratios"`
	Checks     []Check       `json:"checks"`
	OK         bool          `json:"ok"` // every check passed
	Notes      []string      `json:"notes,omitempty"`
}

// PhaseResult is the measurement of one phase. Pointer fields are null (n/a) when the backend
// cannot tell.
type PhaseResult struct {
	Name        string  `json:"name"`
	Goroutines  int     `json:"goroutines"`
	Seconds     float64 `json:"seconds"`
	Ops         int64   `json:"ops"` // completed calls: OK + Replayed + SoldOut
	OpsPerSec   float64 `json:"ops_per_sec"`
	P50us       float64 `json:"p50_us"`
	P99us       float64 `json:"p99_us"`
	P999us      float64 `json:"p999_us"`
	AllocsPerOp float64 `json:"allocs_per_op"`
	// CommandsPerOp is how many Redis commands an op cost, those its scripts ran included;
	// ScriptsPerOp how many script calls (below 1 when coalescing batches requests).
	CommandsPerOp *float64 `json:"redis_commands_per_op"`
	ScriptsPerOp  *float64 `json:"redis_scripts_per_op"`
	// ScriptUsPerCall is the Redis CPU of one script call (EVALSHA, EVAL, FCALL) in microseconds,
	// from INFO commandstats (the commands the script ran included); ScriptUsPerOp the same per
	// request (a coalesced call answers several).
	ScriptUsPerCall *float64 `json:"redis_script_us_per_call"`
	ScriptUsPerOp   *float64 `json:"redis_script_us_per_op"`
	// RoundOpsPerSec and RoundScriptUsPerOp are the figures of each round, whose medians the
	// ratios use.
	RoundOpsPerSec     []float64 `json:"round_ops_per_sec,omitempty"`
	RoundScriptUsPerOp []float64 `json:"round_redis_script_us_per_op,omitempty"`
	// LedgerBytes is the Redis memory of the ledger hashes per entry.
	LedgerBytes *float64 `json:"ledger_bytes_per_entry"`
	// RequestBytes is the Redis memory a request keeps once its event is delivered, per ledger
	// entry: the ledger's, the buyers' counts' and the item's (or the stock key's) keys; the
	// outbox, which a relay empties, is left out.
	RequestBytes *float64 `json:"bytes_per_request"`
	// RedisCPU is the CPU redis-server used during the phase, in cores (1 = one core busy).
	RedisCPU *float64 `json:"redis_cpu"`
	// ClientCPU is the CPU this process used during the phase, in cores.
	ClientCPU *float64 `json:"client_cpu"`
	// RedisUsPerOp and ClientUsPerOp are the CPU time used per op, in microseconds: what an op
	// costs, whatever else was running on the machine.
	RedisUsPerOp  *float64 `json:"redis_cpu_us_per_op"`
	ClientUsPerOp *float64 `json:"client_cpu_us_per_op"`
	OK            int64    `json:"ok"`       // took stock (or gave it back, for restores)
	Replayed      int64    `json:"replayed"` // answered as a repeat of an earlier id
	SoldOut       int64    `json:"soldout"`
	Aborts        int64    `json:"aborts"` // watch-multi: EXEC aborted by a concurrent write
	Errors        int64    `json:"errors"` // transport or unexpected errors: not counted in Ops
	FirstErr      string   `json:"first_error,omitempty"`

	// Transfers is how many times stock moved between the buckets of the phase's items (a
	// bucket short of stock draws on the others), set for items split over buckets (-buckets).
	Transfers *int64 `json:"bucket_transfers,omitempty"`

	// RedisCPUPerNode splits RedisCPU by node address (in cores, as RedisCPU: the values sum to
	// it), RedisUsPerOpPerNode RedisUsPerOp (microseconds per op of each node), and
	// RedisNodeRoles says which node is a "master" and which a "replica". Set only when the
	// client reports more than one node (a cluster): how the load spreads over the masters.
	RedisCPUPerNode     map[string]float64 `json:"redis_cpu_per_node,omitempty"`
	RedisUsPerOpPerNode map[string]float64 `json:"redis_cpu_us_per_op_per_node,omitempty"`
	RedisNodeRoles      map[string]string  `json:"redis_node_roles,omitempty"`
}

// Ratio compares two phases: Value is Num's ops/s divided by Den's, RedisCPU is Num's Redis CPU
// time per op divided by Den's, ScriptCPU the same for the CPU of the script calls alone (INFO
// commandstats). With several rounds, Value and ScriptCPU are the medians of the rounds' ratios
// (round i of one phase against round i of the other). A field is null when a phase did not run
// or the value is n/a.
type Ratio struct {
	Num       string   `json:"num"`
	Den       string   `json:"den"`
	Value     *float64 `json:"value"`
	RedisCPU  *float64 `json:"redis_cpu_per_op"`
	ScriptCPU *float64 `json:"redis_script_cpu_per_op"`
}

// Check is one invariant checked after a phase.
type Check struct {
	Phase  string `json:"phase"`
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil && !errors.Is(err, errUsage) && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(exitCode(err))
}

// exitCode is the exit status of a run: 0 when it passed or help was asked for (-h), 2 on bad
// flags, 1 otherwise.
func exitCode(err error) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	}
	return 1
}

// usageText heads the -h output.
const usageText = `stockbench measures the throughput and latency of stock.Reserver.Deduct against baselines on
the same Redis (a ledger-hash deduct script, a ledger-less GET/DECRBY script, WATCH/MULTI/EXEC,
optionally a PostgreSQL hot row) and prints the ratios between them and the invariants it
checked. It writes under prefixes unique to the run and deletes its keys at the end.

Usage: stockbench [flags]

  stockbench -duration 1s                         # embedded miniredis: a smoke test
  stockbench -redis 127.0.0.1:6379 -duration 5s   # a real Redis
  stockbench -redis 127.0.0.1:6379 -phases deduct,raw-ledger -json

Exit status: 0 when every check holds, 1 when one fails or the run is interrupted, 2 on bad flags.

Flags:
`

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var cfg config
	var cluster, phases, gs, idle string
	fs := flag.NewFlagSet("stockbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageText)
		fs.PrintDefaults()
	}
	fs.StringVar(&cfg.redis, "redis", "", "Redis address (default: an embedded miniredis)")
	fs.StringVar(&cluster, "cluster", "", "comma-separated Redis Cluster seed addresses")
	fs.StringVar(&gs, "g", "256", "goroutines per phase; a comma-separated list (1,16,256) runs every phase at each count, one report each")
	fs.IntVar(&cfg.items, "items", 1, "items per phase; 1 is one hot item")
	fs.DurationVar(&cfg.duration, "duration", 5*time.Second, "duration of each phase")
	fs.Float64Var(&cfg.retry, "retry", 0.05, "share of deduct requests that repeat an earlier id")
	fs.StringVar(&cfg.pg, "pg", "", "PostgreSQL DSN for the pg-hotrow baseline (optional)")
	fs.BoolVar(&cfg.json, "json", false, "print JSON instead of a table")
	fs.StringVar(&phases, "phases", "", "comma-separated phases to run (default: all; pg-hotrow needs -pg)\n"+strings.Join(allPhases, ","))
	fs.BoolVar(&cfg.flush, "flush", false, "FLUSHDB before each phase (only for a Redis you own)")
	fs.BoolVar(&cfg.outbox, "outbox", true, "Reserver phases queue outbox events (stock.WithOutbox)")
	fs.IntVar(&cfg.buckets, "buckets", 1, "split each item of the Reserver phases over this many cluster slots (stock.WithBuckets; 1 = not split, at most 64)")
	fs.Int64Var(&cfg.stock, "stock", bigStock, "units loaded per item in the deduct, deduct-nouser and restore phases (little stock: the items sell out, and with -buckets stock moves between buckets)")
	fs.IntVar(&cfg.coalesce, "coalesce", 4, "calls of one item in flight before deducts are coalesced (stock.WithCoalescing; 0 = off)")
	fs.IntVar(&cfg.rounds, "rounds", 1, "split each phase into this many slices, run in turn with the other phases")
	fs.StringVar(&cfg.cpuprofile, "cpuprofile", "", "write a CPU profile of this process (the client side) to this file")
	fs.StringVar(&idle, "idle", "", "instead of the phases: the cost of Run's background work with no traffic over catalogues of these\nsizes (comma-separated item counts), each measured for -duration, and how soon a new event is delivered")
	fs.IntVar(&cfg.layouts, "layouts", 0, "instead of the phases: this many uncoalesced deducts (new id, new buyer, limit 2) on each candidate\nstored layout, as Redis functions beside the library's Deduct and the ledger-hash script, in -rounds\nalternated rounds of the first -g goroutines: Redis time and CPU per call, bytes per entry (Redis 7 or later)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	bad := func(format string, a ...any) (config, error) {
		fmt.Fprintf(stderr, "stockbench: "+format+"\n", a...)
		fs.Usage()
		return cfg, errUsage
	}
	if fs.NArg() > 0 {
		return bad("unexpected arguments %q", fs.Args())
	}
	if cluster != "" {
		if cfg.redis != "" {
			return bad("-redis and -cluster are exclusive")
		}
		for a := range strings.SplitSeq(cluster, ",") {
			if a = strings.TrimSpace(a); a != "" {
				cfg.cluster = append(cfg.cluster, a)
			}
		}
	}
	for v := range strings.SplitSeq(gs, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 1 {
			return bad("-g must be goroutine counts of at least 1, comma-separated")
		}
		cfg.gs = append(cfg.gs, n)
	}
	cfg.g = cfg.gs[0]
	if idle != "" {
		for v := range strings.SplitSeq(idle, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || n < 1 {
				return bad("-idle must be item counts of at least 1, comma-separated")
			}
			cfg.idle = append(cfg.idle, n)
		}
	}
	switch {
	case cfg.layouts < 0 || (cfg.layouts > 0 && int64(cfg.layouts) < int64(cfg.rounds)*int64(cfg.gs[0])):
		return bad("-layouts must be at least -rounds times the first -g")
	case cfg.items < 1:
		return bad("-items must be at least 1")
	case cfg.duration <= 0:
		return bad("-duration must be positive")
	case cfg.retry < 0 || cfg.retry >= 1:
		return bad("-retry must be in [0, 1)")
	case cfg.rounds < 1 || cfg.duration/time.Duration(cfg.rounds) <= 0:
		return bad("-rounds must be at least 1 and at most the duration in nanoseconds")
	case cfg.buckets < 1 || cfg.buckets > maxBuckets:
		return bad("-buckets must be from 1 to %d", maxBuckets)
	case cfg.stock < 1 || cfg.stock > bigStock:
		return bad("-stock must be from 1 to %d", int64(bigStock))
	}
	if phases == "" {
		for _, p := range allPhases {
			if p != phPGHotRow || cfg.pg != "" {
				cfg.phases = append(cfg.phases, p)
			}
		}
		return cfg, nil
	}
	want := map[string]bool{}
	for p := range strings.SplitSeq(phases, ",") {
		p = strings.TrimSpace(p)
		if !slices.Contains(allPhases, p) {
			return bad("unknown phase %q (phases: %s)", p, strings.Join(allPhases, ","))
		}
		if p == phPGHotRow && cfg.pg == "" {
			return bad("phase %s needs -pg", p)
		}
		want[p] = true
	}
	for _, p := range allPhases { // canonical order
		if want[p] {
			cfg.phases = append(cfg.phases, p)
		}
	}
	return cfg, nil
}

// run parses args, runs the phases and prints the report to stdout. It returns errChecks after
// printing the report when a check failed.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	b, err := newBench(cfg, stderr)
	if err != nil {
		return err
	}
	defer b.close()
	if cfg.cpuprofile != "" {
		f, err := os.Create(cfg.cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if cfg.layouts > 0 {
		res, err := b.layoutReport(ctx, stdout)
		if err == nil && cfg.json {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			err = enc.Encode(res)
		}
		b.cleanupAll() // the candidates' keys: every one of them is left for the end
		return err
	}
	if len(cfg.idle) > 0 {
		res, err := b.idleReport(ctx, stdout)
		if err == nil && cfg.json {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			err = enc.Encode(res)
		}
		if left := b.cleanupAll(); left > 0 && err == nil {
			fmt.Fprintf(stderr, "stockbench: cleanup: %d keys of the run were left and deleted\n", left)
		}
		return err
	}

	// One report per goroutine count, each with its own baselines; printed as they complete.
	var reps []Report
	failed := false
	for i, g := range cfg.gs {
		if i > 0 && ctx.Err() != nil {
			break
		}
		b.cfg.g = g
		rep, err := b.report(ctx)
		if err != nil {
			return err
		}
		failed = failed || !rep.OK
		if cfg.json {
			reps = append(reps, rep)
			continue
		}
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		if err := printTable(stdout, rep); err != nil {
			return err
		}
	}
	if cfg.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		var v any = reps
		if len(reps) == 1 {
			v = reps[0] // one -g: the report itself
		}
		if err := enc.Encode(v); err != nil {
			return err
		}
	}
	if failed {
		return errChecks
	}
	return ctx.Err()
}

// report runs the phases with b.cfg.g goroutines and returns their report.
func (b *bench) report(ctx context.Context) (Report, error) {
	cfg := b.cfg
	rep := Report{
		Target: b.target, Goroutines: cfg.g, Items: cfg.items, Duration: cfg.duration.String(),
		Rounds: cfg.rounds, Retry: cfg.retry, Outbox: cfg.outbox, Coalesce: cfg.coalesce,
		Buckets: cfg.buckets, Stock: cfg.stock, OK: true,
	}
	if b.mini != nil {
		rep.Notes = append(rep.Notes, "embedded miniredis runs in this process: allocs/op and client CPU include the server, Redis CPU and memory are n/a")
	}
	if cfg.buckets > 1 {
		if slices.Contains(cfg.phases, phFastPath) {
			rep.Notes = append(rep.Notes, fmt.Sprintf("-buckets %d: the sold-out fast path answers an item split over buckets with one round trip "+
				"(the claim of the request's id), not in-process: soldout-fast measures that", cfg.buckets))
		}
		if pl := b.bucketPlacement(ctx); pl != "" {
			rep.Notes = append(rep.Notes, pl)
		}
		if b.mini == nil && len(cfg.cluster) == 0 {
			rep.Notes = append(rep.Notes, fmt.Sprintf("-buckets %d on a single Redis: the buckets share one core; they spread over cores only on a cluster", cfg.buckets))
		}
	}
	results, checks, err := b.runPhases(ctx)
	rep.Phases, rep.Checks = results, checks
	if err != nil {
		b.cleanupAll()
		return rep, fmt.Errorf("stockbench: %w", err)
	}
	if left := b.cleanupAll(); left > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("deleted %d leftover keys with prefix %s", left, b.runPrefix()))
	}
	if err := ctx.Err(); err != nil {
		rep.Notes = append(rep.Notes, "interrupted: "+err.Error())
	}
	rep.Ratios = ratios(rep.Phases)
	for _, c := range rep.Checks {
		rep.OK = rep.OK && c.OK
	}
	return rep, nil
}

// bench is what every phase shares: the Redis client and the identity of the run.
type bench struct {
	cfg     config
	client  rueidis.Client
	cached  rueidis.Client       // a client with server-assisted caching, for the fast path
	mini    *miniredis.Miniredis // the embedded server, or nil
	target  string
	runID   string
	private bool // the Redis may be flushed: embedded, or -flush
	stderr  io.Writer
}

func newBench(cfg config, stderr io.Writer) (*bench, error) {
	var id [4]byte
	_, _ = rand.Read(id[:])
	b := &bench{cfg: cfg, runID: hex.EncodeToString(id[:]), stderr: stderr, private: cfg.flush}
	opt := rueidis.ClientOption{DisableCache: true}
	switch {
	case len(cfg.cluster) > 0:
		opt.InitAddress = cfg.cluster
		b.target = "cluster " + strings.Join(cfg.cluster, ",")
	case cfg.redis != "":
		opt.InitAddress = []string{cfg.redis}
		b.target = "redis " + cfg.redis
	default:
		m, err := miniredis.Run()
		if err != nil {
			return nil, fmt.Errorf("stockbench: embedded miniredis: %w", err)
		}
		b.mini, b.private = m, true
		opt.InitAddress = []string{m.Addr()}
		opt.ForceSingleClient = true // miniredis answers CLUSTER SLOTS; it is one node
		b.target = "embedded miniredis " + m.Addr()
	}
	c, err := rueidis.NewClient(opt)
	if err != nil {
		if b.mini != nil {
			b.mini.Close()
		}
		return nil, fmt.Errorf("stockbench: connect to %s: %w", b.target, err)
	}
	b.client, b.cached = c, c
	if b.mini == nil { // miniredis cannot track: the fast path turns itself off there
		opt.DisableCache = false
		if b.cached, err = rueidis.NewClient(opt); err != nil {
			c.Close()
			return nil, fmt.Errorf("stockbench: connect to %s with client-side caching: %w", b.target, err)
		}
	}
	return b, nil
}

func (b *bench) close() {
	if b.cached != b.client {
		b.cached.Close()
	}
	b.client.Close()
	if b.mini != nil {
		b.mini.Close()
	}
}

// runPrefix is the start of every key this run writes.
func (b *bench) runPrefix() string { return "sb-" + b.runID + "-" }

func (b *bench) prefix(phase string) string { return b.runPrefix() + phase }

// ratios divides the deduct phase's ops/s by each baseline's, the sold-out path's by the
// deduct phase's, and the sold-out fast path's by the sold-out path's without it.
func ratios(ps []PhaseResult) []Ratio {
	byName := map[string]PhaseResult{}
	for _, p := range ps {
		byName[p.Name] = p
	}
	pairs := [][2]string{
		{phDeduct, phLedgerHash}, {phDeduct, phOnePerUser}, {phDeduct, phNoLedger}, {phDeduct, phWatch}, {phDeduct, phPGHotRow},
		{phDeductNoUser, phLedgerHash}, {phDeduct, phDeductNoUser},
		{phSoldOut, phDeduct}, {phFastPath, phSoldOut},
	}
	out := make([]Ratio, 0, len(pairs))
	for _, pair := range pairs {
		r := Ratio{Num: pair[0], Den: pair[1]}
		num, ok1 := byName[pair[0]]
		den, ok2 := byName[pair[1]]
		if ok1 && ok2 {
			r.Value = divide(&num.OpsPerSec, &den.OpsPerSec)
			r.RedisCPU = divide(num.RedisUsPerOp, den.RedisUsPerOp)
			r.ScriptCPU = divide(num.ScriptUsPerOp, den.ScriptUsPerOp)
			if m := medianRatio(num.RoundOpsPerSec, den.RoundOpsPerSec); m != nil {
				r.Value = m
			}
			if m := medianRatio(num.RoundScriptUsPerOp, den.RoundScriptUsPerOp); m != nil {
				r.ScriptCPU = m
			}
		}
		out = append(out, r)
	}
	return out
}

// medianRatio returns the median of a[i]/b[i] over the rounds both measured, nil when they
// measured fewer than two in common.
func medianRatio(a, b []float64) *float64 {
	n := min(len(a), len(b))
	if n < 2 {
		return nil
	}
	rs := make([]float64, 0, n)
	for i := range n {
		if b[i] > 0 {
			rs = append(rs, a[i]/b[i])
		}
	}
	if len(rs) == 0 {
		return nil
	}
	slices.Sort(rs)
	m := rs[len(rs)/2]
	if len(rs)%2 == 0 {
		m = (rs[len(rs)/2-1] + rs[len(rs)/2]) / 2
	}
	return &m
}

// divide returns a/b, or nil when either is nil or b is 0.
func divide(a, b *float64) *float64 {
	if a == nil || b == nil || *b == 0 {
		return nil
	}
	v := *a / *b
	return &v
}

func printTable(w io.Writer, rep Report) error {
	fmt.Fprintf(w, "stockbench: %s, g=%d, items=%d, %s per phase in %d round(s), retry=%.2f, outbox=%t, coalesce=%d",
		rep.Target, rep.Goroutines, rep.Items, rep.Duration, rep.Rounds, rep.Retry, rep.Outbox, rep.Coalesce)
	if rep.Buckets > 1 {
		fmt.Fprintf(w, ", buckets=%d", rep.Buckets)
	}
	if rep.Stock != 0 && rep.Stock != bigStock {
		fmt.Fprintf(w, ", stock=%d", rep.Stock)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "(one run on one machine: compare the rows with each other, not with other runs)")
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	width := len("phase") // names padded: left-aligned in a right-aligned table
	for _, p := range rep.Phases {
		width = max(width, len(p.Name))
	}
	fmt.Fprintf(tw, "%-*s\tg\tops/s\tp50\tp99\tp99.9\tallocs/op\tB/entry\tB/req\tcmds/op\tscripts/op\tµs/call\tµs/req\tredis cpu\tµs/op\tclient cpu\tµs/op\tok\treplayed\tsoldout\taborts\terrors\t\n", width, "phase")
	for _, p := range rep.Phases {
		fmt.Fprintf(tw, "%-*s\t%d\t%.0f\t%s\t%s\t%s\t%.1f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t\n",
			width, p.Name, p.Goroutines, p.OpsPerSec, us(p.P50us), us(p.P99us), us(p.P999us), p.AllocsPerOp,
			opt(p.LedgerBytes, "%.0f"), opt(p.RequestBytes, "%.0f"), opt(p.CommandsPerOp, "%.2f"), opt(p.ScriptsPerOp, "%.3f"),
			opt(p.ScriptUsPerCall, "%.1f"), opt(p.ScriptUsPerOp, "%.1f"),
			percent(p.RedisCPU), opt(p.RedisUsPerOp, "%.1f"),
			percent(p.ClientCPU), opt(p.ClientUsPerOp, "%.1f"),
			p.OK, p.Replayed, p.SoldOut, p.Aborts, p.Errors)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, p := range rep.Phases {
		if p.FirstErr != "" {
			fmt.Fprintf(w, "%s: first error: %s\n", p.Name, p.FirstErr)
		}
	}
	for _, p := range rep.Phases {
		if p.Transfers != nil {
			fmt.Fprintf(w, "%s: %d transfers of stock between buckets\n", p.Name, *p.Transfers)
		}
	}
	if err := printNodeCPU(w, rep.Phases, width); err != nil {
		return err
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "ratios:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\tops/s\tredis cpu/op\tscript cpu/op")
	for _, r := range rep.Ratios {
		fmt.Fprintf(tw, "  %s / %s\t%s\t%s\t%s\n", r.Num, r.Den, opt(r.Value, "%.2fx"), opt(r.RedisCPU, "%.2fx"), opt(r.ScriptCPU, "%.2fx"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "checks:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range rep.Checks {
		verdict := "PASS"
		if !c.OK {
			verdict = "FAIL"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", verdict, c.Phase, c.Name, c.Detail)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if rep.OK {
		fmt.Fprintln(w, "all invariants hold")
	} else {
		fmt.Fprintln(w, "INVARIANT CHECK FAILED")
	}
	for _, n := range rep.Notes {
		fmt.Fprintln(w, "note:", n)
	}
	return nil
}

// printNodeCPU prints, when a phase measured more than one node, the Redis CPU of each node per
// phase: a share of one core and, in parentheses, microseconds per op. Replicas are marked.
func printNodeCPU(w io.Writer, ps []PhaseResult, width int) error {
	seen := map[string]bool{}
	var addrs []string
	replica := map[string]bool{}
	for _, p := range ps {
		for addr := range p.RedisCPUPerNode {
			if !seen[addr] {
				seen[addr] = true
				addrs = append(addrs, addr)
			}
			if p.RedisNodeRoles[addr] == "replica" {
				replica[addr] = true
			}
		}
	}
	if len(addrs) < 2 {
		return nil
	}
	slices.SortFunc(addrs, compareAddrs)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "redis cpu per node, % of a core (µs/op):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-*s\t", width, "phase")
	for _, addr := range addrs {
		if replica[addr] {
			addr += " (replica)"
		}
		fmt.Fprintf(tw, "%s\t", addr)
	}
	fmt.Fprintln(tw)
	for _, p := range ps {
		if len(p.RedisCPUPerNode) == 0 {
			continue
		}
		fmt.Fprintf(tw, "%-*s\t", width, p.Name)
		for _, addr := range addrs {
			cell := "n/a"
			if cores, ok := p.RedisCPUPerNode[addr]; ok {
				cell = percent(&cores)
				if v, ok := p.RedisUsPerOpPerNode[addr]; ok {
					cell += fmt.Sprintf(" (%.1f)", v)
				}
			}
			fmt.Fprintf(tw, "%s\t", cell)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// compareAddrs orders "host:port" addresses by host, then by port as a number.
func compareAddrs(a, b string) int {
	ha, pa, _ := strings.Cut(a, ":")
	hb, pb, _ := strings.Cut(b, ":")
	if c := strings.Compare(ha, hb); c != 0 {
		return c
	}
	na, errA := strconv.Atoi(pa)
	nb, errB := strconv.Atoi(pb)
	if errA == nil && errB == nil && na != nb {
		return na - nb
	}
	return strings.Compare(pa, pb)
}

// us formats microseconds with a unit that keeps three significant digits or so.
func us(v float64) string {
	switch {
	case v >= 10000:
		return fmt.Sprintf("%.0fms", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.1fms", v/1000)
	default:
		return fmt.Sprintf("%.0fµs", v)
	}
}

// percent formats a number of cores as a percentage of one core.
func percent(cores *float64) string {
	if cores == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.0f%%", *cores*100)
}

func opt(v *float64, format string) string {
	if v == nil {
		return "n/a"
	}
	return fmt.Sprintf(format, *v)
}
