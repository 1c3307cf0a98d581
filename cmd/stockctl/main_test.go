package main

// The package's test harness, shared by operator_test.go, and stockctl's commands on it (a
// private redis-server when STOCK_REDIS_SERVER is set, else a miniredis), with SQLite as the
// database of record: loads and levels, the ledger, sweeps, reconcile and the relay, their dead
// ends and refusals, the registry, the failover fence and the operator ACL.

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/sqlstore"
	"github.com/stockres/stock/stockops"
)

// ---------------------------------------------------------------------------------------------
// The harness: runCLI runs stockctl as an operator types it; harness runs it
// against one Redis (a private redis-server when STOCK_REDIS_SERVER is set, else a miniredis)
// under a prefix of its own; privateServer and privateClient need a real redis-server and skip
// without one. The dump helpers tell whether a command wrote anything.

type cliResult struct {
	code     int
	out, err string
	took     time.Duration
}

func (r cliResult) String() string {
	return fmt.Sprintf("exit %d after %v\nstdout:\n%s\nstderr:\n%s", r.code, r.took.Round(time.Millisecond), r.out, r.err)
}

// want checks the exit code (ending the test when it differs) and that stdout holds each of
// outs; it returns r for further checks. wantErr is want for stderr.
func (r cliResult) want(t *testing.T, code int, outs ...string) cliResult {
	t.Helper()
	return r.check(t, code, r.out, outs)
}

func (r cliResult) wantErr(t *testing.T, code int, errs ...string) cliResult {
	t.Helper()
	return r.check(t, code, r.err, errs)
}

func (r cliResult) check(t *testing.T, code int, got string, subs []string) cliResult {
	t.Helper()
	require.Equal(t, code, r.code, "%v", r)
	for _, s := range subs {
		assert.Contains(t, got, s)
	}
	return r
}

// clearEnv clears the environment variables stockctl reads, so that the flags given are all.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, k := range []string{"STOCKCTL_REDIS", "STOCKCTL_SENTINEL", "STOCKCTL_DSN"} {
		t.Setenv(k, "")
	}
}

// runCLI runs stockctl with args, bounded by 3 minutes.
func runCLI(t *testing.T, args ...string) cliResult {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	code := run(ctx, args, &out, &errb)
	return cliResult{code, out.String(), errb.String(), time.Since(start)}
}

// mustCLI is runCLI, failing the test unless stockctl exits 0.
func mustCLI(t *testing.T, args ...string) cliResult {
	t.Helper()
	res := runCLI(t, args...)
	if res.code != exitOK {
		t.Fatalf("stockctl %q: %v", args, res)
	}
	return res
}

// privateServer starts a private redis-server, or skips.
func privateServer(t *testing.T, args ...string) *redistest.Server {
	t.Helper()
	if os.Getenv(redistest.EnvServer) == "" {
		t.Skip("needs a private redis-server: set STOCK_REDIS_SERVER to the path of redis-server (or \"path\")")
	}
	clearEnv(t)
	return redistest.StartServer(t, args...)
}

// privateClient starts a private redis-server (or skips) and returns its address and a
// fresh-reading client on it.
func privateClient(t *testing.T) (string, rueidis.Client) {
	t.Helper()
	s := privateServer(t)
	return s.Addr(), serverClient(t, s.Addr())
}

// loadAndSell loads item x with 10 units through stockctl, then sells qty of them as order o1
// through r.
func loadAndSell(t *testing.T, addr string, r *stock.Reserver, qty int64) {
	t.Helper()
	mustCLI(t, "-redis", addr, "load", "x", "10")
	_, err := r.Deduct(context.Background(), stock.Request{SKU: "x", ID: "o1", Qty: qty})
	require.NoError(t, err)
}

// serverClient is a fresh-reading client (no client-side caching) on addr.
func serverClient(t *testing.T, addr string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	require.NoError(t, err, "client on %s", addr)
	t.Cleanup(c.Close)
	return c
}

func serverReserver(t *testing.T, c rueidis.Client, prefix string) *stock.Reserver {
	t.Helper()
	r, err := stock.New(c, stock.WithPrefix(prefix))
	require.NoError(t, err)
	return r
}

// dumpKeys returns every key of the server with its DUMP and its PTTL (-1 or -2 as is; a
// positive PTTL only as "ttl"), so that two dumps are equal when nothing was written.
func dumpKeys(t *testing.T, c rueidis.Client) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	cursor := uint64(0)
	for {
		e, err := c.Do(ctx, c.B().Scan().Cursor(cursor).Count(1000).Build()).AsScanEntry()
		require.NoError(t, err, "SCAN")
		for _, k := range e.Elements {
			d, err := c.Do(ctx, c.B().Dump().Key(k).Build()).ToString()
			if err != nil && !rueidis.IsRedisNil(err) {
				t.Fatalf("DUMP %q: %v", k, err)
			}
			// A set in a hash table dumps its members in the table's order, which a read
			// (SISMEMBER) can change by moving an incremental rehash on: compare its members.
			if typ, _ := c.Do(ctx, c.B().Type().Key(k).Build()).ToString(); typ == "set" {
				ms, err := c.Do(ctx, c.B().Smembers().Key(k).Build()).AsStrSlice()
				require.NoError(t, err, "SMEMBERS %q", k)
				slices.Sort(ms)
				d = "set:" + strings.Join(ms, "\x00")
			}
			ttl, err := c.Do(ctx, c.B().Pttl().Key(k).Build()).AsInt64()
			require.NoError(t, err, "PTTL %q", k)
			ttlS := strconv.FormatInt(ttl, 10)
			if ttl > 0 {
				ttlS = "ttl"
			}
			out[k] = d + "|" + ttlS
		}
		if e.Cursor == 0 {
			return out
		}
		cursor = e.Cursor
	}
}

// stableDump waits until the library's asynchronous writes (due-work hints) are done and
// returns the dump.
func stableDump(t *testing.T, c rueidis.Client) map[string]string {
	t.Helper()
	prev := dumpKeys(t, c)
	for range 50 {
		time.Sleep(150 * time.Millisecond)
		cur := dumpKeys(t, c)
		if maps.Equal(prev, cur) {
			return cur
		}
		prev = cur
	}
	t.Fatal("the keys never stopped changing")
	return nil
}

