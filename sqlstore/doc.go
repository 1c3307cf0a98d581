// Package sqlstore is a stock.Store on database/sql: the database of record for a
// stock.Reserver, on PostgreSQL, MySQL/MariaDB or SQLite. It also implements
// stock.RecordLister, stock.ItemLister and stock.BatchStore.
//
// The caller opens the *sql.DB with the driver of its choice and owns it; New never closes it.
// Tested drivers: github.com/jackc/pgx/v5/stdlib ("pgx"), github.com/go-sql-driver/mysql
// ("mysql") and modernc.org/sqlite ("sqlite", pure Go, the embedded default). The package
// imports and registers no driver; on MySQL it reads the error numbers of the go-sql-driver's
// errors (duplicate key, deadlock, lock wait timeout) without importing it.
//
// # Schema
//
// Migrate creates two tables, named with a prefix ("stock_" unless WithTablePrefix says
// otherwise), if they do not exist. Shown here for PostgreSQL; MySQL uses VARBINARY(255) for
// the names (byte-exact comparison; the default collations ignore case and trailing spaces)
// and DATETIME(6) in UTC for the times, SQLite INTEGER and TEXT columns in STRICT tables.
//
//	CREATE TABLE stock_items (                -- one row per item
//	    sku        VARCHAR(255) COLLATE "C" PRIMARY KEY,
//	    remaining  BIGINT NOT NULL CHECK (remaining >= 0),
//	    loaded     BIGINT NOT NULL,           -- Load plus every applied restock
//	    updated_at TIMESTAMPTZ NOT NULL,
//	    CHECK (remaining <= loaded)
//	);
//	CREATE TABLE stock_records (              -- the local message table: one row per (sku, id)
//	    sku        VARCHAR(255) COLLATE "C" NOT NULL,
//	    id         VARCHAR(255) COLLATE "C" NOT NULL,
//	    user_id    VARCHAR(255) NOT NULL,     -- "" when the event has no user
//	    type       VARCHAR(16) NOT NULL,      -- the event that created the row
//	    qty        BIGINT NOT NULL CHECK (qty > 0),
//	    status     VARCHAR(16) NOT NULL CHECK (status IN ('applied', 'restored', 'refused')),
//	    created_at TIMESTAMPTZ NOT NULL,
//	    updated_at TIMESTAMPTZ NOT NULL,
//	    PRIMARY KEY (sku, id)
//	);
//
// Migrate is safe to run from many processes at once (every replica of a service at start-up,
// every `stockctl load -dsn`): they take turns on a lock named after the table prefix, a
// PostgreSQL advisory lock held by the migrating transaction, a MySQL GET_LOCK, or SQLite's
// database write lock. Its statements are plain SQL files in the directory schema of this
// package, one per dialect (postgres.sql, mysql.sql, sqlite.sql, with the default prefix),
// which Migrate embeds: deployments that run their migrations with goose, golang-migrate or by
// hand, and never call Migrate, copy them.
//
// Ids sort byte-wise in every dialect (COLLATE "C", VARBINARY, SQLite's BINARY), so List pages
// in the order of Go's string comparison.
//
// Times come from the database clock, in UTC: CURRENT_TIMESTAMP on PostgreSQL (the start of
// the transaction), UTC_TIMESTAMP(6) on MySQL, strftime('%Y-%m-%d %H:%M:%f', 'now') on SQLite
// (milliseconds). The MySQL DSN may or may not have parseTime=true.
//
// # How Apply works
//
// Every Apply is one transaction (READ COMMITTED on PostgreSQL and MySQL). A deduct or
// confirm inserts its record with status applied (INSERT … ON CONFLICT DO NOTHING, or a plain
// INSERT whose duplicate-key error 1062 is caught on MySQL), then runs
//
//	UPDATE stock_items SET remaining = remaining - qty WHERE sku = ? AND remaining >= qty
//
// and, when that updates no row for too little stock, marks the record refused in the same
// transaction and returns an error wrapping stock.ErrRefused. When the item has no row, it
// writes nothing and returns an error wrapping stock.ErrNotLoaded: a setup error, not a
// refusal, which a relay retries (never giving the sale back) until the item is loaded in the
// store (Store.Load, or stockops.Preheat). When the insert finds
// a record already there, nothing else is written and Apply answers from its status: nil for
// applied and restored, ErrRefused for refused. Concurrent Applies of one id therefore apply
// it once: the unique key makes all but one wait for the first and then see its record.
//
// A restore (EventRestored or EventRefused) flips an applied deduct or confirm to restored and
// adds the record's quantity back, in one transaction; for an id it has no record of it
// inserts a restored tombstone and changes no stock, so a late deduct of the id is answered
// nil and takes nothing; otherwise it does nothing. A restock inserts its record and adds to
// remaining and loaded; a restock of an item with no row writes nothing and returns an error
// wrapping stock.ErrNotLoaded, which a relay retries until the item is loaded. Held,
// cancelled and expired events are accepted and ignored.
//
// Serialization failures, deadlocks and lock timeouts (PostgreSQL 40001, 40P01 and 55P03,
// MySQL 1213 and 1205, SQLite BUSY and LOCKED) roll the transaction back and run it again, up to 10 times with
// jittered backoff. Any other error is returned as is; the outcome is then unknown and
// applying the same event again is always safe.
//
// # Batches
//
// ApplyBatch applies its events in one transaction with one commit and a handful of
// statements, however many events: it locks the rows of the batch's items (SELECT … FOR
// UPDATE, in SKU order), reads the records its ids already have (one query per item), works
// out each event's outcome in order from those, exactly as Apply would, and writes the result
// with one multi-row INSERT of the new records, one UPDATE per stored record it restores and
// one UPDATE per item. The CHECK on remaining backs up the arithmetic. A refusal is an outcome
// like any other and is committed with the rest; no savepoint is needed. Events are applied in
// the caller's order. The first failure that is not a refusal (an invalid event, a restock of
// an item with no row) ends the batch, as stock.BatchStore requires: the events before it are
// committed, the events after it are not applied and get an error that wraps no sentinel. If
// the transaction fails after its retries, the batch applies the events one by one with
// Apply, and stops the same way at the first that fails.
//
// Concurrent batches queue on the item rows and do not deadlock on each other. A batch and a
// single Apply of the same id at the same moment can (Apply takes the record first, the item
// second): MySQL breaks the deadlock at once; on PostgreSQL the batch sets lock_timeout to
// 100 ms once it holds its items, instead of waiting for deadlock_timeout (1 s by default);
// the loser runs again. Taking the item first in Apply as well would rule this out, but cost
// Apply 25 % of its throughput on a hot item on PostgreSQL and 30–45 % on MariaDB, for a case
// that needs a duplicate delivery racing itself.
//
// Measured with BenchmarkApplyBatch (deducts of distinct ids on one hot item, 8 goroutines,
// 2 shared cores, PostgreSQL 15 and MariaDB 10.11 with their default durability settings,
// SQLite in WAL with synchronous NORMAL), in events per second, noisy by ±50 %:
//
//	                  Apply   batches of 10   batches of 100
//	SQLite            6–9 k       24–34 k          63–75 k
//	PostgreSQL      0.5–1.2 k    1.7–6.2 k         18–24 k
//	MariaDB         1.5–1.9 k    5.5–7 k           28–38 k
//
// Running Apply's statements for each event inside one transaction instead gave 4 k (batches
// of 100 on PostgreSQL) and 3.4 k (MariaDB): fewer commits alone do not help much when each
// event still costs two round trips under the item's lock.
//
// # SQLite
//
// Open the file with a busy timeout, WAL and immediate transactions, for example
//
//	sql.Open("sqlite", "file:stock.db?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
//
// Writers take turns on one database lock; the busy timeout makes them wait for it instead of
// failing, and _txlock=immediate takes it at BEGIN, so that no transaction has to upgrade a
// read lock. _pragma=synchronous(NORMAL) trades the durability of the last transactions
// on power loss for fewer fsyncs. Several open connections are fine; db.SetMaxOpenConns(1)
// also works and avoids lock waits, at the cost of queuing reads behind writes.
//
// # MySQL
//
// The tables use InnoDB; MySQL 8.0.16 or MariaDB 10.4 or later, for the CHECK constraints.
// Without interpolateParams=true in the DSN the driver prepares, runs and closes a
// server-side statement for every query with arguments; with it, Apply ran about 1.3 times
// as fast (2.0 k against 1.5 k events/s; batches of 10, 8.0 k against 5.7 k).
package sqlstore
