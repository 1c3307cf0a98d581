package kafkapub_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"iter"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	_ "modernc.org/sqlite"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/queuetest"
	"github.com/stockres/stock/kafkapub"
	"github.com/stockres/stock/sqlstore"
	"github.com/stockres/stock/stockops"
	"github.com/stockres/stock/stocktest"
)

const topic = "stock-events"

// fakeCluster starts an in-process Kafka cluster with topic in the given number of partitions.
func fakeCluster(t testing.TB, partitions int) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(partitions), topic))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

func producer(t testing.TB, addrs []string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addrs...)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

func consumer(t testing.TB, addrs []string) *kafkapub.Consumer {
	t.Helper()
	c, err := kafkapub.NewConsumer(topic, "store", &kafkapub.ConsumerOptions{RetryDelay: 100 * time.Millisecond},
		kgo.SeedBrokers(addrs...), kgo.FetchMaxWait(100*time.Millisecond))
	require.NoError(t, err)
	return c
}

// TestPublisherConformance runs the publisher conformance suite on the fake cluster: 4
// partitions, one consumer group; a crashed member leaves the group without committing.
func TestPublisherConformance(t *testing.T) {
	stocktest.TestPublisher(t, func(t *testing.T) stocktest.PublisherPair {
		addrs, pub := newPublisher(t, 4)
		return stocktest.PublisherPair{
			Publisher: pub,
			NewConsumer: func(t testing.TB) stocktest.Consumer {
				m := &member{c: consumer(t, addrs)}
				t.Cleanup(func() {
					if !m.dead.Load() {
						m.c.Close()
					}
				})
				return m
			},
			Redelivery: 3 * time.Second,
			// The consumers apply to sqlstore on a SQLite file, as in production.
			NewStore: func(t testing.TB) stock.Store { return openStore(t, filepath.Join(t.TempDir(), "store.sqlite")) },
		}
	})
}

