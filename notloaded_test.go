package stock_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// logBuffer is an io.Writer safe for the concurrent writes of a slog handler.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// count returns how many logged lines contain s.
func (l *logBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

const notLoadedLog = "the store does not know the item"

// TestStoreWithoutTheItemKeepsTheSale follows the README's Run path literally: the item is
// loaded in Redis and not in the store. The acknowledged sales are never given back (no
// refusal, no dead letter): they wait in the outbox, counted as NotLoaded, said once at Error
// level however many passes retry them, and reach the store once the item is loaded there.
func TestStoreWithoutTheItemKeepsTheSale(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		logs := &logBuffer{}
		r := newReserver(t, c, stock.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
		require.NoError(t, r.Load(ctx, "A", 5))
		for _, id := range []string{"o1", "o2"} {
			must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: id, User: "u", Qty: 1}))
		}
		store := memstore.New() // sqlstore.New + Migrate: no row for A
		rl := newRelay(t, r, store, nil, &stock.RelayOptions{MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond})

		var all stockops.RelayStats
		for tries := 0; tries < 3; {
			st, err := rl.Once(ctx)
			if st.Claimed == 0 {
				require.NoError(t, err)
				redistest.Sleep(c, 5*time.Millisecond) // the item's backoff
				continue
			}
			require.ErrorIs(t, err, stock.ErrNotLoaded) // a pass says what holds the item back
			tries++
			all.Refused += st.Refused
			all.DeadLettered += st.DeadLettered
			all.NotLoaded += st.NotLoaded
			all.Delivered += st.Delivered
		}
		assert.Zero(t, all.Refused, "a sale of an item the store does not know is not a refusal")
		assert.Zero(t, all.DeadLettered)
		assert.Zero(t, all.Delivered)
		assert.Equal(t, 6, all.NotLoaded, "both events, on each of 3 tries")
		assert.Equal(t, 1, logs.count(notLoadedLog), "said once per item per interval, not per event or pass:\n%s", logs.b.String())
		assert.Equal(t, 1, logs.count("level=ERROR"), "and nothing else at Error:\n%s", logs.b.String())

		l := levels(t, r, "A")
		assert.EqualValues(t, 2, l.Sold, "the acknowledged sales stay sold: %+v", l)
		for id, e := range ledger(t, r, "A") {
			assert.NotEqual(t, stock.StateRefused, e.State, "%s given back", id)
		}
		pending, dead, err := stockops.Pending(ctx, r, "A")
		require.NoError(t, err)
		assert.EqualValues(t, 2, pending, "the sales wait in the outbox")
		assert.Zero(t, dead)

		require.NoError(t, store.Load(ctx, "A", 5)) // the setup is fixed
		redistest.Sleep(c, 5*time.Millisecond)      // the item's backoff
		st := drain(t, rl)
		assert.Equal(t, 2, st.Delivered, "%+v", st)
		rem := remaining(t, store, "A")
		assert.EqualValues(t, 3, rem)
		for _, id := range []string{"o1", "o2"} {
			assert.Equal(t, 1, store.Applications("A", id, stock.EventDeducted))
		}
		pending, _, err = stockops.Pending(ctx, r, "A")
		require.NoError(t, err)
		assert.Zero(t, pending)
	})
}

// TestConsumeOfAnItemTheStoreDoesNotKnow: on the queue path too, an item the store does not
// know is not a refusal: Consume answers a temporary error (the queue delivers it again),
// gives nothing back, and applies the event once the item is loaded.
func TestConsumeOfAnItemTheStoreDoesNotKnow(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c, stock.WithLogger(slog.New(slog.DiscardHandler)))
		require.NoError(t, r.Load(ctx, "A", 5))
		must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 2}))
		var msgs []stock.Event
		q := stock.PublisherFunc(func(_ context.Context, ev stock.Event) error { msgs = append(msgs, ev); return nil })
		rl := newRelay(t, r, nil, q, nil)
		drain(t, rl)
		require.Len(t, msgs, 1)

		store := memstore.New()
		err := stock.Consume(ctx, r, store, msgs[0])
		require.ErrorIs(t, err, stock.ErrNotLoaded)
		require.False(t, errors.Is(err, stock.ErrInvalid) || errors.Is(err, stock.ErrRefused), "%v", err)
		l := levels(t, r, "A")
		assert.EqualValues(t, 2, l.Sold, "nothing given back: %+v", l)

		require.NoError(t, store.Load(ctx, "A", 5))
		require.NoError(t, stock.Consume(ctx, r, store, msgs[0]))
		rem := remaining(t, store, "A")
		assert.EqualValues(t, 3, rem)
		assert.EqualValues(t, 2, levels(t, r, "A").Sold)
	})
}

// TestDefaultLoggerIsSlogDefault: a Reserver made without WithLogger logs to slog.Default(),
// so the call for a human is seen by a default setup.
func TestDefaultLoggerIsSlogDefault(t *testing.T) {
	logs := &logBuffer{}
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(logs, nil)))
	defer slog.SetDefault(prev)
	ctx := context.Background()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			r := newReserver(t, b.Client(t)) // no WithLogger
			require.NoError(t, r.Load(ctx, "A", 5))
			must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1}))
			rl := newRelay(t, r, memstore.New(), nil, nil)
			_, err := rl.Once(ctx)
			require.ErrorIs(t, err, stock.ErrNotLoaded)
			assert.Contains(t, logs.b.String(), notLoadedLog)
			assert.Contains(t, logs.b.String(), "level=ERROR")
		})
	}
}

// TestPreheatLoadsStoreAndRedis: stockops.Preheat puts an item on sale on both sides from the
// database of record's stock, and a sale reaches the store.
func TestPreheatLoadsStoreAndRedis(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		store := memstore.New()
		n, err := stockops.Preheat(ctx, r, store, "A", 10)
		require.NoError(t, err)
		assert.EqualValues(t, 10, n)
		assert.EqualValues(t, 10, levels(t, r, "A").Available)

		// The store's row wins over qty: the database of record had 7 left.
		store.Set("B", 7)
		n, err = stockops.Preheat(ctx, r, store, "B", 10)
		require.NoError(t, err)
		assert.EqualValues(t, 7, n)
		assert.EqualValues(t, 7, levels(t, r, "B").Available)

		// Again: a live sale is not clobbered.
		must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1}))
		_, err = stockops.Preheat(ctx, r, store, "A", 10)
		require.ErrorIs(t, err, stock.ErrLoaded)
		assert.EqualValues(t, 9, levels(t, r, "A").Available)

		// Bad input changes nothing.
		_, err = stockops.Preheat(ctx, r, store, "C", -1)
		require.ErrorIs(t, err, stock.ErrInvalid)
		_, err = stockops.Preheat(ctx, r, store, "bad{name", 1)
		require.ErrorIs(t, err, stock.ErrInvalid)
		_, err = store.Remaining(ctx, "bad{name")
		require.ErrorIs(t, err, stock.ErrNotLoaded)

		rl := newRelay(t, r, store, nil, nil)
		assert.Equal(t, 1, drain(t, rl).Delivered)
		rem := remaining(t, store, "A")
		assert.EqualValues(t, 9, rem)
	})
}