// wroteNothing fails the test (Errorf, or Fatalf when fatal) when the keys of c differ from
// before, naming what did it.
func wroteNothing(t *testing.T, c rueidis.Client, before map[string]string, fatal bool, what string, args ...any) {
	t.Helper()
	after := dumpKeys(t, c)
	if maps.Equal(before, after) {
		return
	}
	var d []string
	for k, v := range before {
		if w, ok := after[k]; !ok {
			d = append(d, "deleted "+k)
		} else if w != v {
			d = append(d, "changed "+k)
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			d = append(d, "created "+k)
		}
	}
	slices.Sort(d)
	report := t.Errorf
	if fatal {
		report = t.Fatalf
	}
	report("%s wrote:\n%s", fmt.Sprintf(what, args...), strings.Join(d, "\n"))
}

// listen listens on a free 127.0.0.1 port.
func listen(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return l
}

// closedAddr is a 127.0.0.1 address nothing listens on.
func closedAddr(t *testing.T) string {
	l := listen(t)
	defer l.Close()
	return l.Addr().String()
}

// silentAddr is a TCP server that accepts connections and never answers: a hung Redis. Each
// connection is held open until the test ends.
func silentAddr(t *testing.T) string {
	l := listen(t)
	done := make(chan struct{})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { <-done; c.Close() }()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		close(done)
	})
	return l.Addr().String()
}

func sqliteDSN(t *testing.T) string {
	return "sqlite:" + filepath.Join(t.TempDir(), "store.db")
}

// sqliteCount answers a SELECT COUNT(*) query on the SQLite database of dsn.
func sqliteCount(t *testing.T, dsn, query string) int {
	t.Helper()
	db, err := sql.Open("sqlite", strings.TrimPrefix(dsn, "sqlite:"))
	require.NoError(t, err)
	defer db.Close()
	var n int
	require.NoError(t, db.QueryRow(query).Scan(&n), "%s", query)
	return n
}

// harness runs stockctl against one Redis: a private redis-server when STOCK_REDIS_SERVER is
// set, else a miniredis, reached by address either way, as an operator would. The tests also
// drive the library directly (deducts, holds) on the same prefix.
type harness struct {
	t      *testing.T
	addr   string
	client rueidis.Client
	r      *stock.Reserver
	prefix string
	dsn    string
	tables string // -table-prefix, when set
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	h := &harness{t: t, prefix: fmt.Sprintf("t%d", time.Now().UnixNano())}
	if redistest.ServerBinary(t) != "" {
		h.addr = redistest.StartServer(t).Addr()
		h.client = serverClient(t, h.addr)
	} else {
		m, c := redistest.Miniredis(t)
		h.addr, h.client = m.Addr(), c
	}
	h.r = serverReserver(t, h.client, h.prefix)
	h.dsn = "sqlite:" + filepath.Join(t.TempDir(), "stock.db")
	return h
}

// run runs stockctl with -redis and -prefix set.
func (h *harness) run(args ...string) cliResult {
	h.t.Helper()
	res := runCLI(h.t, append([]string{"-redis", h.addr, "-prefix", h.prefix, "-timeout", "20s"}, args...)...)
	h.t.Logf("stockctl %s -> %d\n%s%s", strings.Join(args, " "), res.code, res.out, res.err)
	return res
}

// store runs stockctl with -dsn too.
func (h *harness) store(args ...string) cliResult {
	h.t.Helper()
	pre := []string{"-dsn", h.dsn}
	if h.tables != "" {
		pre = append(pre, "-table-prefix", h.tables)
	}
	return h.run(append(pre, args...)...)
}

// exec runs statements on the harness's database of record, opened as stockctl opens it.
func (h *harness) exec(stmts ...string) {
	h.t.Helper()
	e := &env{g: defaultGlobals()}
	e.g.dsn = h.dsn
	if h.tables != "" {
		e.g.tablePrefix = h.tables
	}
	defer e.close()
	_, err := e.openStore(context.Background(), "test")
	require.NoError(h.t, err)
	for _, s := range stmts {
		_, err := e.db.Exec(s)
		require.NoError(h.t, err, s)
	}
}

// soldAndRelayed loads A (10 units) and B (b) in Redis and the store, sells 2 of A (order o1)
// and relays the sale to the store.
func (h *harness) soldAndRelayed(b int64) {
	h.t.Helper()
	h.store("load", "A", "10").want(h.t, exitOK)
	h.store("load", "B", strconv.FormatInt(b, 10)).want(h.t, exitOK)
	h.deduct("o1", "", 2)
	h.store("relay-once").want(h.t, exitOK)
}

// take deducts qty of sku as id, behind stockctl's back.
func (h *harness) take(sku, id string, qty int64) {
	h.t.Helper()
	_, err := h.r.Deduct(context.Background(), stock.Request{SKU: sku, ID: id, Qty: qty})
	require.NoError(h.t, err)
}

// deduct takes qty of item A as id for user.
func (h *harness) deduct(id, user string, qty int64) {
	h.t.Helper()
	_, err := h.r.Deduct(context.Background(), stock.Request{SKU: "A", ID: id, User: user, Qty: qty})
	require.NoError(h.t, err)
}

// skew adds n units to the available count of sku in Redis: a drift the store does not know.
func (h *harness) skew(sku string, n int64) {
	h.t.Helper()
	c := h.client
	require.NoError(h.t, c.Do(context.Background(), c.B().Hincrby().Key(h.prefix+":{"+sku+"}").Field("a").Increment(n).Build()).Error())
}

// registry lists the items of the prefix's registry.
func (h *harness) registry() []string {
	h.t.Helper()
	var out []string
	for sku, err := range stockops.Items(context.Background(), h.r) {
		require.NoError(h.t, err)
		out = append(out, sku)
	}
	return out
}

func decode[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal([]byte(s), &v), s)
	return v
}

// row is the fields of the n-th line (0: the header) of a table stockctl printed.
func row(out string, n int) []string {
	return strings.Fields(strings.Split(out, "\n")[n])
}

// ---------------------------------------------------------------------------------------------
// Loads, levels, the ledger, sweeps, reconcile and the relay.

