package main

// stockctl as an operator types it, checked against its help text and the README's "Operating
// it": the command line and its usage errors, unreachable services, bad names and quantities,
// unknown items, bad DSNs, JSON output, read-only commands, commands over every item, and
// Sentinel. Tests that need a private redis-server skip
// without STOCK_REDIS_SERVER; the PostgreSQL and MariaDB cases skip when those servers do not
// answer.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
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
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/sqlstore"
	"github.com/stockres/stock/stockops"
)

// ---------------------------------------------------------------------------------------------
// The command line: help, unknown commands, bad flags, missing arguments, bad names, -prefix,
// -dsn, -sentinel and quantities. None of it needs Redis: a command line that is wrong whatever
// Redis says is a usage error (exit 2), found before connecting.

// Every row: the exit code, and what stdout and stderr contain. Help goes to stdout and exits 0
// with nothing on stderr; a usage error exits 2 with nothing on stdout, never says it tried to
// connect, and a quantity out of range names the whole range, never "not a whole number".
func TestHelpAndUsageExitCodes(t *testing.T) {
	clearEnv(t)
	closed := closedAddr(t) // nothing of these must reach Redis
	dsn := sqliteDSN(t)
	const max = ", 9007199254740991]"
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
		{[]string{"help", "ledger"}, 0, "usage: stockctl ledger SKU [-limit N] [-state STATE]", ""},
		{[]string{"load", "-h"}, 0, "usage: stockctl load SKU QTY", ""},
		{[]string{"-redis", closed, "reconcile", "-h"}, 0, "usage: stockctl reconcile", ""},
		{[]string{"ledger", "x", "-h"}, 0, "usage: stockctl ledger", ""},
		{[]string{}, 2, "", "Usage:"},
		{[]string{"-json"}, 2, "", "Usage:"},
		{[]string{"frobnicate"}, 2, "", `unknown command "frobnicate"`},
		{[]string{"LOAD", "x", "1"}, 2, "", `unknown command "LOAD"`},
		{[]string{"help", "frobnicate"}, 2, "", `unknown command "frobnicate"`},
		{[]string{"help", "load", "extra"}, 2, "", "usage: stockctl help"},
		{[]string{"-bogus", "items"}, 2, "", "flag provided but not defined: -bogus"},
		{[]string{"-redis", closed, "items", "-bogus"}, 2, "", "-bogus"},
		{[]string{"-redis", closed, "levels", "-bogus"}, 2, "", "flag provided but not defined: -bogus"},
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
		{[]string{"-redis", closed, "ledger", "A", "-state", "lost"}, 2, "", `-state "lost"`},
		{[]string{"-redis", closed, "reconcile", "-repair-limit", "-1"}, 2, "", "-repair-limit -1 is negative"},
		{[]string{"-redis", closed, "reconcile", "-retention", "-1h"}, 2, "", "-retention -1h0m0s is negative"},
		{[]string{"-redis", closed, "load", "x", "ten"}, 2, "", `QTY "ten" is not a whole number`},
		{[]string{"-redis", closed, "restock", "x", "po", "0"}, 2, "", "QTY 0 out of range [1, 9007199254740991]"},
		{[]string{"-redis", closed, "load", "x", "99999999999999999999"}, 2, "", "99999999999999999999 out of range ["},
		{[]string{"-redis", closed, "load", "x", "+99999999999999999999"}, 2, "", "99999999999999999999 out of range ["},
		{[]string{"-redis", closed, "load", "--", "x", "-99999999999999999999"}, 2, "", "99999999999999999999 out of range ["},
		{[]string{"-redis", closed, "restock", "x", "po", "99999999999999999999"}, 2, "", "99999999999999999999 out of range ["},
		{[]string{"migrate"}, 2, "", "needs the database of record: -dsn"},
		{[]string{"-redis", closed, "reconcile"}, 2, "", "reconcile needs the database of record: -dsn"},
		{[]string{"-redis", closed, "reconcile", "x"}, 2, "", "reconcile needs the database of record: -dsn"},
		{[]string{"-redis", closed, "relay-once"}, 2, "", "relay-once needs the database of record: -dsn"},
		{[]string{"-redis", closed, "relay-once", "A"}, 2, "", "relay-once needs the database of record: -dsn"},
		{[]string{"-redis", "", "items"}, 2, "", "-redis"},
		{[]string{"-redis", "localhost", "items"}, 2, "", "-redis"},
		{[]string{"-redis", "nohost", "items"}, 2, "", "want host:port"},
		{[]string{"-sentinel", "noatsign", "items"}, 2, "", "-sentinel"},
		{[]string{"-sentinel", "127.0.0.1:26379", "available", "A"}, 2, "", "-sentinel"},
		{[]string{"-sentinel", "127.0.0.1:26379", "available", "A"}, 2, "", "name@host:port"},
		{[]string{"-dsn", "oracle://x/y", "migrate"}, 2, "", "-dsn"},
		{[]string{"-dsn", "oracle://x", "reconcile"}, 2, "", `unknown database "oracle"`},
		{[]string{"-dsn", "sqlite:", "migrate"}, 2, "", "-dsn"},
		{[]string{"-redis", closed, "-dsn", "oracle://x/y", "load", "x", "5"}, 2, "", "-dsn"},
		{[]string{"-redis", closed, "-dsn", "sqlite:", "levels"}, 2, "", "-dsn"},
		{[]string{"-redis", closed, "-dsn", "oracle://x/y", "relay-once"}, 2, "", "-dsn"},
		// Names (SKU, ID) of every command, and -prefix, refused as the library would.
		{[]string{"-redis", closed, "available", "a{b}"}, 2, "", "braces"},
		{[]string{"-redis", closed, "load", "a|b", "5"}, 2, "", "invalid"},
		{[]string{"-redis", closed, "load", "a b", "5"}, 2, "", "invalid"},
		{[]string{"-redis", closed, "restock", "a b", "po", "5"}, 2, "", "invalid"},
		{[]string{"-redis", closed, "restock", "x", "p|o", "5"}, 2, "", "invalid"},
		{[]string{"-redis", closed, "available", "{x}"}, 2, "", "invalid"},
		{[]string{"-redis", closed, "levels", "x", "a b"}, 2, "", "invalid"},
		{[]string{"-redis", closed, "entry", "x", ""}, 2, "", "invalid"},
		{[]string{"-redis", closed, "ledger", "a\tb"}, 2, "", "invalid"},
		{[]string{"-redis", closed, "close", "a}"}, 2, "", "invalid"},
		{[]string{"-redis", closed, "reopen", "a{"}, 2, "", "invalid"},
		{[]string{"-redis", closed, "delist", "a|"}, 2, "", "invalid"},
		{[]string{"-redis", closed, "restore", "x", "o 1"}, 2, "", "invalid"},
		{[]string{"-redis", closed, "restore", "-tombstone", "x y", "o1"}, 2, "", "invalid"},
		{[]string{"-redis", closed, "sweep", "a b"}, 2, "", "invalid"},
		{[]string{"-redis", closed, "-dsn", dsn, "reconcile", "x", "a b"}, 2, "", "invalid"},
		{[]string{"-redis", closed, "-dsn", dsn, "relay-once", "a b"}, 2, "", "invalid"},
		{[]string{"-redis", closed, "-prefix", "a{b", "items"}, 2, "", "-prefix"},
		{[]string{"-redis", closed, "-prefix", "", "items"}, 2, "", "-prefix"},
		{[]string{"-redis", closed, "-prefix", "a|b", "levels"}, 2, "", "-prefix"},
		{[]string{"-redis", closed, "-prefix", strings.Repeat("p", 129), "sweep"}, 2, "", "-prefix"},
		// -prefix is not migrate's business.
		{[]string{"-prefix", "a b", "-dsn", dsn, "migrate"}, 0, "ready", ""},
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
			if tc.code != 2 {
				return
			}
			if res.out != "" || strings.Contains(res.err, "connect to") {
				t.Fatalf("a usage error wrote to stdout or tried to connect\n%v", res)
			}
			if strings.Contains(res.err, "out of range [") && (!strings.Contains(res.err, max) || strings.Contains(res.err, "not a whole number")) {
				t.Fatalf("a whole number out of range is not reported with its range\n%v", res)
			}
		})
	}
}

