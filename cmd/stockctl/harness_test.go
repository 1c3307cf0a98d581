package main

// The package's one test harness: runCLI runs stockctl as an operator types it; harness runs it
// against one Redis (a private redis-server when STOCK_REDIS_SERVER is set, else a miniredis)
// under a prefix of its own; privateServer and privateClient need a real redis-server and skip
// without one. The dump helpers tell whether a command wrote anything.

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
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/stockops"
)

type cliResult struct {
	code     int
	out, err string
	took     time.Duration
}

func (r cliResult) String() string {
	return fmt.Sprintf("exit %d after %v\nstdout:\n%s\nstderr:\n%s", r.code, r.took.Round(time.Millisecond), r.out, r.err)
}

// want checks the exit code (ending the test when it differs) and that stdout holds each of
// outs; it returns r for further checks.
func (r cliResult) want(t *testing.T, code int, outs ...string) cliResult {
	t.Helper()
	require.Equal(t, code, r.code, "%v", r)
	for _, o := range outs {
		assert.Contains(t, r.out, o)
	}
	return r
}

// wantErr is want for stderr.
func (r cliResult) wantErr(t *testing.T, code int, errs ...string) cliResult {
	t.Helper()
	require.Equal(t, code, r.code, "%v", r)
	for _, e := range errs {
		assert.Contains(t, r.err, e)
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
	if _, err := r.Deduct(context.Background(), stock.Request{SKU: "x", ID: "o1", Qty: qty}); err != nil {
		t.Fatal(err)
	}
}

// serverClient is a fresh-reading client (no client-side caching) on addr.
func serverClient(t *testing.T, addr string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatalf("client on %s: %v", addr, err)
	}
	t.Cleanup(c.Close)
	return c
}

func serverReserver(t *testing.T, c rueidis.Client, prefix string) *stock.Reserver {
	t.Helper()
	r, err := stock.New(c, stock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
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
		if err != nil {
			t.Fatalf("SCAN: %v", err)
		}
		for _, k := range e.Elements {
			d, err := c.Do(ctx, c.B().Dump().Key(k).Build()).ToString()
			if err != nil && !rueidis.IsRedisNil(err) {
				t.Fatalf("DUMP %q: %v", k, err)
			}
			// A set in a hash table dumps its members in the table's order, which a read
			// (SISMEMBER) can change by moving an incremental rehash on: compare its members.
			if typ, _ := c.Do(ctx, c.B().Type().Key(k).Build()).ToString(); typ == "set" {
				ms, err := c.Do(ctx, c.B().Smembers().Key(k).Build()).AsStrSlice()
				if err != nil {
					t.Fatalf("SMEMBERS %q: %v", k, err)
				}
				slices.Sort(ms)
				d = "set:" + strings.Join(ms, "\x00")
			}
			ttl, err := c.Do(ctx, c.B().Pttl().Key(k).Build()).AsInt64()
			if err != nil {
				t.Fatalf("PTTL %q: %v", k, err)
			}
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

// closedAddr is a 127.0.0.1 address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// silentAddr is a TCP server that accepts connections and never answers: a hung Redis.
func silentAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
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
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(query).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
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