type member struct {
	c    *kafkapub.Consumer
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

func (m *member) Crash() {
	if !m.dead.Swap(true) {
		m.c.Abandon()
	}
}

type delivery struct {
	c *kafkapub.Consumer
	m kafkapub.Message
}

func (d delivery) Event() (stock.Event, error)   { return d.m.Event, d.m.Err }
func (d delivery) Ack(ctx context.Context) error { return d.c.Ack(ctx, d.m) }
func (d delivery) Retry(context.Context) error   { d.c.Retry(d.m); return nil }

func TestNewRefusesWeakProducer(t *testing.T) {
	addrs := fakeCluster(t, 4)
	_, err := kafkapub.New(nil, topic)
	assert.ErrorIs(t, err, stock.ErrInvalid)
	_, err = kafkapub.New(producer(t, addrs), "")
	assert.ErrorIs(t, err, stock.ErrInvalid)
	_, err = kafkapub.New(producer(t, addrs, kgo.RequiredAcks(kgo.LeaderAck()), kgo.DisableIdempotentWrite()), topic)
	assert.ErrorIs(t, err, stock.ErrInvalid)
	_, err = kafkapub.New(producer(t, addrs, kgo.DisableIdempotentWrite()), topic)
	assert.ErrorIs(t, err, stock.ErrInvalid)
	_, err = kafkapub.New(producer(t, addrs), topic)
	assert.NoError(t, err)
}

// TestRecordsKeyedBySKU: one item's records share its partition, in order, with the key, value
// and headers the package doc names; an invalid event fails alone in a batch.
func TestRecordsKeyedBySKU(t *testing.T) {
	addrs, pub := newPublisher(t, 4)
	var evs []stock.Event
	for i := range 40 {
		sku := []string{"a", "b", "c", "d", "e"}[i%5]
		evs = append(evs, stock.Event{Type: stock.EventDeducted, SKU: sku, ID: "o" + string(rune('A'+i)), Qty: 1, At: time.Now().UTC(), Seq: int64(i + 1)})
	}
	bad := evs[3]
	bad.ID = ""
	errs := pub.PublishBatch(context.Background(), append(evs, bad))
	for _, err := range errs[:40] {
		require.NoError(t, err)
	}
	assert.ErrorIs(t, errs[40], stock.ErrInvalid)
	recs := readAll(t, addrs, 40)
	require.Len(t, recs, 40)
	checkRecords(t, recs)
}

// checkRecords checks records as the package doc describes them: keyed by the SKU, each item
// in one partition in the item's sequence, with the type and sequence headers.
func checkRecords(t *testing.T, recs []*kgo.Record) {
	t.Helper()
	part := map[string]int32{}
	last := map[string]int64{}
	for i, ev := range decodeAll(t, recs) {
		r := recs[i]
		assert.Equal(t, ev.SKU, string(r.Key), "the record's key")
		if pp, ok := part[ev.SKU]; ok {
			assert.Equal(t, pp, r.Partition, "item %q in one partition", ev.SKU)
		}
		part[ev.SKU] = r.Partition
		assert.Greater(t, ev.Seq, last[ev.SKU], "item %q in order in its partition", ev.SKU)
		last[ev.SKU] = ev.Seq
		require.Len(t, r.Headers, 2)
		assert.Equal(t, kafkapub.HeaderType, r.Headers[0].Key)
		hdr := map[string]string{}
		for _, h := range r.Headers {
			hdr[h.Key] = string(h.Value)
		}
		assert.Equal(t, map[string]string{kafkapub.HeaderType: string(ev.Type), kafkapub.HeaderSeq: fmt.Sprint(ev.Seq)}, hdr)
	}
}

// readAll reads the whole topic with a plain client (no group): want records, or until 5s.
func readAll(t *testing.T, brokers []string, want int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	var out []*kgo.Record
	deadline := time.Now().Add(5 * time.Second)
	for len(out) < want && time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out
}

// newPublisher starts a fake cluster with topic in the given number of partitions and returns
// its brokers and a publisher on it.
func newPublisher(t *testing.T, partitions int) ([]string, *kafkapub.Publisher) {
	t.Helper()
	brokers := fakeCluster(t, partitions)
	pub, err := kafkapub.New(producer(t, brokers), topic)
	require.NoError(t, err)
	return brokers, pub
}

// TestPublishBatchInvalidStopsItem: an invalid event in the middle of one item's batch. The
// BatchPublisher contract asks an implementation that can to stop at the item's first failure
// and not publish the later events (so that the queue gets them in order when the relay retries
// from the failed one); kafkapub's doc says an item's records are never written out of order.
func TestPublishBatchInvalidStopsItem(t *testing.T) {
	brokers, pub := newPublisher(t, 1)
	ctx := context.Background()
	evs := []stock.Event{queuetest.Ev("k:1", "1", 1), queuetest.Ev("k:1", "", 2), queuetest.Ev("k:1", "3", 3), queuetest.Ev("other", "1", 1)}
	errs := pub.PublishBatch(ctx, evs)
	require.Len(t, errs, len(evs))
	assert.NoError(t, errs[0], "the valid first event")
	assert.ErrorIs(t, errs[1], stock.ErrInvalid)
	assert.NoError(t, errs[3], "another item's event")
	var ids []string
	for _, ev := range decodeAll(t, readAll(t, brokers, 3)) {
		if ev.SKU == "k:1" {
			ids = append(ids, ev.ID)
		}
	}
	// Produced and answered nil, the relay would retry from the failed event and the queue
	// get the item's events out of order.
	assert.Error(t, errs[2], "the event after the item's invalid one (the topic has %v)", ids)
}

// decodeAll decodes the events of recs, failing the test on an error.
func decodeAll(t *testing.T, recs []*kgo.Record) []stock.Event {
	t.Helper()
	out := make([]stock.Event, len(recs))
	for i, r := range recs {
		ev, err := kafkapub.Decode(r.Value)
		require.NoError(t, err)
		out[i] = ev
	}
	return out
}

// TestAwkwardSKUsOnePartition: with awkward SKUs through a relay, each item's records must sit
// in one partition, keyed by the SKU, in the item's sequence, with the headers the doc lists.
func TestAwkwardSKUsOnePartition(t *testing.T) {
	brokers, pub := newPublisher(t, 8)
	p := queuetest.NewMiniredisPipeline(t, []string{"a:b:c", "ü~ñ", "😀", "x/y%z", "-_-", "a.b", strings.Repeat("L", 128)})
	rng := rand.New(rand.NewPCG(18, 3))
	p.Traffic(t, 200, rng)
	rl, err := stockops.NewRelay(p.R, nil, pub, nil)
	require.NoError(t, err)
	p.Drain(t, rl)
	recs := readAll(t, brokers, p.Events())
	if len(recs) < p.Events() {
		t.Fatalf("read %d records, the relay published %d events", len(recs), p.Events())
	}
	checkRecords(t, recs)
}

// TestMemberCrashReturnsUnsettled: a member that dies holding a message it did not settle hands
// it to the next member of the group: after acknowledging the third and first of three messages
// of a partition, not the second (the commit may not pass it, and the committed first does not
// come back); or after calling Retry on it, dying before the retry delay.
func TestMemberCrashReturnsUnsettled(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name, sku string
		n         int
		opts      *kafkapub.ConsumerOptions
		settle    func(t *testing.T, c *kafkapub.Consumer, got []kafkapub.Message)
		committed string // an ID that must not come back; "" checks none
	}{
		{name: "ack out of order", sku: "o", n: 3, committed: "1",
			settle: func(t *testing.T, c *kafkapub.Consumer, got []kafkapub.Message) {
				require.NoError(t, c.Ack(ctx, got[2]))
				require.NoError(t, c.Ack(ctx, got[0]))
			}},
		{name: "retry", sku: "r", n: 4, opts: &kafkapub.ConsumerOptions{RetryDelay: 5 * time.Second},
			settle: func(t *testing.T, c *kafkapub.Consumer, got []kafkapub.Message) {
				_ = c.Ack(ctx, got[0])
				c.Retry(got[1])
				_ = c.Ack(ctx, got[2])
				_ = c.Ack(ctx, got[3])
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			brokers, pub := newPublisher(t, 1)
			for i := 1; i <= tc.n; i++ {
				require.NoError(t, pub.Publish(ctx, queuetest.Ev(tc.sku, fmt.Sprint(i), int64(i))))
			}
			c1, err := kafkapub.NewConsumer(topic, "g", tc.opts, kgo.SeedBrokers(brokers...))
			require.NoError(t, err)
			var got []kafkapub.Message
			for deadline := time.Now().Add(10 * time.Second); len(got) < tc.n && time.Now().Before(deadline); {
				msgs, _ := c1.Receive(ctx, 10, time.Second)
				got = append(got, msgs...)
			}
			require.Len(t, got, tc.n, "the first member's messages")
			tc.settle(t, c1, got)
			time.Sleep(200 * time.Millisecond) // its commits land
			c1.Abandon()
			c2, err := kafkapub.NewConsumer(topic, "g", nil, kgo.SeedBrokers(brokers...))
			require.NoError(t, err)
			defer c2.Close()
			seen := map[string]bool{}
			for deadline := time.Now().Add(10 * time.Second); !seen["2"] && time.Now().Before(deadline); {
				msgs, _ := c2.Receive(ctx, 10, 500*time.Millisecond)
				for _, m := range msgs {
					seen[m.Event.ID] = true
				}
			}
			assert.True(t, seen["2"], "the unsettled second message was lost with its member (the next one got %v)", seen)
			if tc.committed != "" {
				assert.False(t, seen[tc.committed], "the acknowledged and committed message came back")
			}
		})
	}
}