// The help lists every command, the exit statuses and -redis; each command's help, through help
// NAME and NAME -h, starts with its usage line and gives an example.
func TestHelpListsEveryCommand(t *testing.T) {
	clearEnv(t)
	for _, args := range [][]string{{"-h"}, {"help"}, {"help", "help"}} {
		res := runCLI(t, args...)
		assert.Equal(t, exitOK, res.code, args)
		for _, name := range commandNames() {
			assert.Contains(t, res.out, "\n  "+name+" ", "%v lists %s", args, name)
		}
		assert.Contains(t, res.out, "Exit status")
		assert.Contains(t, res.out, "-redis ADDR")
	}
	for _, name := range commandNames() {
		for _, args := range [][]string{{"help", name}, {name, "-h"}} {
			res := runCLI(t, args...)
			assert.Equal(t, exitOK, res.code, args)
			assert.True(t, strings.HasPrefix(res.out, "usage: stockctl "+name), res.out)
			assert.Contains(t, res.out, "Example:\n  stockctl ", args)
		}
	}
}

// offlineClient is a rueidis.Client that is never called: stock.New only keeps it, which lets
// the tests ask the library whether it takes a name without any Redis.
type offlineClient struct{ rueidis.Client }

// A name the library refuses is refused before connecting by checkName, and checkName refuses
// exactly what the library refuses, so that its early refusal changes no answer: a name it
// refused and the library takes could not be used at all.
func TestCheckNameAsTheLibrary(t *testing.T) {
	names := []string{"a", "sneaker-42", "b:c", "~", ":", "ünïcødé", "日本語", "-dash", "a.b", "a/b", "a@b", "a%b",
		strings.Repeat("x", 128), strings.Repeat("é", 64), "a\u200bb", "a\u00adb", "\U0001F600"}
	for _, n := range badNames() {
		names = append(names, n)
	}
	names = append(names, "a\u2028b", "a\u0085b", "a\ufeffb", "a\x00b", strings.Repeat("é", 65))
	for _, n := range names {
		_, libErr := stock.New(offlineClient{}, stock.WithPrefix(n))
		if libErr != nil && !errors.Is(libErr, stock.ErrInvalid) {
			t.Fatalf("%q: %v", n, libErr)
		}
		err := checkName("SKU", n)
		if (err == nil) != (libErr == nil) {
			t.Errorf("%q: checkName says %v, the library %v", n, err, libErr)
		}
		var ue usageError
		if err != nil && (!errors.As(err, &ue) || !strings.Contains(err.Error(), "invalid")) {
			t.Errorf("%q: %v is not a usage error saying invalid", n, err)
		}
	}
}

