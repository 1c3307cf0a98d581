package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"time"
)

// migrateLockClass is the first key of PostgreSQL's two-key advisory lock that Migrate takes
// ("stoc" in ASCII); the second is hashtext of the lock name.
const migrateLockClass = 0x73746f63

// migrateLockWait is how long one GET_LOCK call waits on MySQL before Migrate checks its
// context and asks again.
const migrateLockWait = 5 * time.Second

// lockName names the migration lock of the tables with this prefix: processes migrating the
// same tables take turns, other prefixes do not wait for them. At most 14 + 48 bytes, within
// MySQL's 64-byte limit for GET_LOCK names.
func (s *Store) lockName() string { return "stock_migrate:" + s.prefix }

// Migrate creates the tables if they do not exist. It is idempotent, changes no existing
// table, and is safe to run concurrently from any number of processes: they take turns on a
// lock, and each finds the tables the first one created. The lock is, on PostgreSQL, a
// transaction-level advisory lock (pg_advisory_xact_lock) taken in the transaction that runs
// the statements, so that the tables appear all at once or not at all; on MySQL, a named lock
// (GET_LOCK) held by one connection while it runs the statements (MySQL commits each DDL
// statement by itself); on SQLite, the database's own write lock, taken by a transaction that
// runs the statements (use the busy timeout the package doc recommends). The lock is named
// after the table prefix, so Stores with other prefixes do not wait for each other.
//
// The same statements are in the files of the schema directory of this package, for users
// of migration tools such as goose or golang-migrate (with the default prefix).
func (s *Store) Migrate(ctx context.Context) error {
	var err error
	switch s.d {
	case Postgres:
		err = s.inTx(ctx, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, migrateLockClass, s.lockName()); err != nil {
				return err
			}
			return execAll(ctx, tx, s.q.schema)
		})
	case MySQL:
		err = s.migrateMySQL(ctx)
	default:
		err = s.inTx(ctx, func(tx *sql.Tx) error { return execAll(ctx, tx, s.q.schema) })
	}
	if err != nil {
		return fmt.Errorf("sqlstore: migrate: %w", err)
	}
	return nil
}

// migrateMySQL runs the schema statements on one connection while it holds the named lock.
func (s *Store) migrateMySQL(ctx context.Context) (err error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close() // also ends the session's lock if RELEASE_LOCK did not run
	for {
		var got sql.NullInt64
		err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, ?)`, s.lockName(), int(migrateLockWait/time.Second)).Scan(&got)
		if err != nil {
			return err
		}
		if got.Valid && got.Int64 == 1 {
			break
		}
		if !got.Valid { // an error inside GET_LOCK, such as a killed wait
			return fmt.Errorf("GET_LOCK(%q) returned NULL", s.lockName())
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	defer func() {
		// A failed release leaves the lock to the session, which Close ends: the connection
		// goes back to the pool only when the release worked.
		var released sql.NullInt64
		if rerr := conn.QueryRowContext(context.WithoutCancel(ctx), `SELECT RELEASE_LOCK(?)`, s.lockName()).Scan(&released); rerr != nil || !released.Valid || released.Int64 != 1 {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn }) // discard the connection
			if err == nil && rerr != nil {
				err = rerr
			}
		}
	}()
	return execAll(ctx, conn, s.q.schema)
}

// execer is a *sql.Tx or *sql.Conn.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func execAll(ctx context.Context, db execer, stmts []string) error {
	for _, stmt := range stmts {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	return nil
}