// TestMembersCrashMidStream: a live relay, traffic, and three members of one group; two crash
// mid-stream holding messages (one restarts), one joins late. The store must end equal to Redis
// and to the acknowledged answers, nothing applied twice.
func TestMembersCrashMidStream(t *testing.T) {
	brokers, pub := newPublisher(t, 4)
	skus := []string{"m:1", "m:2", "m~3", "m:ü4", "m:5", "m:6", "m:7", "m:8"}
	p := queuetest.NewMiniredisPipeline(t, skus)
	ctx := context.Background()
	stopRelay := p.RunRelay(t, pub)
	stopAll := make(chan struct{})
	var wg sync.WaitGroup
	var crashedHolding atomic.Int64
	member := func(crashAfter int) {
		defer wg.Done()
		cons, err := kafkapub.NewConsumer(topic, "store", &kafkapub.ConsumerOptions{RetryDelay: 50 * time.Millisecond}, kgo.SeedBrokers(brokers...))
		if err != nil {
			t.Error(err)
			return
		}
		for batch := 0; ; batch++ {
			select {
			case <-stopAll:
				cons.Close()
				return
			default:
			}
			msgs, _ := cons.Receive(ctx, 8, 100*time.Millisecond)
			if len(msgs) == 0 {
				continue
			}
			if crashAfter > 0 && batch >= crashAfter {
				crashedHolding.Add(int64(len(msgs)))
				cons.Abandon()
				return
			}
			for _, m := range msgs {
				if p.Settle(t, "record", m.Event, m.Err) {
					_ = cons.Ack(ctx, m)
				} else {
					cons.Retry(m)
				}
			}
		}
	}
	wg.Add(3)
	go member(4)
	go member(0)
	go member(7)
	rng := rand.New(rand.NewPCG(18, 4))
	p.Traffic(t, 300, rng)
	wg.Add(1)
	go member(0)
	p.Traffic(t, 200, rng)
	p.WaitApplied(t, 15*time.Second, nil)
	close(stopAll)
	wg.Wait()
	stopRelay()
	p.VerifyCrashed(t, crashedHolding.Load())
}

