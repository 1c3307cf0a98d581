package kafkapub_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"iter"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	_ "modernc.org/sqlite"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/queuetest"
	"github.com/stockres/stock/kafkapub"
	"github.com/stockres/stock/sqlstore"
)

// The queue path with consumer processes killed by SIGKILL (queuetest.KillRig): Reserver →
// Relay (no store) → kafkapub → the fake cluster (in the parent) → a group member in a child
// process → stock.Consume → sqlstore on a SQLite file that the parent reads too. A killed
// member does not leave the group: its partitions move after the session timeout, and its
// successor starts at the first message it did not acknowledge.

const sessionTimeout = 1500 * time.Millisecond

// childBroker is how a consumer child reaches the fake cluster.
type childBroker struct {
	Brokers []string
}

var child = queuetest.Child{
	Env:      "STOCK_KAFKAPUB_CONSUMER_CHILD",
	NewStore: newSQLStore,
	Consumer: func(t *testing.T, cfg queuetest.ChildConfig) queuetest.Receiver {
		var b childBroker
		require.NoError(t, json.Unmarshal(cfg.Broker, &b))
		cons, err := kafkapub.NewConsumer(topic, "store", &kafkapub.ConsumerOptions{RetryDelay: 100 * time.Millisecond},
			kgo.SeedBrokers(b.Brokers...), kgo.SessionTimeout(sessionTimeout), kgo.HeartbeatInterval(300*time.Millisecond),
			kgo.FetchMaxWait(100*time.Millisecond))
		require.NoError(t, err)
		return func(ctx context.Context) (iter.Seq[queuetest.Message], error) {
			msgs, err := cons.Receive(ctx, 2, 300*time.Millisecond)
			out := make([]queuetest.Message, len(msgs))
			for i, m := range msgs {
				out[i] = queuetest.Message{Event: m.Event, Err: m.Err, Body: m.Record.Value,
					Ack: func() error { return cons.Ack(ctx, m) }, Retry: func() { cons.Retry(m) }}
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
		fc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, topic), kfake.GroupMinSessionTimeout(100*time.Millisecond))
		require.NoError(t, err)
		t.Cleanup(fc.Close)
		pub, err := kafkapub.New(producer(t, fc.ListenAddrs()), topic)
		require.NoError(t, err)
		return childBroker{Brokers: fc.ListenAddrs()}, pub
	}})
}

// TestConsumerKilledKeepsOrder: one unit; deduct a, restore a, deduct b. A member process acks
// D(a), takes R(a) and is killed by SIGKILL before it acks it; its successor, once the group
// notices the death, starts again at R(a). The store ends with a restored and b applied.
func TestConsumerKilledKeepsOrder(t *testing.T) {
	queuetest.ConsumerKilledKeepsOrder(t, newKillRig(t), nil)
}

// TestConsumersKilledRandom: buyers deduct and restore at the edge of the stock of a few items
// while the relay publishes and member processes apply the events; three members are killed by
// SIGKILL at random moments. No valid sale may be refused by the store, and Redis and the
// store end equal.
func TestConsumersKilledRandom(t *testing.T) {
	queuetest.ConsumersKilledRandom(t, newKillRig(t), queuetest.Random{Buyers: 3, Seed: 11,
		PauseMin: 2, PauseSpread: 5, AliveMin: 1500, AliveSpread: 1500})
}