// ---------------------------------------------------------------------------------------------
// Redis unreachable: a closed port and a server that never answers.

// With Redis unreachable every command fails (exit 1) within its -timeout and says Redis.
func TestUnreachableRedisIsBounded(t *testing.T) {
	clearEnv(t)
	dsn := sqliteDSN(t)
	mustCLI(t, "-dsn", dsn, "migrate")
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
			assert.EqualValues(t, "", res.out, "%v: wrote to stdout\n%v", c, res)
		}
		// The error names the address it could not reach.
		res := runCLI(t, "-redis", "127.0.0.1:1", "-timeout", "5s", "available", "A")
		if res.code != exitFail || !strings.Contains(res.err, "connect to Redis at 127.0.0.1:1") {
			t.Errorf("want exit 1 naming the address\n%v", res)
		}
	})
	t.Run("server that never answers", func(t *testing.T) {
		addr := silentAddr(t)
		var wg sync.WaitGroup
		for _, c := range cmds {
			wg.Go(func() {
				res := runCLI(t, append([]string{"-redis", addr, "-timeout", "3s"}, c...)...)
				if res.code != exitFail || res.took > 30*time.Second || res.err == "" {
					t.Errorf("%v -timeout 3s: want exit 1 within 30s with an error\n%v", c, res)
				}
			})
		}
		wg.Wait()
	})
	t.Run("server that never answers, default timeout", func(t *testing.T) {
		res := runCLI(t, "-redis", silentAddr(t), "levels")
		if res.code != exitFail || res.took > 70*time.Second || res.err == "" {
			t.Errorf("want exit 1 within the 1m default -timeout (70s allowed)\n%v", res)
		}
	})
	t.Run("tiny timeout", func(t *testing.T) {
		res := runCLI(t, "-redis", privateServer(t).Addr(), "-timeout", "1ns", "load", "x", "5")
		if res.code != exitFail || res.took > 30*time.Second {
			t.Errorf("-timeout 1ns: want exit 1 quickly\n%v", res)
		}
		if !strings.Contains(res.err, "deadline") && !strings.Contains(res.err, "timeout") && !strings.Contains(res.err, "unknown") {
			t.Errorf("-timeout 1ns: the error does not say the time ran out\n%v", res)
		}
	})
}

