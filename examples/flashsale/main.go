// Command flashsale runs a complete flash sale through the stock library and then checks that
// nothing was oversold, nothing was applied twice, every refusal has a reason, and Redis and
// the database of record agree.
//
// With no flags it needs only Go: Redis is an embedded miniredis and the database of record is
// SQLite (sqlstore on modernc.org/sqlite) in a file in a new temporary directory:
//
//	go run ./examples/flashsale
//	go run ./examples/flashsale -buyers 20000 -items 5 -stock 500 -seed 7
//
// On real servers:
//
//	go run ./examples/flashsale -redis 127.0.0.1:6379
//	go run ./examples/flashsale -cluster 127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002
//	go run ./examples/flashsale -redis 127.0.0.1:6379 -dsn 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//	go run ./examples/flashsale -dsn 'mysql://root@127.0.0.1:3306/test'
//	go run ./examples/flashsale -sentinel stock@127.0.0.1:26379,127.0.0.1:26380,127.0.0.1:26381 -failover-at 50% -replica-ack 1
//
// The first go run compiles the example and its dependencies (SQLite, pgx, the MySQL driver,
// rueidis): about 100 CPU seconds, 60 of them SQLite's, one package after another, so over a
// minute even on two idle cores; `go run -v` lists the packages as it compiles them. Later
// runs start at once.
//
// A Relay drains the outbox into the database, a Reconciler runs every 500ms and a sweeper
// releases expired holds, all while thousands of buyers race for a few items: most buy once,
// some retry the same request id, some try to buy more than the per-user limit (2), some hold,
// pay and confirm, some hold and cancel or let the hold expire, some give back what they
// bought. At the end the buyers stop, the relay drains, a last reconcile pass runs, and a
// report table shows the checks, each PASS or FAIL.
//
// Flags:
//
//	-redis addr        a real Redis (default: an embedded miniredis): host:port, or a URL with the
//	                   user and password of an ACL user, redis://user:password@host:port, or
//	                   rediss://… for TLS
//	-cluster a,b,c     a real Redis Cluster, by the addresses of some of its nodes
//	-sentinel name@a,b,c  a real Redis behind Sentinel: the name of the primary the sentinels
//	                   monitor and their addresses (a rueidis Sentinel client, which follows a
//	                   failover); a FailoverGuard then runs beside the relay and the reconciler
//	-failover-at p%    with -sentinel: ask the sentinels for a failover (SENTINEL FAILOVER) once p%
//	                   of the buyers have come; buyers retry an unknown outcome, a fenced call
//	                   (ErrFailover) and an unreplicated write (ErrNotReplicated) with the same
//	                   request id until they get a definite answer, and a check counts the
//	                   acknowledged sales that are missing from both Redis and the database
//	-replica-ack n     every write waits for n replicas (stock.WithReplicaAck, 2s); with
//	                   min-replicas-to-write on the primary and as many replicas as n, a failover
//	                   loses nothing the buyers were told
//	-dsn dsn           the database of record (default: a SQLite file in a temporary directory),
//	                   by the parser stockctl uses too:
//	                     postgres://… or postgresql://…      PostgreSQL, through pgx (the DSN is passed as is)
//	                     mysql://user:pass@host:port/db?k=v  MySQL or MariaDB, through go-sql-driver/mysql
//	                     mysql:DSN                           the same, in that driver's own form,
//	                                                         user:pass@tcp(host:port)/db?params
//	                     sqlite:path                         a SQLite file (busy timeout, WAL, immediate transactions)
//	-prefix p          the Redis key prefix (default: flashsale-<random>, unique per run); the tables
//	                   are named after it (flashsale_<random>_items and _records)
//	-keep              keep the keys, the tables and the SQLite file at the end (default: delete them)
//	-buyers n          simulated buyers (5000)
//	-items n           items on sale (3)
//	-stock n           units of each item (100)
//	-duration d        the longest the sale runs (5s); it ends earlier when every buyer is done
//	-seed n            seed of the buyers' choices (1)
//	-buckets n         split each item over n buckets in cluster slots of their own
//	                   (stock.WithBuckets; 1, the default: not split), so that one hot item is
//	                   served by several masters; meaningful with -cluster, allowed on any
//	                   backend. The checks read every bucket (Levels, the ledger through
//	                   stockops.Entries, which also must not hold an id in two buckets) and the
//	                   clean-up deletes every bucket's keys
//
// The progress line is redrawn in place when stdout is a terminal, and printed at most once a
// second otherwise. The exit status is 0 when every check passes, 1 when one fails, 2 when the
// sale could not run or was interrupted. SIGINT, SIGTERM, SIGHUP and SIGPIPE (the reader of
// its output went away) end the sale early; the keys, tables and files of the run are removed
// on every exit path unless -keep is given.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"

	"github.com/stockres/stock/internal/dburl"
	"github.com/stockres/stock/internal/protocol"
	"github.com/stockres/stock/internal/redisaddr"
	"github.com/stockres/stock/sqlstore"
)

