package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

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
