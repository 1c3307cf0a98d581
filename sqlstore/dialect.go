package sqlstore

import (
	"embed"
	"errors"
	"reflect"
	"strconv"
	"strings"
)

// Dialect is the SQL dialect of the database a Store runs on.
type Dialect int

// The supported dialects.
const (
	Postgres Dialect = iota + 1 // PostgreSQL 12 or later
	MySQL                       // MySQL 8.0.16 or later, MariaDB 10.4 or later (InnoDB)
	SQLite                      // SQLite 3.37 or later
)

// String returns the dialect's name: "postgres", "mysql" or "sqlite".
func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "postgres"
	case MySQL:
		return "mysql"
	case SQLite:
		return "sqlite"
	}
	return "Dialect(" + strconv.Itoa(int(d)) + ")"
}

// quote returns the identifier name quoted for the dialect. Names are built only from the
// validated prefix and constants.
func (d Dialect) quote(name string) string {
	if d == MySQL {
		return "`" + name + "`"
	}
	return `"` + name + `"`
}

// now is the dialect's expression for the current time in UTC.
func (d Dialect) now() string {
	switch d {
	case Postgres:
		return "CURRENT_TIMESTAMP"
	case MySQL:
		return "UTC_TIMESTAMP(6)"
	}
	return "strftime('%Y-%m-%d %H:%M:%f', 'now')"
}

// rebind turns the ? placeholders of q into $1, $2, … for PostgreSQL. q is one of this
// package's constant statements, which have no ? inside literals.
func (d Dialect) rebind(q string) string {
	if d != Postgres {
		return q
	}
	var b strings.Builder
	n := 0
	for i := 0; i < len(q); i++ {
		if q[i] == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteByte(q[i])
	}
	return b.String()
}

// schemaFiles holds the CREATE TABLE statements of each dialect, in schema/<dialect>.sql, with
// the default table prefix: the files users copy into migrations of their own are the
// statements Migrate runs.
//
//go:embed schema/*.sql
var schemaFiles embed.FS

// schema returns the CREATE TABLE statements for the items and records tables (quoted names):
// the statements of the dialect's schema file, without its comment lines, with items and
// records in place of the default names.
func (d Dialect) schema(items, records string) []string {
	b, err := schemaFiles.ReadFile("schema/" + d.String() + ".sql")
	if err != nil {
		panic("sqlstore: no schema file for dialect " + d.String()) // New accepts only the dialects that have one
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, "--") {
			lines = append(lines, l)
		}
	}
	names := strings.NewReplacer(d.quote(defaultPrefix+"items"), items, d.quote(defaultPrefix+"records"), records)
	var stmts []string
	for _, stmt := range strings.Split(strings.Join(lines, "\n"), ";\n") {
		if stmt = strings.TrimSpace(stmt); stmt != "" {
			stmts = append(stmts, names.Replace(stmt))
		}
	}
	return stmts
}

// onConflict is the clause that makes an INSERT into the records table skip an existing
// (sku, id). MySQL has none that leaves other errors alone and reports a skip reliably (INSERT
// IGNORE turns truncation and CHECK failures into warnings; ON DUPLICATE KEY UPDATE's row
// count depends on clientFoundRows): a plain INSERT fails with 1062 instead, see isDuplicate.
func (d Dialect) onConflict() string {
	if d == MySQL {
		return ""
	}
	return " ON CONFLICT (sku, id) DO NOTHING"
}

// isDuplicate reports whether err is MySQL's duplicate-key error.
func isDuplicate(err error) bool {
	n, ok := mysqlErrorNumber(err)
	return ok && n == 1062 // ER_DUP_ENTRY
}

// mysqlErrorNumber returns the server error number of the first *mysql.MySQLError of
// github.com/go-sql-driver/mysql in err's chain. It reads the error's Number field by reflection
// so that this package does not import (and register) the MySQL driver for users of another
// database.
func mysqlErrorNumber(err error) (uint16, bool) {
	for err != nil {
		if n, ok := mysqlNumber(err); ok {
			return n, true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if n, ok := mysqlErrorNumber(e); ok {
					return n, true
				}
			}
			return 0, false
		default:
			return 0, false
		}
	}
	return 0, false
}

// mysqlDriverPkg is the import path of the MySQL driver whose errors mysqlNumber reads.
const mysqlDriverPkg = "github.com/go-sql-driver/mysql"

// mysqlNumber returns the Number of err when err is a *MySQLError of the MySQL driver (also a
// vendored copy of it).
func mysqlNumber(err error) (uint16, bool) {
	t := reflect.TypeOf(err)
	if t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
		return 0, false
	}
	t = t.Elem()
	if pkg := t.PkgPath(); t.Name() != "MySQLError" || (pkg != mysqlDriverPkg && !strings.HasSuffix(pkg, "/vendor/"+mysqlDriverPkg)) {
		return 0, false
	}
	v := reflect.ValueOf(err)
	if v.IsNil() {
		return 0, false
	}
	f := v.Elem().FieldByName("Number")
	if !f.IsValid() || f.Kind() != reflect.Uint16 {
		return 0, false
	}
	return uint16(f.Uint()), true
}

// retryable reports whether err is a serialization failure, a deadlock or a lock timeout,
// after which the whole transaction can run again.
func retryable(err error) bool {
	if errors.Is(err, errRaced) {
		return true
	}
	if n, ok := mysqlErrorNumber(err); ok {
		return n == 1213 || n == 1205 // ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT
	}
	var pe interface{ SQLState() string } // pgconn.PgError, pq.Error
	if errors.As(err, &pe) {
		s := pe.SQLState()
		return s == "40001" || s == "40P01" || s == "55P03" // serialization_failure, deadlock_detected, lock_not_available
	}
	var se interface{ Code() int } // modernc.org/sqlite
	if errors.As(err, &se) {
		c := se.Code() & 0xff
		return c == 5 || c == 6 // SQLITE_BUSY, SQLITE_LOCKED
	}
	return false
}

// placeholders returns "?, ?, …" with n marks (not for PostgreSQL).
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}