// load, available, items, levels, close, reopen and restock: their text and JSON answers, and
// a load that would overwrite a live item refused.
func TestLoadLevels(t *testing.T) {
	h := newHarness(t)
	res := h.run("load", "A", "10").want(t, exitOK)
	assert.Equal(t, "loaded A: 10 units in Redis\n", res.out)

	h.run("load", "A", "5").wantErr(t, exitFail, "already loaded", "restock")

	require.Equal(t, exitOK, h.run("-json", "load", "B", "0").code)
	h.deduct("o1", "alice", 3)

	res = h.run("available", "A").want(t, exitOK)
	assert.Equal(t, "7\n", res.out)
	res = h.run("available", "-json", "A") // global flags after the command too
	assert.Equal(t, map[string]any{"sku": "A", "available": 7.0}, decode[map[string]any](t, res.out))
	h.run("available", "Z").wantErr(t, exitFail, "not loaded: Z")

	res = h.run("items")
	assert.Equal(t, "A\nB\n", res.out)
	assert.Equal(t, []string{"A", "B"}, decode[[]string](t, h.run("-json", "items").out))

	res = h.run("levels").want(t, exitOK)
	lines := strings.Split(strings.TrimSpace(res.out), "\n")
	require.Len(t, lines, 3)
	assert.Equal(t, []string{"SKU", "AVAILABLE", "HELD", "SOLD", "LOADED", "CLOSED"}, strings.Fields(lines[0]))
	assert.Equal(t, []string{"A", "7", "0", "3", "10", "no"}, strings.Fields(lines[1]))
	assert.Equal(t, []string{"B", "0", "0", "0", "0", "no"}, strings.Fields(lines[2]))

	res = h.run("-json", "levels", "A", "Z").want(t, exitFail)
	rows := decode[[]levelsJSON](t, res.out)
	assert.Equal(t, []levelsJSON{
		{SKU: "A", Available: 7, Sold: 3, Loaded: 10},
		{SKU: "Z", Error: "not_loaded", Message: "stock: item not loaded: Z"},
	}, rows)

	for range 2 { // closing twice does nothing more
		res = h.run("close", "A").want(t, exitOK)
		assert.Equal(t, "closed A\n", res.out)
	}
	_, err := h.r.Deduct(context.Background(), stock.Request{SKU: "A", ID: "o2", Qty: 1})
	assert.ErrorIs(t, err, stock.ErrClosed)
	assert.True(t, decode[[]levelsJSON](t, h.run("-json", "levels", "A").out)[0].Closed)
	// restore goes on while closed, once.
	for _, replay := range []bool{false, true} {
		res = h.run("-json", "restore", "A", "o1").want(t, exitOK)
		assert.Equal(t, receiptJSON{SKU: "A", ID: "o1", Qty: 3, Remaining: 10, Replayed: replay}, decode[receiptJSON](t, res.out))
	}
	res = h.run("reopen", "A").want(t, exitOK)
	assert.Equal(t, "reopened A\n", res.out)
	h.deduct("o2", "", 1)
	assert.Equal(t, exitFail, h.run("close", "Z").code)

	res = h.run("restock", "A", "r1", "5").want(t, exitOK)
	assert.Equal(t, "restocked A/r1: +5, 14 available\n", res.out)
	res = h.run("-json", "restock", "A", "r1", "5").want(t, exitOK)
	assert.Equal(t, receiptJSON{SKU: "A", ID: "r1", Qty: 5, Remaining: 14, Replayed: true}, decode[receiptJSON](t, res.out))
	// A load of a live item never overwrites it.
	assert.Equal(t, exitFail, h.run("load", "A", "999").code)
	assert.Equal(t, "14\n", h.run("available", "A").out)
}

// entry and ledger show the ledger (filtered and limited); restore gives back once, and a
// restore of an unknown id needs -tombstone.
func TestEntryLedgerRestore(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	require.Equal(t, exitOK, h.run("load", "A", "10").code)
	h.deduct("o1", "alice", 2)
	h.deduct("o2", "bob", 1)
	_, err := h.r.Hold(ctx, stock.Request{SKU: "A", ID: "h1", User: "carol", Qty: 3}, time.Hour)
	require.NoError(t, err)

	res := h.run("entry", "A", "o1").want(t, exitOK)
	for _, want := range []string{"kind    deduct", "state   reserved", "qty     2", "before  10", "after   8", "user    alice"} {
		assert.Contains(t, res.out, want)
	}
	en := decode[entryJSON](t, h.run("-json", "entry", "A", "h1").out)
	assert.Equal(t, stock.KindHold, en.Kind)
	assert.Equal(t, "held", en.State)
	assert.Equal(t, int64(3), en.Qty)
	assert.Equal(t, "carol", en.User)
	require.NotNil(t, en.Deadline)
	assert.WithinDuration(t, en.At.Add(time.Hour), *en.Deadline, time.Second)
	h.run("entry", "A", "nope").wantErr(t, exitFail, "unknown request id")

	res = h.run("ledger", "A").want(t, exitOK)
	lines := strings.Split(strings.TrimSpace(res.out), "\n")
	require.Len(t, lines, 4)
	assert.Equal(t, []string{"AT", "ID", "KIND", "STATE", "QTY", "BEFORE", "AFTER", "USER", "DEADLINE"}, strings.Fields(lines[0]))
	var ids []string
	for _, e := range decode[[]entryJSON](t, h.run("-json", "ledger", "A").out) {
		ids = append(ids, e.ID)
	}
	assert.ElementsMatch(t, []string{"o1", "o2", "h1"}, ids)
	res = h.run("ledger", "A", "-limit", "1").want(t, exitOK)
	assert.Len(t, strings.Split(strings.TrimSpace(res.out), "\n"), 2)
	assert.Contains(t, res.err, "showing the first 1 entries")
	held := decode[[]entryJSON](t, h.run("-json", "ledger", "-state", "held", "A").out)
	require.Len(t, held, 1)
	assert.Equal(t, "h1", held[0].ID)
	assert.Equal(t, "[]\n", h.run("-json", "ledger", "A", "-state", "expired").out)
	assert.Equal(t, exitFail, h.run("ledger", "Z").code, "an unknown item is not an empty ledger")

	res = h.run("restore", "A", "o1").want(t, exitOK)
	assert.Equal(t, "restored A/o1: +2, 6 available\n", res.out) // 10 - 2 - 1 - 3 + 2
	res = h.run("-json", "restore", "A", "o1").want(t, exitOK)
	assert.True(t, decode[receiptJSON](t, res.out).Replayed)
	assert.Equal(t, "6\n", h.run("available", "A").out)

	h.run("restore", "A", "ghost").wantErr(t, exitFail, "nothing restored")
	assert.Equal(t, exitFail, h.run("entry", "A", "ghost").code, "no tombstone without -tombstone")
	h.run("restore", "A", "ghost", "-tombstone").want(t, exitOK, "left a tombstone")
	_, err = h.r.Deduct(ctx, stock.Request{SKU: "A", ID: "ghost", Qty: 1})
	assert.ErrorIs(t, err, stock.ErrRestored)

	res = h.run("restore", "A", "h1") // a live hold is cancelled
	require.Equal(t, exitOK, res.code)
	assert.Equal(t, "restored A/h1: +3, 9 available\n", res.out)
}

