package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"

	"github.com/stockres/stock"
	"github.com/stockres/stock/sqlstore"
	"github.com/stockres/stock/stocktest"
)

// backend is a database the contract suite runs on.
type backend struct {
	name    string
	dialect sqlstore.Dialect
	driver  string
	dsn     func(t testing.TB) string
}

// sqliteDSN is the DSN the package doc recommends, plus synchronous(NORMAL) to spare fsyncs.
func sqliteDSN(t testing.TB) string {
	return "file:" + filepath.Join(t.TempDir(), "stock.db") +
		"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate"
}

// backends returns SQLite, and PostgreSQL and MariaDB/MySQL when STOCK_TEST_POSTGRES and
// STOCK_TEST_MYSQL name a server.
func backends() []backend {
	bs := []backend{{"sqlite", sqlstore.SQLite, "sqlite", sqliteDSN}}
	if dsn := os.Getenv("STOCK_TEST_POSTGRES"); dsn != "" {
		bs = append(bs, backend{"postgres", sqlstore.Postgres, "pgx", func(testing.TB) string { return dsn }})
	}
	if dsn := os.Getenv("STOCK_TEST_MYSQL"); dsn != "" {
		bs = append(bs, backend{"mysql", sqlstore.MySQL, "mysql", func(testing.TB) string { return dsn }})
	}
	return bs
}

// env is one migrated Store on fresh tables, dropped when the test ends.
type env struct {
	s       *sqlstore.Store
	apply   func(context.Context, stock.Event) error // Apply, or ApplyBatch of one event
	db      *sql.DB
	d       sqlstore.Dialect
	items   string
	records string
}

func open(t testing.TB, b backend) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db := openDB(ctx, t, b.driver, b.dsn(t))
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	prefix := freshPrefix(t, db, "t")
	s, err := sqlstore.New(db, b.dialect, sqlstore.WithTablePrefix(prefix))
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))
	require.NoError(t, s.Migrate(ctx), "Migrate is idempotent")
	return &env{s: s, apply: s.Apply, db: db, d: b.dialect, items: prefix + "items", records: prefix + "records"}
}

// openDB opens and pings a database: a configured server must be there.
func openDB(ctx context.Context, t testing.TB, driver, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	require.NoError(t, db.PingContext(ctx), "%s: server unreachable", driver)
	return db
}

// freshPrefix returns a table prefix of the test's own, "stock_"+kind+random+"_", whose
// tables db drops when the test ends.
func freshPrefix(t testing.TB, db *sql.DB, kind string) string {
	prefix := fmt.Sprintf("stock_%s%08x_", kind, rand.Uint32())
	t.Cleanup(func() {
		for _, tbl := range []string{prefix + "items", prefix + "records"} {
			_, err := db.Exec("DROP TABLE IF EXISTS " + tbl)
			assert.NoError(t, err)
		}
	})
	return prefix
}

// forEachBackend runs test as a subtest on every backend, with its own tables. The subtests
// run in parallel: their tables are their own.
func forEachBackend(t *testing.T, test func(t *testing.T, e *env)) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			test(t, open(t, b))
		})
	}
}

// forEach runs test on every backend twice: applying events with Apply, then with
// ApplyBatch, which has its own implementation.
func forEach(t *testing.T, test func(t *testing.T, e *env)) {
	for _, b := range backends() {
		t.Run(b.name+"/apply", func(t *testing.T) {
			t.Parallel() // tables of its own
			test(t, open(t, b))
		})
		t.Run(b.name+"/batch", func(t *testing.T) {
			t.Parallel()
			e := open(t, b)
			e.apply = func(ctx context.Context, ev stock.Event) error { return e.s.ApplyBatch(ctx, []stock.Event{ev})[0] }
			test(t, e)
		})
	}
}

func (e *env) rebind(q string) string {
	if e.d != sqlstore.Postgres {
		return q
	}
	for i := 1; strings.Contains(q, "?"); i++ {
		q = strings.Replace(q, "?", fmt.Sprintf("$%d", i), 1)
	}
	return q
}

// scalar runs a query returning one int64, straight on the tables.
func (e *env) scalar(t testing.TB, q string, args ...any) int64 {
	t.Helper()
	var n sql.NullInt64
	require.NoError(t, e.db.QueryRow(e.rebind(q), args...).Scan(&n))
	return n.Int64
}

func (e *env) remaining(t testing.TB, sku string) int64 {
	t.Helper()
	n, err := e.s.Remaining(context.Background(), sku)
	require.NoError(t, err)
	assert.Equal(t, n, e.scalar(t, "SELECT remaining FROM "+e.items+" WHERE sku = ?", sku))
	return n
}

