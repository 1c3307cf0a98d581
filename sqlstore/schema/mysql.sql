-- The tables of github.com/stockres/stock/sqlstore for MySQL 8.0.16 or later, MariaDB 10.4 or later,
-- with the default table prefix "stock_": the statements (*sqlstore.Store).Migrate runs.
-- For goose or golang-migrate, copy them into a migration of your own; for another
-- prefix (WithTablePrefix), replace "stock_" in the table names.
-- Migrate runs them from this file, which is embedded in the package: edit here to change them.

CREATE TABLE IF NOT EXISTS `stock_items` (
	sku        VARBINARY(255) NOT NULL,
	remaining  BIGINT NOT NULL,
	loaded     BIGINT NOT NULL,
	updated_at DATETIME(6) NOT NULL,
	PRIMARY KEY (sku),
	CHECK (remaining >= 0),
	CHECK (remaining <= loaded)
) ENGINE=InnoDB;

CREATE TABLE IF NOT EXISTS `stock_records` (
	sku        VARBINARY(255) NOT NULL,
	id         VARBINARY(255) NOT NULL,
	user_id    VARBINARY(255) NOT NULL,
	type       VARCHAR(16) NOT NULL,
	qty        BIGINT NOT NULL,
	status     VARCHAR(16) NOT NULL,
	created_at DATETIME(6) NOT NULL,
	updated_at DATETIME(6) NOT NULL,
	PRIMARY KEY (sku, id),
	CHECK (qty > 0),
	CHECK (status IN ('applied', 'restored', 'refused'))
) ENGINE=InnoDB;