// sweep releases the expired holds, of every item or of one.
func TestSweep(t *testing.T) {
	h := newHarness(t)
	require.Equal(t, exitOK, h.run("load", "A", "5").code)
	_, err := h.r.Hold(context.Background(), stock.Request{SKU: "A", ID: "h1", Qty: 2}, 50*time.Millisecond)
	require.NoError(t, err)
	redistest.Sleep(h.client, 200*time.Millisecond)
	res := h.run("sweep").want(t, exitOK)
	assert.Equal(t, "released 2 units of expired holds\n", res.out)
	res = h.run("-json", "sweep", "A")
	assert.Equal(t, map[string]any{"released": 0.0}, decode[map[string]any](t, res.out))
	assert.Equal(t, "expired", decode[entryJSON](t, h.run("-json", "entry", "A", "h1").out).State)
}

// reconcile reports in-flight sales without drift, relay-once delivers them, a drift is
// reported, left above -repair-limit and repaired with -apply; an item the store does not
// know needs a human; migrate is idempotent.
func TestReconcileAndRelay(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	res := h.store("load", "A", "10").want(t, exitOK)
	assert.Equal(t, "loaded A: 10 units in Redis and the store\n", res.out)
	h.store("load", "A", "10").wantErr(t, exitFail, "already loaded")

	h.deduct("o1", "alice", 2)
	h.deduct("o2", "bob", 1)
	_, err := h.r.Restore(ctx, "A", "o2")
	require.NoError(t, err)

	// Nothing delivered yet: the events are in flight and there is no drift.
	h.store("reconcile").want(t, exitOK, "A: redis 8+0 held, store 10, in flight 2 (3 pending), drift 0", "items: 1, with drift or losses: 0,")

	res = h.store("relay-once", "A").want(t, exitOK)
	assert.Equal(t, "delivered 3 events (claimed 3, refused by the store 0, retried later 0, orphaned 0, dead-lettered 0, redelivered 0) in 2 passes\n"+
		"the outboxes are empty\n", res.out)
	res = h.store("-json", "relay-once").want(t, exitOK)
	assert.Equal(t, map[string]any{"claimed": 0.0, "delivered": 0.0, "refused": 0.0, "retried": 0.0, "orphaned": 0.0,
		"redelivered": 0.0, "dead_lettered": 0.0, "passes": 1.0, "pending": 0.0, "dead": 0.0, "waiting": []any{}},
		decode[map[string]any](t, res.out))
	assert.Equal(t, "applied", decode[entryJSON](t, h.run("-json", "entry", "A", "o1").out).State)

	res = h.store("levels", "A").want(t, exitOK)
	assert.Equal(t, []string{"A", "8", "0", "2", "10", "no", "8"}, row(res.out, 1))

	// Redis gains 5 units it should not have: the report-only run says so and changes nothing.
	h.skew("A", 5)
	res = h.store("reconcile", "A").want(t, exitDrift, "A: redis 13+0 held, store 8, in flight 0 (0 pending), drift 5\n", "report only")
	assert.Contains(t, res.err, "1 of 1 items drifted")
	assert.Equal(t, "13\n", h.run("available", "A").out)

	res = h.store("-json", "reconcile").want(t, exitDrift)
	rep := decode[struct {
		Apply   bool         `json:"apply"`
		Found   bool         `json:"found"`
		Reports []reportJSON `json:"reports"`
	}](t, res.out)
	assert.False(t, rep.Apply)
	assert.True(t, rep.Found)
	require.Len(t, rep.Reports, 1)
	assert.Equal(t, reportJSON{SKU: "A", Available: 13, StoreRemaining: 8, Drift: 5, Found: true, Left: true}, rep.Reports[0])

	h.store("reconcile", "-apply", "-repair-limit", "2", "A").want(t, exitDrift, "NEEDS A HUMAN: drift 5 above the repair limit 2")
	assert.Equal(t, "13\n", h.run("available", "A").out)

	h.store("reconcile", "-apply", "A").want(t, exitOK, "drift 5; repaired: adjusted -5")
	assert.Equal(t, "8\n", h.run("available", "A").out)
	h.store("reconcile").want(t, exitOK)

	// An item the store does not know needs a human.
	require.Equal(t, exitOK, h.run("load", "B", "1").code)
	h.store("reconcile").want(t, exitDrift, "B: ", "B: redis 1+0 held, store 0, in flight 0 (0 pending), drift 0; NEEDS A HUMAN: the store does not know the item", "items: 2, with drift or losses: 1, need a human: 1,")

	// migrate is idempotent, with other table prefixes too.
	res = h.store("migrate").want(t, exitOK)
	assert.Equal(t, "tables stock_items and stock_records are ready\n", res.out)
	h.store("-table-prefix", "other_", "-json", "migrate").want(t, exitOK, `"other_items"`)
}

// A relay pass whose store refuses the deduct gives the stock back.
func TestRelayOnceRefused(t *testing.T) {
	h := newHarness(t)
	require.Equal(t, exitOK, h.store("load", "A", "5").code)
	h.deduct("o1", "", 2)
	h.exec(`UPDATE stock_items SET remaining = 1 WHERE sku = 'A'`) // less than Redis sold: it refuses
	h.store("relay-once").want(t, exitOK, "refused by the store 1")
	assert.Equal(t, "refused", decode[entryJSON](t, h.run("-json", "entry", "A", "o1").out).State)
	assert.Equal(t, "5\n", h.run("available", "A").out)
}