func (e *env) loaded(t testing.TB, sku string) int64 {
	return e.scalar(t, "SELECT loaded FROM "+e.items+" WHERE sku = ?", sku)
}

func (e *env) countRecords(t testing.TB) int64 {
	return e.scalar(t, "SELECT COUNT(*) FROM "+e.records)
}

func (e *env) record(t testing.TB, sku, id string) (stock.Record, bool) {
	t.Helper()
	m, err := e.s.Records(context.Background(), sku, []string{id})
	require.NoError(t, err)
	r, ok := m[id]
	return r, ok
}

// wantRecord checks that the record of sku's id is there, with the status and type, and
// returns it.
func (e *env) wantRecord(t testing.TB, sku, id string, status stock.State, typ stock.EventType) stock.Record {
	t.Helper()
	r, ok := e.record(t, sku, id)
	require.True(t, ok, "no record of %s/%s", sku, id)
	assert.Equal(t, status, r.Status, "status of %s/%s", sku, id)
	assert.Equal(t, typ, r.Type, "type of %s/%s", sku, id)
	return r
}

func ev(typ stock.EventType, sku, id string, qty int64) stock.Event {
	return stock.Event{Type: typ, SKU: sku, ID: id, User: "u-" + id, Qty: qty, At: time.Now()}
}

func TestNew(t *testing.T) {
	db, err := sql.Open("sqlite", sqliteDSN(t))
	require.NoError(t, err)
	defer db.Close()
	_, err = sqlstore.New(nil, sqlstore.SQLite)
	assert.ErrorIs(t, err, stock.ErrInvalid)
	_, err = sqlstore.New(db, sqlstore.Dialect(0))
	assert.ErrorIs(t, err, stock.ErrInvalid)
	for _, p := range []string{"a-b", "1x", "x y", "x;DROP", `x"`, strings.Repeat("x", 49), "é"} {
		_, err = sqlstore.New(db, sqlstore.SQLite, sqlstore.WithTablePrefix(p))
		assert.ErrorIs(t, err, stock.ErrInvalid, p)
	}
	for _, p := range []string{"", "_", "shop_2_", "Stock"} {
		_, err = sqlstore.New(db, sqlstore.SQLite, sqlstore.WithTablePrefix(p))
		assert.NoError(t, err, p)
	}
	assert.Equal(t, "postgres", sqlstore.Postgres.String())
	assert.Equal(t, "mysql", sqlstore.MySQL.String())
	assert.Equal(t, "sqlite", sqlstore.SQLite.String())
}

func TestLoadRemaining(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		require.NoError(t, e.s.Load(ctx, "a", 10))
		require.NoError(t, e.s.Load(ctx, "zero", 0))
		assert.Equal(t, int64(10), e.remaining(t, "a"))
		assert.Equal(t, int64(10), e.loaded(t, "a"))
		assert.Equal(t, int64(0), e.remaining(t, "zero"))

		assert.ErrorIs(t, e.s.Load(ctx, "a", 3), stock.ErrLoaded)
		assert.Equal(t, int64(10), e.remaining(t, "a"), "a second Load changes nothing")
		_, err := e.s.Remaining(ctx, "nope")
		assert.ErrorIs(t, err, stock.ErrNotLoaded)
		_, err = e.s.Remaining(ctx, "")
		assert.ErrorIs(t, err, stock.ErrInvalid)

		assert.ErrorIs(t, e.s.Load(ctx, "b", -1), stock.ErrInvalid)
		assert.ErrorIs(t, e.s.Load(ctx, "b", stock.MaxQty+1), stock.ErrInvalid)
		assert.ErrorIs(t, e.s.Load(ctx, "", 1), stock.ErrInvalid)
		require.NoError(t, e.s.Load(ctx, "max", stock.MaxQty))
		assert.Equal(t, int64(stock.MaxQty), e.remaining(t, "max"))
		// Names compare byte-exactly: case and trailing spaces make other items.
		require.NoError(t, e.s.Load(ctx, "A", 1))
		require.NoError(t, e.s.Load(ctx, "a ", 2))
		assert.Equal(t, int64(1), e.remaining(t, "A"))
		assert.Equal(t, int64(2), e.remaining(t, "a "))
		assert.Equal(t, int64(10), e.remaining(t, "a"))
	})
}

// step applies x with e.apply, and checks that the answer wraps want (nil: no error) and that
// x's item has left remaining after it; msg says what the step proves.
func (e *env) step(t testing.TB, x stock.Event, want error, left int64, msg ...any) {
	t.Helper()
	err := e.apply(context.Background(), x)
	if want == nil {
		require.NoError(t, err, msg...)
	} else {
		require.ErrorIs(t, err, want, msg...)
	}
	assert.Equal(t, left, e.remaining(t, x.SKU), msg...)
}

