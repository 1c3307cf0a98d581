package amqppub_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"iter"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"

	"github.com/stockres/stock"
	"github.com/stockres/stock/amqppub"
	"github.com/stockres/stock/internal/queuetest"
	"github.com/stockres/stock/sqlstore"
	"github.com/stockres/stock/stocktest"
)

// EnvAMQP names the variable with the URL of the RabbitMQ server the tests use; they skip
// when it is unset and fail when it is set and the server cannot be used.
const EnvAMQP = "STOCK_TEST_AMQP"

func url(t testing.TB) string {
	t.Helper()
	u := os.Getenv(EnvAMQP)
	if u == "" {
		t.Skip(EnvAMQP + " not set (for example amqp://guest:guest@127.0.0.1:5672/)")
	}
	return u
}

func dial(t testing.TB, u string) *amqp.Connection {
	t.Helper()
	conn, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	require.NoError(t, err, "%s=%s: dial", EnvAMQP, u)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// rig is a publisher on an exchange of the test's own, deleted with its queues at clean-up.
type rig struct {
	u    string // the server's URL
	ex   string // the exchange
	opts []amqppub.Option
	conn *amqp.Connection // the publisher's
	pub  *amqppub.Publisher
}

// newRig makes the rig of an exchange with the given number of queues.
func newRig(t testing.TB, u string, queues int) *rig {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	r := &rig{u: u, ex: "stocktest." + hex.EncodeToString(b[:]), conn: dial(t, u)}
	t.Cleanup(func() {
		conn, err := amqp.Dial(u)
		if err != nil {
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		for n := range queues {
			_, _ = ch.QueueDelete(amqppub.Queue(r.ex, n), false, false, false)
		}
		_ = ch.ExchangeDelete(r.ex, false, false)
	})
	r.opts = []amqppub.Option{amqppub.WithExchange(r.ex), amqppub.WithQueues(queues)}
	var err error
	r.pub, err = amqppub.New(r.conn, r.opts...)
	require.NoError(t, err)
	return r
}

// TestPublisherConformance runs the publisher conformance suite on the RabbitMQ server: 4
// queues with a single active consumer each; a member is a connection of its own, and a
// crash closes it without acknowledging what it holds.
func TestPublisherConformance(t *testing.T) {
	u := url(t)
	stocktest.TestPublisher(t, func(t *testing.T) stocktest.PublisherPair {
		rg := newRig(t, u, 4)
		return stocktest.PublisherPair{
			Publisher: rg.pub,
			NewConsumer: func(t testing.TB) stocktest.Consumer {
				conn := dial(t, u)
				c, err := amqppub.NewConsumer(conn, &amqppub.ConsumerOptions{RetryDelay: 100 * time.Millisecond, Options: rg.opts})
				require.NoError(t, err)
				return &member{conn: conn, c: c}
			},
			Redelivery: 2 * time.Second,
			// The consumers apply to sqlstore on a SQLite file, as in production.
			NewStore: func(t testing.TB) stock.Store { return openStore(t, filepath.Join(t.TempDir(), "store.sqlite")) },
		}
	})
}

type member struct {
	conn *amqp.Connection
	c    *amqppub.Consumer
	dead atomic.Bool
}

func (m *member) Receive(ctx context.Context, n int, wait time.Duration) ([]stocktest.Delivery, error) {
	if m.dead.Load() {
		return nil, nil
	}
	msgs, err := m.c.Receive(ctx, n, wait)
	out := make([]stocktest.Delivery, len(msgs))
	for i, msg := range msgs {
		out[i] = delivery{c: m.c, m: msg}
	}
	return out, err
}

// Crash closes the member's connection, as the death of its process would.
func (m *member) Crash() {
	if !m.dead.Swap(true) {
		_ = m.conn.Close()
	}
}

type delivery struct {
	c *amqppub.Consumer
	m amqppub.Message
}

func (d delivery) Event() (stock.Event, error) { return d.m.Event, d.m.Err }
func (d delivery) Ack(context.Context) error   { return d.c.Ack(d.m) }
func (d delivery) Retry(context.Context) error { d.c.Retry(d.m); return nil }

func TestOptions(t *testing.T) {
	for _, o := range []amqppub.Option{amqppub.WithExchange(""), amqppub.WithExchange("a b"), amqppub.WithQueues(0), amqppub.WithQueues(1025)} {
		_, err := amqppub.New(&amqp.Connection{}, o)
		assert.ErrorIs(t, err, stock.ErrInvalid)
	}
	_, err := amqppub.New(nil)
	assert.ErrorIs(t, err, stock.ErrInvalid)
	assert.Equal(t, "stock.events.3", amqppub.Queue(amqppub.DefaultExchange, 3))
	assert.Equal(t, "a%2Fb/o%201/deducted", amqppub.MsgID(stock.Event{SKU: "a/b", ID: "o 1", Type: stock.EventDeducted}))
	for _, sku := range []string{"a", "b", "sku-42"} {
		s := amqppub.ShardOf(sku, 4)
		assert.True(t, s >= 0 && s < 4)
	}
}

// TestMessages: a message carries the event, its id, headers and persistence; an item's
// messages are in one queue, in order; an invalid event fails alone.
func TestMessages(t *testing.T) {
	u := url(t)
	ctx := context.Background()
	rg := newRig(t, u, 2)
	pub, opts := rg.pub, rg.opts
	var evs []stock.Event
	for i := range 10 {
		evs = append(evs, stock.Event{Type: stock.EventDeducted, SKU: []string{"a", "b"}[i%2], ID: "o" + string(rune('0'+i)), Qty: 1, At: time.Now().UTC().Truncate(time.Second), Seq: int64(i + 1)})
	}
	bad := evs[0]
	bad.Qty = -1
	errs := pub.PublishBatch(ctx, append(evs, bad))
	for _, err := range errs[:10] {
		require.NoError(t, err)
	}
	assert.ErrorIs(t, errs[10], stock.ErrInvalid)
	c, err := amqppub.NewConsumer(dial(t, u), &amqppub.ConsumerOptions{Options: opts})
	require.NoError(t, err)
	defer c.Close()
	last := map[string]int64{}
	queue := map[string]string{}
	for got := 0; got < 10; {
		msgs, err := c.Receive(ctx, 10, 5*time.Second)
		require.NoError(t, err)
		require.NotEmpty(t, msgs)
		for _, m := range msgs {
			got++
			require.NoError(t, m.Err)
			assert.Equal(t, amqppub.MsgID(m.Event), m.Delivery.MessageId)
			assert.Equal(t, amqp.Persistent, m.Delivery.DeliveryMode)
			assert.Equal(t, string(m.Event.Type), m.Delivery.Headers[amqppub.HeaderType])
			assert.Greater(t, m.Event.Seq, last[m.Event.SKU], "in order")
			last[m.Event.SKU] = m.Event.Seq
			if q, ok := queue[m.Event.SKU]; ok {
				assert.Equal(t, q, m.Delivery.RoutingKey)
			}
			queue[m.Event.SKU] = m.Delivery.RoutingKey
			require.NoError(t, c.Ack(m))
		}
	}
}

// queued takes every message of a queue (auto ack) and decodes them.
func queued(t *testing.T, conn *amqp.Connection, queue string) []stock.Event {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	var out []stock.Event
	for {
		d, ok, err := ch.Get(queue, true)
		require.NoError(t, err)
		if !ok {
			return out
		}
		ev, err := amqppub.Decode(d.Body)
		require.NoError(t, err)
		out = append(out, ev)
	}
}

// TestPublishBatchInvalidStopsItem: an invalid event in the middle of one item's batch fails
// with ErrInvalid, and (as the doc says) the later events of the same item are not sent, while
// another item's event is.
func TestPublishBatchInvalidStopsItem(t *testing.T) {
	rg := newRig(t, url(t), 1)
	evs := []stock.Event{queuetest.Ev("q:1", "1", 1), queuetest.Ev("q:1", "", 2), queuetest.Ev("q:1", "3", 3), queuetest.Ev("other", "1", 1)}
	errs := rg.pub.PublishBatch(context.Background(), evs)
	require.Len(t, errs, len(evs))
	assert.NoError(t, errs[0], "the valid first event")
	assert.ErrorIs(t, errs[1], stock.ErrInvalid)
	assert.Error(t, errs[2], "the event after the item's invalid one")
	assert.NoError(t, errs[3], "another item's event")
	time.Sleep(100 * time.Millisecond)
	var ids []string
	for _, ev := range queued(t, rg.conn, amqppub.Queue(rg.ex, 0)) {
		if ev.SKU == "q:1" {
			ids = append(ids, ev.ID)
		}
	}
	assert.Equal(t, []string{"1"}, ids, "the queue holds the item's events before the invalid one only")
}

// TestMsgIDInjective: for awkward SKUs and ids, distinct events must have distinct ids, and the
// escaping must leave only letters, digits, '-', '_', '%' and the two '/' separators.
func TestMsgIDInjective(t *testing.T) {
	parts := []string{"a", "a/b", "a%2Fb", "b", "%", "/", "", "ü", "😀", "a b", "-_", "%25", "x/y/z"}
	seen := map[string]string{}
	for _, sku := range parts {
		for _, id := range parts {
			for _, typ := range []stock.EventType{stock.EventDeducted, stock.EventRestored} {
				ev := stock.Event{Type: typ, SKU: sku, ID: id}
				m := amqppub.MsgID(ev)
				k := fmt.Sprintf("%q %q %q", sku, id, typ)
				assert.NotContains(t, seen, m, "MsgID %q for both %s and %s", m, seen[m], k)
				seen[m] = k
				slashes := 0
				for _, r := range m {
					switch {
					case r == '/':
						slashes++
					case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '%':
					default:
						t.Errorf("MsgID %q of %s holds %q", m, k, r)
					}
				}
				assert.Equal(t, 2, slashes, "separators of MsgID %q of %s", m, k)
			}
		}
	}
}

// BenchmarkPublish measures events/s published one by one (Publish: one confirm waited for
// each) and in batches of 128 events of one item (PublishBatch: 128 messages, then their
// confirms, as the Relay calls it), on the RabbitMQ server of STOCK_TEST_AMQP:
//
//	STOCK_TEST_AMQP=amqp://guest:guest@127.0.0.1:5672/ go test -run '^$' -bench Publish -benchtime 3s ./  (in amqppub/)
func BenchmarkPublish(b *testing.B) {
	queuetest.BenchPublish(b, newRig(b, url(b), 4).pub)
}

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
		rg := newRig(t, url(t), 2)
		return childBroker{URL: rg.u, Exchange: rg.ex, Queues: 2}, rg.pub
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
	rg := newRig(t, u, 4)
	pub, opts := rg.pub, rg.opts
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
	rng := mrand.New(mrand.NewPCG(18, 5))
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
