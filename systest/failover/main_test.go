package failover_test

import (
	"os"
	"testing"

	"github.com/stockres/stock/internal/redistest"
)

func TestMain(m *testing.M) { os.Exit(redistest.Run(m)) }
