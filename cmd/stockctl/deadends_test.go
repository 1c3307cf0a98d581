package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/stockops"
)

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
		res := h.store(args...)
		assert.Equal(t, exitDrift, res.code, args)
		assert.Contains(t, res.out, "B: redis 106+4 held, store 0, in flight 10 (2 pending)", args)
		assert.Contains(t, res.out, "NEEDS A HUMAN: the store does not know the item", args)
		assert.Contains(t, res.out, "load -dsn DSN B 120", args) // the way out
		assert.Contains(t, res.out, "delist", args)
	}
	res := h.store("-json", "reconcile")
	assert.Equal(t, exitDrift, res.code)
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
	res := h.store("reconcile", "A")
	require.Equal(t, exitDrift, res.code)

	// The wrong count: refused, nothing written on either side.
	for _, qty := range []string{"130", "115", "0"} {
		res = h.store("load", "A", qty)
		assert.Equal(t, exitFail, res.code, qty)
		assert.Contains(t, res.err, "Redis accounts for 110 units of A (115 available + 5 held, -10 in flight)", qty)
		assert.Contains(t, res.err, "nothing loaded", qty)
		assert.NotContains(t, res.err, "restock", qty)
	}
	res = h.store("levels", "A")
	assert.Equal(t, []string{"A", "115", "5", "10", "130", "no", "-"}, row(res.out, 1), "no store row")

	// The right count: the store side is added, Redis is untouched.
	res = h.store("load", "A", "110")
	require.Equal(t, exitOK, res.code, res.err)
	assert.Equal(t, "added A to the store: 110 units (Redis had it: 115 available + 5 held, -10 in flight); reconcile finds no drift\n", res.out)
	lv, err := h.r.Levels(context.Background(), "A")
	require.NoError(t, err)
	assert.Equal(t, stock.Levels{Available: 115, Held: 5, Sold: 10, Loaded: 130}, lv)

	res = h.store("reconcile")
	assert.Equal(t, exitOK, res.code, res.out)
	assert.Contains(t, res.out, "A: redis 115+5 held, store 110, in flight -10 (3 pending), drift 0")
	res = h.store("relay-once")
	require.Equal(t, exitOK, res.code, res.err)
	assert.Contains(t, res.out, "delivered 3 events")
	res = h.store("reconcile")
	assert.Equal(t, exitOK, res.code, res.out)
	assert.Contains(t, res.out, "A: redis 115+5 held, store 120, in flight 0 (0 pending), drift 0")

	// Both sides have it now: the old answer.
	res = h.store("load", "A", "110")
	assert.Equal(t, exitFail, res.code)
	assert.Contains(t, res.err, "already loaded")
	assert.Contains(t, res.err, "restock")

	// -json says which side was written.
	require.Equal(t, exitOK, h.run("load", "C", "7").code)
	res = h.store("-json", "load", "C", "7")
	require.Equal(t, exitOK, res.code, res.err)
	assert.Equal(t, map[string]any{"sku": "C", "loaded": 7.0, "store": true, "redis": false}, decode[map[string]any](t, res.out))
}

// delist ends an item's sale for good; once its retention has passed and Redis and the store
// agree, reconcile -apply retires it and exits 0.
func TestDelistCommand(t *testing.T) {
	h := newHarness(t)
	require.Equal(t, exitOK, h.store("load", "A", "5").code)
	h.deduct("o1", "", 2)

	res := h.run("delist", "A")
	require.Equal(t, exitOK, res.code, res.err)
	assert.Contains(t, res.out, "delisted A: closed for good")
	_, err := h.r.Deduct(context.Background(), stock.Request{SKU: "A", ID: "o2", Qty: 1})
	assert.ErrorIs(t, err, stock.ErrClosed)
	res = h.run("reopen", "A")
	assert.Equal(t, exitFail, res.code)
	assert.Contains(t, res.err, "delisted and cannot be reopened")
	assert.Equal(t, exitOK, h.run("-json", "delist", "A").code, "delisting twice does nothing")
	res = h.run("delist", "Z")
	assert.Equal(t, exitFail, res.code)
	assert.Contains(t, res.err, "not loaded: Z")

	// The sale's events still go to the store; then the item retires.
	require.Equal(t, exitOK, h.store("relay-once").code)
	time.Sleep(20 * time.Millisecond)
	res = h.store("reconcile", "-apply", "-retention", "1ms")
	assert.Equal(t, exitOK, res.code, res.out)
	assert.Contains(t, res.out, "A: redis 3+0 held, store 3, in flight 0 (0 pending), drift 0; repaired: trimmed 3, retired")
	res = h.run("available", "A")
	assert.Equal(t, exitFail, res.code)
	assert.Equal(t, "", h.run("items").out)
	res = h.store("reconcile")
	assert.Equal(t, exitOK, res.code, res.out)
}

