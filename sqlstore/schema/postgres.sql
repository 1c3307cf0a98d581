-- The tables of github.com/stockres/stock/sqlstore for PostgreSQL 12 or later,
-- with the default table prefix "stock_": the statements (*sqlstore.Store).Migrate runs.
-- For goose or golang-migrate, copy them into a migration of your own; for another
-- prefix (WithTablePrefix), replace "stock_" in the table names.
-- Migrate runs them from this file, which is embedded in the package: edit here to change them.

CREATE TABLE IF NOT EXISTS "stock_items" (
	sku        VARCHAR(255) COLLATE "C" NOT NULL PRIMARY KEY,
	remaining  BIGINT NOT NULL CHECK (remaining >= 0),
	loaded     BIGINT NOT NULL,
	updated_at TIMESTAMPTZ NOT NULL,
	CHECK (remaining <= loaded)
);

CREATE TABLE IF NOT EXISTS "stock_records" (
	sku        VARCHAR(255) COLLATE "C" NOT NULL,
	id         VARCHAR(255) COLLATE "C" NOT NULL,
	user_id    VARCHAR(255) NOT NULL,
	type       VARCHAR(16) NOT NULL,
	qty        BIGINT NOT NULL CHECK (qty > 0),
	status     VARCHAR(16) NOT NULL CHECK (status IN ('applied', 'restored', 'refused')),
	created_at TIMESTAMPTZ NOT NULL,
	updated_at TIMESTAMPTZ NOT NULL,
	PRIMARY KEY (sku, id)
);
