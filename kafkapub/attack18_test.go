package kafkapub_test

// Attack 18 on kafkapub, through its exported API, on franz-go's in-process fake cluster: a batch
// with a bad event in the middle, awkward SKUs, acknowledgements out of order before a crash,
// a retried message whose member dies, and members crashing mid-stream under a live relay.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/stockres/stock"
	"github.com/stockres/stock/kafkapub"
	"github.com/stockres/stock/memstore"
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

func a18Ev(sku, id string, seq int64) stock.Event {
	return stock.Event{Type: stock.EventDeducted, SKU: sku, ID: id, Qty: 1, At: time.UnixMilli(1_700_000_000_000).UTC(), Seq: seq}
}

// An invalid event in the middle of one item's batch. The BatchPublisher contract asks an
// implementation that can to stop at the item's first failure and not publish the later events
// (so that the queue gets them in order when the relay retries from the failed one); kafkapub's
// doc says an item's records are never written out of order.
func TestAttack18InvalidMidBatchStopsTheItem(t *testing.T) {
	brokers := a18Cluster(t, 1)
	pub := a18Producer(t, brokers)
	ctx := context.Background()
	evs := []stock.Event{a18Ev("k:1", "1", 1), a18Ev("k:1", "", 2), a18Ev("k:1", "3", 3), a18Ev("other", "1", 1)}
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
	p := newA18Pipeline(t, []string{"a:b:c", "ü~ñ", "😀", "x/y%z", "-_-", "a.b", strRepeat("L", 128)})
	rng := rand.New(rand.NewPCG(18, 3))
	p.traffic(t, 200, rng)
	rl, err := stockops.NewRelay(p.r, nil, pub, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.drain(t, rl)
	recs := a18ReadAll(t, brokers, p.events)
	if len(recs) < p.events {
		t.Fatalf("read %d records, the relay published %d events", len(recs), p.events)
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
		if err := pub.Publish(ctx, a18Ev("o", fmt.Sprint(i), int64(i))); err != nil {
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
		if err := pub.Publish(ctx, a18Ev("r", fmt.Sprint(i), int64(i))); err != nil {
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
	p := newA18Pipeline(t, skus)
	ctx := context.Background()
	rl, err := stockops.NewRelay(p.r, nil, pub, &stock.RelayOptions{Batch: 16, Poll: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan struct{})
	go func() { defer close(relayDone); _ = rl.Run(runCtx) }()
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
				if m.Err != nil {
					t.Errorf("record does not decode: %v", m.Err)
					_ = cons.Ack(ctx, m)
					continue
				}
				switch err := stock.Consume(ctx, p.r, p.store, m.Event); {
				case err == nil:
					_ = cons.Ack(ctx, m)
				case errors.Is(err, stock.ErrInvalid):
					t.Errorf("Consume: %v", err)
					_ = cons.Ack(ctx, m)
				default:
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
	p.traffic(t, 300, rng)
	wg.Add(1)
	go member(0)
	p.traffic(t, 200, rng)
	rec, err := stockops.NewReconciler(p.r, p.store, &stock.ReconcileOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
		busy := false
		for _, sku := range skus {
			rp, err := rec.Item(ctx, sku)
			if err != nil {
				t.Fatal(err)
			}
			if rp.Pending+rp.Published > 0 {
				busy = true
			}
		}
		if !busy {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(stopAll)
	wg.Wait()
	stopRelay()
	<-relayDone
	if crashedHolding.Load() == 0 {
		t.Error("no member crashed holding messages: the attack did not happen")
	}
	t.Logf("crashed members held %d messages", crashedHolding.Load())
	p.verify(t)
}

// a18Pipeline is a Reserver on miniredis, a memstore and the acknowledged operations.
type a18Pipeline struct {
	r        *stock.Reserver
	store    *memstore.Store
	mu       sync.Mutex
	deducted map[string]map[string]int64
	restored map[string]map[string]bool
	initial  map[string]int64
	n        int
	events   int // events the traffic queued (deducts and restores)
}

func newA18Pipeline(t *testing.T, skus []string) *a18Pipeline {
	t.Helper()
	m := miniredis.RunT(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{m.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	r, err := stock.New(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p := &a18Pipeline{r: r, store: memstore.New(), deducted: map[string]map[string]int64{}, restored: map[string]map[string]bool{}, initial: map[string]int64{}}
	for _, sku := range skus {
		if err := r.Load(ctx, sku, 100000); err != nil {
			t.Fatal(err)
		}
		if err := p.store.Load(ctx, sku, 100000); err != nil {
			t.Fatal(err)
		}
		p.initial[sku] = 100000
		p.deducted[sku] = map[string]int64{}
		p.restored[sku] = map[string]bool{}
	}
	return p
}

func (p *a18Pipeline) traffic(t *testing.T, n int, rng *rand.Rand) {
	ctx := context.Background()
	skus := make([]string, 0, len(p.initial))
	for sku := range p.initial {
		skus = append(skus, sku)
	}
	sort.Strings(skus)
	for i := 0; i < n; i++ {
		sku := skus[rng.IntN(len(skus))]
		p.n++
		id := fmt.Sprintf("o%d", p.n)
		q := int64(1 + rng.IntN(3))
		if _, err := p.r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: q}); err != nil {
			t.Fatalf("Deduct: %v", err)
		}
		p.mu.Lock()
		p.deducted[sku][id] = q
		p.events++
		p.mu.Unlock()
		if i%4 == 3 {
			if _, err := p.r.Restore(ctx, sku, id); err != nil {
				t.Fatalf("Restore: %v", err)
			}
			p.mu.Lock()
			p.restored[sku][id] = true
			p.events++
			p.mu.Unlock()
		}
	}
}

func (p *a18Pipeline) drain(t *testing.T, rl *stockops.Relay) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < 100; i++ {
		if _, err := rl.Once(ctx); err != nil {
			t.Fatalf("relay: %v", err)
		}
		var left int64
		for sku := range p.initial {
			n, _, err := stockops.Pending(ctx, p.r, sku)
			if err != nil {
				t.Fatal(err)
			}
			left += n
		}
		if left == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the relay did not drain")
}

func (p *a18Pipeline) verify(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	rec, err := stockops.NewReconciler(p.r, p.store, &stock.ReconcileOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	for sku, init := range p.initial {
		want := init
		for id, q := range p.deducted[sku] {
			if !p.restored[sku][id] {
				want -= q
			}
		}
		lv, err := p.r.Levels(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		rem, err := p.store.Remaining(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		if rem != want || lv.Available != want {
			t.Errorf("item %q: store %d, Redis %d, acknowledged answers %d", sku, rem, lv.Available, want)
		}
		rp, err := rec.Item(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		if rp.Pending != 0 || rp.Published != 0 || rp.InFlight != 0 || rp.Drift != 0 || rp.DeadLetters != 0 {
			t.Errorf("item %q after the drain: %s", sku, rp)
		}
	}
	if m := p.store.MaxApplications(); m > 1 {
		t.Errorf("an event changed the store %d times", m)
	}
}

// A context that ends while a batch is produced: every event answered nil must be in the topic,
// and an item's events that are there must be a prefix of the batch (never a hole).
func TestAttack18ContextEndsMidBatch(t *testing.T) {
	brokers := a18Cluster(t, 2)
	pub := a18Producer(t, brokers)
	var evs []stock.Event
	for i := 1; i <= 200; i++ {
		evs = append(evs, a18Ev("c:1", fmt.Sprint(i), int64(i)))
	}
	if err := pub.Publish(context.Background(), a18Ev("warm", "0", 1)); err != nil { // connected
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
