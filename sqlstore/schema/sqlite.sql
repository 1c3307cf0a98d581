-- The tables of github.com/stockres/stock/sqlstore for SQLite 3.37 or later,
-- with the default table prefix "stock_": the statements (*sqlstore.Store).Migrate runs.
-- For goose or golang-migrate, copy them into a migration of your own; for another
-- prefix (WithTablePrefix), replace "stock_" in the table names.
-- Migrate runs them from this file, which is embedded in the package: edit here to change them.

CREATE TABLE IF NOT EXISTS "stock_items" (
	sku        TEXT NOT NULL PRIMARY KEY,
	remaining  INTEGER NOT NULL CHECK (remaining >= 0),
	loaded     INTEGER NOT NULL,
	updated_at TEXT NOT NULL,
	CHECK (remaining <= loaded)
) WITHOUT ROWID, STRICT;

CREATE TABLE IF NOT EXISTS "stock_records" (
	sku        TEXT NOT NULL,
	id         TEXT NOT NULL,
	user_id    TEXT NOT NULL,
	type       TEXT NOT NULL,
	qty        INTEGER NOT NULL CHECK (qty > 0),
	status     TEXT NOT NULL CHECK (status IN ('applied', 'restored', 'refused')),
	created_at TEXT NOT NULL,
	updated_at TEXT NOT NULL,
	PRIMARY KEY (sku, id)
) WITHOUT ROWID, STRICT;
