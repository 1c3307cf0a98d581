package amqppub_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"iter"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"

	"github.com/stockres/stock"
	"github.com/stockres/stock/amqppub"
	"github.com/stockres/stock/internal/queuetest"
	"github.com/stockres/stock/sqlstore"
)

// The queue path with consumer processes killed by SIGKILL (queuetest.KillRig): Reserver →
// Relay (no store) → amqppub → RabbitMQ → a consumer in a child process → stock.Consume →
// sqlstore on a SQLite file that the parent reads too. When a consumer's process dies, the
// broker requeues what it did not acknowledge and makes the next consumer of each queue the
// active one.

// childBroker is how a consumer child reaches RabbitMQ.
type childBroker struct {
	URL      string
	Exchange string
	Queues   int
}

var child = queuetest.Child{
	Env:      "STOCK_AMQPPUB_CONSUMER_CHILD",
	NewStore: newSQLStore,
	Consumer: func(t *testing.T, cfg queuetest.ChildConfig) queuetest.Receiver {
		var b childBroker
		require.NoError(t, json.Unmarshal(cfg.Broker, &b))
		conn, err := amqp.Dial(b.URL)
		require.NoError(t, err)
		cons, err := amqppub.NewConsumer(conn, &amqppub.ConsumerOptions{RetryDelay: 100 * time.Millisecond, Prefetch: 2,
			Options: []amqppub.Option{amqppub.WithExchange(b.Exchange), amqppub.WithQueues(b.Queues)}})
		require.NoError(t, err)
		return func(ctx context.Context) (iter.Seq[queuetest.Message], error) {
			msgs, err := cons.Receive(ctx, 2, 300*time.Millisecond)
			out := make([]queuetest.Message, len(msgs))
			for i, m := range msgs {
				delivered := uint64(1)
				if m.Delivery.Redelivered {
					delivered = 2 // at least
				}
				out[i] = queuetest.Message{Event: m.Event, Err: m.Err, Body: m.Delivery.Body, Delivered: delivered,
					Ack: func() error { return cons.Ack(m) }, Retry: func() { cons.Retry(m) }}
			}
			return queuetest.Slice(out), err
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

func newKillRig(t *testing.T) *queuetest.KillRig {
	return queuetest.NewKillRig(t, queuetest.Kill{Child: child, Broker: func() (any, stock.Publisher) {
		u := url(t)
		ex, opts := namedLayout(t, u, 2)
		pub, err := amqppub.New(dial(t, u), opts...)
		require.NoError(t, err)
		return childBroker{URL: u, Exchange: ex, Queues: 2}, pub
	}})
}

// TestConsumerKilledKeepsOrder: one unit; deduct a, restore a, deduct b. A consumer process acks
// D(a), takes R(a) and is killed by SIGKILL before it acks it; RabbitMQ requeues R(a) for the
// queue's next active consumer. The store ends with a restored and b applied.
func TestConsumerKilledKeepsOrder(t *testing.T) {
	queuetest.ConsumerKilledKeepsOrder(t, newKillRig(t), nil)
}

// TestConsumersKilledRandom: buyers deduct and restore at the edge of the stock of a few items
// while the relay publishes and consumer processes apply the events; three consumers are killed by
// SIGKILL at random moments. No valid sale may be refused by the store, and Redis and the
// store end equal.
func TestConsumersKilledRandom(t *testing.T) {
	queuetest.ConsumersKilledRandom(t, newKillRig(t), queuetest.Random{Buyers: 3, Seed: 11,
		PauseMin: 2, PauseSpread: 5, AliveMin: 1500, AliveSpread: 1500})
}

// TestConsumersClosedMidStream: a live relay, traffic, and three consumer processes
// (connections) on four queues; two are killed (their connection closed) mid-stream while
// holding unacknowledged messages, one comes back. RabbitMQ requeues what they held for the
// next active consumer. The store must end equal to Redis and to the acknowledged answers,
// nothing applied twice.
func TestConsumersClosedMidStream(t *testing.T) {
	u := url(t)
	_, opts := namedLayout(t, u, 4)
	pubConn := dial(t, u)
	pub, err := amqppub.New(pubConn, opts...)
	require.NoError(t, err)
	skus := []string{"m:1", "m:2", "m~3", "m:ü4", "m/5", "m%6", "m:7", "m:8"}
	p := queuetest.NewMiniredisPipeline(t, skus)
	ctx := context.Background()
	stopRelay := p.RunRelay(t, pub)
	stopAll := make(chan struct{})
	var wg sync.WaitGroup
	var crashedHolding atomic.Int64
	member := func(crashAfter int) {
		defer wg.Done()
		conn, err := amqp.Dial(u)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		cons, err := amqppub.NewConsumer(conn, &amqppub.ConsumerOptions{Prefetch: 8, RetryDelay: 50 * time.Millisecond, Options: opts})
		if err != nil {
			t.Error(err)
			return
		}
		for batch := 0; ; batch++ {
			select {
			case <-stopAll:
				_ = cons.Close()
				return
			default:
			}
			msgs, err := cons.Receive(ctx, 8, 100*time.Millisecond)
			if err != nil {
				t.Errorf("Receive: %v", err)
				return
			}
			if len(msgs) == 0 {
				continue
			}
			if crashAfter > 0 && batch >= crashAfter {
				crashedHolding.Add(int64(len(msgs)))
				_ = conn.Close() // the process dies: the broker requeues what it held
				return
			}
			for _, m := range msgs {
				if p.Settle(t, "message", m.Event, m.Err) {
					_ = cons.Ack(m)
				} else {
					cons.Retry(m)
				}
			}
		}
	}
	// The members that will be killed start first, so that the broker makes them the active
	// consumers of the queues; the steady one waits behind them.
	// The queues fill up first, so that each batch a member receives is full.
	rng := rand.New(rand.NewPCG(18, 5))
	p.Traffic(t, 300, rng)
	time.Sleep(200 * time.Millisecond)
	wg.Add(2)
	go member(3)
	go member(6)
	time.Sleep(300 * time.Millisecond)
	wg.Add(1)
	go member(0)
	wg.Add(1)
	go member(0)
	p.Traffic(t, 150, rng)
	p.WaitApplied(t, 15*time.Second, nil)
	close(stopAll)
	wg.Wait()
	stopRelay()
	p.VerifyCrashed(t, crashedHolding.Load())
}
