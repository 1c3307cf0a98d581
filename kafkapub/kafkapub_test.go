package kafkapub_test

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/stockres/stock"
	"github.com/stockres/stock/kafkapub"
	"github.com/stockres/stock/stocktest"
)

const topic = "stock-events"

// fakeCluster starts an in-process Kafka cluster with topic in 4 partitions.
func fakeCluster(t testing.TB) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, topic))
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
		addrs := fakeCluster(t)
		pub, err := kafkapub.New(producer(t, addrs), topic)
		require.NoError(t, err)
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
	addrs := fakeCluster(t)
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
	ctx := context.Background()
	addrs := fakeCluster(t)
	pub, err := kafkapub.New(producer(t, addrs), topic)
	require.NoError(t, err)
	var evs []stock.Event
	for i := range 40 {
		sku := []string{"a", "b", "c", "d", "e"}[i%5]
		evs = append(evs, stock.Event{Type: stock.EventDeducted, SKU: sku, ID: "o" + string(rune('A'+i)), Qty: 1, At: time.Now().UTC(), Seq: int64(i + 1)})
	}
	bad := evs[3]
	bad.ID = ""
	errs := pub.PublishBatch(ctx, append(evs, bad))
	for _, err := range errs[:40] {
		require.NoError(t, err)
	}
	assert.ErrorIs(t, errs[40], stock.ErrInvalid)

	cl := producer(t, addrs, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	part := map[string]int32{}
	last := map[string]int64{}
	got := 0
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for got < 40 {
		fs := cl.PollFetches(pctx)
		require.NoError(t, pctx.Err())
		fs.EachRecord(func(r *kgo.Record) {
			got++
			ev, err := kafkapub.Decode(r.Value)
			require.NoError(t, err)
			assert.Equal(t, ev.SKU, string(r.Key))
			if p, ok := part[ev.SKU]; ok {
				assert.Equal(t, p, r.Partition, "one partition per item")
			}
			part[ev.SKU] = r.Partition
			assert.Greater(t, ev.Seq, last[ev.SKU], "in order")
			last[ev.SKU] = ev.Seq
			require.Len(t, r.Headers, 2)
			assert.Equal(t, kafkapub.HeaderType, r.Headers[0].Key)
			assert.Equal(t, string(ev.Type), string(r.Headers[0].Value))
		})
	}
}
