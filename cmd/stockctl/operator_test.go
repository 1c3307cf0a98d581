package main

// stockctl as an operator types it, checked against its help text and the README's "Operating
// it": bad flags and arguments, bad names and quantities, unknown items, unreachable services, bad DSNs, JSON
// output, read-only commands, and commands over every item. Tests that need a private
// redis-server skip without STOCK_REDIS_SERVER; the PostgreSQL and MariaDB cases skip when
// those servers do not answer.

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
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

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/sqlstore"
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

// clearEnv clears the environment variables stockctl reads, so that the flags given are all.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, k := range []string{"STOCKCTL_REDIS", "STOCKCTL_SENTINEL", "STOCKCTL_DSN"} {
		t.Setenv(k, "")
	}
}

func runCLI(t *testing.T, args ...string) cliResult {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	code := run(ctx, args, &out, &errb)
	return cliResult{code, out.String(), errb.String(), time.Since(start)}
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
	if res := runCLI(t, "-redis", addr, "load", "x", "10"); res.code != 0 {
		t.Fatal(res)
	}
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
		if sameDump(prev, cur) {
			return cur
		}
		prev = cur
	}
	t.Fatal("the keys never stopped changing")
	return nil
}

func sameDump(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func diffDump(a, b map[string]string) string {
	var d []string
	for k, v := range a {
		if w, ok := b[k]; !ok {
			d = append(d, "deleted "+k)
		} else if w != v {
			d = append(d, "changed "+k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			d = append(d, "created "+k)
		}
	}
	slices.Sort(d)
	return strings.Join(d, "\n")
}

func dbSize(t *testing.T, c rueidis.Client) int64 {
	t.Helper()
	n, err := c.Do(context.Background(), c.B().Dbsize().Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return n
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

// ---------------------------------------------------------------------------------------------
// Usage: help, unknown commands, bad flags, missing arguments. No Redis needed.

func TestHelpAndUsageExitCodes(t *testing.T) {
	clearEnv(t)
	closed := closedAddr(t) // nothing of these must reach Redis
	for _, tc := range []struct {
		args   []string
		code   int
		stdout string // substring of stdout
		stderr string // substring of stderr
	}{
		{[]string{"-h"}, 0, "Usage:", ""},
		{[]string{"-help"}, 0, "Usage:", ""},
		{[]string{"--help"}, 0, "Usage:", ""},
		{[]string{"help"}, 0, "Commands:", ""},
		{[]string{"help", "help"}, 0, "Commands:", ""},
		{[]string{"help", "ledger"}, 0, "usage: stockctl ledger SKU", ""},
		{[]string{"load", "-h"}, 0, "usage: stockctl load SKU QTY", ""},
		{[]string{"-redis", closed, "reconcile", "-h"}, 0, "usage: stockctl reconcile", ""},
		{[]string{"ledger", "x", "-h"}, 0, "usage: stockctl ledger", ""},
		{[]string{}, 2, "", "Usage:"},
		{[]string{"-json"}, 2, "", "Usage:"},
		{[]string{"frobnicate"}, 2, "", `unknown command "frobnicate"`},
		{[]string{"LOAD", "x", "1"}, 2, "", `unknown command "LOAD"`},
		{[]string{"help", "frobnicate"}, 2, "", `unknown command "frobnicate"`},
		{[]string{"help", "load", "extra"}, 2, "", "usage: stockctl help"},
		{[]string{"-bogus", "items"}, 2, "", "-bogus"},
		{[]string{"-redis", closed, "items", "-bogus"}, 2, "", "-bogus"},
		{[]string{"-redis", closed, "load", "x"}, 2, "", "missing arguments"},
		{[]string{"-redis", closed, "load"}, 2, "", "missing arguments"},
		{[]string{"-redis", closed, "load", "x", "1", "2"}, 2, "", "too many arguments"},
		{[]string{"-redis", closed, "items", "extra"}, 2, "", "too many arguments"},
		{[]string{"-redis", closed, "sweep", "a", "b"}, 2, "", "too many arguments"},
		{[]string{"-redis", closed, "restock", "x", "id"}, 2, "", "missing arguments"},
		{[]string{"-redis", closed, "entry", "x"}, 2, "", "missing arguments"},
		{[]string{"-redis", closed, "-timeout", "0", "items"}, 2, "", "-timeout must be positive"},
		{[]string{"-redis", closed, "-timeout", "-5s", "items"}, 2, "", "-timeout must be positive"},
		{[]string{"-redis", closed, "-timeout", "soon", "items"}, 2, "", "-timeout"},
		{[]string{"-redis", closed, "-json=maybe", "items"}, 2, "", "-json"},
		{[]string{"-redis", closed, "ledger", "x", "-limit", "-1"}, 2, "", "-limit -1 is negative"},
		{[]string{"-redis", closed, "ledger", "x", "-limit", "many"}, 2, "", "-limit"},
		{[]string{"-redis", closed, "ledger", "x", "-state", "sold"}, 2, "", `-state "sold"`},
		{[]string{"-redis", closed, "reconcile", "-repair-limit", "-1"}, 2, "", "-repair-limit -1 is negative"},
		{[]string{"-redis", closed, "reconcile", "-retention", "-1h"}, 2, "", "-retention -1h0m0s is negative"},
		{[]string{"-redis", closed, "load", "x", "ten"}, 2, "", `QTY "ten" is not a whole number`},
		{[]string{"-redis", closed, "restock", "x", "po", "0"}, 2, "", "QTY 0 out of range [1, 9007199254740991]"},
		{[]string{"migrate"}, 2, "", "needs the database of record: -dsn"},
		{[]string{"-redis", "", "items"}, 2, "", "-redis"},
		{[]string{"-redis", "localhost", "items"}, 2, "", "-redis"},
		{[]string{"-sentinel", "noatsign", "items"}, 2, "", "-sentinel"},
		{[]string{"-dsn", "oracle://x/y", "migrate"}, 2, "", "-dsn"},
		{[]string{"-dsn", "sqlite:", "migrate"}, 2, "", "-dsn"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			res := runCLI(t, tc.args...)
			if res.code != tc.code {
				t.Fatalf("want exit %d\n%v", tc.code, res)
			}
			if !strings.Contains(res.out, tc.stdout) || !strings.Contains(res.err, tc.stderr) {
				t.Fatalf("want stdout with %q and stderr with %q\n%v", tc.stdout, tc.stderr, res)
			}
			if tc.code == 0 && res.err != "" {
				t.Fatalf("help wrote to stderr\n%v", res)
			}
			if tc.code == 2 && res.out != "" {
				t.Fatalf("a usage error wrote to stdout\n%v", res)
			}
		})
	}
}

// A command line that is wrong whatever Redis says is a usage error (exit 2, "2 usage error"
// in the help), also when Redis is down: reconcile and relay-once "(needs -dsn)", a -prefix
// the library refuses, a SKU with '|'.
func TestUsageErrorsBeforeConnecting(t *testing.T) {
	clearEnv(t)
	closed := closedAddr(t)
	for _, args := range [][]string{
		{"-redis", closed, "reconcile"},
		{"-redis", closed, "relay-once"},
		{"-redis", closed, "-prefix", "a{b", "items"},
		{"-redis", closed, "load", "a|b", "5"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			res := runCLI(t, args...)
			if res.code != exitUsage {
				t.Errorf("want exit 2 (usage error): the command line is wrong whatever Redis says\n%v", res)
			}
		})
	}
}

// ---------------------------------------------------------------------------------------------
// Redis unreachable: a closed port and a server that never answers.

func TestUnreachableRedisIsBounded(t *testing.T) {
	clearEnv(t)
	dsn := sqliteDSN(t)
	if res := runCLI(t, "-dsn", dsn, "migrate"); res.code != 0 {
		t.Fatalf("migrate: %v", res)
	}
	cmds := [][]string{
		{"load", "x", "5"}, {"restock", "x", "po", "5"}, {"available", "x"}, {"levels"}, {"levels", "x"},
		{"items"}, {"entry", "x", "id"}, {"ledger", "x"}, {"close", "x"}, {"reopen", "x"}, {"delist", "x"},
		{"restore", "x", "id"}, {"sweep"}, {"sweep", "x"}, {"-dsn", dsn, "reconcile"}, {"-dsn", dsn, "relay-once"},
		{"-dsn", dsn, "load", "x", "5"},
	}
	t.Run("closed port", func(t *testing.T) {
		addr := closedAddr(t)
		for _, c := range cmds {
			res := runCLI(t, append([]string{"-redis", addr}, c...)...)
			if res.code != exitFail || res.took > 30*time.Second || !strings.Contains(res.err, "Redis") {
				t.Errorf("%v: want exit 1 within 30s and an error naming Redis\n%v", c, res)
			}
			if res.out != "" {
				t.Errorf("%v: wrote to stdout\n%v", c, res)
			}
		}
	})
	t.Run("server that never answers", func(t *testing.T) {
		addr := silentAddr(t)
		var wg sync.WaitGroup
		for _, c := range cmds {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res := runCLI(t, append([]string{"-redis", addr, "-timeout", "3s"}, c...)...)
				if res.code != exitFail || res.took > 30*time.Second || res.err == "" {
					t.Errorf("%v -timeout 3s: want exit 1 within 30s with an error\n%v", c, res)
				}
			}()
		}
		wg.Wait()
	})
	t.Run("server that never answers, default timeout", func(t *testing.T) {
		addr := silentAddr(t)
		res := runCLI(t, "-redis", addr, "levels")
		if res.code != exitFail || res.took > 70*time.Second || res.err == "" {
			t.Errorf("want exit 1 within the 1m default -timeout (70s allowed)\n%v", res)
		}
	})
}

// The password of a redis:// URL must not be printed: stockctl redacts a DSN's password, and
// internal/redisaddr, the -redis parser, promises "Its errors never show a password". An
// operator's stderr goes to cron mail and logs.
func TestRedisPasswordNotShown(t *testing.T) {
	clearEnv(t)
	const secret = "S3cretPW-op"
	t.Run("closed port", func(t *testing.T) {
		res := runCLI(t, "-redis", "redis://ops:"+secret+"@"+closedAddr(t), "levels")
		if res.code != exitFail {
			t.Fatalf("want exit 1\n%v", res)
		}
		if strings.Contains(res.err+res.out, secret) {
			t.Errorf("the password is printed\n%v", res)
		}
	})
	t.Run("wrong password", func(t *testing.T) {
		s := privateServer(t)
		c := serverClient(t, s.Addr())
		if err := c.Do(context.Background(), c.B().ConfigSet().ParameterValue().ParameterValue("requirepass", "right-one").Build()).Error(); err != nil {
			t.Fatal(err)
		}
		res := runCLI(t, "-redis", "redis://:"+secret+"@"+s.Addr(), "levels")
		if res.code != exitFail || !strings.Contains(res.err, "WRONGPASS") {
			t.Fatalf("want exit 1 with WRONGPASS\n%v", res)
		}
		if strings.Contains(res.err+res.out, secret) {
			t.Errorf("the password is printed\n%v", res)
		}
	})
}

// ---------------------------------------------------------------------------------------------
// Names: refused wholly, or handled as distinct items.

func badNames() map[string]string {
	return map[string]string{
		"open brace":     "a{b",
		"close brace":    "a}b",
		"both braces":    "{a}",
		"pipe":           "a|b",
		"space":          "a b",
		"leading space":  " a",
		"tab":            "a\tb",
		"newline":        "a\nb",
		"nbsp":           "a\u00a0b",
		"ideographic sp": "a\u3000b",
		"control":        "a\x01b",
		"DEL":            "a\x7fb",
		"invalid utf8":   "a\xffb",
		"empty":          "",
		"129 bytes":      strings.Repeat("x", 129),
		"129 bytes utf8": strings.Repeat("€", 43),
	}
}

func TestBadNamesRefusedWholly(t *testing.T) {
	addr, c := privateClient(t)
	dsn := sqliteDSN(t)
	if res := runCLI(t, "-redis", addr, "-dsn", dsn, "load", "good", "10"); res.code != 0 {
		t.Fatalf("load good: %v", res)
	}
	r := serverReserver(t, c, "stock")
	if _, err := r.Deduct(context.Background(), stock.Request{SKU: "good", ID: "o1", Qty: 2}); err != nil {
		t.Fatal(err)
	}
	before := stableDump(t, c)
	for what, bad := range badNames() {
		for _, cmd := range [][]string{
			{"load", bad, "5"}, {"-dsn", dsn, "load", bad, "5"}, {"restock", bad, "po", "5"}, {"restock", "good", bad, "5"},
			{"available", bad}, {"levels", bad}, {"levels", "good", bad}, {"entry", bad, "o1"}, {"entry", "good", bad},
			{"ledger", bad}, {"close", bad}, {"reopen", bad}, {"delist", bad}, {"restore", bad, "o1"},
			{"restore", "good", bad}, {"restore", "-tombstone", "good", bad}, {"restore", "-tombstone", bad, "x"},
			{"sweep", bad}, {"-dsn", dsn, "reconcile", bad}, {"-dsn", dsn, "relay-once", bad},
			{"-prefix", bad, "load", "p", "1"},
		} {
			// "--" before the name, so that a name starting with '-' is not a flag.
			args := []string{"-redis", addr}
			if i := slices.Index(cmd, bad); i >= 0 && cmd[0] != "-prefix" {
				args = append(args, cmd[:i]...)
				args = append(args, "--")
				args = append(args, cmd[i:]...)
			} else {
				args = append(args, cmd...)
			}
			res := runCLI(t, args...)
			if res.code != exitUsage {
				t.Errorf("%s: %q: want exit 2 (a name the library rejects)\n%v", what, args, res)
			}
			if !strings.Contains(res.err, "invalid") && !strings.Contains(res.err, "not allowed") {
				t.Errorf("%s: %q: the refusal does not say what is wrong\n%v", what, args, res)
			}
		}
	}
	after := dumpKeys(t, c)
	if !sameDump(before, after) {
		t.Errorf("refused commands wrote to Redis:\n%s", diffDump(before, after))
	}
	// The store has nothing but "good".
	db, err := sql.Open("sqlite", strings.TrimPrefix(dsn, "sqlite:"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM stock_items").Scan(&n); err != nil || n != 1 {
		t.Errorf("store items: %d, %v; want 1 (good)", n, err)
	}
}

// ':' '~', non-ASCII letters and 128 bytes are valid names (the README lists what is refused):
// each must be its own item, never sharing keys with another.
func TestOddValidNamesAreDistinctItems(t *testing.T) {
	addr, c := privateClient(t)
	names := []string{"tee", "tee:u", "tee:l", "tee:o", "~carts", "carts", "items", ":", "~", "ünïcødé",
		"日本語", "-dash", strings.Repeat("x", 128), strings.Repeat("é", 64), "due", "holdsdue", "epoch", "tee~"}
	want := map[string]int64{}
	for i, n := range names {
		q := int64(10 + i)
		res := runCLI(t, "-redis", addr, "load", "--", n, strconv.FormatInt(q, 10))
		if res.code != 0 {
			t.Fatalf("load %q: %v", n, res)
		}
		want[n] = q
	}
	// A restock and a sale of each, with ids that look like keys.
	for i, n := range names {
		res := runCLI(t, "-redis", addr, "restock", "--", n, "po:"+strconv.Itoa(i), strconv.Itoa(i+1))
		if res.code != 0 {
			t.Fatalf("restock %q: %v", n, res)
		}
		want[n] += int64(i + 1)
	}
	r := serverReserver(t, c, "stock")
	ctx := context.Background()
	for _, n := range names {
		if _, err := r.Deduct(ctx, stock.Request{SKU: n, ID: "o~1", Qty: 1}); err != nil {
			t.Fatalf("deduct %q: %v", n, err)
		}
	}
	for _, n := range names {
		lv, err := r.Levels(ctx, n)
		if err != nil {
			t.Fatalf("levels %q: %v", n, err)
		}
		if lv.Loaded != want[n] || lv.Available != want[n]-1 || lv.Sold != 1 {
			t.Errorf("%q: %+v, want loaded %d, available %d, sold 1", n, lv, want[n], want[n]-1)
		}
		res := runCLI(t, "-redis", addr, "-json", "ledger", "--", n)
		if res.code != 0 {
			t.Fatalf("ledger %q: %v", n, res)
		}
		var es []entryJSON
		if err := json.Unmarshal([]byte(res.out), &es); err != nil || len(es) != 2 {
			t.Errorf("ledger %q: %d entries, %v; want 2\n%v", n, len(es), err, res)
		}
		res = runCLI(t, "-redis", addr, "-json", "available", "--", n)
		var av struct {
			SKU       string `json:"sku"`
			Available int64  `json:"available"`
		}
		if err := json.Unmarshal([]byte(res.out), &av); err != nil || av.SKU != n || av.Available != want[n]-1 {
			t.Errorf("available %q: %+v %v\n%v", n, av, err, res)
		}
	}
	res := runCLI(t, "-redis", addr, "-json", "items")
	var got []string
	if err := json.Unmarshal([]byte(res.out), &got); err != nil {
		t.Fatalf("items: %v\n%v", err, res)
	}
	wantItems := slices.Clone(names)
	slices.Sort(wantItems)
	if !slices.Equal(got, wantItems) {
		t.Errorf("items %q, want %q", got, wantItems)
	}
	// Closing one item closes no other.
	if res := runCLI(t, "-redis", addr, "close", "tee:u"); res.code != 0 {
		t.Fatal(res)
	}
	for _, n := range names {
		lv, _ := r.Levels(ctx, n)
		if lv.Closed != (n == "tee:u") {
			t.Errorf("%q closed=%v after close tee:u", n, lv.Closed)
		}
	}
}

// ---------------------------------------------------------------------------------------------
// Quantities.

func TestQuantities(t *testing.T) {
	addr, c := privateClient(t)
	r := serverReserver(t, c, "stock")
	ctx := context.Background()
	for i, tc := range []struct {
		qty  string
		code int
		want int64 // loaded, when code is 0
	}{
		{"0", 0, 0},
		{"1", 0, 1},
		{"9007199254740991", 0, stock.MaxQty},
		{"+7", 0, 7},
		{"007", 0, 7},
		{"9007199254740992", 2, 0},
		{"9223372036854775807", 2, 0},
		{"9223372036854775808", 2, 0},
		{"99999999999999999999", 2, 0},
		{"-1", 2, 0},
		{"-9007199254740992", 2, 0},
		{"abc", 2, 0},
		{"1.0", 2, 0},
		{"1e3", 2, 0},
		{"0x10", 2, 0},
		{"1_000", 2, 0},
		{" 5", 2, 0},
		{"5 ", 2, 0},
		{"", 2, 0},
		{"٣", 2, 0}, // an Arabic-Indic digit
	} {
		sku := fmt.Sprintf("q%d", i)
		res := runCLI(t, "-redis", addr, "load", "--", sku, tc.qty)
		if res.code != tc.code {
			t.Errorf("load %s %q: want exit %d\n%v", sku, tc.qty, tc.code, res)
			continue
		}
		lv, err := r.Levels(ctx, sku)
		if tc.code != 0 {
			if !errors.Is(err, stock.ErrNotLoaded) {
				t.Errorf("load %s %q was refused but the item exists: %+v %v", sku, tc.qty, lv, err)
			}
			if !strings.Contains(res.err, "QTY") {
				t.Errorf("load %s %q: the refusal does not name QTY\n%v", sku, tc.qty, res)
			}
			continue
		}
		if err != nil || lv.Loaded != tc.want || lv.Available != tc.want {
			t.Errorf("load %s %q: %+v %v, want %d", sku, tc.qty, lv, err, tc.want)
		}
	}
	// A restock that would take the item past 2^53-1 is refused and changes nothing; the id
	// stays free.
	if res := runCLI(t, "-redis", addr, "restock", "q1", "po-max", "9007199254740991"); res.code == 0 {
		t.Errorf("restock past 2^53-1 accepted\n%v", res)
	}
	if lv, _ := r.Levels(ctx, "q1"); lv.Loaded != 1 {
		t.Errorf("after a refused restock: %+v", lv)
	}
	if res := runCLI(t, "-redis", addr, "restock", "q1", "po-max", "5"); res.code != 0 {
		t.Errorf("the id of a refused restock cannot be used: %v", res)
	}
	if lv, _ := r.Levels(ctx, "q1"); lv.Loaded != 6 || lv.Available != 6 {
		t.Errorf("after restock 5: %+v", lv)
	}
	// Replaying the restock adds nothing; the same id with another quantity is refused.
	res := runCLI(t, "-redis", addr, "-json", "restock", "q1", "po-max", "5")
	var rc receiptJSON
	if err := json.Unmarshal([]byte(res.out), &rc); err != nil || res.code != 0 || !rc.Replayed {
		t.Errorf("replayed restock: %+v %v\n%v", rc, err, res)
	}
	if res := runCLI(t, "-redis", addr, "restock", "q1", "po-max", "6"); res.code == 0 {
		t.Errorf("the same restock id with another QTY accepted\n%v", res)
	}
	if lv, _ := r.Levels(ctx, "q1"); lv.Loaded != 6 {
		t.Errorf("after replays: %+v", lv)
	}
}

// "99999999999999999999" is a whole number: too large, not "not a whole number".
func TestHugeQtyMessage(t *testing.T) {
	clearEnv(t)
	res := runCLI(t, "-redis", closedAddr(t), "load", "x", "99999999999999999999")
	if res.code != exitUsage {
		t.Fatalf("want exit 2\n%v", res)
	}
	if strings.Contains(res.err, "not a whole number") || !strings.Contains(res.err, "out of range") {
		t.Errorf("a whole number too large for int64 is reported as not a whole number; want \"out of range [0, 9007199254740991]\" like 9007199254740992\n%v", res)
	}
}

// A restock refused because the item would pass 2^53-1 must say why; "stock: invalid input"
// tells the operator nothing (and QTY itself is within the range the help states).
func TestRestockOverflowExplained(t *testing.T) {
	s := privateServer(t)
	addr := s.Addr()
	if res := runCLI(t, "-redis", addr, "load", "big", "9007199254740991"); res.code != 0 {
		t.Fatal(res)
	}
	res := runCLI(t, "-redis", addr, "restock", "big", "po1", "1")
	if res.code == 0 {
		t.Fatalf("restock past 2^53-1 accepted\n%v", res)
	}
	msg := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(res.err), "stockctl restock:"))
	if msg == "stock: invalid input" || !strings.ContainsAny(msg, "0123456789") {
		t.Errorf("the refusal does not say what is wrong (the limit, the current stock or the QTY)\n%v", res)
	}
}

