package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/sqlstore"
)

func TestLoadLevels(t *testing.T) {
	h := newHarness(t)
	res := h.run("load", "A", "10")
	require.Equal(t, exitOK, res.code)
	assert.Equal(t, "loaded A: 10 units in Redis\n", res.out)

	res = h.run("load", "A", "5")
	assert.Equal(t, exitFail, res.code)
	assert.Contains(t, res.err, "already loaded")
	assert.Contains(t, res.err, "restock")

	require.Equal(t, exitOK, h.run("-json", "load", "B", "0").code)
	h.deduct("o1", "alice", 3)

	res = h.run("available", "A")
	assert.Equal(t, exitOK, res.code)
	assert.Equal(t, "7\n", res.out)
	res = h.run("available", "-json", "A") // global flags after the command too
	assert.Equal(t, map[string]any{"sku": "A", "available": 7.0}, decode[map[string]any](t, res.out))
	res = h.run("available", "Z")
	assert.Equal(t, exitFail, res.code)
	assert.Contains(t, res.err, "not loaded: Z")

	res = h.run("items")
	assert.Equal(t, "A\nB\n", res.out)
	assert.Equal(t, []string{"A", "B"}, decode[[]string](t, h.run("-json", "items").out))

	res = h.run("levels")
	require.Equal(t, exitOK, res.code)
	lines := strings.Split(strings.TrimSpace(res.out), "\n")
	require.Len(t, lines, 3)
	assert.Equal(t, []string{"SKU", "AVAILABLE", "HELD", "SOLD", "LOADED", "CLOSED"}, strings.Fields(lines[0]))
	assert.Equal(t, []string{"A", "7", "0", "3", "10", "no"}, strings.Fields(lines[1]))
	assert.Equal(t, []string{"B", "0", "0", "0", "0", "no"}, strings.Fields(lines[2]))

	res = h.run("-json", "levels", "A", "Z")
	assert.Equal(t, exitFail, res.code, "an item is not loaded")
	rows := decode[[]levelsJSON](t, res.out)
	assert.Equal(t, []levelsJSON{
		{SKU: "A", Available: 7, Sold: 3, Loaded: 10},
		{SKU: "Z", Error: "not_loaded", Message: "stock: item not loaded: Z"},
	}, rows)

	res = h.run("close", "A")
	require.Equal(t, exitOK, res.code)
	assert.Equal(t, "closed A\n", res.out)
	_, err := h.r.Deduct(context.Background(), stock.Request{SKU: "A", ID: "o2", Qty: 1})
	assert.ErrorIs(t, err, stock.ErrClosed)
	assert.True(t, decode[[]levelsJSON](t, h.run("-json", "levels", "A").out)[0].Closed)
	res = h.run("reopen", "A")
	require.Equal(t, exitOK, res.code)
	assert.Equal(t, "reopened A\n", res.out)
	h.deduct("o2", "", 1)
	assert.Equal(t, exitFail, h.run("close", "Z").code)

	res = h.run("restock", "A", "r1", "5")
	require.Equal(t, exitOK, res.code)
	assert.Equal(t, "restocked A/r1: +5, 11 available\n", res.out)
	res = h.run("-json", "restock", "A", "r1", "5")
	require.Equal(t, exitOK, res.code)
	assert.Equal(t, receiptJSON{SKU: "A", ID: "r1", Qty: 5, Remaining: 11, Replayed: true}, decode[receiptJSON](t, res.out))
}

