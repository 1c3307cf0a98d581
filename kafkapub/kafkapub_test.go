package kafkapub_test

import (
	"context"
	"errors"
	"fmt"
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

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/queuetest"
	"github.com/stockres/stock/kafkapub"
	"github.com/stockres/stock/stockops"
	"github.com/stockres/stock/stocktest"
)

const topic = "stock-events"

// fakeCluster starts an in-process Kafka cluster with topic in 4 partitions.
func fakeCluster(t testing.TB) []string {
	t.Helper()
	return fakeClusterN(t, 4)
}

// fakeClusterN starts an in-process Kafka cluster with topic in the given number of partitions.
func fakeClusterN(t testing.TB, partitions int) []string {
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

// readAll reads the whole topic with a plain client (no group): want records, or until 5s.
func readAll(t *testing.T, brokers []string, want int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
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
	brokers := fakeClusterN(t, partitions)
	pub, err := kafkapub.New(producer(t, brokers), topic)
	require.NoError(t, err)
	return brokers, pub
}

// publishN publishes the events 1 to n of sku, one by one.
func publishN(t *testing.T, pub *kafkapub.Publisher, sku string, n int) {
	t.Helper()
	for i := 1; i <= n; i++ {
		if err := pub.Publish(context.Background(), queuetest.Ev(sku, fmt.Sprint(i), int64(i))); err != nil {
			t.Fatal(err)
		}
	}
}

// receiveN receives from c until it holds n messages or 10s pass, and fails the test with fewer.
func receiveN(t *testing.T, c *kafkapub.Consumer, n int) []kafkapub.Message {
	t.Helper()
	var got []kafkapub.Message
	for deadline := time.Now().Add(10 * time.Second); len(got) < n && time.Now().Before(deadline); {
		msgs, _ := c.Receive(context.Background(), 10, time.Second)
		got = append(got, msgs...)
	}
	if len(got) != n {
		t.Fatalf("the first member received %d messages, want %d", len(got), n)
	}
	return got
}

// crashAndRejoin lets c's commits land, abandons c as a crashed member would, and returns the
// IDs a new member of group "g" receives until it sees want or 10s pass.
func crashAndRejoin(t *testing.T, brokers []string, c *kafkapub.Consumer, want string) map[string]bool {
	t.Helper()
	time.Sleep(200 * time.Millisecond)
	c.Abandon()
	c2, err := kafkapub.NewConsumer(topic, "g", nil, kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	seen := map[string]bool{}
	for deadline := time.Now().Add(10 * time.Second); !seen[want] && time.Now().Before(deadline); {
		msgs, _ := c2.Receive(context.Background(), 10, 500*time.Millisecond)
		for _, m := range msgs {
			seen[m.Event.ID] = true
		}
	}
	return seen
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
	if len(errs) != len(evs) {
		t.Fatalf("%d answers for %d events", len(errs), len(evs))
	}
	if errs[0] != nil || errs[3] != nil {
		t.Errorf("the valid first event or another item's event failed: %v", errs)
	}
	if !errors.Is(errs[1], stock.ErrInvalid) {
		t.Errorf("the invalid event: %v, want ErrInvalid", errs[1])
	}
	recs := readAll(t, brokers, 3)
	var ids []string
	for _, r := range recs {
		ev, err := kafkapub.Decode(r.Value)
		if err != nil {
			t.Fatal(err)
		}
		if ev.SKU == "k:1" {
			ids = append(ids, ev.ID)
		}
	}
	if errs[2] == nil {
		t.Errorf("the event after the item's invalid one was produced and answered nil (the topic has %v): "+
			"when the relay retries from the failed event, the queue gets the item's events out of order", ids)
	}
}

// TestAwkwardSKUsOnePartition: with awkward SKUs through a relay, each item's records must sit
// in one partition, keyed by the SKU, in the item's sequence, with the headers the doc lists.
func TestAwkwardSKUsOnePartition(t *testing.T) {
	brokers, pub := newPublisher(t, 8)
	p := queuetest.NewMiniredisPipeline(t, []string{"a:b:c", "ü~ñ", "😀", "x/y%z", "-_-", "a.b", strings.Repeat("L", 128)})
	rng := rand.New(rand.NewPCG(18, 3))
	p.Traffic(t, 200, rng)
	rl, err := stockops.NewRelay(p.R, nil, pub, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.Drain(t, rl)
	recs := readAll(t, brokers, p.Events())
	if len(recs) < p.Events() {
		t.Fatalf("read %d records, the relay published %d events", len(recs), p.Events())
	}
	part := map[string]int32{}
	last := map[string]int64{}
	for _, r := range recs {
		ev, err := kafkapub.Decode(r.Value)
		if err != nil {
			t.Fatal(err)
		}
		if string(r.Key) != ev.SKU {
			t.Errorf("record key %q, event SKU %q", r.Key, ev.SKU)
		}
		if pp, ok := part[ev.SKU]; ok && pp != r.Partition {
			t.Errorf("item %q in partitions %d and %d", ev.SKU, pp, r.Partition)
		}
		part[ev.SKU] = r.Partition
		if ev.Seq <= last[ev.SKU] {
			t.Errorf("item %q: seq %d after %d in its partition", ev.SKU, ev.Seq, last[ev.SKU])
		}
		last[ev.SKU] = ev.Seq
		hdr := map[string]string{}
		for _, h := range r.Headers {
			hdr[h.Key] = string(h.Value)
		}
		if hdr[kafkapub.HeaderType] != string(ev.Type) || hdr[kafkapub.HeaderSeq] != fmt.Sprint(ev.Seq) {
			t.Errorf("headers %v for %s seq %d", hdr, ev.Type, ev.Seq)
		}
	}
}

// TestAckOutOfOrderThenCrash: a member acknowledges the third and first of three messages of a
// partition, not the second, and dies. The next member must get the second again (the commit
// may not pass it).
func TestAckOutOfOrderThenCrash(t *testing.T) {
	brokers, pub := newPublisher(t, 1)
	ctx := context.Background()
	publishN(t, pub, "o", 3)
	c1, err := kafkapub.NewConsumer(topic, "g", nil, kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	got := receiveN(t, c1, 3)
	if err := c1.Ack(ctx, got[2]); err != nil {
		t.Fatal(err)
	}
	if err := c1.Ack(ctx, got[0]); err != nil {
		t.Fatal(err)
	}
	seen := crashAndRejoin(t, brokers, c1, "2")
	if !seen["2"] {
		t.Errorf("the unacknowledged second message never came back after the crash (got %v)", seen)
	}
	if seen["1"] {
		t.Errorf("the first message, acknowledged and committed, came back")
	}
}

// TestRetryThenCrash: a member calls Retry on a message and dies before the retry delay: the
// next member must get the message (and the ones after it).
func TestRetryThenCrash(t *testing.T) {
	brokers, pub := newPublisher(t, 1)
	ctx := context.Background()
	publishN(t, pub, "r", 4)
	c1, err := kafkapub.NewConsumer(topic, "g", &kafkapub.ConsumerOptions{RetryDelay: 5 * time.Second}, kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	got := receiveN(t, c1, 4)
	_ = c1.Ack(ctx, got[0])
	c1.Retry(got[1])
	_ = c1.Ack(ctx, got[2])
	_ = c1.Ack(ctx, got[3])
	seen := crashAndRejoin(t, brokers, c1, "2")
	if !seen["2"] {
		t.Errorf("the retried message was lost with its member (the next one got %v)", seen)
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
	if err := pub.Publish(context.Background(), queuetest.Ev("warm", "0", 1)); err != nil { // connected
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(300 * time.Microsecond); cancel() }()
	errs := pub.PublishBatch(ctx, evs)
	if len(errs) != len(evs) {
		t.Fatalf("%d answers for %d events", len(errs), len(evs))
	}
	acked := 0
	for _, err := range errs {
		if err == nil {
			acked++
		}
	}
	recs := readAll(t, brokers, len(evs)+1)
	in := map[string]bool{}
	var seqs []int64
	for _, r := range recs {
		ev, err := kafkapub.Decode(r.Value)
		if err != nil {
			t.Fatal(err)
		}
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
