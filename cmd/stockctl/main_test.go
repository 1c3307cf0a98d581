package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/sqlstore"
)

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
		s := redistest.StartServer(t)
		h.addr = s.Addr()
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{h.addr}, DisableCache: true})
		require.NoError(t, err)
		t.Cleanup(c.Close)
		h.client = c
	} else {
		m, c := redistest.Miniredis(t)
		h.addr, h.client = m.Addr(), c
	}
	r, err := stock.New(h.client, stock.WithPrefix(h.prefix))
	require.NoError(t, err)
	h.r = r
	h.dsn = "sqlite:" + filepath.Join(t.TempDir(), "stock.db")
	return h
}

type result struct {
	code           int
	stdout, stderr string
}

// run runs stockctl with -redis and -prefix set.
func (h *harness) run(args ...string) result {
	h.t.Helper()
	var out, errOut bytes.Buffer
	all := append([]string{"-redis", h.addr, "-prefix", h.prefix, "-timeout", "20s"}, args...)
	code := run(context.Background(), all, &out, &errOut)
	h.t.Logf("stockctl %s -> %d\n%s%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return result{code, out.String(), errOut.String()}
}

// store runs stockctl with -dsn too.
func (h *harness) store(args ...string) result {
	h.t.Helper()
	pre := []string{"-dsn", h.dsn}
	if h.tables != "" {
		pre = append(pre, "-table-prefix", h.tables)
	}
	return h.run(append(pre, args...)...)
}

func (h *harness) deduct(id, user string, qty int64) {
	h.t.Helper()
	_, err := h.r.Deduct(context.Background(), stock.Request{SKU: "A", ID: id, User: user, Qty: qty})
	require.NoError(h.t, err)
}

func decode[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal([]byte(s), &v), s)
	return v
}

func TestUsage(t *testing.T) {
	h := newHarness(t)
	res := h.run()
	assert.Equal(t, exitUsage, res.code)
	assert.Contains(t, res.stderr, "Usage:")

	for _, args := range [][]string{{"-h"}, {"help"}, {"help", "help"}} {
		res = h.run(args...)
		assert.Equal(t, exitOK, res.code, args)
		for _, name := range commandNames() {
			assert.Contains(t, res.stdout, "\n  "+name+" ", "%v lists %s", args, name)
		}
		assert.Contains(t, res.stdout, "Exit status")
		assert.Contains(t, res.stdout, "-redis ADDR")
	}
	for _, name := range commandNames() {
		for _, args := range [][]string{{"help", name}, {name, "-h"}} {
			res = h.run(args...)
			assert.Equal(t, exitOK, res.code, args)
			assert.True(t, strings.HasPrefix(res.stdout, "usage: stockctl "+name), res.stdout)
			assert.Contains(t, res.stdout, "Example:\n  stockctl ", args)
		}
	}
	res = h.run("help", "ledger")
	assert.Contains(t, res.stdout, "usage: stockctl ledger SKU [-limit N] [-state STATE]")

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"nope"}, `unknown command "nope"`},
		{[]string{"help", "nope"}, `unknown command "nope"`},
		{[]string{"load", "A"}, "missing arguments"},
		{[]string{"load", "A", "1", "2"}, "too many arguments"},
		{[]string{"load", "A", "ten"}, `QTY "ten" is not a whole number`},
		{[]string{"restock", "A", "r1", "0"}, "QTY 0 out of range"},
		{[]string{"items", "extra"}, "too many arguments"},
		{[]string{"levels", "-bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"-bogus", "levels"}, "flag provided but not defined: -bogus"},
		{[]string{"ledger", "A", "-limit", "-1"}, "-limit -1 is negative"},
		{[]string{"ledger", "A", "-state", "lost"}, `-state "lost"`},
		{[]string{"reconcile"}, "reconcile needs the database of record: -dsn"},
		{[]string{"relay-once", "A"}, "relay-once needs the database of record: -dsn"},
		{[]string{"migrate"}, "needs the database of record: -dsn"},
		{[]string{"available", "a{b}"}, "braces"},
		{[]string{"-timeout", "0", "items"}, "-timeout must be positive"},
		{[]string{"-dsn", "oracle://x", "reconcile"}, `unknown database "oracle"`},
		{[]string{"-redis", "nohost", "items"}, "want host:port"},
	} {
		res = h.run(tc.args...)
		assert.Equal(t, exitUsage, res.code, tc.args)
		assert.Contains(t, res.stderr, tc.want, tc.args)
		assert.Empty(t, res.stdout, tc.args)
	}
}

