package main

// What stockctl says when it refuses: names and -prefix checked before connecting, the messages
// of commands on items Redis does not know, a restock past stock.MaxQty, what relay-once leaves,
// and passwords never printed.

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
)

// offlineClient is a rueidis.Client that is never called: stock.New only keeps it, which lets
// the tests ask the library whether it takes a name without any Redis.
type offlineClient struct{ rueidis.Client }

// checkName must refuse exactly what the library refuses, so that its early refusal changes no
// answer: a name it refused and the library takes could not be used at all.
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

// Every name argument (SKU, ID) of every command, and -prefix, is refused before connecting
// (exit 2, the port given is closed); a malformed -dsn too, for the commands that use it.
func TestNamesRefusedBeforeConnecting(t *testing.T) {
	clearEnv(t)
	closed := closedAddr(t)
	dsn := sqliteDSN(t)
	for _, args := range [][]string{
		{"load", "a b", "5"}, {"restock", "a b", "po", "5"}, {"restock", "x", "p|o", "5"}, {"available", "{x}"},
		{"levels", "x", "a b"}, {"entry", "x", ""}, {"ledger", "a\tb"}, {"close", "a}"}, {"reopen", "a{"},
		{"delist", "a|"}, {"restore", "x", "o 1"}, {"restore", "-tombstone", "x y", "o1"}, {"sweep", "a b"},
		{"-dsn", dsn, "reconcile", "x", "a b"}, {"-dsn", dsn, "relay-once", "a b"},
		{"-prefix", "", "items"}, {"-prefix", "a|b", "levels"}, {"-prefix", strings.Repeat("p", 129), "sweep"},
		{"-dsn", "oracle://x/y", "load", "x", "5"}, {"-dsn", "sqlite:", "levels"}, {"-dsn", "oracle://x/y", "relay-once"},
		{"reconcile", "x"}, {"relay-once"},
	} {
		res := runCLI(t, append([]string{"-redis", closed}, args...)...)
		if res.code != exitUsage || strings.Contains(res.err, "connect") {
			t.Errorf("%q: want exit 2 before connecting\n%v", args, res)
		}
	}
	// -prefix is not migrate's business.
	if res := runCLI(t, "-prefix", "a b", "-dsn", dsn, "migrate"); res.code != exitOK {
		t.Errorf("migrate with a -prefix it does not use: %v", res)
	}
}

func TestQtyTooLargeForInt64(t *testing.T) {
	clearEnv(t)
	closed := closedAddr(t)
	for _, tc := range []struct{ args []string }{
		{[]string{"load", "x", "99999999999999999999"}},
		{[]string{"load", "x", "+99999999999999999999"}},
		{[]string{"load", "--", "x", "-99999999999999999999"}},
		{[]string{"restock", "x", "po", "99999999999999999999"}},
	} {
		res := runCLI(t, append([]string{"-redis", closed}, tc.args...)...)
		if res.code != exitUsage || !strings.Contains(res.err, "99999999999999999999 out of range [") ||
			!strings.Contains(res.err, ", 9007199254740991]") {
			t.Errorf("%q: want exit 2 and out of range\n%v", tc.args, res)
		}
	}
}

// Passwords of -redis, -sentinel and -dsn never reach stderr, whatever the message.
func TestPasswordsNotPrinted(t *testing.T) {
	clearEnv(t)
	const secret = "Pw-0ps-Secret"
	closed := closedAddr(t)
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
		if strings.Contains(res.err+res.out, secret) || strings.Contains(res.err+res.out, "Pw%2D0ps") {
			t.Errorf("%q: the password is printed\n%v", args, res)
		}
	}
}

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