// config is what a run needs; the zero values of the optional fields take the defaults.
type config struct {
	Redis    string   // a real Redis address; "" for the embedded miniredis
	Cluster  []string // real Redis Cluster nodes
	Sentinel string   // name@host:port,...: a real Redis behind Sentinel
	// FailoverAt, with Sentinel, is the share of the buyers (0 to 1) after whose arrival a
	// SENTINEL FAILOVER is asked for; 0: none.
	FailoverAt float64
	ReplicaAck int    // WithReplicaAck(ReplicaAck, 2s); 0: off
	DSN        string // the database of record; "" for a SQLite file in a temporary directory
	Prefix     string // Redis key prefix; "" for a unique one
	Keep       bool   // keep keys, tables and files
	Buyers     int
	Items      int
	Stock      int64
	Duration   time.Duration
	Seed       uint64
	Buckets    int  // stock.WithBuckets: buckets per item; 0 or 1: not split
	TTY        bool // redraw the progress line with \r

	HoldTTL   time.Duration // holds that are confirmed or cancelled (5s)
	ExpireTTL time.Duration // holds that are left to expire (300ms)
	Reconcile time.Duration // reconciler interval (500ms)

	// tamper, for tests, runs after the relay drained and before the final reconcile pass.
	tamper func(ctx context.Context, c rueidis.Client) error
}

// usageText heads the -h output: the program's own name, not the temporary path of go run.
const usageText = `flashsale runs a flash sale through the stock library (buyers racing for a few items, with the
relay, the reconciler and the sweeper running) and checks that nothing was oversold, nothing
was applied twice, every refusal has a reason, and Redis and the database of record agree.

Usage: flashsale [flags]

  flashsale                                   # embedded miniredis and a temporary SQLite file
  flashsale -redis 127.0.0.1:6379 -dsn 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
  flashsale -dsn 'mysql://root@127.0.0.1:3306/test'
  flashsale -sentinel stock@127.0.0.1:26379,127.0.0.1:26380,127.0.0.1:26381 -failover-at 50% -replica-ack 1

Exit status: 0 when every check passes, 1 when one fails, 2 when the sale could not run or was
interrupted. Keys and tables of the run are removed on every exit, interrupted or not.

Flags:
`

// exitSignals end a sale early; the run then cleans up what it wrote before it exits. SIGPIPE
// is among them: a report piped into a reader that went away (| head) makes writes fail
// instead of killing the process before its clean-up.
var exitSignals = []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE}