func TestUnreachable(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"-redis", "127.0.0.1:1", "-timeout", "5s", "available", "A"}, &out, &errOut)
	assert.Equal(t, exitFail, code)
	assert.Contains(t, errOut.String(), "connect to Redis at 127.0.0.1:1")
}

func TestLoadLevels(t *testing.T) {
	h := newHarness(t)
	res := h.run("load", "A", "10")
	require.Equal(t, exitOK, res.code)
	assert.Equal(t, "loaded A: 10 units in Redis\n", res.stdout)

	res = h.run("load", "A", "5")
	assert.Equal(t, exitFail, res.code)
	assert.Contains(t, res.stderr, "already loaded")
	assert.Contains(t, res.stderr, "restock")

	require.Equal(t, exitOK, h.run("-json", "load", "B", "0").code)
	h.deduct("o1", "alice", 3)

	res = h.run("available", "A")
	assert.Equal(t, exitOK, res.code)
	assert.Equal(t, "7\n", res.stdout)
	res = h.run("available", "-json", "A") // global flags after the command too
	assert.Equal(t, map[string]any{"sku": "A", "available": 7.0}, decode[map[string]any](t, res.stdout))
	res = h.run("available", "Z")
	assert.Equal(t, exitFail, res.code)
	assert.Contains(t, res.stderr, "not loaded: Z")

	res = h.run("items")
	assert.Equal(t, "A\nB\n", res.stdout)
	assert.Equal(t, []string{"A", "B"}, decode[[]string](t, h.run("-json", "items").stdout))

	res = h.run("levels")
	require.Equal(t, exitOK, res.code)
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	require.Len(t, lines, 3)
	assert.Equal(t, []string{"SKU", "AVAILABLE", "HELD", "SOLD", "LOADED", "CLOSED"}, strings.Fields(lines[0]))
	assert.Equal(t, []string{"A", "7", "0", "3", "10", "no"}, strings.Fields(lines[1]))
	assert.Equal(t, []string{"B", "0", "0", "0", "0", "no"}, strings.Fields(lines[2]))

	res = h.run("-json", "levels", "A", "Z")
	assert.Equal(t, exitFail, res.code, "an item is not loaded")
	rows := decode[[]levelsJSON](t, res.stdout)
	assert.Equal(t, []levelsJSON{
		{SKU: "A", Available: 7, Sold: 3, Loaded: 10},
		{SKU: "Z", Error: "not_loaded", Message: "stock: item not loaded: Z"},
	}, rows)

	res = h.run("close", "A")
	require.Equal(t, exitOK, res.code)
	assert.Equal(t, "closed A\n", res.stdout)
	_, err := h.r.Deduct(context.Background(), stock.Request{SKU: "A", ID: "o2", Qty: 1})
	assert.ErrorIs(t, err, stock.ErrClosed)
	assert.True(t, decode[[]levelsJSON](t, h.run("-json", "levels", "A").stdout)[0].Closed)
	res = h.run("reopen", "A")
	require.Equal(t, exitOK, res.code)
	assert.Equal(t, "reopened A\n", res.stdout)
	h.deduct("o2", "", 1)
	assert.Equal(t, exitFail, h.run("close", "Z").code)

	res = h.run("restock", "A", "r1", "5")
	require.Equal(t, exitOK, res.code)
	assert.Equal(t, "restocked A/r1: +5, 11 available\n", res.stdout)
	res = h.run("-json", "restock", "A", "r1", "5")
	require.Equal(t, exitOK, res.code)
	assert.Equal(t, receiptJSON{SKU: "A", ID: "r1", Qty: 5, Remaining: 11, Replayed: true}, decode[receiptJSON](t, res.stdout))
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
		assert.Contains(t, res.stdout, want)
	}
	en := decode[entryJSON](t, h.run("-json", "entry", "A", "h1").stdout)
	assert.Equal(t, stock.KindHold, en.Kind)
	assert.Equal(t, "held", en.State)
	assert.Equal(t, int64(3), en.Qty)
	assert.Equal(t, "carol", en.User)
	require.NotNil(t, en.Deadline)
	assert.WithinDuration(t, en.At.Add(time.Hour), *en.Deadline, time.Second)
	res = h.run("entry", "A", "nope")
	assert.Equal(t, exitFail, res.code)
	assert.Contains(t, res.stderr, "unknown request id")

	res = h.run("ledger", "A")
	require.Equal(t, exitOK, res.code)
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	require.Len(t, lines, 4)
	assert.Equal(t, []string{"AT", "ID", "KIND", "STATE", "QTY", "BEFORE", "AFTER", "USER", "DEADLINE"}, strings.Fields(lines[0]))
	var ids []string
	for _, e := range decode[[]entryJSON](t, h.run("-json", "ledger", "A").stdout) {
		ids = append(ids, e.ID)
	}
	assert.ElementsMatch(t, []string{"o1", "o2", "h1"}, ids)
	res = h.run("ledger", "A", "-limit", "1")
	require.Equal(t, exitOK, res.code)
	assert.Len(t, strings.Split(strings.TrimSpace(res.stdout), "\n"), 2)
	assert.Contains(t, res.stderr, "showing the first 1 entries")
	held := decode[[]entryJSON](t, h.run("-json", "ledger", "-state", "held", "A").stdout)
	require.Len(t, held, 1)
	assert.Equal(t, "h1", held[0].ID)
	assert.Equal(t, "[]\n", h.run("-json", "ledger", "A", "-state", "expired").stdout)
	assert.Equal(t, exitFail, h.run("ledger", "Z").code, "an unknown item is not an empty ledger")

	res = h.run("restore", "A", "o1")
	require.Equal(t, exitOK, res.code)
	assert.Equal(t, "restored A/o1: +2, 6 available\n", res.stdout) // 10 - 2 - 1 - 3 + 2
	res = h.run("-json", "restore", "A", "o1")
	require.Equal(t, exitOK, res.code)
	assert.True(t, decode[receiptJSON](t, res.stdout).Replayed)
	assert.Equal(t, "6\n", h.run("available", "A").stdout)

	res = h.run("restore", "A", "ghost")
	assert.Equal(t, exitFail, res.code)
	assert.Contains(t, res.stderr, "nothing restored")
	assert.Equal(t, exitFail, h.run("entry", "A", "ghost").code, "no tombstone without -tombstone")
	res = h.run("restore", "A", "ghost", "-tombstone")
	require.Equal(t, exitOK, res.code)
	assert.Contains(t, res.stdout, "left a tombstone")
	_, err = h.r.Deduct(ctx, stock.Request{SKU: "A", ID: "ghost", Qty: 1})
	assert.ErrorIs(t, err, stock.ErrRestored)

	res = h.run("restore", "A", "h1") // a live hold is cancelled
	require.Equal(t, exitOK, res.code)
	assert.Equal(t, "restored A/h1: +3, 9 available\n", res.stdout)
}