// parseDSN reads every DSN form stockctl documents, refuses the others as usage errors, and
// redact hides a password.
func TestParseDSN(t *testing.T) {
	for _, tc := range []struct {
		in, driver, dsn string
		d               sqlstore.Dialect
	}{
		{"postgres://app@db:5432/shop?sslmode=disable", "pgx", "postgres://app@db:5432/shop?sslmode=disable", sqlstore.Postgres},
		{"postgresql://app@db/shop", "pgx", "postgresql://app@db/shop", sqlstore.Postgres},
		{"mysql://app:s%40cret@db/shop?parseTime=true&interpolateParams=true", "mysql", "app:s@cret@tcp(db:3306)/shop?parseTime=true&interpolateParams=true", sqlstore.MySQL},
		{"mysql://root@127.0.0.1:3307/test", "mysql", "root@tcp(127.0.0.1:3307)/test", sqlstore.MySQL},
		{"mysql:root@tcp(127.0.0.1:3306)/test?parseTime=true", "mysql", "root@tcp(127.0.0.1:3306)/test?parseTime=true", sqlstore.MySQL},
		{"sqlite:/var/lib/shop.db", "sqlite", "file:/var/lib/shop.db?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate", sqlstore.SQLite},
		{"sqlite:file:x.db?mode=memory", "sqlite", "file:x.db?mode=memory", sqlstore.SQLite},
	} {
		driver, dsn, d, err := parseDSN(tc.in)
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.driver, driver, tc.in)
		assert.Equal(t, tc.dsn, dsn, tc.in)
		assert.Equal(t, tc.d, d, tc.in)
	}
	for _, bad := range []string{"nothing", "oracle://x", "sqlite:", "mysql://:pw@/db"} {
		_, _, _, err := parseDSN(bad)
		assert.ErrorAs(t, err, new(usageError), bad)
	}
	assert.Equal(t, "mysql://app:xxxxx@db/shop", redact("mysql://app:secret@db/shop"))
}

// ---------------------------------------------------------------------------------------------
// Dead ends of reconcile and load: items the store does not know, delisted items, repairs.

// reconcileJSON is the -json output of reconcile.
type reconcileJSON struct {
	Apply   bool         `json:"apply"`
	Found   bool         `json:"found"`
	Left    bool         `json:"left"`
	Reports []reportJSON `json:"reports"`
}

// An item loaded in Redis only: reconcile reports Redis's real figures for it (they were 0+0),
// with a SKU and without (a pass over the registry), in text and in JSON.
func TestReconcileStoreUnknownShowsRedisFigures(t *testing.T) {
	h := newHarness(t)
	require.Equal(t, exitOK, h.store("migrate").code)
	require.Equal(t, exitOK, h.run("load", "B", "120").code)
	h.take("B", "o1", 10)
	_, err := h.r.Hold(context.Background(), stock.Request{SKU: "B", ID: "h1", Qty: 4}, time.Hour)
	require.NoError(t, err)

	for _, args := range [][]string{{"reconcile", "B"}, {"reconcile"}, {"reconcile", "-apply"}} {
		res := h.store(args...).want(t, exitDrift)
		assert.Contains(t, res.out, "B: redis 106+4 held, store 0, in flight 10 (2 pending)", args)
		assert.Contains(t, res.out, "NEEDS A HUMAN: the store does not know the item", args)
		assert.Contains(t, res.out, "load -dsn DSN B 120", args) // the way out
		assert.Contains(t, res.out, "delist", args)
	}
	res := h.store("-json", "reconcile").want(t, exitDrift)
	rep := decode[reconcileJSON](t, res.out)
	require.Len(t, rep.Reports, 1)
	got := rep.Reports[0]
	assert.Equal(t, int64(106), got.Available)
	assert.Equal(t, int64(4), got.Held)
	assert.Equal(t, int64(10), got.InFlight)
	assert.Equal(t, 2, got.Pending)
	assert.True(t, got.Left)
	assert.True(t, rep.Left)
	// The report changed nothing: the events wait for the store side.
	lv, err := h.r.Levels(context.Background(), "B")
	require.NoError(t, err)
	assert.Equal(t, stock.Levels{Available: 106, Held: 4, Sold: 10, Loaded: 120}, lv)
	pending, _, err := stockops.Pending(context.Background(), h.r, "B")
	require.NoError(t, err)
	assert.Equal(t, int64(2), pending)
}

// load -dsn on an item Redis already has adds its store side, once the quantity given is the
// one Redis accounts for (available + held + the sales and restocks not yet delivered);
// otherwise it refuses and writes nothing. Then reconcile finds nothing and the relay delivers.
func TestLoadAddsStoreSide(t *testing.T) {
	h := newHarness(t)
	require.Equal(t, exitOK, h.run("load", "A", "110").code)
	h.deduct("o1", "alice", 10)
	_, err := h.r.Hold(context.Background(), stock.Request{SKU: "A", ID: "h1", Qty: 5}, time.Hour)
	require.NoError(t, err)
	require.Equal(t, exitOK, h.run("restock", "A", "r1", "20").code)

	require.Equal(t, exitOK, h.store("migrate").code)
	res := h.store("reconcile", "A").want(t, exitDrift)

	// The wrong count: refused, nothing written on either side.
	for _, qty := range []string{"130", "115", "0"} {
		res = h.store("load", "A", qty).want(t, exitFail)
		assert.Contains(t, res.err, "Redis accounts for 110 units of A (115 available + 5 held, -10 in flight)", qty)
		assert.Contains(t, res.err, "nothing loaded", qty)
		assert.NotContains(t, res.err, "restock", qty)
	}
	res = h.store("levels", "A")
	assert.Equal(t, []string{"A", "115", "5", "10", "130", "no", "-"}, row(res.out, 1), "no store row")

	// The right count: the store side is added, Redis is untouched.
	res = h.store("load", "A", "110").want(t, exitOK)
	assert.Equal(t, "added A to the store: 110 units (Redis had it: 115 available + 5 held, -10 in flight); reconcile finds no drift\n", res.out)
	lv, err := h.r.Levels(context.Background(), "A")
	require.NoError(t, err)
	assert.Equal(t, stock.Levels{Available: 115, Held: 5, Sold: 10, Loaded: 130}, lv)

	h.store("reconcile").want(t, exitOK, "A: redis 115+5 held, store 110, in flight -10 (3 pending), drift 0")
	h.store("relay-once").want(t, exitOK, "delivered 3 events")
	h.store("reconcile").want(t, exitOK, "A: redis 115+5 held, store 120, in flight 0 (0 pending), drift 0")

	// Both sides have it now: the old answer.
	h.store("load", "A", "110").wantErr(t, exitFail, "already loaded", "restock")

	// -json says which side was written.
	require.Equal(t, exitOK, h.run("load", "C", "7").code)
	res = h.store("-json", "load", "C", "7").want(t, exitOK)
	assert.Equal(t, map[string]any{"sku": "C", "loaded": 7.0, "store": true, "redis": false}, decode[map[string]any](t, res.out))
}