func main() {
	var cfg config
	var cluster string
	flag.CommandLine.Init("flashsale", flag.ExitOnError)
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), usageText)
		flag.PrintDefaults()
	}
	flag.StringVar(&cfg.Redis, "redis", "", "a real Redis: host:port, or redis://user:password@host:port (rediss:// for TLS) (default: an embedded miniredis)")
	flag.StringVar(&cluster, "cluster", "", "a real Redis Cluster: comma-separated node `addresses`")
	flag.StringVar(&cfg.Sentinel, "sentinel", "", "a real Redis behind Sentinel: `name@host:port,...`, the primary's name and the sentinels")
	failoverAt := flag.String("failover-at", "", "with -sentinel: SENTINEL FAILOVER once this `share` of the buyers came (50% or 0.5)")
	flag.IntVar(&cfg.ReplicaAck, "replica-ack", 0, "every write waits for `n` replicas (stock.WithReplicaAck, 2s)")
	flag.StringVar(&cfg.DSN, "dsn", "", "the database of record: postgres://…, mysql://user:pass@host:3306/db, mysql:<go-sql-driver DSN>,\nsqlite:PATH (default: a SQLite file in a temporary directory)")
	flag.StringVar(&cfg.Prefix, "prefix", "", "Redis key prefix, also names the tables (default: flashsale-<random>)")
	flag.BoolVar(&cfg.Keep, "keep", false, "keep the Redis keys, the tables and the SQLite file")
	flag.IntVar(&cfg.Buyers, "buyers", 5000, "simulated buyers")
	flag.IntVar(&cfg.Items, "items", 3, "items on sale")
	flag.Int64Var(&cfg.Stock, "stock", 100, "units of each item")
	flag.DurationVar(&cfg.Duration, "duration", 5*time.Second, "the longest the sale runs; it ends earlier when every buyer is done")
	flag.Uint64Var(&cfg.Seed, "seed", 1, "seed of the buyers' random choices (the same seed, the same buyers)")
	flag.IntVar(&cfg.Buckets, "buckets", 1, "split each item over `n` buckets in cluster slots of their own (stock.WithBuckets; 1: not split; meaningful with -cluster)")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "flashsale: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	if cluster != "" {
		cfg.Cluster = strings.Split(cluster, ",")
	}
	if *failoverAt != "" {
		f, err := parseShare(*failoverAt)
		if err != nil {
			fmt.Fprintln(os.Stderr, "flashsale: -failover-at:", err)
			os.Exit(2)
		}
		cfg.FailoverAt = f
	}
	if fi, err := os.Stdout.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		cfg.TTY = true
	}

	ctx, stop := signal.NotifyContext(context.Background(), exitSignals...)
	out := &errWriter{w: os.Stdout}
	rep, err := run(ctx, cfg, out)
	interrupted := ctx.Err() != nil // a signal came, maybe after the sale ended (a SIGPIPE of its report)
	stop()
	if err == nil && out.err != nil {
		err = fmt.Errorf("writing the report: %w", out.err)
	}
	if err == nil && interrupted {
		err = errors.New("interrupted")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "flashsale:", err)
		os.Exit(2)
	}
	if !rep.Passed {
		os.Exit(1)
	}
}

// withDefaults fills in the defaults and checks the sizes.
func (c config) withDefaults() (config, error) {
	if c.Buyers == 0 {
		c.Buyers = 5000
	}
	if c.Items == 0 {
		c.Items = 3
	}
	if c.Stock == 0 {
		c.Stock = 100
	}
	if c.Duration == 0 {
		c.Duration = 5 * time.Second
	}
	if c.HoldTTL == 0 {
		c.HoldTTL = 5 * time.Second
		if c.Sentinel != "" {
			// A failover stalls writes for seconds (until a reconcile pass lifts the fence, and
			// with replica acks until the old primary has rejoined): a buyer's hold must outlive it.
			c.HoldTTL = time.Minute
		}
	}
	if c.ExpireTTL == 0 {
		c.ExpireTTL = 300 * time.Millisecond
	}
	if c.Reconcile == 0 {
		c.Reconcile = 500 * time.Millisecond
	}
	switch {
	case c.Buyers < 0 || c.Items < 0 || c.Stock < 0 || c.Duration < 0:
		return c, errors.New("-buyers, -items, -stock and -duration must be positive")
	case c.Items > 1000:
		return c, errors.New("-items: at most 1000")
	case (c.Redis != "") && len(c.Cluster) > 0, (c.Redis != "" || len(c.Cluster) > 0) && c.Sentinel != "":
		return c, errors.New("-redis, -cluster and -sentinel: pick one")
	case c.FailoverAt != 0 && c.Sentinel == "":
		return c, errors.New("-failover-at needs -sentinel: the sentinels run the failover")
	case c.FailoverAt < 0 || c.FailoverAt > 1:
		return c, errors.New("-failover-at: a share of the buyers, from 0% to 100%")
	case c.ReplicaAck < 0:
		return c, errors.New("-replica-ack: a number of replicas")
	case c.Buckets < 0 || c.Buckets > maxBuckets:
		return c, fmt.Errorf("-buckets: from 1 to %d", maxBuckets)
	}
	if c.Prefix == "" {
		c.Prefix = fmt.Sprintf("flashsale-%08x", rand.Uint32())
	}
	return c, nil
}

// parseShare parses a share of the buyers: "50%" or "0.5".
func parseShare(s string) (float64, error) {
	s = strings.TrimSpace(s)
	div := 1.0
	if t, ok := strings.CutSuffix(s, "%"); ok {
		s, div = t, 100
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f/div < 0 || f/div > 1 {
		return 0, fmt.Errorf("%q: want a share of the buyers, 0%% to 100%% (or 0 to 1)", s)
	}
	return f / div, nil
}

// tablePrefix turns a key prefix into a table prefix sqlstore accepts: ASCII letters, digits
// and '_', not starting with a digit, at most 48 bytes, ending in '_'.
func tablePrefix(prefix string) string {
	var b strings.Builder
	for _, c := range prefix {
		if c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' {
			b.WriteRune(c)
		} else {
			b.WriteByte('_')
		}
	}
	s := b.String()
	if s == "" || '0' <= s[0] && s[0] <= '9' {
		s = "t" + s
	}
	return s[:min(len(s), 47)] + "_"
}

