package natspub_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/queuetest"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/natspub"
	"github.com/stockres/stock/sqlstore"
	"github.com/stockres/stock/stockops"
)

// The queue path with consumer processes killed by SIGKILL (queuetest.KillRig): Reserver →
// Relay (no store) → natspub → JetStream → a durable pull consumer in a child process →
// stock.Consume → sqlstore on a SQLite file that the parent reads too.

// childBroker is how a consumer child reaches JetStream.
type childBroker struct {
	NATS, Stream, Durable string
	Batch                 int
}

var child = queuetest.Child{
	Env:      "STOCK_NATSPUB_CONSUMER_CHILD",
	NewStore: newSQLStore,
	Consumer: func(t *testing.T, cfg queuetest.ChildConfig) queuetest.Receiver {
		var b childBroker
		require.NoError(t, json.Unmarshal(cfg.Broker, &b))
		if cfg.HangAfterAcks > 0 {
			b.Batch = 2
		}
		nc, err := nats.Connect(b.NATS)
		require.NoError(t, err)
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		cons, err := js.Consumer(context.Background(), b.Stream, b.Durable)
		require.NoError(t, err)
		return func(ctx context.Context) (iter.Seq[queuetest.Message], error) {
			batch, err := cons.Fetch(b.Batch, jetstream.FetchMaxWait(300*time.Millisecond))
			if err != nil {
				return nil, err
			}
			return func(yield func(queuetest.Message) bool) {
				for m := range batch.Messages() {
					ev, err := natspub.Decode(m.Data())
					delivered := uint64(0)
					if md, _ := m.Metadata(); md != nil {
						delivered = md.NumDelivered
					}
					if !yield(queuetest.Message{Event: ev, Err: err, Body: m.Data(), Delivered: delivered,
						Ack:   func() error { return m.DoubleAck(ctx) },
						Retry: func() { _ = m.NakWithDelay(100 * time.Millisecond) },
						Drop:  func() { _ = m.Term() }}) {
						return
					}
				}
			}, nil
		}
	},
}

// openStore opens sqlstore on the SQLite file path, as the consumer children do.
func openStore(t testing.TB, path string) queuetest.Store {
	return queuetest.OpenSQLite(t, path, newSQLStore)
}

func newSQLStore(db *sql.DB) (queuetest.Store, error) { return sqlstore.New(db, sqlstore.SQLite) }

// TestConsumerProcess is the consumer child; it skips unless child.Env is set.
func TestConsumerProcess(t *testing.T) { queuetest.RunChild(t, child) }

// newKillRig starts the rig on a stream of the test's own and a durable consumer whose
// unacknowledged messages are redelivered after ackWait; the rig is settled once the
// consumer has every message of the stream acknowledged.
func newKillRig(t *testing.T, ackWait time.Duration) *queuetest.KillRig {
	var e *env
	var cb childBroker
	return queuetest.NewKillRig(t, queuetest.Kill{
		Child: child,
		Broker: func() (any, stock.Publisher) {
			e = newEnv(t)
			ctx := context.Background()
			cb = childBroker{NATS: e.nc.ConnectedUrl(), Stream: e.stream, Durable: "store", Batch: 8}
			_, err := e.js.CreateOrUpdateConsumer(ctx, e.stream, jetstream.ConsumerConfig{
				Durable:       cb.Durable,
				AckPolicy:     jetstream.AckExplicitPolicy,
				AckWait:       ackWait,
				FilterSubject: e.prefix + ".>",
			})
			require.NoError(t, err)
			pub, err := natspub.New(e.js, natspub.WithPrefix(e.prefix), natspub.WithStream(e.stream), natspub.WithTimeout(5*time.Second))
			require.NoError(t, err)
			return cb, pub
		},
		Settled: func() bool {
			ctx := context.Background()
			cons, err := e.js.Consumer(ctx, cb.Stream, cb.Durable)
			require.NoError(t, err)
			info, err := cons.Info(ctx)
			require.NoError(t, err)
			return info.NumPending == 0 && info.NumAckPending == 0
		},
	})
}

// TestConsumerKilledKeepsOrder: one unit; deduct a, restore a, deduct b, published to
// JetStream. A consumer process acks D(a), takes R(a) and is killed by SIGKILL before it acks
// it; its successor is handed D(b) first, R(a) only after the ack wait. The store must still
// get R(a) before D(b) (Consume applies R(a) from Redis first): b's sale is applied, not
// refused and given back.
func TestConsumerKilledKeepsOrder(t *testing.T) {
	queuetest.ConsumerKilledKeepsOrder(t, newKillRig(t, 2*time.Second), func(results []string) {
		require.GreaterOrEqual(t, len(results), 2)
		assert.True(t, strings.HasPrefix(results[1], "MSG deducted b "),
			"the successor must be handed D(b) before the redelivered R(a), or the test proves nothing: %s", results[1])
	})
}