// ---------------------------------------------------------------------------------------------
// Items that do not exist.

func TestUnknownItemChangesNothing(t *testing.T) {
	addr, c := privateClient(t)
	for _, cmd := range [][]string{
		{"available", "ghost"}, {"levels", "ghost"}, {"close", "ghost"}, {"reopen", "ghost"}, {"delist", "ghost"},
		{"restock", "ghost", "po", "5"}, {"entry", "ghost", "id"}, {"ledger", "ghost"}, {"restore", "ghost", "id"},
	} {
		res := runCLI(t, append([]string{"-redis", addr}, cmd...)...)
		if res.code != exitFail {
			t.Errorf("%v: want exit 1\n%v", cmd, res)
		}
		if n := dbSize(t, c); n != 0 {
			t.Fatalf("%v on an unknown item wrote %d keys", cmd, n)
		}
	}
	for _, cmd := range [][]string{{"available", "ghost"}, {"levels", "ghost"}, {"close", "ghost"},
		{"reopen", "ghost"}, {"delist", "ghost"}, {"restock", "ghost", "po", "5"}, {"ledger", "ghost"}} {
		res := runCLI(t, append([]string{"-redis", addr}, cmd...)...)
		if !strings.Contains(res.err, "not loaded") {
			t.Errorf("%v: the error does not say the item is not loaded\n%v", cmd, res)
		}
	}
	// -json levels of a missing item: still JSON, with the error labelled.
	res := runCLI(t, "-redis", addr, "-json", "levels", "ghost")
	var rows []levelsJSON
	if err := json.Unmarshal([]byte(res.out), &rows); err != nil || res.code != 1 || len(rows) != 1 || rows[0].Error != "not_loaded" {
		t.Errorf("-json levels ghost: %+v %v\n%v", rows, err, res)
	}
	// sweep of an unknown item writes nothing.
	if res := runCLI(t, "-redis", addr, "sweep", "ghost"); res.code == 2 || res.code == 3 {
		t.Errorf("sweep ghost: %v", res)
	}
	// (A refused restock records a due-work hint for the relay from a goroutine, which the
	// closing client usually, not always, cuts off: the hint sets are not the item's keys.)
	for k := range dumpKeys(t, c) {
		if strings.Contains(k, "ghost") {
			t.Errorf("commands on an unknown item wrote %q", k)
		}
	}
}