// delist ends an item's sale for good; once its retention has passed and Redis and the store
// agree, reconcile -apply retires it and exits 0.
func TestDelistCommand(t *testing.T) {
	h := newHarness(t)
	require.Equal(t, exitOK, h.store("load", "A", "5").code)
	h.deduct("o1", "", 2)

	h.run("delist", "A").want(t, exitOK, "delisted A: closed for good")
	_, err := h.r.Deduct(context.Background(), stock.Request{SKU: "A", ID: "o2", Qty: 1})
	assert.ErrorIs(t, err, stock.ErrClosed)
	h.run("reopen", "A").wantErr(t, exitFail, "delisted and cannot be reopened")
	assert.Equal(t, exitOK, h.run("-json", "delist", "A").code, "delisting twice does nothing")
	h.run("delist", "Z").wantErr(t, exitFail, "not loaded: Z")

	// The sale's events still go to the store; then the item retires.
	require.Equal(t, exitOK, h.store("relay-once").code)
	time.Sleep(20 * time.Millisecond)
	h.store("reconcile", "-apply", "-retention", "1ms").want(t, exitOK, "A: redis 3+0 held, store 3, in flight 0 (0 pending), drift 0; repaired: trimmed 3, retired")
	h.run("available", "A").want(t, exitFail)
	assert.Equal(t, "", h.run("items").out)
	h.store("reconcile").want(t, exitOK)
}

// reconcile -apply exits 0 when it repaired everything it found, 3 only for what it left.
func TestReconcileApplyExitsZeroWhenRepaired(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	h.soldAndRelayed(4)

	// Drift on A, B's hash lost: both repaired.
	h.skew("A", 5)
	require.NoError(t, h.client.Do(ctx, h.client.B().Del().Key(h.prefix+":{B}").Build()).Error())
	res := h.store("reconcile").want(t, exitDrift)
	res = h.store("reconcile", "-apply").want(t, exitOK, "A: redis 13+0 held, store 8, in flight 0 (0 pending), drift 5; repaired: adjusted -5", "B: redis 0+0 held, store 4, in flight 0 (0 pending), drift -4, key missing; repaired: rebuilt", "with drift or losses: 2, need a human: 0, busy: 0, errors: 0, left: 0")
	assert.Empty(t, res.err)
	assert.Equal(t, "8\n", h.run("available", "A").out)
	assert.Equal(t, "4\n", h.run("available", "B").out)

	// JSON: found, not left.
	h.skew("A", -1)
	res = h.store("-json", "reconcile", "-apply", "A").want(t, exitOK)
	rep := decode[reconcileJSON](t, res.out)
	assert.True(t, rep.Found)
	assert.False(t, rep.Left)
	require.Len(t, rep.Reports, 1)
	assert.True(t, rep.Reports[0].Found)
	assert.False(t, rep.Reports[0].Left)

	// What is left exits 3: a drift above the repair limit stays, and only it is counted.
	h.skew("A", 7)
	h.skew("B", 1)
	res = h.store("reconcile", "-apply", "-repair-limit", "3").want(t, exitDrift, "NEEDS A HUMAN: drift 7 above the repair limit 3", "B: redis 5+0 held, store 4, in flight 0 (0 pending), drift 1; repaired: adjusted -1", "left: 1")
	assert.Contains(t, res.err, "1 of 2 items left unrepaired or need a human")
	assert.Equal(t, "15\n", h.run("available", "A").out)
}

// TestMissingTablesHint: a command that needs the store's tables, on a database without them,
// fails and says how to create them.
func TestMissingTablesHint(t *testing.T) {
	h := newHarness(t)
	res := h.store("reconcile").want(t, exitFail)
	assert.Contains(t, res.err, "stockctl -dsn DSN migrate", "the error names the cure")
	h.store("migrate").want(t, exitOK)
	h.store("reconcile").want(t, exitOK)
}

// ---------------------------------------------------------------------------------------------
// What stockctl says when it refuses: secrets hidden in its messages, an unknown id, a restock
// past stock.MaxQty, and what relay-once leaves.

// hideSecrets takes the passwords of -redis, -sentinel and -dsn out of a message, and only them.
func TestHideSecrets(t *testing.T) {
	g := globals{redis: "redis://ops:s%40cret-1@h:6379", sentinel: "m@redis://x:pw@h:1", dsn: "mysql:root:dbpass!@tcp(h:3306)/x"}
	for in, want := range map[string]string{
		"dial redis://ops:s%40cret-1@h:6379: refused":     "dial redis://ops:xxxxx@h:6379: refused",
		"AUTH s@cret-1 failed":                            "AUTH xxxxx failed",
		"sentinel redis://x:pw@h:1: bad":                  "sentinel redis://x:xxxxx@h:1: bad",
		"the pw word stays, short passwords only in URLs": "the pw word stays, short passwords only in URLs",
		"want mysql://user:pass@host:port/db":             "want mysql://user:pass@host:port/db",
		"Access denied (password: dbpass!)":               "Access denied (password: xxxxx)",
	} {
		assert.Equal(t, want, hideSecrets(in, g))
	}
	assert.Equal(t, "no secret here", hideSecrets("no secret here", globals{redis: "127.0.0.1:6379"}))
}

// An unknown id of a loaded item is named, with the way to leave a tombstone, and its restore
// writes nothing (DUMP needs a real Redis); with -tombstone the restore goes through, and sweep
// of the item releases nothing.
func TestUnknownIDMessages(t *testing.T) {
	h := newHarness(t)
	require.Equal(t, exitOK, h.run("load", "x", "5").code)
	var before map[string]string
	if redistest.ServerBinary(t) != "" {
		before = stableDump(t, h.client)
	}
	h.run("restore", "x", "o1").wantErr(t, exitFail, "item x has no ledger entry for id o1", "-tombstone")
	if before != nil {
		wroteNothing(t, h.client, before, false, "restore without -tombstone")
	}

	h.run("entry", "x", "o1").wantErr(t, exitFail, "item x has no ledger entry for id o1")
	h.run("restore", "-tombstone", "x", "o1").want(t, exitOK, "left a tombstone")
	h.run("sweep", "x").want(t, exitOK, "released 0 units")
}

