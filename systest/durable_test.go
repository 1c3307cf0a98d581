package systest_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"

	"github.com/stockres/stock"
	"github.com/stockres/stock/sqlstore"
	"github.com/stockres/stock/stockops"
)

var sqlStoresSeq atomic.Int64

// sqlStores returns the SQL stores to run the durable path against: SQLite always, PostgreSQL
// when STOCK_TEST_POSTGRES is set (failing if it cannot be reached).
func sqlStores(t *testing.T) map[string]*sqlstore.Store {
	t.Helper()
	ctx := context.Background()
	out := map[string]*sqlstore.Store{}
	// Its own tables per call: the backends' subtests that call it run in parallel.
	prefix := fmt.Sprintf("stock_dur%d_%d_", os.Getpid(), sqlStoresSeq.Add(1))
	open := func(name, driver, dsn string, d sqlstore.Dialect) {
		db, err := sql.Open(driver, dsn)
		require.NoError(t, err)
		t.Cleanup(func() { db.Close() })
		require.NoError(t, db.PingContext(ctx), "%s is configured but cannot be reached", name)
		s, err := sqlstore.New(db, d, sqlstore.WithTablePrefix(prefix))
		require.NoError(t, err)
		require.NoError(t, s.Migrate(ctx))
		if d != sqlstore.SQLite {
			t.Cleanup(func() {
				_, _ = db.Exec("DROP TABLE IF EXISTS " + prefix + "items")
				_, _ = db.Exec("DROP TABLE IF EXISTS " + prefix + "records")
			})
		}
		out[name] = s
	}
	open("sqlite", "sqlite", "file:"+filepath.Join(t.TempDir(), "db.sqlite")+
		"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate", sqlstore.SQLite)
	if dsn := os.Getenv("STOCK_TEST_POSTGRES"); dsn != "" {
		open("postgres", "pgx", dsn, sqlstore.Postgres)
	}
	return out
}

// TestDurablePathSQL: deducts, restores and a restock go through the relay into a real SQL
// store; the store ends equal to Redis, each id applied once, refusals given back.
func TestDurablePathSQL(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		for name, store := range sqlStores(t) {
			t.Run(name, func(t *testing.T) {
				ctx := context.Background()
				r := newReserver(t, c, stock.WithPrefix("dur-"+name))
				sku := "sku-" + name
				require.NoError(t, r.Load(ctx, sku, 100))
				require.NoError(t, store.Load(ctx, sku, 95)) // 5 units of drift: refusals
				for i := range 100 {
					_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprint("o", i), Qty: 1})
					require.NoError(t, err)
					if i%10 == 0 {
						_, err = r.Restore(ctx, sku, fmt.Sprint("o", i))
						require.NoError(t, err)
					}
				}
				rl, err := stockops.NewRelay(r, store, nil, &stock.RelayOptions{Batch: 32})
				require.NoError(t, err)
				st := drain(t, rl)
				assert.Zero(t, st.Retried)
				// 90 sold in Redis, the store had 95: no refusal. Now drift the other way.
				avail, err := available(r.Levels(ctx, sku))
				require.NoError(t, err)
				rem, err := store.Remaining(ctx, sku)
				require.NoError(t, err)
				assert.Equal(t, int64(10), avail)
				assert.Equal(t, int64(5), rem)
				for i := 100; i < 110; i++ {
					_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprint("o", i), Qty: 1})
					require.NoError(t, err)
				}
				st = drain(t, rl)
				assert.Equal(t, 5, st.Refused)
				rem, _ = store.Remaining(ctx, sku)
				assert.Zero(t, rem)
				avail, _ = available(r.Levels(ctx, sku))
				assert.Equal(t, int64(5), avail, "refused units given back once")
				// The reconciler closes the remaining drift.
				rec, err := stockops.NewReconciler(r, store, &stock.ReconcileOptions{Items: []string{sku}})
				require.NoError(t, err)
				reps, err := rec.Once(ctx)
				require.NoError(t, err)
				assert.Equal(t, int64(-5), reps[0].Adjusted)
				avail, _ = available(r.Levels(ctx, sku))
				assert.Equal(t, rem, avail)
				recs, err := store.Records(ctx, sku, []string{"o0", "o1", "o105"})
				require.NoError(t, err)
				assert.Equal(t, stock.StateRestored, recs["o0"].Status)
				assert.Equal(t, stock.StateApplied, recs["o1"].Status)
			})
		}
	})
}