// notLoaded applies x, of an item with no row, and checks that it is not loaded (not a
// refusal) and that nothing was recorded.
func (e *env) notLoaded(t testing.TB, x stock.Event) {
	t.Helper()
	err := e.apply(context.Background(), x)
	assert.ErrorIs(t, err, stock.ErrNotLoaded)
	assert.NotErrorIs(t, err, stock.ErrRefused)
	_, ok := e.record(t, x.SKU, x.ID)
	require.False(t, ok, "a record of %s/%s", x.SKU, x.ID)
}

func TestDeductAppliedOnce(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		require.NoError(t, e.s.Load(context.Background(), "a", 10))
		before := time.Now().Add(-time.Minute)
		e.step(t, ev(stock.EventDeducted, "a", "o1", 3), nil, 7)
		for range 3 {
			e.step(t, ev(stock.EventDeducted, "a", "o1", 3), nil, 7, "a repeat answers as the first and takes nothing")
		}
		e.step(t, ev(stock.EventConfirmed, "a", "h1", 2), nil, 5)
		assert.Equal(t, int64(10), e.loaded(t, "a"))

		r, ok := e.record(t, "a", "o1")
		require.True(t, ok)
		assert.Equal(t, stock.Record{SKU: "a", ID: "o1", User: "u-o1", Type: stock.EventDeducted, Qty: 3, Status: stock.StateApplied, At: r.At}, r)
		assert.Equal(t, time.UTC, r.At.Location())
		assert.WithinRange(t, r.At, before, time.Now().Add(time.Minute), "the database clock, in UTC")
		e.wantRecord(t, "a", "h1", stock.StateApplied, stock.EventConfirmed)
		assert.Equal(t, int64(2), e.countRecords(t))
	})
}

func TestRefusal(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		require.NoError(t, e.s.Load(ctx, "a", 5))
		e.step(t, ev(stock.EventDeducted, "a", "big", 6), stock.ErrRefused, 5)
		e.step(t, ev(stock.EventDeducted, "a", "big", 6), stock.ErrRefused, 5, "refused again")
		e.step(t, ev(stock.EventDeducted, "a", "big", 1), stock.ErrRefused, 5,
			"a refused id stays refused even when the stock would cover it now")
		assert.Equal(t, int64(6), e.wantRecord(t, "a", "big", stock.StateRefused, stock.EventDeducted).Qty)

		// The relay gives a refused id back in Redis and sends EventRefused: nothing changes here.
		e.step(t, ev(stock.EventRefused, "a", "big", 6), nil, 5)
		e.step(t, ev(stock.EventRestored, "a", "big", 6), nil, 5)
		e.wantRecord(t, "a", "big", stock.StateRefused, stock.EventDeducted)

		// Exactly the remaining stock is covered; then nothing is.
		e.step(t, ev(stock.EventDeducted, "a", "all", 5), nil, 0)
		e.step(t, ev(stock.EventConfirmed, "a", "one", 1), stock.ErrRefused, 0)

		// An unknown item is not a refusal: not loaded, nothing recorded, and the sale applies
		// once the item is loaded.
		for range 2 {
			e.notLoaded(t, ev(stock.EventDeducted, "ghost", "g1", 1))
		}
		_, err := e.s.Remaining(ctx, "ghost")
		assert.ErrorIs(t, err, stock.ErrNotLoaded)
		require.NoError(t, e.s.Load(ctx, "ghost", 1))
		e.step(t, ev(stock.EventDeducted, "ghost", "g1", 1), nil, 0)
	})
}

func TestRestoreAfterDeduct(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		require.NoError(t, e.s.Load(context.Background(), "a", 10))
		e.step(t, ev(stock.EventDeducted, "a", "o1", 4), nil, 6)
		e.step(t, ev(stock.EventDeducted, "a", "o2", 1), nil, 5)

		// The restore gives back what the deduct took, whatever quantity it carries.
		e.step(t, ev(stock.EventRestored, "a", "o1", 1), nil, 9)
		e.step(t, ev(stock.EventRestored, "a", "o1", 4), nil, 9, "given back once")
		e.step(t, ev(stock.EventRefused, "a", "o1", 4), nil, 9, "given back once")
		e.step(t, ev(stock.EventDeducted, "a", "o1", 4), nil, 9, "a late repeat answers nil and takes nothing")
		assert.Equal(t, int64(4), e.wantRecord(t, "a", "o1", stock.StateRestored, stock.EventDeducted).Qty)

		// EventRefused gives back an applied confirm just the same.
		e.step(t, ev(stock.EventConfirmed, "a", "h1", 3), nil, 6)
		e.step(t, ev(stock.EventRefused, "a", "h1", 3), nil, 9)
		assert.Equal(t, int64(10), e.loaded(t, "a"))
	})
}