// openRedis returns n clients on the configured Redis (each has its own connections), a
// description of it, and a function that closes them all.
func openRedis(cfg config, n int) ([]rueidis.Client, string, func(), error) {
	var opt rueidis.ClientOption
	var desc string
	var m *miniredis.Miniredis
	switch {
	case len(cfg.Cluster) > 0:
		opt, desc = rueidis.ClientOption{InitAddress: cfg.Cluster, ShuffleInit: true}, "cluster "+strings.Join(cfg.Cluster, ",")
	case cfg.Sentinel != "":
		o, err := redisaddr.ParseSentinel(cfg.Sentinel)
		if err != nil {
			return nil, "", nil, fmt.Errorf("-sentinel %v", err)
		}
		opt, desc = o, "sentinel "+cfg.Sentinel
	case cfg.Redis != "":
		o, err := redisaddr.Parse(cfg.Redis)
		if err != nil {
			return nil, "", nil, fmt.Errorf("-redis %v", err)
		}
		o.ForceSingleClient = len(o.InitAddress) == 1
		opt, desc = o, "redis "+redisaddr.Redact(cfg.Redis)
	default:
		m = miniredis.NewMiniRedis()
		if err := m.Start(); err != nil {
			return nil, "", nil, fmt.Errorf("miniredis: %w", err)
		}
		// Key TTLs (the relay's lease and backoff) run on the wall clock, as on a real
		// server; without this, miniredis expires keys only when told to.
		m.ClockTTL(true)
		opt, desc = rueidis.ClientOption{InitAddress: []string{m.Addr()}, DisableCache: true}, "embedded miniredis"
	}
	var cs []rueidis.Client
	closeAll := func() {
		for _, c := range cs {
			c.Close()
		}
		if m != nil {
			m.Close()
		}
	}
	for range n {
		c, err := rueidis.NewClient(opt)
		if err != nil {
			closeAll()
			return nil, "", nil, fmt.Errorf("%s: %w", desc, err)
		}
		cs = append(cs, c)
	}
	return cs, desc, closeAll, nil
}

// database is the database of record of a run.
type database struct {
	db      *sql.DB
	dialect sqlstore.Dialect
	desc    string
	dir     string // the temporary directory of the default SQLite file, or ""
}

// openDB opens the database the DSN names, by the parser the tools share (internal/dburl:
// postgres://…, mysql://user:pass@host:port/db, mysql:DSN, sqlite:PATH); with no DSN, a SQLite
// file in a new temporary directory.
func openDB(cfg config) (*database, error) {
	raw := cfg.DSN
	d := &database{}
	if raw == "" {
		dir, err := os.MkdirTemp("", "flashsale-")
		if err != nil {
			return nil, err
		}
		d.dir, raw = dir, "sqlite:"+filepath.Join(dir, "stock.db")
	}
	t, err := dburl.Parse(raw)
	if err != nil {
		if d.dir != "" {
			os.RemoveAll(d.dir)
		}
		return nil, fmt.Errorf("-dsn %v", err)
	}
	d.dialect, d.desc = t.Dialect, dburl.Redact(raw)
	if d.dir != "" {
		d.desc = "sqlite " + filepath.Join(d.dir, "stock.db")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := t.Open(ctx)
	if err != nil {
		if d.dir != "" {
			os.RemoveAll(d.dir)
		}
		return nil, fmt.Errorf("database %s: %w", d.desc, err)
	}
	d.db = db
	return d, nil
}

// close closes the database and removes the temporary SQLite file unless keep is set.
func (d *database) close(keep bool, out io.Writer) {
	d.db.Close()
	if d.dir == "" {
		return
	}
	if keep {
		fmt.Fprintf(out, "kept the SQLite database in %s\n", d.dir)
		return
	}
	os.RemoveAll(d.dir)
}

// quote quotes a table name for the dialect (names come from tablePrefix: no quotes inside).
func (d *database) quote(name string) string {
	if d.dialect == sqlstore.MySQL {
		return "`" + name + "`"
	}
	return `"` + name + `"`
}

// placeholder is the i-th (from 1) placeholder of a statement.
func (d *database) placeholder(i int) string {
	if d.dialect == sqlstore.Postgres {
		return fmt.Sprintf("$%d", i)
	}
	return "?"
}

// tableExists reports whether the table can be read.
func (d *database) tableExists(ctx context.Context, table string) bool {
	rows, err := d.db.QueryContext(ctx, "SELECT 1 FROM "+d.quote(table)+" WHERE 1 = 0")
	if err != nil {
		return false
	}
	rows.Close()
	return true
}

// dropOrDelete removes what a run wrote: the tables if the run created them, else the rows of
// its items.
func (d *database) dropOrDelete(ctx context.Context, tprefix string, created bool, skus []string) error {
	tables := []string{tprefix + "records", tprefix + "items"}
	if created {
		for _, t := range tables {
			if _, err := d.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+d.quote(t)); err != nil {
				return err
			}
		}
		return nil
	}
	for _, t := range tables {
		for _, sku := range skus {
			if _, err := d.db.ExecContext(ctx, "DELETE FROM "+d.quote(t)+" WHERE sku = "+d.placeholder(1), sku); err != nil {
				return err
			}
		}
	}
	return nil
}