// Passwords of -redis, -sentinel and -dsn never reach stdout or stderr, whatever the message:
// stockctl redacts a DSN's password, and internal/redisaddr, the -redis parser, promises "Its
// errors never show a password". An operator's stderr goes to cron mail and logs.
func TestPasswordsNotPrinted(t *testing.T) {
	clearEnv(t)
	const secret = "Pw-0ps-Secret"
	closed := closedAddr(t)
	shown := func(res cliResult) bool {
		return strings.Contains(res.err+res.out, secret) || strings.Contains(res.err+res.out, "Pw%2D0ps")
	}
	for _, args := range [][]string{
		{"-redis", "redis://ops:" + secret + "@" + closed, "items"},
		{"-redis", "redis://ops:Pw%2D0ps%2DSecret@" + closed, "items"},
		{"-redis", "rediss://:" + secret + "@" + closed + "/0", "levels", "x"},
		{"-redis", "unix://ops:" + secret + "@/nonexistent/redis.sock", "items"},
		{"-redis", "redis://ops:" + secret + "@" + closed + "/notadb", "items"},
		{"-sentinel", "m@redis://ops:" + secret + "@" + closed, "items"},
		{"-sentinel", "redis://ops:" + secret + "@" + closed, "items"},
		{"-sentinel", "m@" + closed, "-redis", "redis://ops:" + secret + "@" + closed, "items"},
		{"-dsn", "mysql://root:" + secret + "@" + closed + "/x", "migrate"},
		{"-dsn", "mysql:root:" + secret + "@tcp(" + closed + ")/x", "migrate"},
		{"-dsn", "postgres://u:" + secret + "@" + closed + "/x?sslmode=disable", "migrate"},
		{"-dsn", "postgres://u:" + secret + "@" + closed + "/x?sslmode=bogus", "migrate"},
	} {
		res := runCLI(t, append(args, "-timeout", "5s")...)
		if res.code == exitOK || res.err == "" {
			t.Errorf("%q: want a failure\n%v", args, res)
		}
		if shown(res) {
			t.Errorf("%q: the password is printed\n%v", args, res)
		}
	}
	// A redis:// URL on a closed port is a connection failure (exit 1).
	if res := runCLI(t, "-redis", "redis://ops:"+secret+"@"+closed, "levels"); res.code != exitFail || shown(res) {
		t.Errorf("closed port: want exit 1 without the password\n%v", res)
	}
	t.Run("wrong password", func(t *testing.T) {
		addr, c := privateClient(t)
		require.NoError(t, c.Do(context.Background(), c.B().ConfigSet().ParameterValue().ParameterValue("requirepass", "right-one").Build()).Error())
		res := runCLI(t, "-redis", "redis://:"+secret+"@"+addr, "levels")
		if res.code != exitFail || !strings.Contains(res.err, "WRONGPASS") || shown(res) {
			t.Fatalf("want exit 1 with WRONGPASS, without the password\n%v", res)
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

// A name the library refuses is refused by every command (exit 2, saying what is wrong), and
// nothing is written to Redis or the store.
func TestBadNamesRefusedWholly(t *testing.T) {
	addr, c := privateClient(t)
	dsn := sqliteDSN(t)
	mustCLI(t, "-redis", addr, "-dsn", dsn, "load", "good", "10")
	r := serverReserver(t, c, "stock")
	_, err := r.Deduct(context.Background(), stock.Request{SKU: "good", ID: "o1", Qty: 2})
	require.NoError(t, err)
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
	wroteNothing(t, c, before, false, "refused commands")
	// The store has nothing but "good".
	n := sqliteCount(t, dsn, "SELECT COUNT(*) FROM stock_items")
	assert.EqualValues(t, 1, n, "store items: %d; want 1 (good)", n)
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
		mustCLI(t, "-redis", addr, "load", "--", n, strconv.FormatInt(q, 10))
		want[n] = q
	}
	// A restock and a sale of each, with ids that look like keys.
	for i, n := range names {
		mustCLI(t, "-redis", addr, "restock", "--", n, "po:"+strconv.Itoa(i), strconv.Itoa(i+1))
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
		require.NoError(t, err, "levels %q", n)
		if lv.Loaded != want[n] || lv.Available != want[n]-1 || lv.Sold != 1 {
			t.Errorf("%q: %+v, want loaded %d, available %d, sold 1", n, lv, want[n], want[n]-1)
		}
		es := decode[[]entryJSON](t, mustCLI(t, "-redis", addr, "-json", "ledger", "--", n).out)
		assert.Len(t, es, 2, "ledger %q: %d entries; want 2", n, len(es))
		av := decode[map[string]any](t, runCLI(t, "-redis", addr, "-json", "available", "--", n).out)
		if av["sku"] != n || av["available"] != float64(want[n]-1) {
			t.Errorf("available %q: %v", n, av)
		}
	}
	got := decode[[]string](t, runCLI(t, "-redis", addr, "-json", "items").out)
	wantItems := slices.Clone(names)
	slices.Sort(wantItems)
	if !slices.Equal(got, wantItems) {
		t.Errorf("items %q, want %q", got, wantItems)
	}
	// Closing one item closes no other.
	mustCLI(t, "-redis", addr, "close", "tee:u")
	for _, n := range names {
		lv, _ := r.Levels(ctx, n)
		if lv.Closed != (n == "tee:u") {
			t.Errorf("%q closed=%v after close tee:u", n, lv.Closed)
		}
	}
}

// ---------------------------------------------------------------------------------------------
// Quantities.

// QTY is a whole number from 0 (load) to 2^53-1 in plain decimal; anything else is refused
// naming QTY, and creates nothing; a restock past 2^53-1 is refused and leaves its id free.
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
			assert.ErrorIs(t, err, stock.ErrNotLoaded, "load %s %q was refused but the item exists: %+v %v", sku, tc.qty, lv, err)
			assert.Contains(t, res.err, "QTY", "load %s %q: the refusal does not name QTY\n%v", sku, tc.qty, res)
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
	lv, _ := r.Levels(ctx, "q1")
	assert.EqualValues(t, 1, lv.Loaded, "after a refused restock: %+v", lv)
	mustCLI(t, "-redis", addr, "restock", "q1", "po-max", "5") // the id of the refused restock is free
	if lv, _ := r.Levels(ctx, "q1"); lv.Loaded != 6 || lv.Available != 6 {
		t.Errorf("after restock 5: %+v", lv)
	}
	// Replaying the restock adds nothing; the same id with another quantity is refused.
	if rc := decode[receiptJSON](t, mustCLI(t, "-redis", addr, "-json", "restock", "q1", "po-max", "5").out); !rc.Replayed {
		t.Errorf("replayed restock: %+v", rc)
	}

	if res := runCLI(t, "-redis", addr, "restock", "q1", "po-max", "6"); res.code == 0 {
		t.Errorf("the same restock id with another QTY accepted\n%v", res)
	}
	lv, _ = r.Levels(ctx, "q1")
	assert.EqualValues(t, 6, lv.Loaded, "after replays: %+v", lv)
}

// ---------------------------------------------------------------------------------------------
// Items that do not exist.

// Commands on an item Redis does not know exit 1, say the item is not loaded (most with the
// item's name and nothing on stdout) and write nothing, on an empty Redis and beside a loaded
// item: restore -tombstone of a typo included, which must not leave a ledger key for an item
// that never sells.
func TestUnknownItemChangesNothing(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	cmds := []struct {
		args  []string
		quiet bool // "item not loaded: ghost", and nothing on stdout
	}{
		{[]string{"available", "ghost"}, false}, {[]string{"levels", "ghost"}, false}, {[]string{"close", "ghost"}, true},
		{[]string{"reopen", "ghost"}, false}, {[]string{"delist", "ghost"}, false}, {[]string{"restock", "ghost", "po", "5"}, true},
		{[]string{"entry", "ghost", "o1"}, true}, {[]string{"ledger", "ghost"}, true}, {[]string{"restore", "ghost", "o1"}, true},
		{[]string{"restore", "-tombstone", "ghost", "o1"}, true}, {[]string{"sweep", "ghost"}, true},
	}
	refused := func(sku string, quiet bool, args ...string) {
		t.Helper()
		res := h.run(args...)
		assert.Equal(t, exitFail, res.code, args)
		assert.Contains(t, res.err, "not loaded", args)
		if quiet {
			assert.Contains(t, res.err, "item not loaded: "+sku, args)
			assert.Empty(t, res.out, args)
		}
	}
	for _, c := range cmds {
		refused("ghost", c.quiet, c.args...)
		n, err := h.client.Do(ctx, h.client.B().Dbsize().Build()).AsInt64()
		require.NoError(t, err)
		require.Zero(t, n, "%v on an unknown item wrote keys to an empty Redis", c.args)
	}
	// -json levels of a missing item: still JSON, with the error labelled.
	res := h.run("-json", "levels", "ghost")
	if rows := decode[[]levelsJSON](t, res.out); res.code != exitFail || len(rows) != 1 || rows[0].Error != "not_loaded" {
		t.Errorf("-json levels ghost: %+v\n%v", rows, res)
	}
	// Beside a loaded item: a restore of a typo writes nothing at all (DUMP needs a real Redis),
	// and no command writes a key of the unknown item. (A refused restock records a due-work
	// hint for the relay from a goroutine, which the closing client usually, not always, cuts
	// off: the hint sets are not the item's keys.)
	require.Equal(t, exitOK, h.run("load", "sneaker-42", "10").code)
	var before map[string]string
	if redistest.ServerBinary(t) != "" {
		before = stableDump(t, h.client)
	}
	refused("sneakr-42", true, "restore", "sneakr-42", "order-1001")
	refused("sneakr-42", true, "restore", "-tombstone", "sneakr-42", "order-1001")
	if before != nil {
		wroteNothing(t, h.client, before, false, "restore on an unknown item")
	}
	for _, c := range cmds {
		refused("ghost", c.quiet, c.args...)
	}
	keys, err := h.client.Do(ctx, h.client.B().Keys().Pattern("*ghost*").Build()).AsStrSlice()
	require.NoError(t, err)
	assert.Empty(t, keys, "commands on an unknown item wrote")
}

// ---------------------------------------------------------------------------------------------
// Read-only commands write nothing.

// The read-only commands, in text and JSON, write nothing to Redis, whatever the items hold.
func TestReadOnlyCommandsWriteNothing(t *testing.T) {
	addr, c := privateClient(t)
	dsn := sqliteDSN(t)
	for _, sku := range []string{"a", "b:c", "ünï"} {
		mustCLI(t, "-redis", addr, "-dsn", dsn, "load", sku, "50")
	}
	mustCLI(t, "-redis", addr, "load", "redis-only", "7")
	r := serverReserver(t, c, "stock")
	ctx := context.Background()
	must := func(_ stock.Receipt, err error) {
		t.Helper()
		require.NoError(t, err)
	}
	must(r.Deduct(ctx, stock.Request{SKU: "a", ID: "o1", Qty: 3, User: "u1"}))
	must(r.Hold(ctx, stock.Request{SKU: "a", ID: "h-live", Qty: 2}, time.Hour))
	must(r.Hold(ctx, stock.Request{SKU: "a", ID: "h-exp", Qty: 4}, 50*time.Millisecond))
	must(r.Hold(ctx, stock.Request{SKU: "b:c", ID: "h-exp", Qty: 1}, 50*time.Millisecond))
	must(r.Restock(ctx, "b:c", "po1", 5))
	must(r.Deduct(ctx, stock.Request{SKU: "redis-only", ID: "o1", Qty: 1}))
	require.ErrorIs(t, testkit.Err(r.Restore(ctx, "ünï", "never")), stock.ErrUnknownID)
	require.NoError(t, r.CloseItem(ctx, "ünï"))
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
			wroteNothing(t, c, before, true, "read-only %v (%v)", args, res)
		}
	}
}