func TestRestoreBeforeDeduct(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		require.NoError(t, e.s.Load(ctx, "a", 10))
		e.step(t, ev(stock.EventRestored, "a", "late", 4), nil, 10, "a tombstone changes no stock")
		e.wantRecord(t, "a", "late", stock.StateRestored, stock.EventRestored)
		e.step(t, ev(stock.EventDeducted, "a", "late", 4), nil, 10, "the late deduct takes nothing")
		e.step(t, ev(stock.EventRestored, "a", "late", 4), nil, 10, "nor does a second restore give anything")
		e.wantRecord(t, "a", "late", stock.StateRestored, stock.EventRestored)

		// A tombstone needs no item.
		require.NoError(t, e.apply(ctx, ev(stock.EventRefused, "ghost", "x", 1)))
		require.NoError(t, e.apply(ctx, ev(stock.EventDeducted, "ghost", "x", 1)))
		assert.Equal(t, int64(2), e.countRecords(t))
	})
}

func TestRestock(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		require.NoError(t, e.s.Load(ctx, "a", 10))
		e.step(t, ev(stock.EventDeducted, "a", "o1", 10), nil, 0)
		e.step(t, ev(stock.EventRestocked, "a", "r1", 5), nil, 5)
		e.step(t, ev(stock.EventRestocked, "a", "r1", 5), nil, 5, "a repeat adds nothing")
		assert.Equal(t, int64(15), e.loaded(t, "a"))
		// A restore of a restock id is not a deduct's: nothing to give back.
		e.step(t, ev(stock.EventRestored, "a", "r1", 5), nil, 5)
		e.wantRecord(t, "a", "r1", stock.StateApplied, stock.EventRestocked)

		// An item with no row: not loaded, nothing written, and a later try after Load works.
		e.notLoaded(t, ev(stock.EventRestocked, "b", "r1", 5))
		require.NoError(t, e.s.Load(ctx, "b", 1))
		e.step(t, ev(stock.EventRestocked, "b", "r1", 5), nil, 6)
		assert.Equal(t, int64(6), e.loaded(t, "b"))
	})
}

func TestIgnoredAndInvalid(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		require.NoError(t, e.s.Load(ctx, "a", 10))
		for _, typ := range []stock.EventType{stock.EventHeld, stock.EventCancelled, stock.EventExpired} {
			assert.NoError(t, e.apply(ctx, ev(typ, "a", "h", 3)), typ)
		}
		bad := map[string]stock.Event{
			"empty sku":     ev(stock.EventDeducted, "", "x", 1),
			"empty id":      ev(stock.EventDeducted, "a", "", 1),
			"zero qty":      ev(stock.EventDeducted, "a", "x", 0),
			"negative qty":  ev(stock.EventRestored, "a", "x", -1),
			"qty too big":   ev(stock.EventRestocked, "a", "x", stock.MaxQty+1),
			"unknown type":  ev("stolen", "a", "x", 1),
			"empty type":    ev("", "a", "x", 1),
			"long id":       ev(stock.EventDeducted, "a", strings.Repeat("x", stock.MaxNameLen+1), 1),
			"long sku":      ev(stock.EventDeducted, strings.Repeat("a", stock.MaxNameLen+1), "x", 1),
			"bad utf-8 id":  ev(stock.EventDeducted, "a", "x\xff", 1),
			"NUL in id":     ev(stock.EventDeducted, "a", "x\x00", 1),
			"newline sku":   ev(stock.EventDeducted, "a\n", "x", 1),
			"bad utf-8 usr": {Type: stock.EventDeducted, SKU: "a", ID: "x", User: "\xc3", Qty: 1},
		}
		for name, b := range bad {
			assert.ErrorIs(t, e.apply(ctx, b), stock.ErrInvalid, name)
			errs := e.s.ApplyBatch(ctx, []stock.Event{b})
			assert.ErrorIs(t, errs[0], stock.ErrInvalid, name)
		}
		assert.Equal(t, int64(10), e.remaining(t, "a"))
		assert.Equal(t, int64(0), e.countRecords(t), "nothing written")

		_, err := e.s.Records(ctx, "a", []string{"ok", ""})
		assert.ErrorIs(t, err, stock.ErrInvalid)
		_, err = e.s.List(ctx, "a", "", 0)
		assert.ErrorIs(t, err, stock.ErrInvalid)
		_, err = e.s.List(ctx, "", "", 10)
		assert.ErrorIs(t, err, stock.ErrInvalid)
	})
}

