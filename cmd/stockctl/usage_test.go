package main

// The command line: help, unknown commands, bad flags, missing arguments, bad names, -prefix,
// -dsn, -sentinel and quantities. None of it needs Redis: a command line that is wrong whatever
// Redis says is a usage error (exit 2), found before connecting.

import (
	"errors"
	"strings"
	"testing"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"

	"github.com/stockres/stock"
)

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