// ---------------------------------------------------------------------------------------------
// JSON output parses, on stdout only, for every command.

// With -json every command prints one JSON value of its documented shape on stdout; an
// empty registry is [], not null.
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

// A command that needs the store's tables, on a database without them (or with another
// -table-prefix), fails with a hint to run migrate, and the sale waits, not dead-lettered.
// migrate is idempotent; then the documented way out, load -dsn with the units Redis accounts
// for, lets the relay and reconcile through.
func TestStoreWithoutTables(t *testing.T) {
	addr, c := privateClient(t)
	r := serverReserver(t, c, "stock")
	loadAndSell(t, addr, r, 3)
	dsn := sqliteDSN(t)
	withStore := func(args ...string) cliResult {
		t.Helper()
		return runCLI(t, append([]string{"-redis", addr, "-dsn", dsn}, args...)...)
	}
	for _, cmd := range [][]string{{"reconcile"}, {"reconcile", "x"}, {"levels", "x"}, {"relay-once", "x"}} {
		withStore(cmd...).wantErr(t, exitFail, "migrate")
	}
	if p, d, err := stockops.Pending(context.Background(), r, "x"); err != nil || p != 1 || d != 0 {
		t.Errorf("after relay-once into a store without tables: pending %d, dead %d, %v; want 1, 0", p, d, err)
	}
	for range 2 { // migrate is idempotent
		withStore("migrate").want(t, exitOK, "ready")
	}
	withStore("-table-prefix", "other_", "reconcile", "x").wantErr(t, exitFail, "migrate")
	// load -dsn with the units Redis accounts for (7 + 3 in flight), not another figure.
	if res := withStore("load", "x", "9"); res.code == exitOK {
		t.Errorf("load -dsn with the wrong figure accepted: %v", res)
	}
	for _, cmd := range [][]string{{"load", "x", "10"}, {"relay-once"}, {"reconcile"}} {
		withStore(cmd...).want(t, exitOK)
	}
	res := withStore("-json", "levels", "x")
	if rows := decode[[]levelsJSON](t, res.out); res.code != exitOK || len(rows) != 1 || rows[0].StoreRemaining == nil || *rows[0].StoreRemaining != 7 {
		t.Errorf("levels -dsn x: %v", res)
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
	n := sqliteCount(t, dsn, "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'")
	assert.EqualValues(t, 0, n, "tables after refused prefixes: %d", n)
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
	require.NoError(t, err)
	db, err := sql.Open(driver, d)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		t.Fatalf("%s is set, and %s does not answer: %v", env, redact(dsn), err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// On PostgreSQL and MariaDB (each in the forms stockctl reads, in tables of its own): migrate
// twice, a wrong database or password fails without printing the password, load, relay-once,
// levels and reconcile (with and without -apply) go through, an item loaded in Redis only gets
// its store side from load -dsn, and tables missing under another prefix are named with the way
// out.
func TestServerDatabases(t *testing.T) {
	clearEnv(t)
	for _, tc := range []struct{ name, env, dsn, wrongDB, wrongPW string }{
		{"postgres", "STOCK_TEST_POSTGRES", testPG, "postgres://postgres@127.0.0.1:5432/no_such_db_op?sslmode=disable",
			"postgres://no_such_user_op:S3cretPW-op@127.0.0.1:5432/test?sslmode=disable"},
		{"mariadb", "STOCK_TEST_MYSQL", testMySQL, "mysql://root@127.0.0.1:3306/no_such_db_op",
			"mysql://root:S3cretPW-op@127.0.0.1:3306/test"},
		{"mariadb go-sql-driver form", "STOCK_TEST_MYSQL", "mysql:root@tcp(127.0.0.1:3306)/test?parseTime=true",
			"mysql:root@tcp(127.0.0.1:3306)/no_such_db_op", "mysql:root:S3cretPW-op@tcp(127.0.0.1:3306)/test"},
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
				assert.Contains(t, res.err, "database", "%s: the error does not say the database failed\n%v", what, res)
				assert.NotContains(t, res.err+res.out, "S3cretPW-op", "%s: the password is printed\n%v", what, res)
			}

			h := newHarness(t)
			h.dsn, h.tables = tc.dsn, prefix
			require.Equal(t, exitOK, h.store("load", "A", "10").code)
			h.deduct("o1", "alice", 2)
			res := h.store("relay-once")
			require.Equal(t, exitOK, res.code, res.err)
			assert.Contains(t, res.out, "delivered 1 events")
			res = h.store("levels", "A")
			require.Equal(t, exitOK, res.code)
			assert.Equal(t, []string{"A", "8", "0", "2", "10", "no", "8"}, row(res.out, 1))
			assert.Equal(t, exitOK, h.store("reconcile").code)
			h.skew("A", -3)
			res = h.store("reconcile")
			assert.Equal(t, exitDrift, res.code)
			assert.Contains(t, res.out, "drift -3")
			res = h.store("reconcile", "-apply")
			assert.Equal(t, exitOK, res.code, "repaired: nothing left")
			assert.Contains(t, res.out, "repaired: adjusted +3")
			assert.Equal(t, exitOK, h.store("reconcile").code)

			// An item loaded in Redis only: reported with Redis's figures, then given its store
			// side by load -dsn with the stock Redis accounts for.
			require.Equal(t, exitOK, h.run("load", "C", "6").code)
			h.take("C", "c1", 2)
			res = h.store("reconcile", "C")
			assert.Equal(t, exitDrift, res.code)
			assert.Contains(t, res.out, "C: redis 4+0 held, store 0, in flight 2 (1 pending)")
			assert.Equal(t, exitFail, h.store("load", "C", "4").code)
			require.Equal(t, exitOK, h.store("load", "C", "6").code)
			require.Equal(t, exitOK, h.store("relay-once").code)
			res = h.store("reconcile", "C")
			assert.Equal(t, exitOK, res.code)
			assert.Contains(t, res.out, "C: redis 4+0 held, store 4, in flight 0 (0 pending), drift 0")

			// A store without tables (another prefix) is named with the way out.
			h.tables = prefix + "none_"
			if res := h.store("reconcile"); res.code != exitFail || !strings.Contains(res.err, "migrate") {
				t.Errorf("reconcile on a database without the tables: want exit 1 and the migrate hint\n%v", res)
			}
		})
	}
}