// A restock past stock.MaxQty in all is refused with the figures, exit 1 (the command line is
// right; the item's stock refuses it), and changes nothing: "stock: invalid input" would tell
// the operator nothing, and QTY itself is within the range the help states.
func TestRestockPastMaxQty(t *testing.T) {
	h := newHarness(t)
	require.Equal(t, exitOK, h.run("load", "big", "9007199254740000").code)
	h.take("big", "o1", 10)
	res := h.run("restock", "big", "po1", "1000").want(t, exitFail)
	for _, want := range []string{"big/po1", "9007199254740000 units loaded", "9007199254739990 available", "QTY 1000",
		"9007199254741000", "9007199254740991"} {
		assert.Contains(t, res.err, want)
	}
	lv, err := h.r.Levels(context.Background(), "big")
	require.NoError(t, err)
	assert.Equal(t, int64(9007199254740000), lv.Loaded)
	h.run("restock", "big", "po1", "991").want(t, exitOK)
	// An item loaded with MaxQty itself takes no restock of 1.
	require.Equal(t, exitOK, h.run("load", "full", "9007199254740991").code)
	res = h.run("restock", "full", "po1", "1").want(t, exitFail)
	for _, want := range []string{"full/po1", "9007199254740991 units loaded", "QTY 1"} {
		assert.Contains(t, res.err, want)
	}
}

// relay-once says what it leaves in the outboxes, in text and JSON: a run that delivered
// nothing while an event waits in backoff does not look like an empty outbox.
func TestRelayOnceSaysWhatIsLeft(t *testing.T) {
	h := newHarness(t)
	require.Equal(t, exitOK, h.run("load", "A", "10").code)
	require.Equal(t, exitOK, h.run("load", "B", "10").code)
	h.deduct("o1", "", 2)
	h.dsn = sqliteDSN(t) // no tables: the delivery fails
	res := h.store("relay-once").want(t, exitFail, "NOT DRAINED: 1 event of 1 item still in the outbox", ": A (1)")
	// The next run finds the event in backoff (exit 0), or, on a slow machine, past it and fails
	// again (exit 1): either way it says the event waits. (An empty outbox: "the outboxes are
	// empty", TestReconcileAndRelay.)
	res = h.store("relay-once")
	assert.Contains(t, res.out, "delivered 0 events")
	assert.Contains(t, res.out, "NOT DRAINED: 1 event of 1 item")
	if res.code != exitOK {
		assert.Equal(t, exitFail, res.code)
		assert.Contains(t, res.out, "retried later 1")
	}
	j := decode[struct {
		Delivered     int
		Pending, Dead int64
		Waiting       []waitJSON
	}](t, h.store("-json", "relay-once", "A", "B").out)
	assert.Equal(t, 0, j.Delivered)
	assert.Equal(t, int64(1), j.Pending)
	assert.Zero(t, j.Dead, "the event waits, not dead-lettered")
	assert.Equal(t, []waitJSON{{SKU: "A", Pending: 1}}, j.Waiting)
}

// ---------------------------------------------------------------------------------------------
// The registry lost, and the failover fence.

// TestReconcileLostRegistry: Redis loses everything (FLUSHALL) after sales reached the store.
// Before, `reconcile` printed no item and exited 0, so no cron alert fired, and `reconcile
// -apply SKU` rebuilt the item without registering it, so the relay never drained it again.
func TestReconcileLostRegistry(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	h.soldAndRelayed(3)
	require.NoError(t, h.client.Do(ctx, h.client.B().Flushall().Build()).Error())

	res := h.store("reconcile").want(t, exitDrift, "REDIS LOST ITS REGISTRY: 1 items", "A: redis 0+0 held, store 8", "in the store only, never in Redis (left alone; 'load' puts them on sale): B")
	assert.Empty(t, h.registry(), "a report-only run changes nothing")

	// One item, by name: rebuilt and registered again.
	h.store("reconcile", "-apply", "A").want(t, exitDrift, "NOT IN THE REGISTRY")
	assert.Equal(t, []string{"A"}, h.registry())
	assert.Equal(t, "8\n", h.run("available", "A").out)

	// The relay drains it again.
	_, err := h.r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", Qty: 1})
	require.NoError(t, err)
	h.store("relay-once").want(t, exitOK, "delivered 1 events")

	res = h.store("reconcile")
	assert.NotContains(t, res.out, "REDIS LOST")
	assert.Contains(t, res.out, "A: redis 7+0 held, store 7")
}

// TestReconcileLiftsFence: a FailoverGuard fenced a Reserver; `stockctl reconcile -apply`, a
// complete pass in another process, lifts the fence. Before, only a pass run in the guarded
// process itself recorded the reconciled primaries, so a deployment whose only reconciler was
// the CLI stayed fenced forever.
func TestReconcileLiftsFence(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skip("needs a real redis-server (INFO for the guard): set " + redistest.EnvServer)
	}
	h := newHarness(t)
	ctx := context.Background()
	require.Equal(t, exitOK, h.store("load", "A", "10").code)
	// The first load recorded the epoch (a new deployment is not fenced); its loss, with the
	// item still there, fences.
	require.NoError(t, h.client.Do(ctx, h.client.B().Del().Key(h.prefix+":epoch").Build()).Error())
	g := stockops.NewFailoverGuard(h.r)
	fenced, err := g.Check(ctx) // items exist and no epoch recorded: fenced
	require.NoError(t, err)
	require.True(t, fenced)
	_, err = h.r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1})
	require.ErrorIs(t, err, stock.ErrFailover)

	res := h.store("reconcile") // a report-only run does not lift it
	require.Equal(t, exitOK, res.code)
	fenced, err = g.Check(ctx)
	require.NoError(t, err)
	require.True(t, fenced)
	res = h.store("reconcile", "-apply", "A") // nor does a pass over some items
	require.Equal(t, exitOK, res.code)
	fenced, err = g.Check(ctx)
	require.NoError(t, err)
	require.True(t, fenced)

	h.store("reconcile", "-apply").want(t, exitOK, "the Redis primaries are recorded as reconciled")
	fenced, err = g.Check(ctx)
	require.NoError(t, err)
	assert.False(t, fenced, "the CLI's complete pass lifts the fence")
	_, err = h.r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1})
	require.NoError(t, err)
}