func TestEntryLedgerRestore(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	require.Equal(t, exitOK, h.run("load", "A", "10").code)
	h.deduct("o1", "alice", 2)
	h.deduct("o2", "bob", 1)
	_, err := h.r.Hold(ctx, stock.Request{SKU: "A", ID: "h1", User: "carol", Qty: 3}, time.Hour)
	require.NoError(t, err)

	res := h.run("entry", "A", "o1")
	require.Equal(t, exitOK, res.code)
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
	res = h.run("entry", "A", "nope")
	assert.Equal(t, exitFail, res.code)
	assert.Contains(t, res.err, "unknown request id")

	res = h.run("ledger", "A")
	require.Equal(t, exitOK, res.code)
	lines := strings.Split(strings.TrimSpace(res.out), "\n")
	require.Len(t, lines, 4)
	assert.Equal(t, []string{"AT", "ID", "KIND", "STATE", "QTY", "BEFORE", "AFTER", "USER", "DEADLINE"}, strings.Fields(lines[0]))
	var ids []string
	for _, e := range decode[[]entryJSON](t, h.run("-json", "ledger", "A").out) {
		ids = append(ids, e.ID)
	}
	assert.ElementsMatch(t, []string{"o1", "o2", "h1"}, ids)
	res = h.run("ledger", "A", "-limit", "1")
	require.Equal(t, exitOK, res.code)
	assert.Len(t, strings.Split(strings.TrimSpace(res.out), "\n"), 2)
	assert.Contains(t, res.err, "showing the first 1 entries")
	held := decode[[]entryJSON](t, h.run("-json", "ledger", "-state", "held", "A").out)
	require.Len(t, held, 1)
	assert.Equal(t, "h1", held[0].ID)
	assert.Equal(t, "[]\n", h.run("-json", "ledger", "A", "-state", "expired").out)
	assert.Equal(t, exitFail, h.run("ledger", "Z").code, "an unknown item is not an empty ledger")

	res = h.run("restore", "A", "o1")
	require.Equal(t, exitOK, res.code)
	assert.Equal(t, "restored A/o1: +2, 6 available\n", res.out) // 10 - 2 - 1 - 3 + 2
	res = h.run("-json", "restore", "A", "o1")
	require.Equal(t, exitOK, res.code)
	assert.True(t, decode[receiptJSON](t, res.out).Replayed)
	assert.Equal(t, "6\n", h.run("available", "A").out)

	res = h.run("restore", "A", "ghost")
	assert.Equal(t, exitFail, res.code)
	assert.Contains(t, res.err, "nothing restored")
	assert.Equal(t, exitFail, h.run("entry", "A", "ghost").code, "no tombstone without -tombstone")
	res = h.run("restore", "A", "ghost", "-tombstone")
	require.Equal(t, exitOK, res.code)
	assert.Contains(t, res.out, "left a tombstone")
	_, err = h.r.Deduct(ctx, stock.Request{SKU: "A", ID: "ghost", Qty: 1})
	assert.ErrorIs(t, err, stock.ErrRestored)

	res = h.run("restore", "A", "h1") // a live hold is cancelled
	require.Equal(t, exitOK, res.code)
	assert.Equal(t, "restored A/h1: +3, 9 available\n", res.out)
}

func TestSweep(t *testing.T) {
	h := newHarness(t)
	require.Equal(t, exitOK, h.run("load", "A", "5").code)
	_, err := h.r.Hold(context.Background(), stock.Request{SKU: "A", ID: "h1", Qty: 2}, 50*time.Millisecond)
	require.NoError(t, err)
	redistest.Sleep(h.client, 200*time.Millisecond)
	res := h.run("sweep")
	require.Equal(t, exitOK, res.code)
	assert.Equal(t, "released 2 units of expired holds\n", res.out)
	res = h.run("-json", "sweep", "A")
	assert.Equal(t, map[string]any{"released": 0.0}, decode[map[string]any](t, res.out))
	assert.Equal(t, "expired", decode[entryJSON](t, h.run("-json", "entry", "A", "h1").out).State)
}