// ---------------------------------------------------------------------------------------------
// Commands over every item: 0 items and many.

// The commands over every item succeed on an empty Redis and create no item key.
func TestEveryItemEmpty(t *testing.T) {
	addr, c := privateClient(t)
	dsn := sqliteDSN(t)
	mustCLI(t, "-dsn", dsn, "migrate")
	for _, cmd := range [][]string{{"levels"}, {"items"}, {"sweep"}, {"-dsn", dsn, "reconcile"},
		{"-dsn", dsn, "reconcile", "-apply"}, {"-dsn", dsn, "relay-once"}, {"-dsn", dsn, "levels"}} {
		runCLI(t, append([]string{"-redis", addr}, cmd...)...).want(t, exitOK)
	}
	runCLI(t, "-redis", addr, "sweep").want(t, exitOK, "released 0 units")
	runCLI(t, "-redis", addr, "-dsn", dsn, "reconcile").want(t, exitOK, "items: 0,")
	// Nothing but what a reconcile -apply pass records (the epoch) may be there: no item keys.
	for k := range dumpKeys(t, c) {
		if strings.Contains(k, "{") && !strings.Contains(k, "{~") {
			t.Errorf("an item key appeared on an empty Redis: %q", k)
		}
	}
}

// The commands over every item cover 1200 items: items sorted, levels, a report-only reconcile,
// sweep of every expired hold, relay-once of every sale, and a final reconcile -apply.
func TestEveryItemMany(t *testing.T) {
	addr, c := privateClient(t)
	r := serverReserver(t, c, "stock")
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "many.db")
	dsn := "sqlite:" + path
	db, err := sql.Open("sqlite", path)
	require.NoError(t, err)
	defer db.Close()
	st, err := sqlstore.New(db, sqlstore.SQLite)
	require.NoError(t, err)
	require.NoError(t, st.Migrate(ctx))
	const n = 1200
	var skus []string
	for i := range n {
		sku := fmt.Sprintf("m:%04d~é", i)
		skus = append(skus, sku)
		require.NoError(t, st.Load(ctx, sku, 20))
		require.NoError(t, r.Load(ctx, sku, 20))
	}
	// Every 10th item: a sale; every 7th: a hold that expires at once.
	var sales, expiring int64
	for i, sku := range skus {
		if i%10 == 0 {
			_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: "o", Qty: 2})
			require.NoError(t, err)
			sales++
		}
		if i%7 == 0 {
			_, err := r.Hold(ctx, stock.Request{SKU: sku, ID: "h", Qty: 3}, time.Millisecond)
			require.NoError(t, err)
			expiring += 3
		}
	}
	time.Sleep(50 * time.Millisecond)

	res := runCLI(t, "-redis", addr, "-json", "items")
	if items := decode[[]string](t, res.out); len(items) != n || !slices.IsSorted(items) {
		t.Fatalf("items: %d, sorted %v", len(items), slices.IsSorted(items))
	}
	rows := decode[[]levelsJSON](t, runCLI(t, "-redis", addr, "-json", "levels").want(t, exitOK).out)
	require.Len(t, rows, n)
	for _, row := range rows {
		if row.Available+row.Held+row.Sold != row.Loaded || row.Loaded != 20 {
			t.Errorf("levels %+v", row)
		}
	}
	// Report-only reconcile: the sales are in flight, no drift.
	rep := decode[reconcileJSON](t, runCLI(t, "-redis", addr, "-dsn", dsn, "-json", "reconcile").want(t, exitOK).out)
	if len(rep.Reports) != n || rep.Found {
		t.Errorf("reconcile: %d reports, found %v", len(rep.Reports), rep.Found)
	}
	// sweep releases every expired hold, of every item.
	type sweepJSON struct{ Released int64 }
	if sw := decode[sweepJSON](t, runCLI(t, "-redis", addr, "-json", "sweep").want(t, exitOK).out); sw.Released != expiring {
		t.Errorf("sweep: released %d, want %d", sw.Released, expiring)
	}
	var held int64
	for _, sku := range skus {
		lv, err := r.Levels(ctx, sku)
		require.NoError(t, err)
		held += lv.Held
	}
	assert.EqualValues(t, 0, held, "held after sweep: %d", held)
	sw := decode[sweepJSON](t, runCLI(t, "-redis", addr, "-json", "sweep").out)
	assert.EqualValues(t, 0, sw.Released, "second sweep: released %d", sw.Released)
	// relay-once delivers every sale (the expired holds queue nothing for the store, or their
	// release with them).
	type relayJSON struct{ Delivered, Claimed, Refused int }
	rl := decode[relayJSON](t, runCLI(t, "-redis", addr, "-dsn", dsn, "-json", "relay-once").want(t, exitOK).out)
	require.EqualValues(t, 0, rl.Refused, "relay-once: %+v", rl)
	for _, sku := range skus {
		if p, d, err := stockops.Pending(ctx, r, sku); err != nil || p != 0 || d != 0 {
			t.Fatalf("%s after relay-once: pending %d dead %d %v", sku, p, d, err)
		}
	}
	var remaining int64
	require.NoError(t, db.QueryRow("SELECT SUM(remaining) FROM stock_items").Scan(&remaining))
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
// Sentinel.