// ---------------------------------------------------------------------------------------------
// The operator ACL.

// cliACL is the ACL of an operator's stockctl user on one prefix, as the README documents it:
// the items' keys and the registry; the scripts and the commands they run; the reads; no
// client-side caching (stockctl reads fresh), no replica ack, no failover guard, no carts; the
// epoch key and INFO, so that reconcile -apply records the primaries and lifts the fences.
func cliACL(user, password, prefix string) []string {
	args := []string{user, "reset", "on", ">" + password, "resetchannels",
		"~" + prefix + ":{*", "~" + prefix + ":items", "~" + prefix + ":due{~*", "~" + prefix + ":holdsdue{~*",
		"~" + prefix + ":epoch", "-@all", "+ping", "+info", "+cluster|slots", "+cluster|shards", "+evalsha", "+eval",
		"+get", "+set", "+del", "+exists", "+pexpire", "+setbit", "+time",
		"+hget", "+hmget", "+hset", "+hsetnx", "+hdel", "+hexists", "+hincrby", "+hscan",
		"+zadd", "+zrem", "+zcard", "+zcount", "+zrange", "+zrangebyscore", "+zscore",
		"+sadd", "+srem", "+sscan", "+sismember"}
	var out []string
	for _, a := range args {
		if a != os.Getenv("ACL_DROP") {
			out = append(out, a)
		}
	}
	return out
}

// TestOperatorACL runs every stockctl command as a Redis user with only the documented
// operator ACL, reached by a redis://user:password@host URL, and checks that this user cannot
// read or change another prefix's items.
func TestOperatorACL(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skip("STOCK_REDIS_SERVER is not set: ACLs need a real Redis")
	}
	s := redistest.StartServer(t)
	ctx := context.Background()
	admin := serverClient(t, s.Addr())
	require.NoError(t, admin.Do(ctx, admin.B().Arbitrary("ACL", "SETUSER").Args(cliACL("shop-ops", "p@ss", "shop")...).Build()).Error())
	other, err := stock.New(admin, stock.WithPrefix("other"))
	require.NoError(t, err)
	require.NoError(t, other.Load(ctx, "A", 5))
	lib, err := stock.New(admin, stock.WithPrefix("shop"), stock.WithOutbox(true))
	require.NoError(t, err)

	url := "redis://shop-ops:p%40ss@" + s.Addr()
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "stock.db")
	stockctl := func(args ...string) (int, string) {
		res := runCLI(t, append([]string{"-redis", url, "-dsn", dsn, "-timeout", "20s"}, args...)...)
		return res.code, res.out + res.err
	}
	for _, args := range [][]string{
		{"-prefix", "shop", "migrate"},
		{"-prefix", "shop", "load", "A", "10"},
		{"-prefix", "shop", "restock", "A", "po-1", "5"},
		{"-prefix", "shop", "available", "A"},
		{"-prefix", "shop", "levels"},
		{"-prefix", "shop", "items"},
		{"deduct by the service"},
		{"-prefix", "shop", "entry", "A", "o1"},
		{"-prefix", "shop", "ledger", "A"},
		{"-prefix", "shop", "restore", "A", "o1"},
		{"-prefix", "shop", "sweep"},
		{"-prefix", "shop", "close", "A"},
		{"-prefix", "shop", "reopen", "A"},
		{"-prefix", "shop", "relay-once"},
		{"-prefix", "shop", "reconcile", "-apply"},
	} {
		if args[0] == "deduct by the service" {
			_, err := lib.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 2})
			require.NoError(t, err)
			_, err = lib.Hold(ctx, stock.Request{SKU: "A", ID: "h1", Qty: 1}, time.Millisecond)
			require.NoError(t, err)
			time.Sleep(20 * time.Millisecond) // the hold expires: sweep releases it
			continue
		}
		code, out := stockctl(args...)
		assert.Equal(t, exitOK, code, "stockctl %s: %s", strings.Join(args, " "), out)
		if args[len(args)-1] == "-apply" {
			assert.NotContains(t, out, "fences stay", "a complete repairing pass records the primaries: it lifts every fence")
		}
	}
	lv, err := lib.Levels(ctx, "A")
	require.NoError(t, err)
	assert.Equal(t, stock.Levels{Available: 15, Loaded: 15}, lv, "restored and swept by the operator")
	// An item loaded in Redis only gets its store side; delist ends a sale.
	require.NoError(t, lib.Load(ctx, "B", 3))
	for _, args := range [][]string{{"load", "B", "3"}, {"reconcile", "-apply"}, {"delist", "A"}} {
		code, out := stockctl(append([]string{"-prefix", "shop"}, args...)...)
		assert.Equal(t, exitOK, code, "stockctl %s: %s", strings.Join(args, " "), out)
	}
	lv, err = lib.Levels(ctx, "A")
	require.NoError(t, err)
	assert.True(t, lv.Closed, "delisted")

	// Another prefix: refused, untouched.
	for _, args := range [][]string{{"levels", "A"}, {"items"}, {"restore", "A", "x"}, {"close", "A"}, {"load", "B", "1"}} {
		code, out := stockctl(append([]string{"-prefix", "other"}, args...)...)
		assert.NotEqual(t, exitOK, code, "stockctl -prefix other %s: %s", strings.Join(args, " "), out)
		assert.Contains(t, out, "NOPERM", args)
	}
	lv, err = other.Levels(ctx, "A")
	require.NoError(t, err)
	assert.Equal(t, stock.Levels{Available: 5, Loaded: 5}, lv)
}

// docs/operating.md documents the same operator ACL as TestOperatorACL runs.
func TestOperatorACLDocumented(t *testing.T) {
	readme, err := os.ReadFile("../../docs/operating.md")
	require.NoError(t, err)
	doc := strings.Join(strings.Fields(string(readme)), " ")
	assert.Contains(t, doc, "ACL SETUSER "+strings.Join(cliACL("shop-ops", "PASSWORD", "shop"), " "))
}