// reconcile -apply exits 0 when it repaired everything it found, 3 only for what it left.
func TestReconcileApplyExitsZeroWhenRepaired(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	require.Equal(t, exitOK, h.store("load", "A", "10").code)
	require.Equal(t, exitOK, h.store("load", "B", "4").code)
	h.deduct("o1", "", 2)
	require.Equal(t, exitOK, h.store("relay-once").code)

	// Drift on A, B's hash lost: both repaired.
	h.skew("A", 5)
	require.NoError(t, h.client.Do(ctx, h.client.B().Del().Key(h.prefix+":{B}").Build()).Error())
	res := h.store("reconcile")
	assert.Equal(t, exitDrift, res.code, "a report-only run alerts on what it found")
	res = h.store("reconcile", "-apply")
	assert.Equal(t, exitOK, res.code, "everything was repaired: %s", res.out)
	assert.Contains(t, res.out, "A: redis 13+0 held, store 8, in flight 0 (0 pending), drift 5; repaired: adjusted -5")
	assert.Contains(t, res.out, "B: redis 0+0 held, store 4, in flight 0 (0 pending), drift -4, key missing; repaired: rebuilt")
	assert.Contains(t, res.out, "with drift or losses: 2, need a human: 0, busy: 0, errors: 0, left: 0")
	assert.Empty(t, res.err)
	assert.Equal(t, "8\n", h.run("available", "A").out)
	assert.Equal(t, "4\n", h.run("available", "B").out)

	// JSON: found, not left.
	h.skew("A", -1)
	res = h.store("-json", "reconcile", "-apply", "A")
	assert.Equal(t, exitOK, res.code)
	rep := decode[reconcileJSON](t, res.out)
	assert.True(t, rep.Found)
	assert.False(t, rep.Left)
	require.Len(t, rep.Reports, 1)
	assert.True(t, rep.Reports[0].Found)
	assert.False(t, rep.Reports[0].Left)

	// What is left exits 3: a drift above the repair limit stays, and only it is counted.
	h.skew("A", 7)
	h.skew("B", 1)
	res = h.store("reconcile", "-apply", "-repair-limit", "3")
	assert.Equal(t, exitDrift, res.code)
	assert.Contains(t, res.out, "NEEDS A HUMAN: drift 7 above the repair limit 3")
	assert.Contains(t, res.out, "B: redis 5+0 held, store 4, in flight 0 (0 pending), drift 1; repaired: adjusted -1")
	assert.Contains(t, res.out, "left: 1")
	assert.Contains(t, res.err, "1 of 2 items left unrepaired or need a human")
	assert.Equal(t, "15\n", h.run("available", "A").out)
}

// TestMissingTablesHint: a command that needs the store's tables, on a database without them,
// fails and says how to create them.
func TestMissingTablesHint(t *testing.T) {
	h := newHarness(t)
	res := h.store("reconcile")
	assert.Equal(t, exitFail, res.code)
	assert.Contains(t, res.err, "stockctl -dsn DSN migrate", "the error names the cure")
	res = h.store("migrate")
	require.Equal(t, exitOK, res.code, res.err)
	res = h.store("reconcile")
	assert.Equal(t, exitOK, res.code, res.err)
}