// TestSentinel runs stockctl on a Sentinel deployment through -sentinel, before and after a
// SENTINEL FAILOVER: it follows the primary the sentinels announce, for reads and writes, also
// with spaces around the parts of -sentinel, as pasted from a config file.
func TestSentinel(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skipf("%s is not set: a Sentinel deployment needs the redis-server binary", redistest.EnvServer)
	}
	clearEnv(t)
	d := redistest.StartSentinel(t, redistest.SentinelConfig{Replicas: 1})
	flagv := redistest.MasterSet + "@" + strings.Join(d.Addrs(), ",")
	prefix := fmt.Sprintf("t%d", time.Now().UnixNano())
	sctl := func(f string, args ...string) cliResult {
		t.Helper()
		res := runCLI(t, append([]string{"-sentinel", f, "-prefix", prefix, "-timeout", "20s"}, args...)...)
		t.Logf("stockctl %s -> %d\n%s%s", strings.Join(args, " "), res.code, res.out, res.err)
		return res
	}
	require.Equal(t, exitOK, sctl(flagv, "load", "A", "10").code)
	old, err := d.Primary()
	require.NoError(t, err)
	c := d.Client(t)
	require.NoError(t, c.Do(t.Context(), c.B().Wait().Numreplicas(1).Timeout(5000).Build()).Error())

	require.NoError(t, d.Failover())
	p, err := d.WaitPrimary(old, 30*time.Second)
	require.NoError(t, err)
	res := sctl(flagv, "available", "A")
	assert.Equal(t, exitOK, res.code)
	assert.Equal(t, "10\n", res.out, "read on the new primary %s", p.Addr())
	spaced := " " + redistest.MasterSet + " @ " + strings.Join(d.Addrs(), " , ") + " "
	if res := sctl(spaced, "available", "A"); res.code != exitUsage { // rejecting spaces is a fair answer too
		assert.Equal(t, exitOK, res.code)
		assert.Equal(t, "10\n", res.out, "-sentinel with spaces")
	}
	res = sctl(flagv, "restock", "A", "r1", "5")
	assert.Equal(t, exitOK, res.code, "a write on the new primary")
	assert.Equal(t, "15\n", sctl(flagv, "available", "A").out)
}

