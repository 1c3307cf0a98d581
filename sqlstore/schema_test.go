package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/sqlstore"
)

// schemaStatements returns the statements of a schema file, without its comments.
func schemaStatements(t *testing.T, d sqlstore.Dialect) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("schema", d.String()+".sql"))
	require.NoError(t, err)
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, "--") {
			lines = append(lines, l)
		}
	}
	var stmts []string
	for _, s := range strings.Split(strings.Join(lines, "\n"), ";\n") {
		if s = strings.TrimSpace(s); s != "" {
			stmts = append(stmts, s)
		}
	}
	require.NotEmpty(t, stmts)
	return stmts
}

// TestSchemaFilesMatchMigrate runs the schema file of each backend's dialect in one empty
// namespace (a SQLite file, a PostgreSQL schema, a MySQL database) and Migrate with the
// default prefix in another, and compares what the database catalogs say they created:
// tables, columns and their types, nullability and collations, constraints and indexes.
func TestSchemaFilesMatchMigrate(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			dsn := b.dsn(t)
			var ns [2]string   // the namespaces: file, Migrate
			var dsns [2]string // DSNs that open them
			var catalog func(db *sql.DB, ns string) []string
			switch b.dialect {
			case sqlstore.SQLite:
				dsns = [2]string{sqliteDSN(t), sqliteDSN(t)}
				catalog = func(db *sql.DB, _ string) []string {
					return rows(ctx, t, db, `SELECT type || ' ' || name || ' ' || tbl_name || ' ' || coalesce(sql, '') FROM sqlite_master ORDER BY type, name`)
				}
			case sqlstore.Postgres:
				admin := openDB(ctx, t, b.driver, dsn)
				u, err := url.Parse(dsn)
				require.NoError(t, err)
				ns, dsns = namespaces(ctx, t, admin, "SCHEMA", " CASCADE", func(n string) string {
					q := u.Query()
					q.Set("search_path", n)
					v := *u
					v.RawQuery = q.Encode()
					return v.String()
				})
				catalog = func(db *sql.DB, ns string) []string {
					var out []string
					out = append(out, rows(ctx, t, db, `SELECT c.relname || ' ' || c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 ORDER BY 1`, ns)...)
					out = append(out, rows(ctx, t, db, `SELECT c.relname || ' ' || a.attnum::text || ' ' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull::text || ' ' || coalesce(co.collname, '') || ' ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_collation co ON co.oid = a.attcollation LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE n.nspname = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY 1`, ns)...)
					out = append(out, rows(ctx, t, db, `SELECT c.relname || ' ' || con.conname || ' ' || pg_get_constraintdef(con.oid) FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 ORDER BY 1`, ns)...)
					out = append(out, rows(ctx, t, db, `SELECT tablename || ' ' || indexname || ' ' || replace(indexdef, schemaname || '.', '') FROM pg_indexes WHERE schemaname = $1 ORDER BY 1`, ns)...)
					return out
				}
			case sqlstore.MySQL:
				admin := openDB(ctx, t, b.driver, dsn)
				cfg, err := mysql.ParseDSN(dsn)
				require.NoError(t, err)
				ns, dsns = namespaces(ctx, t, admin, "DATABASE", "", func(n string) string {
					c := cfg.Clone()
					c.DBName = n
					return c.FormatDSN()
				})
				catalog = func(db *sql.DB, _ string) []string {
					var out []string
					for _, tbl := range rows(ctx, t, db, `SHOW TABLES`) {
						var name, create string
						require.NoError(t, db.QueryRowContext(ctx, "SHOW CREATE TABLE `"+tbl+"`").Scan(&name, &create))
						out = append(out, create)
					}
					return out
				}
			}
			fileDB, migDB := openDB(ctx, t, b.driver, dsns[0]), openDB(ctx, t, b.driver, dsns[1])
			for _, stmt := range schemaStatements(t, b.dialect) {
				_, err := fileDB.ExecContext(ctx, stmt)
				require.NoError(t, err, "schema/%s.sql: %s", b.dialect, stmt)
			}
			s, err := sqlstore.New(migDB, b.dialect)
			require.NoError(t, err)
			require.NoError(t, s.Migrate(ctx))
			fromFile, fromMigrate := catalog(fileDB, ns[0]), catalog(migDB, ns[1])
			require.NotEmpty(t, fromMigrate)
			require.Contains(t, strings.Join(fromMigrate, "\n"), "stock_items")
			require.Equal(t, strings.Join(fromMigrate, "\n"), strings.Join(fromFile, "\n"), "schema/%s.sql creates something else than Migrate", b.dialect)
		})
	}
}

