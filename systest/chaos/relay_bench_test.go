package chaos_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/sqlstore"
	"github.com/stockres/stock/stockops"
)

// BenchmarkRelay measures how fast a Relay drains an outbox into sqlstore: b.N deducts are made
// first (not timed), then one relay delivers them, in batches of 128, into SQLite and, with
// STOCK_TEST_POSTGRES, PostgreSQL. Redis is a real server with STOCK_REDIS_SERVER, else
// miniredis. The figure to read is events/s; the store's books are checked at the end.
func BenchmarkRelay(b *testing.B) {
	stores := []struct{ name, driver, dsn string }{{"sqlite", "sqlite", ""}}
	if dsn := os.Getenv("STOCK_TEST_POSTGRES"); dsn != "" {
		stores = append(stores, struct{ name, driver, dsn string }{"postgres", "pgx", dsn})
	}
	for _, st := range stores {
		b.Run(st.name, func(b *testing.B) {
			ctx := context.Background()
			var c rueidis.Client
			if redistest.ServerBinary(b) != "" {
				c = redistest.StartServer(b).Client(b)
			} else {
				_, c = redistest.Miniredis(b)
			}
			dsn, dialect := st.dsn, sqlstore.Postgres
			if st.driver == "sqlite" {
				dsn, dialect = "file:"+filepath.Join(b.TempDir(), "stock.db")+
					"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate", sqlstore.SQLite
			}
			db, err := sql.Open(st.driver, dsn)
			require.NoError(b, err)
			b.Cleanup(func() { db.Close() })
			prefix := fmt.Sprintf("stock_b%08x_", rand.Uint32())
			store, err := sqlstore.New(db, dialect, sqlstore.WithTablePrefix(prefix))
			require.NoError(b, err)
			require.NoError(b, store.Migrate(ctx))
			dropTables(b, db, prefix)
			r, err := stock.New(c)
			require.NoError(b, err)
			loaded := int64(b.N) + 1
			require.NoError(b, r.Load(ctx, "hot", loaded))
			require.NoError(b, store.Load(ctx, "hot", loaded))
			var wg sync.WaitGroup
			for w := range 32 {
				wg.Go(func() {
					for i := w; i < b.N; i += 32 {
						if _, err := r.Deduct(ctx, stock.Request{SKU: "hot", ID: fmt.Sprintf("o%d", i), Qty: 1}); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			rl, err := stockops.NewRelay(r, store, nil, nil)
			require.NoError(b, err)
			b.ReportAllocs()
			b.ResetTimer()
			delivered := 0
			for delivered < b.N {
				s, err := rl.Once(ctx)
				require.NoError(b, err)
				if s.Delivered == 0 {
					b.Fatalf("the relay stopped after %d of %d events", delivered, b.N)
				}
				delivered += s.Delivered
			}
			b.StopTimer()
			b.ReportMetric(float64(delivered)/b.Elapsed().Seconds(), "events/s")
			if rem, err := store.Remaining(ctx, "hot"); err != nil || rem != 1 {
				b.Fatalf("store remaining %d (%v), want 1", rem, err)
			}
		})
	}
}