// A -sentinel value (or STOCKCTL_SENTINEL) that cannot name a Sentinel deployment must be a
// usage error (exit 2) that names the flag, found before anything is dialled, not a connection
// failure (exit 1) an operator would take for a network problem.
func TestSentinelFlagBadInput(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skip("needs STOCK_REDIS_SERVER (a redis-server binary) for a Sentinel deployment")
	}
	if !redistest.SentinelEnabled(t) {
		t.Skip("needs STOCK_TEST_SENTINEL=1")
	}
	for _, c := range []struct{ name, value string }{
		{"empty name", "@127.0.0.1:1"},
		{"no address", "stock@"},
		{"no port", "stock@127.0.0.1"},
		{"no at sign", "stock"},
		{"space in name", "sto ck@127.0.0.1:1"},
		{"duplicate address", "stock@127.0.0.1:1,127.0.0.1:1"},
		{"duplicate address, three", "stock@127.0.0.1:1,127.0.0.1:2,127.0.0.1:1"},
		{"empty element", "stock@127.0.0.1:1,,127.0.0.1:2"},
		{"trailing comma", "stock@127.0.0.1:1,"},
		{"leading comma", "stock@,127.0.0.1:1"},
		{"port not a number", "stock@127.0.0.1:abc"},
		{"port out of range", "stock@127.0.0.1:99999"},
		{"port zero", "stock@127.0.0.1:0"},
		{"negative port", "stock@127.0.0.1:-1"},
		{"empty host", "stock@:1"},
		{"second at sign", "st@ck@127.0.0.1:1"},
		{"space inside an address", "stock@127.0.0.1 127.0.0.2:1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			clearEnv(t)
			res := runCLI(t, "-timeout", "3s", "-sentinel", c.value, "items")
			if res.code != exitUsage || !strings.Contains(res.err, "-sentinel") {
				t.Errorf("-sentinel %q: want exit %d (usage error) naming the flag\n%v", c.value, exitUsage, res)
			}
			if res.took > 2*time.Second {
				t.Errorf("-sentinel %q: took %v: the bad value was dialled", c.value, res.took)
			}
		})
	}
	for _, v := range []string{"@127.0.0.1:1", "stock@127.0.0.1", "stock@127.0.0.1:1,127.0.0.1:1"} {
		t.Run("STOCKCTL_SENTINEL="+v, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("STOCKCTL_SENTINEL", v)
			if res := runCLI(t, "-timeout", "3s", "items"); res.code != exitUsage {
				t.Errorf("want exit %d\n%v", exitUsage, res)
			}
		})
	}
}