// namespaces creates two namespaces of kind ("SCHEMA", "DATABASE") with admin, dropped (with
// the drop's suffix) when the test ends, and returns their names and the DSNs that open them.
func namespaces(ctx context.Context, t *testing.T, admin *sql.DB, kind, drop string, dsn func(ns string) string) (ns, dsns [2]string) {
	for i := range ns {
		ns[i] = fmt.Sprintf("stock_schema%d_%08x", i, rand.Uint32())
		_, err := admin.ExecContext(ctx, "CREATE "+kind+" "+ns[i])
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = admin.Exec("DROP " + kind + " " + ns[i] + drop) })
		dsns[i] = dsn(ns[i])
	}
	return ns, dsns
}

// rows returns the single string column of a query's rows.
func rows(ctx context.Context, t *testing.T, db *sql.DB, q string, args ...any) []string {
	t.Helper()
	rs, err := db.QueryContext(ctx, q, args...)
	require.NoError(t, err)
	defer rs.Close()
	var out []string
	for rs.Next() {
		var s string
		require.NoError(t, rs.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rs.Err())
	return out
}

// Environment of a TestMigrateChildProcess run, set by TestMigrateConcurrentProcesses.
const (
	childDriver  = "STOCK_MIGRATE_CHILD_DRIVER"  // database/sql driver name
	childDSN     = "STOCK_MIGRATE_CHILD_DSN"     // its DSN
	childDialect = "STOCK_MIGRATE_CHILD_DIALECT" // sqlstore.Dialect as a number
	childPrefix  = "STOCK_MIGRATE_CHILD_PREFIX"  // table prefix
	childStart   = "STOCK_MIGRATE_CHILD_START"   // Unix time in ns at which to call Migrate
)

// TestMigrateChildProcess is one process of TestMigrateConcurrentProcesses: it opens the
// database, waits for the common start time and runs Migrate once. It does nothing when run
// on its own.
func TestMigrateChildProcess(t *testing.T) {
	driver := os.Getenv(childDriver)
	if driver == "" {
		t.Skip("runs only as a child process of TestMigrateConcurrentProcesses")
	}
	d, err := strconv.Atoi(os.Getenv(childDialect))
	require.NoError(t, err)
	start, err := strconv.ParseInt(os.Getenv(childStart), 10, 64)
	require.NoError(t, err)
	db, err := sql.Open(driver, os.Getenv(childDSN))
	require.NoError(t, err)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, db.PingContext(ctx)) // connect before the start, to meet the others there
	s, err := sqlstore.New(db, sqlstore.Dialect(d), sqlstore.WithTablePrefix(os.Getenv(childPrefix)))
	require.NoError(t, err)
	time.Sleep(time.Until(time.Unix(0, start)))
	require.NoError(t, s.Migrate(ctx), "MIGRATE FAILED")
}

// TestMigrateConcurrentProcesses runs Migrate in three processes at the same moment on fresh
// tables, several times, on every backend: every process must succeed and the tables must
// work. Before Migrate took a lock, PostgreSQL failed most rounds with 23505 on
// pg_type_typname_nsp_index, 42P07 or 42710.
func TestMigrateConcurrentProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	if os.Getenv("STOCK_TEST_POSTGRES") == "" || os.Getenv("STOCK_TEST_MYSQL") == "" {
		t.Log("STOCK_TEST_POSTGRES and STOCK_TEST_MYSQL name the PostgreSQL and MariaDB/MySQL servers this test also runs on; unset ones are skipped")
	}
	const rounds, procs = 8, 3
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()    // tables of its own on each server
			dsn := b.dsn(t) // one SQLite file for all rounds and processes
			pctx, pcancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer pcancel()
			db := openDB(pctx, t, b.driver, dsn)
			failed := 0
			for round := 0; round < rounds; round++ {
				prefix := freshPrefix(t, db, "m")
				start := time.Now().Add(time.Second).UnixNano()
				outs := make([]string, procs)
				errs := make([]error, procs)
				var wg sync.WaitGroup
				for p := 0; p < procs; p++ {
					wg.Go(func() {
						cmd := exec.Command(os.Args[0], "-test.run=^TestMigrateChildProcess$", "-test.count=1", "-test.v")
						cmd.Env = append(os.Environ(),
							childDriver+"="+b.driver, childDSN+"="+dsn, childDialect+"="+strconv.Itoa(int(b.dialect)),
							childPrefix+"="+prefix, childStart+"="+strconv.FormatInt(start, 10))
						out, err := cmd.CombinedOutput()
						outs[p], errs[p] = string(out), err
					})
				}
				wg.Wait()
				for p := 0; p < procs; p++ {
					if errs[p] != nil {
						failed++
						t.Errorf("round %d, process %d: %v\n%s", round, p, errs[p], migrateFailure(outs[p]))
					} else if !strings.Contains(outs[p], "--- PASS: TestMigrateChildProcess") {
						t.Errorf("round %d, process %d did not run Migrate:\n%s", round, p, outs[p])
					}
				}
				// The tables work: load an item and read it back.
				s, err := sqlstore.New(db, b.dialect, sqlstore.WithTablePrefix(prefix))
				require.NoError(t, err)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := s.Load(ctx, "sku", 3); err != nil {
					t.Errorf("round %d: Load on the migrated tables: %v", round, err)
				} else if n, err := s.Remaining(ctx, "sku"); err != nil || n != 3 {
					t.Errorf("round %d: Remaining = %d, %v; want 3", round, n, err)
				}
			}
			t.Logf("%s: %d rounds of %d concurrent Migrate processes, %d failed", b.name, rounds, procs, failed)
		})
	}
}

