package contract_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/sqlstore"
	"github.com/stockres/stock/stockops"
)

// The helpers the relay, reconcile, run and fault tests share.

// remaining is the store's remaining stock of sku, failing t on an error.
func remaining(t testing.TB, st stock.Store, sku string) int64 {
	t.Helper()
	n, err := st.Remaining(context.Background(), sku)
	require.NoError(t, err, "store Remaining %s", sku)
	return n
}

// pendingOf is the number of events in the outboxes of skus.
func pendingOf(t testing.TB, r *stock.Reserver, skus ...string) (n int64) {
	t.Helper()
	for _, sku := range skus {
		p, _, err := stockops.Pending(context.Background(), r, sku)
		require.NoError(t, err, "Pending %q", sku)
		n += p
	}
	return n
}

// withStore is a Reserver on c (with opts) and a new memstore, each of skus loaded in both with
// qty units.
func withStore(t *testing.T, c rueidis.Client, qty int64, skus []string, opts ...stock.Option) (*stock.Reserver, *memstore.Store) {
	t.Helper()
	r := testkit.NewReserver(t, c, opts...)
	st := memstore.New()
	for _, sku := range skus {
		loadBoth(t, r, st, sku, qty)
	}
	return r, st
}

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

// loadingStore is a store an item can be loaded into (memstore's and sqlstore's Load).
type loadingStore interface {
	stock.Store
	Load(context.Context, string, int64) error
}

// loadBoth loads sku with qty units in Redis and in the store.
func loadBoth(t *testing.T, r *stock.Reserver, store interface {
	Load(context.Context, string, int64) error
}, sku string, qty int64) {
	t.Helper()
	require.NoError(t, r.Load(context.Background(), sku, qty))
	require.NoError(t, store.Load(context.Background(), sku, qty))
}

// numbered returns the ids prefix0 … prefix(n-1).
func numbered(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint(prefix, i)
	}
	return ids
}

// deductEach deducts req once under each of ids, failing the test on an error.
func deductEach(t *testing.T, r *stock.Reserver, req stock.Request, ids ...string) {
	t.Helper()
	for _, id := range ids {
		req.ID = id
		require.NoError(t, testkit.Err(r.Deduct(context.Background(), req)), "Deduct %s %s", req.SKU, id)
	}
}

// repairConsumeAll delivers msgs to Consume in the given order; held-back ones are redelivered (in
// a shuffled order) until all are acked. Any other error fails the test.
func repairConsumeAll(t *testing.T, ctx context.Context, r *stock.Reserver, st stock.Store, msgs []stock.Event, rng *rand.Rand) {
	t.Helper()
	consumeRounds(t, ctx, r, st, msgs, rng, false)
}

// consumeRounds delivers msgs to Consume round after round, redelivering in the next round (in a
// shuffled order) what was held back, and with temporary, what met any other error but
// ErrInvalid, which fails the test; so does any other error without temporary, or a message not
// settled in 200 rounds.
func consumeRounds(t *testing.T, ctx context.Context, r *stock.Reserver, st stock.Store, msgs []stock.Event, rng *rand.Rand, temporary bool) {
	t.Helper()
	var lastErr error
	for round := 0; len(msgs) > 0; round++ {
		require.LessOrEqual(t, round, 200, "%d messages still unsettled after 200 rounds (last error: %v): %v", len(msgs), lastErr, msgs)
		var again []stock.Event
		for _, ev := range msgs {
			err := stock.Consume(ctx, r, st, ev)
			switch {
			case err == nil:
			case errors.Is(err, stock.ErrHeldBack), temporary && !errors.Is(err, stock.ErrInvalid):
				lastErr = err
				again = append(again, ev)
			case temporary:
				t.Errorf("Consume %s %s %s: %v (a valid event)", ev.SKU, ev.Type, ev.ID, err)
			default:
				t.Fatalf("Consume(%s %s seq %d): %v", ev.Type, ev.ID, ev.Seq, err)
			}
		}
		rng.Shuffle(len(again), func(i, j int) { again[i], again[j] = again[j], again[i] })
		msgs = again
	}
}

// queue is an in-memory message queue between a relay that only publishes and the consumers:
// Publish appends; a consumer takes messages in any order it likes and acks them or puts them
// back, as a broker's redelivery does.
type queue struct {
	mu  sync.Mutex
	msg []stock.Event
}

func (q *queue) Publish(_ context.Context, ev stock.Event) error {
	q.put(ev)
	return nil
}

// put appends evs to the queue (a broker taking them, or redelivering them).
func (q *queue) put(evs ...stock.Event) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.msg = append(q.msg, evs...)
}

// take removes and returns every message queued so far.
func (q *queue) take() []stock.Event {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.msg
	q.msg = nil
	return out
}

// snapshot returns the messages queued so far, leaving them queued.
func (q *queue) snapshot() []stock.Event {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.msg)
}

// consumeAll delivers msgs through Consume until every one is acked, putting a message that
// Consume did not ack at the back, as a broker redelivers it. It returns the redeliveries.
func consumeAll(t *testing.T, r *stock.Reserver, store stock.Store, msgs []stock.Event) int {
	t.Helper()
	redelivered := 0
	for i := 0; len(msgs) > 0; i++ {
		require.Less(t, i, 10000, "messages never acked: %v", msgs)
		ev := msgs[0]
		msgs = msgs[1:]
		if err := stock.Consume(context.Background(), r, store, ev); err != nil {
			msgs = append(msgs, ev)
			redelivered++
		}
	}
	return redelivered
}

// eachStore runs f on c once for each store the queue path is tested against: memstore (unless
// sqlOnly) and the SQL stores of sqlStores (SQLite, and PostgreSQL when configured), each with a
// Reserver of its own prefix (prefix and the store's name) and an item named after the store.
func eachStore(t *testing.T, c rueidis.Client, prefix string, sqlOnly bool, f func(t *testing.T, r *stock.Reserver, store loadingStore, sku string)) {
	stores := map[string]loadingStore{}
	if !sqlOnly {
		stores["memstore"] = memstore.New()
	}
	for name, s := range sqlStores(t) {
		stores[name] = s
	}
	for name, store := range stores {
		t.Run(name, func(t *testing.T) {
			f(t, testkit.NewReserver(t, c, stock.WithPrefix(prefix+name)), store, "sku-"+name)
		})
	}
}

// newRelay and newReconciler are stockops.NewRelay and NewReconciler, which must succeed.
var (
	newRelay      = testkit.NewRelay
	newReconciler = testkit.NewReconciler
)