// restore on a SKU Redis does not know: like close, reopen, delist and restock it must say the
// item is not loaded and write nothing. It says "unknown request id" and advises -tombstone;
// with -tombstone it writes a ledger key for the non-existent item, exits 0 and tells the
// operator a late request will be refused, which is true of no item that sells.
func TestRestoreUnknownItem(t *testing.T) {
	addr, c := privateClient(t)
	if res := runCLI(t, "-redis", addr, "load", "sneaker-42", "10"); res.code != 0 {
		t.Fatal(res)
	}
	before := stableDump(t, c)
	res := runCLI(t, "-redis", addr, "restore", "sneakr-42", "order-1001")
	if res.code != exitFail || !strings.Contains(res.err, "not loaded") {
		t.Errorf("restore on an unknown item: want exit 1 and \"not loaded\"\n%v", res)
	}
	res = runCLI(t, "-redis", addr, "restore", "-tombstone", "sneakr-42", "order-1001")
	if res.code != exitFail {
		t.Errorf("restore -tombstone on an unknown item (a typo): want exit 1, nothing written\n%v", res)
	}
	after := dumpKeys(t, c)
	if !sameDump(before, after) {
		t.Errorf("restore on an unknown item wrote:\n%s", diffDump(before, after))
	}
}

// ---------------------------------------------------------------------------------------------
// Read-only commands write nothing.