// maxBuckets is the most buckets stock.WithBuckets splits an item into.
const maxBuckets = 64

// itemNames returns the names under which Redis keeps the items: each item itself, or with
// buckets > 1 its buckets "sku|0" … "sku|n-1" (see stock.WithBuckets), each with keys of its own.
func itemNames(skus []string, buckets int) []string {
	if buckets <= 1 {
		return skus
	}
	var out []string
	for _, sku := range skus {
		for i := range buckets {
			out = append(out, sku+"|"+strconv.Itoa(i))
		}
	}
	return out
}

// deleteKeys removes the Redis keys of the run's items, given by the names Redis keeps them
// under (itemNames: the items, or their buckets; every key of one shares the hash tag {name},
// {name|k} for a bucket,
// found with SCAN on every node), and takes them out of the registry.
func deleteKeys(ctx context.Context, c rueidis.Client, prefix string, skus []string) error {
	for _, sku := range skus {
		// "{name}" or, for a bucket "sku|i", its spread tag "{sku|i|k}" (protocol.BucketTag).
		pattern := globEscape(prefix+":{"+sku) + "[}|]*"
		keys := map[string]bool{}
		for _, node := range c.Nodes() {
			var cursor uint64
			for {
				se, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match(pattern).Count(1000).Build()).AsScanEntry()
				if err != nil {
					return fmt.Errorf("scan %s: %w", pattern, err)
				}
				for _, k := range se.Elements {
					keys[k] = true
				}
				if se.Cursor == 0 {
					break
				}
				cursor = se.Cursor
			}
		}
		for k := range keys {
			if err := c.Do(ctx, c.B().Del().Key(k).Build()).Error(); err != nil {
				return fmt.Errorf("del %s: %w", k, err)
			}
		}
	}
	registry := prefix + ":items"
	if len(skus) > 0 {
		if err := c.Do(ctx, c.B().Srem().Key(registry).Member(skus...).Build()).Error(); err != nil {
			return fmt.Errorf("srem %s: %w", registry, err)
		}
		// The items' due-work hints (a sorted set emptied of its last member goes).
		for n := range protocol.DueShards {
			for _, k := range []string{protocol.RelayDue(prefix, n), protocol.HoldsDue(prefix, n)} {
				if err := c.Do(ctx, c.B().Zrem().Key(k).Member(skus...).Build()).Error(); err != nil {
					return fmt.Errorf("zrem %s: %w", k, err)
				}
			}
		}
	}
	n, err := c.Do(ctx, c.B().Scard().Key(registry).Build()).AsInt64()
	if err != nil {
		return fmt.Errorf("scard %s: %w", registry, err)
	}
	if n == 0 {
		return c.Do(ctx, c.B().Del().Key(registry).Build()).Error()
	}
	return nil
}

// globEscape escapes the characters SCAN MATCH treats as a pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, c := range s {
		if strings.ContainsRune(`*?[]\`, c) {
			b.WriteByte('\\')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// errWriter is stdout that keeps its first write error: a report that could not be written (the
// reader went away) ends the run with status 2, as an interrupted sale does.
type errWriter struct {
	w   io.Writer
	mu  sync.Mutex
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	n, err := e.w.Write(p)
	if err != nil {
		e.mu.Lock()
		if e.err == nil {
			e.err = err
		}
		e.mu.Unlock()
	}
	return n, err
}
