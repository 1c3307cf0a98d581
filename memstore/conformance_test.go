package memstore_test

import (
	"testing"

	"github.com/stockres/stock"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stocktest"
)

// TestStoreConformance runs the stock.Store conformance suite on memstore.
func TestStoreConformance(t *testing.T) {
	stocktest.TestStore(t, func(*testing.T) stock.Store { return memstore.New() })
}