// TestConsumersKilledRandom: buyers deduct and restore at the edge of the stock of a few items
// while the relay publishes to JetStream and consumer processes apply the events; three
// consumers are killed by SIGKILL at random moments, each successor getting redeliveries out
// of order. No valid sale may be refused by the store, and Redis and the store end equal.
func TestConsumersKilledRandom(t *testing.T) {
	queuetest.ConsumersKilledRandom(t, newKillRig(t, time.Second), queuetest.Random{Buyers: 4, Seed: 7,
		PauseMin: 1, PauseSpread: 4, AliveMin: 400, AliveSpread: 1200, Redelivers: true})
}

// TestConsumerDiesMidBatch, with the package doc's consumer wiring on real JetStream: one unit
// sold and given back over and over; a consumer takes a batch, acks part of it and dies; a
// reconcile pass while it is dead adjusts nothing; its successor gets the rest redelivered
// after the AckWait, out of order: the store refuses nothing and ends equal to Redis.
func TestConsumerDiesMidBatch(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	js, stream, prefix := e.js, e.stream, e.prefix
	pub, err := natspub.New(js, natspub.WithStream(stream), natspub.WithPrefix(prefix))
	require.NoError(t, err)
	_, c := redistest.Miniredis(t)
	r, err := stock.New(c, stock.WithCoalescing(0))
	require.NoError(t, err)
	st := memstore.New()
	const sku = "one.unit*sku"
	require.NoError(t, r.Load(ctx, sku, 1))
	require.NoError(t, st.Load(ctx, sku, 1))
	const n = 15
	for i := 0; i < n; i++ {
		id := fmt.Sprint("o", i)
		_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: 1})
		require.NoError(t, err)
		if i < n-1 {
			_, err := r.Restore(ctx, sku, id)
			require.NoError(t, err)
		}
	}
	rl, err := stockops.NewRelay(r, nil, pub, nil)
	require.NoError(t, err)
	_, err = rl.Once(ctx)
	require.NoError(t, err)
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable: "store", AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: prefix + ".>",
		AckWait: time.Second,
	})
	require.NoError(t, err)
	handle := func(m jetstream.Msg) (refusedOrBad bool) {
		ev, err := natspub.Decode(m.Data())
		if err != nil {
			_ = m.Term()
			return true
		}
		switch err := stock.Consume(ctx, r, st, ev); {
		case err == nil:
			_ = m.Ack()
		case errors.Is(err, stock.ErrInvalid):
			_ = m.Term()
			t.Errorf("terminated %+v: %v", ev, err)
		default:
			_ = m.NakWithDelay(200 * time.Millisecond)
		}
		return false
	}
	// consumer 1: takes 10, handles (acks) the 2nd and 4th only, dies.
	batch, err := cons.Fetch(10, jetstream.FetchMaxWait(3*time.Second))
	require.NoError(t, err)
	k := 0
	for m := range batch.Messages() {
		k++
		if k == 2 || k == 4 {
			handle(m)
		}
	}
	// consumer down: reconcile
	rc, _ := stockops.NewReconciler(r, st, nil)
	res, err := rc.Pass(ctx)
	require.NoError(t, err)
	for _, rp := range res.Reports {
		assert.True(t, rp.Adjusted == 0 && rp.Drift == 0 && rp.Resynced == 0, "pass with the consumer dead: %s", rp)
	}
	// consumer 2
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		p, _, err := stockops.Pending(ctx, r, sku)
		require.NoError(t, err)
		res, _ := rc.Pass(ctx)
		done := p == 0 && len(res.Reports) == 1 && res.Reports[0].Published == 0
		if done {
			break
		}
		_, err = rl.Once(ctx)
		require.NoError(t, err)
		batch, err := cons.Fetch(5, jetstream.FetchMaxWait(500*time.Millisecond))
		require.NoError(t, err)
		for m := range batch.Messages() {
			handle(m)
		}
	}
	rem, _ := st.Remaining(ctx, sku)
	lv, _ := r.Levels(ctx, sku)
	assert.Zero(t, rem, "store remaining")
	assert.Zero(t, lv.Available, "redis available")
	recs, err := st.List(ctx, sku, "", 1000)
	require.NoError(t, err)
	for _, rec := range recs {
		assert.NotEqual(t, stock.StateRefused, rec.Status, "store refused a valid sale: %+v", rec)
	}
	le, _ := r.Ledger(ctx, sku, fmt.Sprint("o", n-1))
	assert.Equal(t, stock.StateApplied, le.State, "the last sale")
	assert.LessOrEqual(t, st.MaxApplications(), 1, "double application")
}