func TestReadOnlyCommandsWriteNothing(t *testing.T) {
	addr, c := privateClient(t)
	dsn := sqliteDSN(t)
	for _, sku := range []string{"a", "b:c", "ünï"} {
		if res := runCLI(t, "-redis", addr, "-dsn", dsn, "load", sku, "50"); res.code != 0 {
			t.Fatal(res)
		}
	}
	if res := runCLI(t, "-redis", addr, "load", "redis-only", "7"); res.code != 0 {
		t.Fatal(res)
	}
	r := serverReserver(t, c, "stock")
	ctx := context.Background()
	must := func(_ stock.Receipt, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(r.Deduct(ctx, stock.Request{SKU: "a", ID: "o1", Qty: 3, User: "u1"}))
	must(r.Hold(ctx, stock.Request{SKU: "a", ID: "h-live", Qty: 2}, time.Hour))
	must(r.Hold(ctx, stock.Request{SKU: "a", ID: "h-exp", Qty: 4}, 50*time.Millisecond))
	must(r.Hold(ctx, stock.Request{SKU: "b:c", ID: "h-exp", Qty: 1}, 50*time.Millisecond))
	must(r.Restock(ctx, "b:c", "po1", 5))
	must(r.Deduct(ctx, stock.Request{SKU: "redis-only", ID: "o1", Qty: 1}))
	if _, err := r.Restore(ctx, "ünï", "never"); !errors.Is(err, stock.ErrUnknownID) {
		t.Fatal(err)
	}
	if err := r.CloseItem(ctx, "ünï"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the holds h-exp are past their deadline, not swept
	before := stableDump(t, c)
	for _, cmd := range [][]string{
		{"available", "a"}, {"available", "b:c"}, {"levels"}, {"levels", "a", "b:c", "ghost"}, {"items"},
		{"entry", "a", "h-exp"}, {"entry", "a", "o1"}, {"entry", "ünï", "never"}, {"entry", "a", "nope"},
		{"ledger", "a"}, {"ledger", "a", "-state", "held"}, {"ledger", "a", "-limit", "1"}, {"ledger", "ghost"},
		{"-dsn", dsn, "levels"}, {"-dsn", dsn, "levels", "a"},
		{"-dsn", dsn, "reconcile"}, {"-dsn", dsn, "reconcile", "a", "redis-only"},
	} {
		for _, j := range []bool{false, true} {
			args := append([]string{"-redis", addr}, cmd...)
			if j {
				args = append([]string{"-json"}, args...)
			}
			res := runCLI(t, args...)
			if res.code == exitUsage {
				t.Errorf("%v: %v", args, res)
			}
			after := dumpKeys(t, c)
			if !sameDump(before, after) {
				t.Fatalf("read-only %v wrote to Redis:\n%s\n%v", args, diffDump(before, after), res)
			}
		}
	}
}

// ---------------------------------------------------------------------------------------------
// JSON output parses, on stdout only, for every command.

func TestJSONOutputParses(t *testing.T) {
	s := privateServer(t)
	addr := s.Addr()
	dsn := sqliteDSN(t)
	for _, tc := range []struct {
		args []string
		code int
		into any
	}{
		{[]string{"-dsn", dsn, "migrate"}, 0, &map[string]any{}},
		{[]string{"-dsn", dsn, "migrate"}, 0, &map[string]any{}},
		{[]string{"items"}, 0, &[]string{}},
		{[]string{"levels"}, 0, &[]levelsJSON{}},
		{[]string{"sweep"}, 0, &map[string]any{}},
		{[]string{"-dsn", dsn, "reconcile"}, 0, &map[string]any{}},
		{[]string{"-dsn", dsn, "relay-once"}, 0, &map[string]any{}},
		{[]string{"-dsn", dsn, "load", "j", "10"}, 0, &loadJSON{}},
		{[]string{"load", "k", "10"}, 0, &loadJSON{}},
		{[]string{"restock", "j", "po", "5"}, 0, &receiptJSON{}},
		{[]string{"restock", "j", "po", "5"}, 0, &receiptJSON{}},
		{[]string{"available", "j"}, 0, &map[string]any{}},
		{[]string{"levels", "j", "k"}, 0, &[]levelsJSON{}},
		{[]string{"levels", "j", "ghost"}, 1, &[]levelsJSON{}},
		{[]string{"-dsn", dsn, "levels"}, 0, &[]levelsJSON{}},
		{[]string{"items"}, 0, &[]string{}},
		{[]string{"entry", "j", "po"}, 0, &entryJSON{}},
		{[]string{"ledger", "j"}, 0, &[]entryJSON{}},
		{[]string{"ledger", "j", "-state", "expired"}, 0, &[]entryJSON{}},
		{[]string{"ledger", "k"}, 0, &[]entryJSON{}},
		{[]string{"close", "j"}, 0, &map[string]any{}},
		{[]string{"reopen", "j"}, 0, &map[string]any{}},
		{[]string{"restore", "-tombstone", "j", "late"}, 0, &map[string]any{}},
		{[]string{"restore", "-tombstone", "j", "late"}, 0, &map[string]any{}},
		{[]string{"sweep", "j"}, 0, &map[string]any{}},
		{[]string{"-dsn", dsn, "relay-once"}, 0, &map[string]any{}},
		{[]string{"-dsn", dsn, "reconcile", "j"}, 0, &map[string]any{}},
		{[]string{"-dsn", dsn, "reconcile"}, 3, &map[string]any{}}, // k is in Redis only
		{[]string{"delist", "k"}, 0, &map[string]any{}},
	} {
		args := append([]string{"-redis", addr, "-json"}, tc.args...)
		res := runCLI(t, args...)
		if res.code != tc.code {
			t.Errorf("%v: want exit %d\n%v", tc.args, tc.code, res)
			continue
		}
		dec := json.NewDecoder(strings.NewReader(res.out))
		dec.DisallowUnknownFields()
		if err := dec.Decode(tc.into); err != nil {
			t.Errorf("%v: stdout is not the JSON expected: %v\n%v", tc.args, err, res)
			continue
		}
		if dec.More() {
			t.Errorf("%v: more than one JSON value on stdout\n%v", tc.args, res)
		}
	}
	// An empty registry is [] and not null.
	s2 := privateServer(t)
	for _, cmd := range []string{"items", "levels"} {
		res := runCLI(t, "-redis", s2.Addr(), "-json", cmd)
		if strings.TrimSpace(res.out) != "[]" || res.code != 0 {
			t.Errorf("-json %s on an empty Redis: want []\n%v", cmd, res)
		}
	}
}

// ---------------------------------------------------------------------------------------------
// The store: migrate twice, no tables, bad DSNs.

func TestStoreWithoutTables(t *testing.T) {
	addr, c := privateClient(t)
	r := serverReserver(t, c, "stock")
	ctx := context.Background()
	loadAndSell(t, addr, r, 3)
	dsn := sqliteDSN(t)
	for _, cmd := range [][]string{{"reconcile"}, {"reconcile", "x"}, {"levels", "x"}, {"relay-once", "x"}} {
		res := runCLI(t, append([]string{"-redis", addr, "-dsn", dsn}, cmd...)...)
		if res.code != exitFail {
			t.Errorf("%v on a store without tables: want exit 1\n%v", cmd, res)
		}
		if !strings.Contains(res.err, "migrate") {
			t.Errorf("%v on a store without tables: no hint to run migrate\n%v", cmd, res)
		}
	}
	// The sale is still waiting, not dead-lettered.
	if p, d, err := stockops.Pending(ctx, r, "x"); err != nil || p != 1 || d != 0 {
		t.Errorf("after relay-once into a store without tables: pending %d, dead %d, %v; want 1, 0", p, d, err)
	}
	// Migrate twice.
	for i := range 2 {
		if res := runCLI(t, "-dsn", dsn, "migrate"); res.code != 0 || !strings.Contains(res.out, "ready") {
			t.Fatalf("migrate #%d: %v", i+1, res)
		}
	}
	// A different -table-prefix has no tables.
	res := runCLI(t, "-redis", addr, "-dsn", dsn, "-table-prefix", "other_", "reconcile", "x")
	if res.code != exitFail || !strings.Contains(res.err, "migrate") {
		t.Errorf("reconcile with another -table-prefix: %v", res)
	}
	// Now the documented way out: load -dsn with the units Redis accounts for (7 + 3 in flight).
	if res := runCLI(t, "-redis", addr, "-dsn", dsn, "load", "x", "9"); res.code == 0 {
		t.Errorf("load -dsn with the wrong figure accepted: %v", res)
	}
	if res := runCLI(t, "-redis", addr, "-dsn", dsn, "load", "x", "10"); res.code != 0 {
		t.Fatalf("load -dsn x 10: %v", res)
	}
	if res := runCLI(t, "-redis", addr, "-dsn", dsn, "relay-once"); res.code != 0 {
		t.Fatalf("relay-once: %v", res)
	}
	if res := runCLI(t, "-redis", addr, "-dsn", dsn, "reconcile"); res.code != 0 {
		t.Errorf("reconcile after the store side was added: %v", res)
	}
	if res := runCLI(t, "-redis", addr, "-dsn", dsn, "-json", "levels", "x"); res.code == 0 {
		var rows []levelsJSON
		if err := json.Unmarshal([]byte(res.out), &rows); err != nil || len(rows) != 1 || rows[0].StoreRemaining == nil || *rows[0].StoreRemaining != 7 {
			t.Errorf("levels -dsn x: %v\n%v", err, res)
		}
	} else {
		t.Errorf("levels -dsn x: %v", res)
	}
}

// relay-once run twice in a row while the store cannot take the events: the second run is
// skipped by the backoff of the first failure (as the help says), but it must not look like
// an empty outbox: it says "delivered 0 events (claimed 0 ...)" and exits 0 while the sale
// still waits, so the operator, or a script, believes the outbox is drained.
func TestRelayOnceRerunHidesPending(t *testing.T) {
	addr, c := privateClient(t)
	r := serverReserver(t, c, "stock")
	ctx := context.Background()
	loadAndSell(t, addr, r, 3)
	dsn := sqliteDSN(t)
	first := runCLI(t, "-redis", addr, "-dsn", dsn, "relay-once")
	if first.code != exitFail {
		t.Fatalf("relay-once into a store without tables: want exit 1\n%v", first)
	}
	second := runCLI(t, "-redis", addr, "-dsn", dsn, "relay-once")
	p, d, err := stockops.Pending(ctx, r, "x")
	if err != nil || p != 1 || d != 0 {
		t.Fatalf("pending %d, dead %d, %v; want 1, 0", p, d, err)
	}
	if second.code == 0 && !strings.Contains(second.out+second.err, "backoff") && !strings.Contains(second.out+second.err, "pending") &&
		!strings.Contains(second.out+second.err, "skipped") {
		t.Errorf("the second relay-once exits 0 and says nothing of the event still pending (in backoff)\n%v", second)
	}
}

// A table prefix that would be SQL is refused before any statement.
func TestTablePrefixInjection(t *testing.T) {
	clearEnv(t)
	dsn := sqliteDSN(t)
	for _, p := range []string{"x; DROP TABLE y; --", "a b", "a\"b", "a`b", "a'b", "a.b", strings.Repeat("p", 200)} {
		res := runCLI(t, "-dsn", dsn, "-table-prefix", p, "migrate")
		if res.code != exitUsage || !strings.Contains(res.err, "-table-prefix") {
			t.Errorf("-table-prefix %q: want exit 2 naming -table-prefix\n%v", p, res)
		}
	}
	db, err := sql.Open("sqlite", strings.TrimPrefix(dsn, "sqlite:"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'").Scan(&n); err != nil || n != 0 {
		t.Errorf("tables after refused prefixes: %d, %v", n, err)
	}
}

const (
	testPG    = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	testMySQL = "mysql://root@127.0.0.1:3306/test"
)

// openDB opens a DSN of stockctl's forms through stockctl's own parser. It skips when env, the
// variable that turns this server's suites on, is unset, and fails when it is set and the
// server does not answer. The DSNs are stockctl's own forms on this machine's services, whatever
// the variable's value: the test is about how stockctl reads them.
func openDB(t *testing.T, env, dsn string) *sql.DB {
	t.Helper()
	if os.Getenv(env) == "" {
		t.Skipf("real-server test: set %s to run it", env)
	}
	driver, d, _, err := parseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open(driver, d)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		t.Fatalf("%s is set, and %s does not answer: %v", env, redact(dsn), err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestServerDatabases(t *testing.T) {
	clearEnv(t)
	for _, tc := range []struct{ name, env, dsn, wrongDB, wrongPW string }{
		{"postgres", "STOCK_TEST_POSTGRES", testPG, "postgres://postgres@127.0.0.1:5432/no_such_db_op?sslmode=disable",
			"postgres://no_such_user_op:S3cretPW-op@127.0.0.1:5432/test?sslmode=disable"},
		{"mariadb", "STOCK_TEST_MYSQL", testMySQL, "mysql://root@127.0.0.1:3306/no_such_db_op",
			"mysql://root:S3cretPW-op@127.0.0.1:3306/test"},
		{"mariadb go-sql-driver form", "STOCK_TEST_MYSQL", "mysql:root@tcp(127.0.0.1:3306)/test", "mysql:root@tcp(127.0.0.1:3306)/no_such_db_op",
			"mysql:root:S3cretPW-op@tcp(127.0.0.1:3306)/test"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := openDB(t, tc.env, tc.dsn)
			prefix := fmt.Sprintf("op_%d_", time.Now().UnixNano()%1e9)
			t.Cleanup(func() {
				for _, tb := range []string{"items", "records"} {
					_, _ = db.Exec("DROP TABLE IF EXISTS " + prefix + tb)
				}
			})
			for i := range 2 {
				res := runCLI(t, "-dsn", tc.dsn, "-table-prefix", prefix, "-json", "migrate")
				var m struct{ Tables []string }
				if res.code != 0 || json.Unmarshal([]byte(res.out), &m) != nil || len(m.Tables) != 2 {
					t.Fatalf("migrate #%d: %v", i+1, res)
				}
			}
			for _, tb := range []string{"items", "records"} {
				var n int
				if err := db.QueryRow("SELECT COUNT(*) FROM " + prefix + tb).Scan(&n); err != nil || n != 0 {
					t.Errorf("table %s%s after migrate twice: %d rows, %v", prefix, tb, n, err)
				}
			}
			for what, dsn := range map[string]string{"wrong database": tc.wrongDB, "wrong password or user": tc.wrongPW} {
				res := runCLI(t, "-dsn", dsn, "-table-prefix", prefix, "migrate")
				if res.code != exitFail || res.took > 30*time.Second {
					t.Errorf("%s: want exit 1 within 30s\n%v", what, res)
				}
				if !strings.Contains(res.err, "database") {
					t.Errorf("%s: the error does not say the database failed\n%v", what, res)
				}
				if strings.Contains(res.err+res.out, "S3cretPW-op") {
					t.Errorf("%s: the password is printed\n%v", what, res)
				}
			}
			// A store without tables (another prefix) is named with the way out.
			if s := os.Getenv(redistest.EnvServer); s != "" {
				srv := redistest.StartServer(t)
				if res := runCLI(t, "-redis", srv.Addr(), "load", "x", "3"); res.code != 0 {
					t.Fatal(res)
				}
				res := runCLI(t, "-redis", srv.Addr(), "-dsn", tc.dsn, "-table-prefix", prefix+"none_", "reconcile")
				if res.code != exitFail || !strings.Contains(res.err, "migrate") {
					t.Errorf("reconcile on a database without the tables: want exit 1 and the migrate hint\n%v", res)
				}
			}
		})
	}
}

// ---------------------------------------------------------------------------------------------
// Commands over every item: 0 items and many.

func TestEveryItemEmpty(t *testing.T) {
	addr, c := privateClient(t)
	dsn := sqliteDSN(t)
	if res := runCLI(t, "-dsn", dsn, "migrate"); res.code != 0 {
		t.Fatal(res)
	}
	for _, cmd := range [][]string{{"levels"}, {"items"}, {"sweep"}, {"-dsn", dsn, "reconcile"},
		{"-dsn", dsn, "reconcile", "-apply"}, {"-dsn", dsn, "relay-once"}, {"-dsn", dsn, "levels"}} {
		res := runCLI(t, append([]string{"-redis", addr}, cmd...)...)
		if res.code != 0 {
			t.Errorf("%v on an empty Redis: %v", cmd, res)
		}
	}
	res := runCLI(t, "-redis", addr, "sweep")
	if !strings.Contains(res.out, "released 0 units") {
		t.Errorf("sweep: %v", res)
	}
	res = runCLI(t, "-redis", addr, "-dsn", dsn, "reconcile")
	if !strings.Contains(res.out, "items: 0,") {
		t.Errorf("reconcile: %v", res)
	}
	// Nothing but what a reconcile -apply pass records (the epoch) may be there: no item keys.
	for k := range dumpKeys(t, c) {
		if strings.Contains(k, "{") && !strings.Contains(k, "{~") {
			t.Errorf("an item key appeared on an empty Redis: %q", k)
		}
	}
}

func TestEveryItemMany(t *testing.T) {
	addr, c := privateClient(t)
	r := serverReserver(t, c, "stock")
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "many.db")
	dsn := "sqlite:" + path
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st, err := sqlstore.New(db, sqlstore.SQLite)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 1200
	var skus []string
	for i := range n {
		sku := fmt.Sprintf("m:%04d~é", i)
		skus = append(skus, sku)
		if err := st.Load(ctx, sku, 20); err != nil {
			t.Fatal(err)
		}
		if err := r.Load(ctx, sku, 20); err != nil {
			t.Fatal(err)
		}
	}
	// Every 10th item: a sale; every 7th: a hold that expires at once.
	var sales, expiring int64
	for i, sku := range skus {
		if i%10 == 0 {
			if _, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: "o", Qty: 2}); err != nil {
				t.Fatal(err)
			}
			sales++
		}
		if i%7 == 0 {
			if _, err := r.Hold(ctx, stock.Request{SKU: sku, ID: "h", Qty: 3}, time.Millisecond); err != nil {
				t.Fatal(err)
			}
			expiring += 3
		}
	}
	time.Sleep(50 * time.Millisecond)

	res := runCLI(t, "-redis", addr, "-json", "items")
	var items []string
	if err := json.Unmarshal([]byte(res.out), &items); err != nil || len(items) != n || !slices.IsSorted(items) {
		t.Fatalf("items: %d, sorted %v, %v", len(items), slices.IsSorted(items), err)
	}
	res = runCLI(t, "-redis", addr, "-json", "levels")
	var rows []levelsJSON
	if err := json.Unmarshal([]byte(res.out), &rows); err != nil || res.code != 0 || len(rows) != n {
		t.Fatalf("levels: %d rows, %v\n%s", len(rows), err, res.err)
	}
	for _, row := range rows {
		if row.Available+row.Held+row.Sold != row.Loaded || row.Loaded != 20 {
			t.Errorf("levels %+v", row)
		}
	}
	// Report-only reconcile: the sales are in flight, no drift.
	res = runCLI(t, "-redis", addr, "-dsn", dsn, "-json", "reconcile")
	var rep struct {
		Found, Left bool
		Reports     []reportJSON
	}
	if err := json.Unmarshal([]byte(res.out), &rep); err != nil || res.code != 0 || len(rep.Reports) != n || rep.Found {
		t.Errorf("reconcile: exit %d, %d reports, found %v, %v\n%s", res.code, len(rep.Reports), rep.Found, err, res.err)
	}
	// sweep releases every expired hold, of every item.
	res = runCLI(t, "-redis", addr, "-json", "sweep")
	var sw struct{ Released int64 }
	if err := json.Unmarshal([]byte(res.out), &sw); err != nil || res.code != 0 || sw.Released != expiring {
		t.Errorf("sweep: released %d, want %d; %v\n%v", sw.Released, expiring, err, res.err)
	}
	var held int64
	for _, sku := range skus {
		lv, err := r.Levels(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		held += lv.Held
	}
	if held != 0 {
		t.Errorf("held after sweep: %d", held)
	}
	res = runCLI(t, "-redis", addr, "-json", "sweep")
	if err := json.Unmarshal([]byte(res.out), &sw); err != nil || sw.Released != 0 {
		t.Errorf("second sweep: released %d, %v", sw.Released, err)
	}
	// relay-once delivers every sale (the expired holds queue nothing for the store, or their
	// release with them).
	res = runCLI(t, "-redis", addr, "-dsn", dsn, "-json", "relay-once")
	var rl struct{ Delivered, Claimed, Refused int }
	if err := json.Unmarshal([]byte(res.out), &rl); err != nil || res.code != 0 || rl.Refused != 0 {
		t.Fatalf("relay-once: %+v %v\n%v", rl, err, res)
	}
	for _, sku := range skus {
		if p, d, err := stockops.Pending(ctx, r, sku); err != nil || p != 0 || d != 0 {
			t.Fatalf("%s after relay-once: pending %d dead %d %v", sku, p, d, err)
		}
	}
	var remaining int64
	if err := db.QueryRow("SELECT SUM(remaining) FROM stock_items").Scan(&remaining); err != nil {
		t.Fatal(err)
	}
	if want := int64(n*20) - 2*sales; remaining != want {
		t.Errorf("store remaining %d, want %d", remaining, want)
	}
	res = runCLI(t, "-redis", addr, "-dsn", dsn, "reconcile", "-apply")
	if res.code != 0 || !strings.Contains(res.out, fmt.Sprintf("items: %d, with drift or losses: 0", n)) {
		t.Errorf("reconcile -apply after relay: %v", res.code)
		t.Log(res.err, lastLines(res.out, 3))
	}
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

// ---------------------------------------------------------------------------------------------
// Closing, delisting and restoring do what the help says, no more.

func TestCloseDelistRestore(t *testing.T) {
	addr, c := privateClient(t)
	r := serverReserver(t, c, "stock")
	ctx := context.Background()
	loadAndSell(t, addr, r, 4)
	for i := range 2 {
		if res := runCLI(t, "-redis", addr, "close", "x"); res.code != 0 {
			t.Fatalf("close #%d: %v", i+1, res)
		}
	}
	if _, err := r.Deduct(ctx, stock.Request{SKU: "x", ID: "o2", Qty: 1}); !errors.Is(err, stock.ErrClosed) {
		t.Errorf("deduct on a closed item: %v", err)
	}
	// restore goes on while closed, once.
	res := runCLI(t, "-redis", addr, "-json", "restore", "x", "o1")
	var rc receiptJSON
	if err := json.Unmarshal([]byte(res.out), &rc); err != nil || res.code != 0 || rc.Qty != 4 || rc.Replayed {
		t.Errorf("restore: %+v %v\n%v", rc, err, res)
	}
	res = runCLI(t, "-redis", addr, "-json", "restore", "x", "o1")
	if err := json.Unmarshal([]byte(res.out), &rc); err != nil || res.code != 0 || !rc.Replayed {
		t.Errorf("restore replay: %+v %v\n%v", rc, err, res)
	}
	if lv, _ := r.Levels(ctx, "x"); lv.Available != 10 || lv.Sold != 0 {
		t.Errorf("after restore and its replay: %+v", lv)
	}
	// restore of an unknown id: refused, nothing written; with -tombstone a late deduct is refused.
	before := stableDump(t, c)
	if res := runCLI(t, "-redis", addr, "restore", "x", "late"); res.code != exitFail || !strings.Contains(res.err, "-tombstone") {
		t.Errorf("restore of an unknown id: %v", res)
	}
	if after := dumpKeys(t, c); !sameDump(before, after) {
		t.Errorf("restore without -tombstone wrote:\n%s", diffDump(before, after))
	}
	if res := runCLI(t, "-redis", addr, "reopen", "x"); res.code != 0 {
		t.Fatal(res)
	}
	if res := runCLI(t, "-redis", addr, "restore", "-tombstone", "x", "late"); res.code != 0 {
		t.Fatal(res)
	}
	if _, err := r.Deduct(ctx, stock.Request{SKU: "x", ID: "late", Qty: 1}); !errors.Is(err, stock.ErrRestored) {
		t.Errorf("late deduct after a tombstone: %v", err)
	}
	// delist: reopen refuses, delist twice does nothing.
	for i := range 2 {
		if res := runCLI(t, "-redis", addr, "delist", "x"); res.code != 0 {
			t.Fatalf("delist #%d: %v", i+1, res)
		}
	}
	if res := runCLI(t, "-redis", addr, "reopen", "x"); res.code == 0 {
		t.Errorf("reopen of a delisted item accepted: %v", res)
	}
	if lv, _ := r.Levels(ctx, "x"); !lv.Closed {
		t.Errorf("delisted item open: %+v", lv)
	}
	// load of a live item never overwrites.
	if res := runCLI(t, "-redis", addr, "load", "x", "999"); res.code != exitFail || !strings.Contains(res.err, "restock") {
		t.Errorf("load of a live item: %v", res)
	}
	if lv, _ := r.Levels(ctx, "x"); lv.Loaded != 10 {
		t.Errorf("load overwrote: %+v", lv)
	}
}

// -timeout bounds a run even when Redis answers slowly: a tiny timeout fails cleanly.
func TestTinyTimeout(t *testing.T) {
	s := privateServer(t)
	res := runCLI(t, "-redis", s.Addr(), "-timeout", "1ns", "load", "x", "5")
	if res.code != exitFail || res.took > 30*time.Second {
		t.Errorf("-timeout 1ns: want exit 1 quickly\n%v", res)
	}
	if !strings.Contains(res.err, "deadline") && !strings.Contains(res.err, "timeout") && !strings.Contains(res.err, "unknown") {
		t.Errorf("-timeout 1ns: the error does not say the time ran out\n%v", res)
	}
}
