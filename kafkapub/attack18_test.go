package kafkapub_test

// Attack 18 on kafkapub, through its exported API, on franz-go's in-process fake cluster: a batch
// with a bad event in the middle, awkward SKUs, acknowledgements out of order before a crash,
// a retried message whose member dies, and members crashing mid-stream under a live relay.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/queuetest"
	"github.com/stockres/stock/kafkapub"
	"github.com/stockres/stock/stockops"
)

const a18Topic = "a18-events"

func a18Cluster(t *testing.T, partitions int) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(partitions), a18Topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

func a18Producer(t *testing.T, brokers []string) *kafkapub.Publisher {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	pub, err := kafkapub.New(cl, a18Topic)
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// a18ReadAll reads the whole topic with a plain client (no group): want records, or until 5s.
func a18ReadAll(t *testing.T, brokers []string, want int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(a18Topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
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

// An invalid event in the middle of one item's batch. The BatchPublisher contract asks an
// implementation that can to stop at the item's first failure and not publish the later events
// (so that the queue gets them in order when the relay retries from the failed one); kafkapub's
// doc says an item's records are never written out of order.
func TestAttack18InvalidMidBatchStopsTheItem(t *testing.T) {
	brokers := a18Cluster(t, 1)
	pub := a18Producer(t, brokers)
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
	recs := a18ReadAll(t, brokers, 3)
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

// Awkward SKUs through a relay: each item's records must sit in one partition, keyed by the SKU,
// in the item's sequence, with the headers the doc lists.
func TestAttack18AwkwardSKUsOnePartition(t *testing.T) {
	brokers := a18Cluster(t, 8)
	pub := a18Producer(t, brokers)
	p := queuetest.NewMiniredisPipeline(t, []string{"a:b:c", "ü~ñ", "😀", "x/y%z", "-_-", "a.b", strRepeat("L", 128)})
	rng := rand.New(rand.NewPCG(18, 3))
	p.Traffic(t, 200, rng)
	rl, err := stockops.NewRelay(p.R, nil, pub, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.Drain(t, rl)
	recs := a18ReadAll(t, brokers, p.Events())
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

func strRepeat(s string, n int) string {
	out := ""
	for i := 0; i < n; i++ {
		out += s
	}
	return out
}

// A member acknowledges the third and first of three messages of a partition, not the second,
// and dies. The next member must get the second again (the commit may not pass it).
func TestAttack18AckOutOfOrderThenCrash(t *testing.T) {
	brokers := a18Cluster(t, 1)
	pub := a18Producer(t, brokers)
	ctx := context.Background()
	for i := 1; i <= 3; i++ {
		if err := pub.Publish(ctx, queuetest.Ev("o", fmt.Sprint(i), int64(i))); err != nil {
			t.Fatal(err)
		}
	}
	c1, err := kafkapub.NewConsumer(a18Topic, "g", nil, kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	var got []kafkapub.Message
	for deadline := time.Now().Add(10 * time.Second); len(got) < 3 && time.Now().Before(deadline); {
		msgs, _ := c1.Receive(ctx, 10, time.Second)
		got = append(got, msgs...)
	}
	if len(got) != 3 {
		t.Fatalf("the first member received %d messages, want 3", len(got))
	}
	if err := c1.Ack(ctx, got[2]); err != nil {
		t.Fatal(err)
	}
	if err := c1.Ack(ctx, got[0]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	c1.Abandon()
	c2, err := kafkapub.NewConsumer(a18Topic, "g", nil, kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	seen := map[string]bool{}
	for deadline := time.Now().Add(10 * time.Second); !seen["2"] && time.Now().Before(deadline); {
		msgs, _ := c2.Receive(ctx, 10, 500*time.Millisecond)
		for _, m := range msgs {
			seen[m.Event.ID] = true
		}
	}
	if !seen["2"] {
		t.Errorf("the unacknowledged second message never came back after the crash (got %v)", seen)
	}
	if seen["1"] {
		t.Errorf("the first message, acknowledged and committed, came back")
	}
}

// A member calls Retry on a message and dies before the retry delay: the next member must get
// the message (and the ones after it).
func TestAttack18RetryThenCrash(t *testing.T) {
	brokers := a18Cluster(t, 1)
	pub := a18Producer(t, brokers)
	ctx := context.Background()
	for i := 1; i <= 4; i++ {
		if err := pub.Publish(ctx, queuetest.Ev("r", fmt.Sprint(i), int64(i))); err != nil {
			t.Fatal(err)
		}
	}
	c1, err := kafkapub.NewConsumer(a18Topic, "g", &kafkapub.ConsumerOptions{RetryDelay: 5 * time.Second}, kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	var got []kafkapub.Message
	for deadline := time.Now().Add(10 * time.Second); len(got) < 4 && time.Now().Before(deadline); {
		msgs, _ := c1.Receive(ctx, 10, time.Second)
		got = append(got, msgs...)
	}
	if len(got) != 4 {
		t.Fatalf("received %d, want 4", len(got))
	}
	_ = c1.Ack(ctx, got[0])
	c1.Retry(got[1])
	_ = c1.Ack(ctx, got[2])
	_ = c1.Ack(ctx, got[3])
	time.Sleep(200 * time.Millisecond)
	c1.Abandon()
	c2, err := kafkapub.NewConsumer(a18Topic, "g", nil, kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	seen := map[string]bool{}
	for deadline := time.Now().Add(10 * time.Second); !seen["2"] && time.Now().Before(deadline); {
		msgs, _ := c2.Receive(ctx, 10, 500*time.Millisecond)
		for _, m := range msgs {
			seen[m.Event.ID] = true
		}
	}
	if !seen["2"] {
		t.Errorf("the retried message was lost with its member (the next one got %v)", seen)
	}
}

// A live relay, traffic, and three members of one group; two crash mid-stream holding messages
// (one restarts), one joins late. The store must end equal to Redis and to the acknowledged
// answers, nothing applied twice.
func TestAttack18MembersCrashMidStream(t *testing.T) {
	brokers := a18Cluster(t, 4)
	pub := a18Producer(t, brokers)
	skus := []string{"m:1", "m:2", "m~3", "m:ü4", "m:5", "m:6", "m:7", "m:8"}
	p := queuetest.NewMiniredisPipeline(t, skus)
	ctx := context.Background()
	stopRelay := p.RunRelay(t, pub)
	stopAll := make(chan struct{})
	var wg sync.WaitGroup
	var crashedHolding atomic.Int64
	member := func(crashAfter int) {
		defer wg.Done()
		cons, err := kafkapub.NewConsumer(a18Topic, "store", &kafkapub.ConsumerOptions{RetryDelay: 50 * time.Millisecond}, kgo.SeedBrokers(brokers...))
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

// A context that ends while a batch is produced: every event answered nil must be in the topic,
// and an item's events that are there must be a prefix of the batch (never a hole).
func TestAttack18ContextEndsMidBatch(t *testing.T) {
	brokers := a18Cluster(t, 2)
	pub := a18Producer(t, brokers)
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
	recs := a18ReadAll(t, brokers, len(evs)+1)
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