func TestRecordsList(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		require.NoError(t, e.s.Load(ctx, "a", 100))
		require.NoError(t, e.s.Load(ctx, "b", 100))
		var ids []string
		for i := range 25 {
			id := fmt.Sprintf("id-%02d", i)
			ids = append(ids, id)
			require.NoError(t, e.apply(ctx, ev(stock.EventDeducted, "a", id, int64(i%3+1))))
		}
		require.NoError(t, e.apply(ctx, ev(stock.EventDeducted, "b", "id-00", 7)))
		// Byte order: "Z" < "a" < "é"; locale collations would differ.
		for _, id := range []string{"Z", "é", "a"} {
			require.NoError(t, e.apply(ctx, ev(stock.EventRestored, "a", id, 1)))
		}

		m, err := e.s.Records(ctx, "a", []string{"id-03", "id-07", "unknown", "id-03"})
		require.NoError(t, err)
		assert.Len(t, m, 2)
		assert.Equal(t, int64(1), m["id-03"].Qty)
		assert.Equal(t, "u-id-07", m["id-07"].User)
		m, err = e.s.Records(ctx, "a", nil)
		require.NoError(t, err)
		assert.Empty(t, m)

		// More ids than one query takes.
		many := make([]string, 1201)
		for i := range many {
			many[i] = fmt.Sprintf("miss-%d", i)
		}
		many[1200] = "id-24"
		m, err = e.s.Records(ctx, "a", many)
		require.NoError(t, err)
		assert.Len(t, m, 1)
		assert.Contains(t, m, "id-24")

		var got []string
		after := ""
		for pages := 0; ; pages++ {
			require.Less(t, pages, 10)
			page, err := e.s.List(ctx, "a", after, 10)
			require.NoError(t, err)
			if len(page) == 0 {
				break
			}
			assert.LessOrEqual(t, len(page), 10)
			for _, r := range page {
				assert.Equal(t, "a", r.SKU)
				got = append(got, r.ID)
			}
			after = page[len(page)-1].ID
		}
		want := append(slices.Clone(ids), "Z", "a", "é")
		slices.Sort(want)
		assert.Equal(t, want, got)
		assert.Equal(t, "Z", got[0])
		assert.Equal(t, "é", got[len(got)-1])

		page, err := e.s.List(ctx, "b", "", 10)
		require.NoError(t, err)
		require.Len(t, page, 1)
		assert.Equal(t, stock.Record{SKU: "b", ID: "id-00", User: "u-id-00", Type: stock.EventDeducted, Qty: 7, Status: stock.StateApplied, At: page[0].At}, page[0])
		page, err = e.s.List(ctx, "nope", "", 10)
		require.NoError(t, err)
		assert.Empty(t, page)
	})
}

func TestApplyBatch(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		require.NoError(t, e.s.Load(ctx, "a", 5))
		require.NoError(t, e.s.Load(ctx, "b", 1))
		evs := []stock.Event{
			ev(stock.EventDeducted, "b", "d1", 1),
			ev(stock.EventDeducted, "a", "d1", 2),
			ev(stock.EventDeducted, "a", "d2", 10), // refused, and the batch goes on
			ev(stock.EventDeducted, "a", "d3", 3),
			ev(stock.EventHeld, "a", "h1", 1),      // ignored
			ev(stock.EventDeducted, "a", "d1", 2),  // repeat in the same batch
			ev(stock.EventDeducted, "b", "d2", 1),  // refused
			ev(stock.EventRestored, "a", "d3", 3),  // gives d3 back
			ev(stock.EventRestored, "a", "t1", 1),  // tombstone
			ev(stock.EventDeducted, "a", "t1", 1),  // then a no-op
			ev(stock.EventRestocked, "b", "r1", 4), // restock
			ev(stock.EventDeducted, "a", "d4", 3),  // covered after d3 came back
		}
		errs := e.s.ApplyBatch(ctx, evs)
		require.Len(t, errs, len(evs))
		for i, err := range errs {
			switch i {
			case 2, 6:
				assert.ErrorIs(t, err, stock.ErrRefused, i)
			default:
				assert.NoError(t, err, i)
			}
		}
		assert.Equal(t, int64(0), e.remaining(t, "a"), "5 - 2 (d1) - 3 (d4); d3 given back")
		assert.Equal(t, int64(4), e.remaining(t, "b"), "1 - 1 (d1) + 4 (r1)")
		assert.Equal(t, int64(5), e.loaded(t, "b"))
		m, err := e.s.Records(ctx, "a", []string{"d1", "d2", "d3", "d4", "h1", "t1"})
		require.NoError(t, err)
		status := map[string]stock.State{}
		for id, r := range m {
			status[id] = r.Status
		}
		assert.Equal(t, map[string]stock.State{
			"d1": stock.StateApplied, "d2": stock.StateRefused, "d3": stock.StateRestored,
			"d4": stock.StateApplied, "t1": stock.StateRestored,
		}, status)

		// The same batch again answers the same and changes nothing.
		again := e.s.ApplyBatch(ctx, evs)
		for i := range errs {
			assert.Equal(t, errs[i] == nil, again[i] == nil, i)
		}
		assert.Equal(t, int64(0), e.remaining(t, "a"))
		assert.Equal(t, int64(4), e.remaining(t, "b"))
		assert.Empty(t, e.s.ApplyBatch(ctx, nil))
	})
}