// migrateFailure returns the line of a child's output that gives Migrate's error, or all of it.
func migrateFailure(out string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "MIGRATE FAILED") {
			return strings.TrimSpace(l)
		}
	}
	return out
}

// TestMigrateWaitsForLock holds the migration lock of a prefix from another session, as a
// concurrent Migrate would: Migrate must wait for it (and give up when its context ends,
// creating nothing), then succeed once the lock is released.
func TestMigrateWaitsForLock(t *testing.T) {
	ran := false
	for _, b := range backends() {
		var lock, unlock string
		switch b.dialect {
		case sqlstore.Postgres:
			lock, unlock = `SELECT pg_advisory_lock($1, hashtext($2))`, `SELECT pg_advisory_unlock($1, hashtext($2))`
		case sqlstore.MySQL:
			lock, unlock = `SELECT GET_LOCK(?, 10)`, `SELECT RELEASE_LOCK(?)`
		default:
			continue // SQLite: the database lock, which TestMigrateConcurrentProcesses covers
		}
		ran = true
		t.Run(b.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			db := openDB(ctx, t, b.driver, b.dsn(t))
			prefix := freshPrefix(t, db, "w")
			args := []any{"stock_migrate:" + prefix}
			if b.dialect == sqlstore.Postgres {
				args = append([]any{0x73746f63}, args...)
			}
			conn, err := db.Conn(ctx)
			require.NoError(t, err)
			defer conn.Close()
			_, err = conn.ExecContext(ctx, lock, args...)
			require.NoError(t, err)

			s, err := sqlstore.New(db, b.dialect, sqlstore.WithTablePrefix(prefix))
			require.NoError(t, err)
			wctx, wcancel := context.WithTimeout(ctx, 500*time.Millisecond)
			err = s.Migrate(wctx)
			wcancel()
			require.Error(t, err, "Migrate ran while another session held the migration lock")
			_, lerr := s.Remaining(ctx, "sku")
			require.Error(t, lerr)
			require.NotContains(t, lerr.Error(), "not loaded", "Migrate created the tables while another session held the lock")

			_, err = conn.ExecContext(ctx, unlock, args...)
			require.NoError(t, err)
			require.NoError(t, s.Migrate(ctx))
			require.NoError(t, s.Load(ctx, "sku", 1))
		})
	}
	if !ran {
		t.Skip("needs PostgreSQL or MySQL/MariaDB: set STOCK_TEST_POSTGRES or STOCK_TEST_MYSQL")
	}
}

// TestMigrateConcurrentPools runs Migrate at the same moment from eight stores on separate
// *sql.DB pools (as separate processes would), on fresh tables and then again on existing
// ones, on every backend: every call must succeed and the store must work afterwards.
func TestMigrateConcurrentPools(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			dsn := b.dsn(t)
			const procs = 8
			dbs := make([]*sql.DB, procs)
			for i := range dbs {
				dbs[i] = openDB(ctx, t, b.driver, dsn)
			}
			prefix := freshPrefix(t, dbs[0], "p")
			// migrate runs Migrate from every pool at the same moment.
			migrate := func(tables string) {
				var wg sync.WaitGroup
				errs := make([]error, procs)
				start := make(chan struct{})
				for i := range procs {
					wg.Go(func() {
						s, err := sqlstore.New(dbs[i], b.dialect, sqlstore.WithTablePrefix(prefix))
						<-start
						if errs[i] = err; err == nil {
							errs[i] = s.Migrate(ctx)
						}
					})
				}
				close(start)
				wg.Wait()
				for i, err := range errs {
					assert.NoError(t, err, "process %d: Migrate on %s tables", i, tables)
				}
			}
			migrate("fresh")
			s, _ := sqlstore.New(dbs[0], b.dialect, sqlstore.WithTablePrefix(prefix))
			require.NoError(t, s.Load(ctx, "m", 2))
			require.NoError(t, s.Apply(ctx, stock.Event{Type: stock.EventDeducted, SKU: "m", ID: "a", Qty: 1, Seq: 1, At: time.Now()}))
			rem, err := s.Remaining(ctx, "m")
			require.NoError(t, err)
			require.Equal(t, int64(1), rem)
			migrate("existing")
		})
	}
}
