package main

// What stockctl says when it refuses: secrets hidden in its messages, an unknown id, a restock
// past stock.MaxQty, and what relay-once leaves.

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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

// An unknown id of a loaded item is named, with the way to leave a tombstone; with -tombstone
// the restore goes through, and sweep of the item releases nothing.
func TestUnknownIDMessages(t *testing.T) {
	h := newHarness(t)
	require.Equal(t, exitOK, h.run("load", "x", "5").code)
	res := h.run("restore", "x", "o1")
	assert.Equal(t, exitFail, res.code)
	assert.Contains(t, res.err, "item x has no ledger entry for id o1")
	assert.Contains(t, res.err, "-tombstone")
	res = h.run("entry", "x", "o1")
	assert.Equal(t, exitFail, res.code)
	assert.Contains(t, res.err, "item x has no ledger entry for id o1")
	res = h.run("restore", "-tombstone", "x", "o1")
	assert.Equal(t, exitOK, res.code, res.err)
	assert.Contains(t, res.out, "left a tombstone")
	res = h.run("sweep", "x")
	assert.Equal(t, exitOK, res.code, res.err)
	assert.Contains(t, res.out, "released 0 units")
}

// A restock past stock.MaxQty in all is refused with the figures, exit 1 (the command line is
// right; the item's stock refuses it), and changes nothing: "stock: invalid input" would tell
// the operator nothing, and QTY itself is within the range the help states.
func TestRestockPastMaxQty(t *testing.T) {
	h := newHarness(t)
	require.Equal(t, exitOK, h.run("load", "big", "9007199254740000").code)
	h.take("big", "o1", 10)
	res := h.run("restock", "big", "po1", "1000")
	assert.Equal(t, exitFail, res.code)
	for _, want := range []string{"big/po1", "9007199254740000 units loaded", "9007199254739990 available", "QTY 1000",
		"9007199254741000", "9007199254740991"} {
		assert.Contains(t, res.err, want)
	}
	lv, err := h.r.Levels(context.Background(), "big")
	require.NoError(t, err)
	assert.Equal(t, int64(9007199254740000), lv.Loaded)
	res = h.run("restock", "big", "po1", "991")
	assert.Equal(t, exitOK, res.code, res.err)
	// An item loaded with MaxQty itself takes no restock of 1.
	require.Equal(t, exitOK, h.run("load", "full", "9007199254740991").code)
	res = h.run("restock", "full", "po1", "1")
	assert.Equal(t, exitFail, res.code)
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
	res := h.store("relay-once")
	assert.Equal(t, exitFail, res.code)
	assert.Contains(t, res.out, "NOT DRAINED: 1 event of 1 item still in the outbox")
	assert.Contains(t, res.out, ": A (1)")
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