// TestApplyBatchStops: the first failure that is not a refusal (an invalid event, a restock
// of an item with no row) stops the batch: the events after it, of any item, stay unapplied
// and get an error that wraps no sentinel; the events before it are applied.
func TestApplyBatchStops(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		require.NoError(t, e.s.Load(ctx, "a", 5))
		require.NoError(t, e.s.Load(ctx, "b", 5))
		for name, bad := range map[string]stock.Event{
			"invalid":    ev(stock.EventDeducted, "a", "x", 0),
			"not loaded": ev(stock.EventRestocked, "c", "x", 1),
		} {
			t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
				evs := []stock.Event{
					ev(stock.EventDeducted, "b", name+"1", 1),
					ev(stock.EventDeducted, "a", name+"2", 9), // refused: goes on
					bad,
					ev(stock.EventDeducted, "a", name+"3", 1), // another item, before in SKU order
					ev(stock.EventHeld, "b", name+"4", 1),
					ev(stock.EventRestored, "b", name+"1", 1),
				}
				errs := e.s.ApplyBatch(ctx, evs)
				require.Len(t, errs, len(evs))
				assert.NoError(t, errs[0])
				assert.ErrorIs(t, errs[1], stock.ErrRefused)
				if name == "invalid" {
					assert.ErrorIs(t, errs[2], stock.ErrInvalid)
				} else {
					assert.ErrorIs(t, errs[2], stock.ErrNotLoaded)
				}
				for _, err := range errs[3:] {
					assert.ErrorContains(t, err, "not applied after an earlier failure")
					for _, sentinel := range []error{stock.ErrRefused, stock.ErrInvalid, stock.ErrNotLoaded} {
						assert.NotErrorIs(t, err, sentinel)
					}
				}
				m, err := e.s.Records(ctx, "a", []string{name + "2", name + "3"})
				require.NoError(t, err)
				assert.Len(t, m, 1)
				assert.Equal(t, stock.StateRefused, m[name+"2"].Status)
				m, err = e.s.Records(ctx, "b", []string{name + "1"})
				require.NoError(t, err)
				assert.Equal(t, stock.StateApplied, m[name+"1"].Status, "the restore after the failure was not applied")
				_, err = e.s.Records(ctx, "c", []string{"x"})
				require.NoError(t, err)
			})
		}
		assert.Equal(t, int64(5), e.remaining(t, "a"))
		assert.Equal(t, int64(3), e.remaining(t, "b"))
		assert.Zero(t, e.scalar(t, "SELECT COUNT(*) FROM "+e.records+" WHERE sku = 'c'"))
	})
}

// TestApplyBatchPoison: an event the database rejects (here by a trigger) fails the batch's
// transaction; the batch then applies the events one by one, in order, and stops there: the
// events after it stay unapplied (an item's events must reach the store in order).
func TestApplyBatchPoison(t *testing.T) {
	e := open(t, backends()[0])
	ctx := context.Background()
	_, err := e.db.Exec(`CREATE TRIGGER poison BEFORE INSERT ON ` + e.records +
		` WHEN NEW.id = 'poison' BEGIN SELECT RAISE(ABORT, 'poisoned'); END`)
	require.NoError(t, err)
	require.NoError(t, e.s.Load(ctx, "a", 10))
	errs := e.s.ApplyBatch(ctx, []stock.Event{
		ev(stock.EventDeducted, "a", "o1", 1),
		ev(stock.EventDeducted, "a", "poison", 1),
		ev(stock.EventDeducted, "a", "o2", 20),
		ev(stock.EventDeducted, "a", "o3", 2),
	})
	assert.NoError(t, errs[0])
	assert.ErrorContains(t, errs[1], "poisoned")
	assert.NotErrorIs(t, errs[1], stock.ErrRefused)
	assert.NotErrorIs(t, errs[1], stock.ErrInvalid)
	for _, err := range errs[2:] {
		assert.ErrorContains(t, err, "not applied after an earlier failure")
		assert.NotErrorIs(t, err, stock.ErrRefused)
	}
	assert.Equal(t, int64(9), e.remaining(t, "a"))
	assert.Equal(t, int64(1), e.countRecords(t))
}

