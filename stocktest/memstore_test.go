package stocktest_test

import (
	"testing"

	"github.com/stockres/stock"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stocktest"
)

// TestStoreOnMemstore runs the stock.Store conformance suite on memstore (memstore is in the
// root module, which does not depend on this one).
func TestStoreOnMemstore(t *testing.T) {
	stocktest.TestStore(t, func(*testing.T) stock.Store { return memstore.New() })
}
