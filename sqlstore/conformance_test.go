package sqlstore_test

import (
	"testing"

	"github.com/stockres/stock"
	"github.com/stockres/stock/stocktest"
)

// TestStoreConformance runs the stock.Store conformance suite on SQLite, and on PostgreSQL and
// MariaDB/MySQL when STOCK_TEST_POSTGRES and STOCK_TEST_MYSQL name a server.
func TestStoreConformance(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			stocktest.TestStore(t, func(t *testing.T) stock.Store { return open(t, b).s })
		})
	}
}