func TestReconcileAndRelay(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	res := h.store("load", "A", "10")
	require.Equal(t, exitOK, res.code)
	assert.Equal(t, "loaded A: 10 units in Redis and the store\n", res.out)
	res = h.store("load", "A", "10")
	assert.Equal(t, exitFail, res.code)
	assert.Contains(t, res.err, "already loaded")

	h.deduct("o1", "alice", 2)
	h.deduct("o2", "bob", 1)
	_, err := h.r.Restore(ctx, "A", "o2")
	require.NoError(t, err)

	// Nothing delivered yet: the events are in flight and there is no drift.
	res = h.store("reconcile")
	require.Equal(t, exitOK, res.code, res.err)
	assert.Contains(t, res.out, "A: redis 8+0 held, store 10, in flight 2 (3 pending), drift 0")
	assert.Contains(t, res.out, "items: 1, with drift or losses: 0,")

	res = h.store("relay-once", "A")
	require.Equal(t, exitOK, res.code, res.err)
	assert.Equal(t, "delivered 3 events (claimed 3, refused by the store 0, retried later 0, orphaned 0, dead-lettered 0, redelivered 0) in 2 passes\n"+
		"the outboxes are empty\n", res.out)
	res = h.store("-json", "relay-once")
	require.Equal(t, exitOK, res.code)
	assert.Equal(t, map[string]any{"claimed": 0.0, "delivered": 0.0, "refused": 0.0, "retried": 0.0, "orphaned": 0.0,
		"redelivered": 0.0, "dead_lettered": 0.0, "passes": 1.0, "pending": 0.0, "dead": 0.0, "waiting": []any{}},
		decode[map[string]any](t, res.out))
	assert.Equal(t, "applied", decode[entryJSON](t, h.run("-json", "entry", "A", "o1").out).State)

	res = h.store("levels", "A")
	require.Equal(t, exitOK, res.code)
	assert.Equal(t, []string{"A", "8", "0", "2", "10", "no", "8"}, row(res.out, 1))

	// Redis gains 5 units it should not have: the report-only run says so and changes nothing.
	h.skew("A", 5)
	res = h.store("reconcile", "A")
	assert.Equal(t, exitDrift, res.code)
	assert.Contains(t, res.out, "A: redis 13+0 held, store 8, in flight 0 (0 pending), drift 5\n")
	assert.Contains(t, res.out, "report only")
	assert.Contains(t, res.err, "1 of 1 items drifted")
	assert.Equal(t, "13\n", h.run("available", "A").out)

	res = h.store("-json", "reconcile")
	assert.Equal(t, exitDrift, res.code)
	rep := decode[struct {
		Apply   bool         `json:"apply"`
		Found   bool         `json:"found"`
		Reports []reportJSON `json:"reports"`
	}](t, res.out)
	assert.False(t, rep.Apply)
	assert.True(t, rep.Found)
	require.Len(t, rep.Reports, 1)
	assert.Equal(t, reportJSON{SKU: "A", Available: 13, StoreRemaining: 8, Drift: 5, Found: true, Left: true}, rep.Reports[0])

	res = h.store("reconcile", "-apply", "-repair-limit", "2", "A")
	assert.Equal(t, exitDrift, res.code)
	assert.Contains(t, res.out, "NEEDS A HUMAN: drift 5 above the repair limit 2")
	assert.Equal(t, "13\n", h.run("available", "A").out)

	res = h.store("reconcile", "-apply", "A")
	assert.Equal(t, exitOK, res.code, "a repaired drift is reported, and nothing is left")
	assert.Contains(t, res.out, "drift 5; repaired: adjusted -5")
	assert.Equal(t, "8\n", h.run("available", "A").out)
	res = h.store("reconcile")
	assert.Equal(t, exitOK, res.code, "nothing left")

	// An item the store does not know needs a human.
	require.Equal(t, exitOK, h.run("load", "B", "1").code)
	res = h.store("reconcile")
	assert.Equal(t, exitDrift, res.code)
	assert.Contains(t, res.out, "B: ")
	assert.Contains(t, res.out, "B: redis 1+0 held, store 0, in flight 0 (0 pending), drift 0; NEEDS A HUMAN: the store does not know the item")
	assert.Contains(t, res.out, "items: 2, with drift or losses: 1, need a human: 1,")

	// migrate is idempotent, with other table prefixes too.
	res = h.store("migrate")
	assert.Equal(t, exitOK, res.code)
	assert.Equal(t, "tables stock_items and stock_records are ready\n", res.out)
	res = h.store("-table-prefix", "other_", "-json", "migrate")
	assert.Equal(t, exitOK, res.code)
	assert.Contains(t, res.out, `"other_items"`)
}

// A relay pass whose store refuses the deduct gives the stock back.
func TestRelayOnceRefused(t *testing.T) {
	h := newHarness(t)
	require.Equal(t, exitOK, h.store("load", "A", "5").code)
	h.deduct("o1", "", 2)
	h.exec(`UPDATE stock_items SET remaining = 1 WHERE sku = 'A'`) // less than Redis sold: it refuses
	res := h.store("relay-once")
	require.Equal(t, exitOK, res.code, res.err)
	assert.Contains(t, res.out, "refused by the store 1")
	assert.Equal(t, "refused", decode[entryJSON](t, h.run("-json", "entry", "A", "o1").out).State)
	assert.Equal(t, "5\n", h.run("available", "A").out)
}

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