func TestSweep(t *testing.T) {
	h := newHarness(t)
	require.Equal(t, exitOK, h.run("load", "A", "5").code)
	_, err := h.r.Hold(context.Background(), stock.Request{SKU: "A", ID: "h1", Qty: 2}, 50*time.Millisecond)
	require.NoError(t, err)
	redistest.Sleep(h.client, 200*time.Millisecond)
	res := h.run("sweep")
	require.Equal(t, exitOK, res.code)
	assert.Equal(t, "released 2 units of expired holds\n", res.stdout)
	res = h.run("-json", "sweep", "A")
	assert.Equal(t, map[string]any{"released": 0.0}, decode[map[string]any](t, res.stdout))
	assert.Equal(t, "expired", decode[entryJSON](t, h.run("-json", "entry", "A", "h1").stdout).State)
}

func TestReconcileAndRelay(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	res := h.store("load", "A", "10")
	require.Equal(t, exitOK, res.code)
	assert.Equal(t, "loaded A: 10 units in Redis and the store\n", res.stdout)
	res = h.store("load", "A", "10")
	assert.Equal(t, exitFail, res.code)
	assert.Contains(t, res.stderr, "already loaded")

	h.deduct("o1", "alice", 2)
	h.deduct("o2", "bob", 1)
	_, err := h.r.Restore(ctx, "A", "o2")
	require.NoError(t, err)

	// Nothing delivered yet: the events are in flight and there is no drift.
	res = h.store("reconcile")
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.Contains(t, res.stdout, "A: redis 8+0 held, store 10, in flight 2 (3 pending), drift 0")
	assert.Contains(t, res.stdout, "items: 1, with drift or losses: 0,")

	res = h.store("relay-once", "A")
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.Equal(t, "delivered 3 events (claimed 3, refused by the store 0, retried later 0, orphaned 0, dead-lettered 0, redelivered 0) in 2 passes\n"+
		"the outboxes are empty\n", res.stdout)
	res = h.store("-json", "relay-once")
	require.Equal(t, exitOK, res.code)
	assert.Equal(t, map[string]any{"claimed": 0.0, "delivered": 0.0, "refused": 0.0, "retried": 0.0, "orphaned": 0.0,
		"redelivered": 0.0, "dead_lettered": 0.0, "passes": 1.0, "pending": 0.0, "dead": 0.0, "waiting": []any{}},
		decode[map[string]any](t, res.stdout))
	assert.Equal(t, "applied", decode[entryJSON](t, h.run("-json", "entry", "A", "o1").stdout).State)

	res = h.store("levels", "A")
	require.Equal(t, exitOK, res.code)
	assert.Equal(t, []string{"A", "8", "0", "2", "10", "no", "8"}, strings.Fields(strings.Split(res.stdout, "\n")[1]))

	// Redis gains 5 units it should not have: the report-only run says so and changes nothing.
	require.NoError(t, h.client.Do(ctx, h.client.B().Hincrby().Key(h.prefix+":{A}").Field("a").Increment(5).Build()).Error())
	res = h.store("reconcile", "A")
	assert.Equal(t, exitDrift, res.code)
	assert.Contains(t, res.stdout, "A: redis 13+0 held, store 8, in flight 0 (0 pending), drift 5\n")
	assert.Contains(t, res.stdout, "report only")
	assert.Contains(t, res.stderr, "1 of 1 items drifted")
	assert.Equal(t, "13\n", h.run("available", "A").stdout)

	res = h.store("-json", "reconcile")
	assert.Equal(t, exitDrift, res.code)
	rep := decode[struct {
		Apply   bool         `json:"apply"`
		Found   bool         `json:"found"`
		Reports []reportJSON `json:"reports"`
	}](t, res.stdout)
	assert.False(t, rep.Apply)
	assert.True(t, rep.Found)
	require.Len(t, rep.Reports, 1)
	assert.Equal(t, reportJSON{SKU: "A", Available: 13, StoreRemaining: 8, Drift: 5, Found: true, Left: true}, rep.Reports[0])

	res = h.store("reconcile", "-apply", "-repair-limit", "2", "A")
	assert.Equal(t, exitDrift, res.code)
	assert.Contains(t, res.stdout, "NEEDS A HUMAN: drift 5 above the repair limit 2")
	assert.Equal(t, "13\n", h.run("available", "A").stdout)

	res = h.store("reconcile", "-apply", "A")
	assert.Equal(t, exitOK, res.code, "a repaired drift is reported, and nothing is left")
	assert.Contains(t, res.stdout, "drift 5; repaired: adjusted -5")
	assert.Equal(t, "8\n", h.run("available", "A").stdout)
	res = h.store("reconcile")
	assert.Equal(t, exitOK, res.code, "nothing left")

	// An item the store does not know needs a human.
	require.Equal(t, exitOK, h.run("load", "B", "1").code)
	res = h.store("reconcile")
	assert.Equal(t, exitDrift, res.code)
	assert.Contains(t, res.stdout, "B: ")
	assert.Contains(t, res.stdout, "B: redis 1+0 held, store 0, in flight 0 (0 pending), drift 0; NEEDS A HUMAN: the store does not know the item")
	assert.Contains(t, res.stdout, "items: 2, with drift or losses: 1, need a human: 1,")

	// migrate is idempotent, with other table prefixes too.
	res = h.store("migrate")
	assert.Equal(t, exitOK, res.code)
	assert.Equal(t, "tables stock_items and stock_records are ready\n", res.stdout)
	res = h.store("-table-prefix", "other_", "-json", "migrate")
	assert.Equal(t, exitOK, res.code)
	assert.Contains(t, res.stdout, `"other_items"`)
}