// TestConcurrentSameIDs: 64 goroutines apply deducts of the same 200 ids, and restores of a
// third of them, each in its own random order; half of them one by one with Apply, half in
// batches of 1 to 8 events. Stock covers about half the quantity, so some deducts are
// refused. Every id must be applied at most once, every goroutine must get the same answer
// for an id, and the stock must match the records.
func TestConcurrentSameIDs(t *testing.T) {
	const (
		workers = 64
		ids     = 200
		loaded  = 300
	)
	forEachBackend(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		require.NoError(t, e.s.Load(ctx, "hot", loaded))
		id := func(i int) string { return fmt.Sprintf("o%03d", i) }
		qty := func(i int) int64 { return int64(i%5 + 1) } // 600 units asked in all
		restored := func(i int) bool { return i%3 == 0 }

		answers := make([][]error, workers) // answers[w][i]: worker w's deduct of id i
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				answers[w] = make([]error, ids)
				var evs []stock.Event
				for i := range ids {
					evs = append(evs, ev(stock.EventDeducted, "hot", id(i), qty(i)))
					if restored(i) {
						evs = append(evs, ev(stock.EventRestored, "hot", id(i), qty(i)))
					}
				}
				rand.Shuffle(len(evs), func(a, b int) { evs[a], evs[b] = evs[b], evs[a] })
				for len(evs) > 0 {
					n := 1
					var errs []error
					if w%2 == 0 {
						errs = []error{e.s.Apply(ctx, evs[0])}
					} else {
						n = min(1+rand.IntN(8), len(evs))
						errs = e.s.ApplyBatch(ctx, evs[:n])
					}
					for k, x := range evs[:n] {
						if x.Type == stock.EventRestored {
							assert.NoError(t, errs[k])
							continue
						}
						var i int
						fmt.Sscanf(x.ID, "o%d", &i)
						answers[w][i] = errs[k]
					}
					evs = evs[n:]
				}
			})
		}
		wg.Wait()

		m, err := e.s.Records(ctx, "hot", func() []string {
			var s []string
			for i := range ids {
				s = append(s, id(i))
			}
			return s
		}())
		require.NoError(t, err)
		require.Len(t, m, ids, "one record per id")
		var applied int64
		var refusals int
		for i := range ids {
			r := m[id(i)]
			switch {
			case restored(i):
				assert.Contains(t, []stock.State{stock.StateRestored, stock.StateRefused}, r.Status, id(i))
			default:
				assert.Contains(t, []stock.State{stock.StateApplied, stock.StateRefused}, r.Status, id(i))
			}
			if r.Status == stock.StateApplied {
				applied += qty(i)
			}
			if r.Status == stock.StateRefused {
				refusals++
			}
			for w := range workers {
				err := answers[w][i]
				if r.Status == stock.StateRefused {
					assert.ErrorIs(t, err, stock.ErrRefused, "%s worker %d", id(i), w)
				} else {
					assert.NoError(t, err, "%s worker %d", id(i), w)
				}
			}
		}
		t.Logf("applied %d units, %d refusals", applied, refusals)
		assert.Positive(t, refusals, "the test should exercise refusals")
		rem := e.scalar(t, "SELECT remaining FROM "+e.items+" WHERE sku = ?", "hot")
		assert.Equal(t, loaded-applied, rem, "remaining = loaded - Σ applied not restored")
		assert.Equal(t, loaded-applied, e.scalar(t,
			"SELECT i.loaded - COALESCE(SUM(r.qty), 0) FROM "+e.items+" i LEFT JOIN "+e.records+
				" r ON r.sku = i.sku AND r.status = 'applied' WHERE i.sku = ? GROUP BY i.loaded", "hot"))
		assert.GreaterOrEqual(t, rem, int64(0))
		assert.Zero(t, e.scalar(t, "SELECT COUNT(*) FROM "+e.items+" WHERE remaining < 0 OR remaining > loaded"))
	})
}

// TestConcurrentDistinct: 200 distinct deducts of one unit race for 100 units.
func TestConcurrentDistinct(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		require.NoError(t, e.s.Load(ctx, "hot", 100))
		errs := make([]error, 200)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Go(func() { errs[i] = e.apply(ctx, ev(stock.EventDeducted, "hot", fmt.Sprintf("d%d", i), 1)) })
		}
		wg.Wait()
		var ok, refused int
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case errors.Is(err, stock.ErrRefused):
				refused++
			default:
				t.Errorf("unexpected error: %v", err)
			}
		}
		assert.Equal(t, 100, ok)
		assert.Equal(t, 100, refused)
		assert.Equal(t, int64(0), e.remaining(t, "hot"))
		assert.Equal(t, int64(100), e.scalar(t, "SELECT COUNT(*) FROM "+e.records+" WHERE status = 'applied'"))
		assert.Equal(t, int64(100), e.scalar(t, "SELECT COUNT(*) FROM "+e.records+" WHERE status = 'refused'"))
	})
}