// Commands on an item Redis does not know say "not loaded" with the item, exit 1 and write
// nothing; sweep included.
func TestUnknownItemMessages(t *testing.T) {
	h := newHarness(t)
	require.Equal(t, exitOK, h.run("load", "x", "5").code)
	for _, args := range [][]string{
		{"restock", "ghost", "po", "5"}, {"restore", "ghost", "o1"}, {"restore", "-tombstone", "ghost", "o1"},
		{"entry", "ghost", "o1"}, {"sweep", "ghost"}, {"ledger", "ghost"}, {"close", "ghost"},
	} {
		res := h.run(args...)
		assert.Equal(t, exitFail, res.code, args)
		assert.Contains(t, res.stderr, "item not loaded: ghost", args)
		assert.Empty(t, res.stdout, args)
	}
	keys, err := h.client.Do(context.Background(), h.client.B().Keys().Pattern("*ghost*").Build()).AsStrSlice()
	require.NoError(t, err)
	assert.Empty(t, keys, "commands on an unknown item wrote")

	// An unknown id of a loaded item: named, with the way to leave a tombstone.
	res := h.run("restore", "x", "o1")
	assert.Equal(t, exitFail, res.code)
	assert.Contains(t, res.stderr, "item x has no ledger entry for id o1")
	assert.Contains(t, res.stderr, "-tombstone")
	res = h.run("entry", "x", "o1")
	assert.Equal(t, exitFail, res.code)
	assert.Contains(t, res.stderr, "item x has no ledger entry for id o1")
	res = h.run("restore", "-tombstone", "x", "o1")
	assert.Equal(t, exitOK, res.code, res.stderr)
	assert.Contains(t, res.stdout, "left a tombstone")
	res = h.run("sweep", "x")
	assert.Equal(t, exitOK, res.code, res.stderr)
	assert.Contains(t, res.stdout, "released 0 units")
}

// A restock past stock.MaxQty in all is refused with the figures, exit 1 (the command line is
// right; the item's stock refuses it), and changes nothing.
func TestRestockPastMaxQty(t *testing.T) {
	h := newHarness(t)
	require.Equal(t, exitOK, h.run("load", "big", "9007199254740000").code)
	_, err := h.r.Deduct(context.Background(), stock.Request{SKU: "big", ID: "o1", Qty: 10})
	require.NoError(t, err)
	res := h.run("restock", "big", "po1", "1000")
	assert.Equal(t, exitFail, res.code)
	for _, want := range []string{"big/po1", "9007199254740000 units loaded", "9007199254739990 available", "QTY 1000",
		"9007199254741000", "9007199254740991"} {
		assert.Contains(t, res.stderr, want)
	}
	lv, err := h.r.Levels(context.Background(), "big")
	require.NoError(t, err)
	assert.Equal(t, int64(9007199254740000), lv.Loaded)
	res = h.run("restock", "big", "po1", "991")
	assert.Equal(t, exitOK, res.code, res.stderr)
}

// relay-once says what it leaves in the outboxes, in text and JSON: a run that delivered
// nothing while an event waits in backoff does not look like an empty outbox.
func TestRelayOnceSaysWhatIsLeft(t *testing.T) {
	h := newHarness(t)
	require.Equal(t, exitOK, h.run("load", "A", "10").code)
	require.Equal(t, exitOK, h.run("load", "B", "10").code)
	h.deduct("o1", "", 2)
	h.dsn = sqliteDSN(t) // no tables: the delivery fails
	res := h.store("relay-once")
	assert.Equal(t, exitFail, res.code)
	assert.Contains(t, res.stdout, "NOT DRAINED: 1 event of 1 item still in the outbox")
	assert.Contains(t, res.stdout, ": A (1)")
	// The next run finds the event in backoff (exit 0), or, on a slow machine, past it and fails
	// again (exit 1): either way it says the event waits. (An empty outbox: "the outboxes are
	// empty", TestReconcileAndRelay.)
	res = h.store("relay-once")
	assert.Contains(t, res.stdout, "delivered 0 events")
	assert.Contains(t, res.stdout, "NOT DRAINED: 1 event of 1 item")
	if res.code != exitOK {
		assert.Equal(t, exitFail, res.code)
		assert.Contains(t, res.stdout, "retried later 1")
	}
	j := decode[struct {
		Delivered     int
		Pending, Dead int64
		Waiting       []waitJSON
	}](t, h.store("-json", "relay-once", "A", "B").stdout)
	assert.Equal(t, 0, j.Delivered)
	assert.Equal(t, int64(1), j.Pending)
	assert.Equal(t, []waitJSON{{SKU: "A", Pending: 1}}, j.Waiting)
}