// A relay pass whose store refuses the deduct gives the stock back.
func TestRelayOnceRefused(t *testing.T) {
	h := newHarness(t)
	require.Equal(t, exitOK, h.store("load", "A", "5").code)
	h.deduct("o1", "", 2)
	// The store has less than Redis sold: it refuses.
	e := &env{g: defaultGlobals()}
	e.g.dsn = h.dsn
	defer e.close()
	_, err := e.openStore(context.Background(), "test")
	require.NoError(t, err)
	_, err = e.db.Exec(`UPDATE stock_items SET remaining = 1 WHERE sku = 'A'`)
	require.NoError(t, err)
	res := h.store("relay-once")
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.Contains(t, res.stdout, "refused by the store 1")
	assert.Equal(t, "refused", decode[entryJSON](t, h.run("-json", "entry", "A", "o1").stdout).State)
	assert.Equal(t, "5\n", h.run("available", "A").stdout)
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

// TestStoreBackends runs load, relay-once, reconcile and levels on PostgreSQL and MySQL when
// STOCK_TEST_POSTGRES and STOCK_TEST_MYSQL name servers, in tables of their own.
func TestStoreBackends(t *testing.T) {
	dsns := map[string]string{}
	if dsn := os.Getenv("STOCK_TEST_POSTGRES"); dsn != "" {
		dsns["postgres"] = dsn
	}
	if dsn := os.Getenv("STOCK_TEST_MYSQL"); dsn != "" {
		dsns["mysql-dsn"] = "mysql:" + dsn
		cfg, err := mysql.ParseDSN(dsn)
		require.NoError(t, err)
		if cfg.Net == "tcp" {
			u := url.URL{Scheme: "mysql", User: url.User(cfg.User), Host: cfg.Addr, Path: "/" + cfg.DBName, RawQuery: "parseTime=true"}
			if cfg.Passwd != "" {
				u.User = url.UserPassword(cfg.User, cfg.Passwd)
			}
			dsns["mysql-url"] = u.String()
		}
	}
	if len(dsns) == 0 {
		t.Skip("STOCK_TEST_POSTGRES and STOCK_TEST_MYSQL are unset (SQLite runs in the other tests)")
	}
	for name, dsn := range dsns {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			h.dsn, h.tables = dsn, fmt.Sprintf("stockctl_t%08x_", rand.Uint32())
			t.Cleanup(func() {
				e := &env{g: defaultGlobals()}
				e.g.dsn, e.g.tablePrefix = h.dsn, h.tables
				defer e.close()
				_, err := e.openStore(context.Background(), "cleanup")
				require.NoError(t, err)
				for _, tbl := range []string{"items", "records"} {
					_, err := e.db.Exec("DROP TABLE IF EXISTS " + h.tables + tbl)
					assert.NoError(t, err)
				}
			})
			ctx := context.Background()
			require.Equal(t, exitOK, h.store("load", "A", "10").code)
			h.deduct("o1", "alice", 2)
			res := h.store("relay-once")
			require.Equal(t, exitOK, res.code, res.stderr)
			assert.Contains(t, res.stdout, "delivered 1 events")
			res = h.store("levels", "A")
			require.Equal(t, exitOK, res.code)
			assert.Equal(t, []string{"A", "8", "0", "2", "10", "no", "8"}, strings.Fields(strings.Split(res.stdout, "\n")[1]))
			assert.Equal(t, exitOK, h.store("reconcile").code)
			require.NoError(t, h.client.Do(ctx, h.client.B().Hincrby().Key(h.prefix+":{A}").Field("a").Increment(-3).Build()).Error())
			res = h.store("reconcile")
			assert.Equal(t, exitDrift, res.code)
			assert.Contains(t, res.stdout, "drift -3")
			res = h.store("reconcile", "-apply")
			assert.Equal(t, exitOK, res.code, "repaired: nothing left")
			assert.Contains(t, res.stdout, "repaired: adjusted +3")
			assert.Equal(t, exitOK, h.store("reconcile").code)

			// An item loaded in Redis only: reported with Redis's figures, then given its store
			// side by load -dsn with the stock Redis accounts for.
			require.Equal(t, exitOK, h.run("load", "C", "6").code)
			_, err := h.r.Deduct(ctx, stock.Request{SKU: "C", ID: "c1", Qty: 2})
			require.NoError(t, err)
			res = h.store("reconcile", "C")
			assert.Equal(t, exitDrift, res.code)
			assert.Contains(t, res.stdout, "C: redis 4+0 held, store 0, in flight 2 (1 pending)")
			assert.Equal(t, exitFail, h.store("load", "C", "4").code)
			require.Equal(t, exitOK, h.store("load", "C", "6").code)
			require.Equal(t, exitOK, h.store("relay-once").code)
			res = h.store("reconcile", "C")
			assert.Equal(t, exitOK, res.code)
			assert.Contains(t, res.stdout, "C: redis 4+0 held, store 4, in flight 0 (0 pending), drift 0")
		})
	}
}