// TestContextEndsMidBatch: a context that ends while a batch is produced: every event answered
// nil must be in the topic, and an item's events that are there must be a prefix of the batch
// (never a hole).
func TestContextEndsMidBatch(t *testing.T) {
	brokers, pub := newPublisher(t, 2)
	var evs []stock.Event
	for i := 1; i <= 200; i++ {
		evs = append(evs, queuetest.Ev("c:1", fmt.Sprint(i), int64(i)))
	}
	require.NoError(t, pub.Publish(context.Background(), queuetest.Ev("warm", "0", 1))) // connected
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(300 * time.Microsecond); cancel() }()
	errs := pub.PublishBatch(ctx, evs)
	require.Len(t, errs, len(evs))
	acked := 0
	for _, err := range errs {
		if err == nil {
			acked++
		}
	}
	recs := readAll(t, brokers, len(evs)+1)
	in := map[string]bool{}
	var seqs []int64
	for _, ev := range decodeAll(t, recs) {
		if ev.SKU != "c:1" {
			continue
		}
		in[ev.ID] = true
		seqs = append(seqs, ev.Seq)
	}
	for i, ev := range evs {
		if errs[i] == nil && !in[ev.ID] {
			t.Errorf("event %s answered nil, not in the topic", ev.ID)
		}
	}
	for i, s := range seqs {
		if s != int64(i+1) {
			t.Errorf("the topic holds the item's events %v...: not a prefix of the batch", seqs[:i+1])
			break
		}
	}
	t.Logf("%d of %d answered nil, %d in the topic", acked, len(evs), len(recs))
}

// BenchmarkPublish measures events/s published one by one (Publish: one ProduceSync of one
// record each) and in batches of 128 events of one item (PublishBatch: one ProduceSync of 128
// records, as the Relay calls it), on the in-process fake cluster: a figure of the client and
// the protocol round trips, not of a real cluster's disks and replication.
//
//	go test -run '^$' -bench Publish -benchtime 3s ./  (in kafkapub/)
func BenchmarkPublish(b *testing.B) {
	pub, err := kafkapub.New(producer(b, fakeCluster(b, 4)), topic)
	require.NoError(b, err)
	queuetest.BenchPublish(b, pub)
}

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
