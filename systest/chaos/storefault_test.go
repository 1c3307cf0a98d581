package chaos_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/sqlstore"
	"github.com/stockres/stock/stockops"
)

// TestFaultStoreConnectionKills: the database of record loses its connections again and again
// (pg_terminate_backend of the relay's sessions) while deducts and restores run and a relay
// drains into it. Nothing is lost or applied twice, and the store ends equal to Redis.
func TestFaultStoreConnectionKills(t *testing.T) {
	dsn := os.Getenv("STOCK_TEST_POSTGRES")
	if dsn == "" {
		t.Skip("set STOCK_TEST_POSTGRES to run this fault test")
	}
	ctx := context.Background()
	app := fmt.Sprintf("stockfault%d", rand.Uint32())
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	db, err := sql.Open("pgx", dsn+sep+"application_name="+app)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	admin, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close() })
	require.NoError(t, admin.PingContext(ctx), "STOCK_TEST_POSTGRES is set but PostgreSQL cannot be reached")
	prefix := app + "_"
	store, err := sqlstore.New(db, sqlstore.Postgres, sqlstore.WithTablePrefix(prefix))
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))
	dropTables(t, admin, prefix)

	_, c := redistest.Miniredis(t)
	r := testkit.NewReserver(t, c)
	const loaded = 3000
	require.NoError(t, r.Load(ctx, "A", loaded))
	require.NoError(t, store.Load(ctx, "A", loaded))
	relay, err := stockops.NewRelay(r, store, nil, &stock.RelayOptions{Batch: 32, MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond, Lease: 2 * time.Second})
	require.NoError(t, err)
	rctx, stopRelay := context.WithCancel(ctx)
	var bg sync.WaitGroup
	bg.Go(func() { _ = relay.Run(rctx) })

	var kills atomic.Int64
	killCtx, stopKills := context.WithCancel(ctx)
	bg.Go(func() {
		for killCtx.Err() == nil {
			res, err := admin.ExecContext(killCtx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", app)
			if err == nil {
				n, _ := res.RowsAffected()
				kills.Add(n)
			}
			time.Sleep(time.Duration(10+rand.IntN(40)) * time.Millisecond)
		}
	})

	var mu sync.Mutex
	sold := map[string]bool{} // id -> still sold (false once restored)
	// miniredis's clock only moves when told: keep backoffs and leases expiring.
	bg.Go(func() {
		for killCtx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
			redistest.Sleep(c, 10*time.Millisecond)
		}
	})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 250 {
				id := fmt.Sprint("g", g, "-", i)
				_, err := r.Deduct(ctx, stock.Request{SKU: "A", ID: id, Qty: 1})
				if errors.Is(err, stock.ErrSoldOut) {
					continue
				}
				if !assert.NoError(t, err) {
					return
				}
				restored := i%7 == 0
				if restored {
					_, err = r.Restore(ctx, "A", id)
					assert.NoError(t, err)
				}
				mu.Lock()
				sold[id] = !restored
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	time.Sleep(300 * time.Millisecond) // kills go on while the relay catches up
	stopKills()
	require.Eventually(t, func() bool {
		redistest.Sleep(c, 20*time.Millisecond) // miniredis: lets backoff and lease keys expire
		p, _, err := stockops.Pending(ctx, r, "A")
		return err == nil && p == 0
	}, 60*time.Second, 20*time.Millisecond, "the relay delivers everything once the database is back")
	stopRelay()
	bg.Wait()

	ids := make([]string, 0, len(sold))
	var want int64
	for id, s := range sold {
		ids = append(ids, id)
		if s {
			want++
		}
	}
	recs, err := store.Records(ctx, "A", ids)
	require.NoError(t, err)
	for id, s := range sold {
		rec, ok := recs[id]
		require.True(t, ok, "deduct %s never reached the store", id)
		if s {
			assert.Equal(t, stock.StateApplied, rec.Status, id)
		} else {
			assert.Equal(t, stock.StateRestored, rec.Status, id)
		}
	}
	var records int
	require.NoError(t, admin.QueryRowContext(ctx, "SELECT count(*) FROM "+prefix+"records").Scan(&records))
	assert.Equal(t, len(sold), records, "one record per id, no other")
	rem, err := store.Remaining(ctx, "A")
	require.NoError(t, err)
	assert.Equal(t, int64(loaded)-want, rem)
	l := testkit.Levels(t, r, "A")
	assert.Equal(t, rem, l.Available, "Redis and the store agree")
	assert.Positive(t, kills.Load(), "connections were killed")
	t.Logf("store connection kills: %d sessions killed; %d deducts, %d kept, store remaining %d = Redis available %d",
		kills.Load(), len(sold), want, rem, l.Available)
}
