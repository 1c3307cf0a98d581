package contract_test

import (
	"os"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // the database/sql drivers of the SQL stores the tests open
	_ "modernc.org/sqlite"

	"github.com/stockres/stock/internal/redistest"
)

func TestMain(m *testing.M) { os.Exit(redistest.Run(m)) }
