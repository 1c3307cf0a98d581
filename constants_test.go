package stock_test

import (
	"testing"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/engine"
)

// TestConstantsAreTheEngines: the limits and defaults package stock documents are the ones its
// engine applies.
func TestConstantsAreTheEngines(t *testing.T) {
	for _, c := range []struct {
		name      string
		api, used int64
	}{
		{"MaxQty", stock.MaxQty, engine.MaxQty},
		{"MaxNameLen", stock.MaxNameLen, engine.MaxNameLen},
		{"MaxHoldTTL", int64(stock.MaxHoldTTL), int64(engine.MaxHoldTTL)},
		{"DefaultTimeout", int64(stock.DefaultTimeout), int64(engine.DefaultTimeout)},
	} {
		if c.api != c.used {
			t.Errorf("stock.%s = %d, the engine uses %d", c.name, c.api, c.used)
		}
	}
}