// TestConcurrentBatches: 8 relays apply the same 200 events in batches of 25, each in its
// own order, so batches overlap and deadlock; retries and the fallback must keep every id
// applied once.
func TestConcurrentBatches(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		require.NoError(t, e.s.Load(ctx, "a", 150))
		require.NoError(t, e.s.Load(ctx, "b", 150))
		var evs []stock.Event
		for i := range 100 {
			for _, sku := range []string{"a", "b"} {
				evs = append(evs, ev(stock.EventDeducted, sku, fmt.Sprintf("o%03d", i), int64(i%3+1)))
			}
		}
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				mine := slices.Clone(evs)
				rand.Shuffle(len(mine), func(a, b int) { mine[a], mine[b] = mine[b], mine[a] })
				for batch := range slices.Chunk(mine, 25) {
					for i, err := range e.s.ApplyBatch(ctx, batch) {
						if err != nil && !errors.Is(err, stock.ErrRefused) {
							t.Errorf("%s/%s: %v", batch[i].SKU, batch[i].ID, err)
						}
					}
				}
			})
		}
		wg.Wait()
		for _, sku := range []string{"a", "b"} {
			assert.Equal(t, e.scalar(t, "SELECT 150 - COALESCE(SUM(qty), 0) FROM "+e.records+" WHERE sku = ? AND status = 'applied'", sku),
				e.remaining(t, sku), sku)
			assert.Equal(t, int64(100), e.scalar(t, "SELECT COUNT(*) FROM "+e.records+" WHERE sku = ?", sku))
			assert.Positive(t, e.scalar(t, "SELECT COUNT(*) FROM "+e.records+" WHERE sku = ? AND status = 'refused'", sku))
		}
	})
}

// BenchmarkApplyBatch applies deducts of distinct ids to one hot item, one at a time with
// Apply (batch=1) and with ApplyBatch in batches of 10 and 100, from 4 × GOMAXPROCS
// goroutines, on SQLite and, when configured, PostgreSQL and MySQL. events/s is the figure
// to compare; ns/op is per Apply or per batch.
func BenchmarkApplyBatch(b *testing.B) {
	for _, be := range backends() {
		for _, size := range []int{1, 10, 100} {
			b.Run(fmt.Sprintf("%s/batch=%d", be.name, size), func(b *testing.B) {
				e := open(b, be)
				ctx := context.Background()
				require.NoError(b, e.s.Load(ctx, "hot", stock.MaxQty))
				var seq sync.Mutex
				next := 0
				b.SetParallelism(4) // 4 × GOMAXPROCS goroutines
				b.ReportAllocs()
				b.ResetTimer()
				start := time.Now()
				b.RunParallel(func(pb *testing.PB) {
					evs := make([]stock.Event, size)
					for pb.Next() {
						seq.Lock()
						base := next
						next += size
						seq.Unlock()
						for i := range evs {
							evs[i] = ev(stock.EventDeducted, "hot", fmt.Sprintf("b%09d", base+i), 1)
						}
						if size == 1 {
							if err := e.apply(ctx, evs[0]); err != nil {
								b.Error(err)
							}
							continue
						}
						for _, err := range e.s.ApplyBatch(ctx, evs) {
							assert.NoError(b, err)
						}
					}
				})
				b.ReportMetric(float64(next)/time.Since(start).Seconds(), "events/s")
				b.ReportMetric(float64(size), "events/op")
			})
		}
	}
}

// TestListItems: ListItems pages through the items in byte order (as Go compares strings),
// which the reconciler relies on to find the items Redis lost from its registry.
func TestListItems(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		skus := []string{"b", "B", "a", "é", "a-1", "Z", "aa"}
		for _, sku := range skus {
			require.NoError(t, e.s.Load(ctx, sku, 1))
		}
		want := slices.Clone(skus)
		slices.Sort(want)
		var got []string
		after := ""
		for range 10 {
			page, err := e.s.ListItems(ctx, after, 3)
			require.NoError(t, err)
			got = append(got, page...)
			if len(page) < 3 {
				break
			}
			after = page[len(page)-1]
		}
		assert.Equal(t, want, got)
		_, err := e.s.ListItems(ctx, "", 0)
		assert.Error(t, err)
	})
}

// TestStoreConformance runs the stock.Store conformance suite on SQLite, and on PostgreSQL and
// MariaDB/MySQL when STOCK_TEST_POSTGRES and STOCK_TEST_MYSQL name a server.
func TestStoreConformance(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			stocktest.TestStore(t, func(t *testing.T) stock.Store { return open(t, b).s })
		})
	}
}
