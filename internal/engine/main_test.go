package engine

import (
	"os"
	"testing"

	"github.com/stockres/stock/internal/redistest"
)

// TestMain starts the real Redis deployments the tests run on when STOCK_REDIS_SERVER names a
// redis-server binary (redistest.Backends), and stops them at the end.
func TestMain(m *testing.M) { os.Exit(redistest.Run(m)) }
