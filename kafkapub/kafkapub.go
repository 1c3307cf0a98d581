// Package kafkapub publishes stock events to Apache Kafka with franz-go, and reads them back on
// the consumer side with a consumer group.
//
// A [Publisher] is a [stock.Publisher] and a [stock.BatchPublisher]: hand it to the Relay,
// which drains each item's outbox into it. Every event becomes one record of the topic whose
// key is the SKU, whose value is the JSON of the [stock.Event] (read it with [Decode]), and
// whose headers carry the event type and its place in the item's sequence. Publish returns
// once every in-sync replica has the record; the Relay publishes the events it claimed from
// one item in one ProduceSync call.
//
// # Order and durability
//
// The key is the SKU, and franz-go's default partitioner hashes the key, so all the events of
// one item go to one partition, in the order the Relay hands them over. New refuses a client
// that would weaken this: its producer must be idempotent (franz-go's default; not
// kgo.DisableIdempotentWrite), so that a retried produce request neither duplicates nor
// reorders records within a partition, and must wait for every in-sync replica (acks=all,
// kgo.RequiredAcks(kgo.AllISRAcks()), the default). Keep the default partitioner, or another
// that maps a key to one partition; and keep the topic's partition count fixed, since adding
// partitions moves keys (stock.Consume keeps each item's order in the store anyway, but
// consumers then see an item's events in two partitions).
//
// The Relay publishes at least once: after a crash or a lost acknowledgement it produces the
// same event again, as a new record (the idempotent producer only removes the duplicates of
// its own retries). Consumers must deduplicate on (SKU, ID, Type), as stock.Consume does.
//
// # Consumers
//
// A [Consumer] is one member of a consumer group, with its own franz-go client. It commits
// offsets itself, and only past messages acknowledged with [Consumer.Ack]: Kafka has one
// committed offset per partition, so a message left unacknowledged holds back the commit of
// the partition's later messages, and after a crash or a rebalance the next member starts at
// the first unacknowledged one (the later ones come again: stock.Consume takes them as
// repeats). There is no negative acknowledgement in Kafka: [Consumer.Retry] hands a message
// over again, from this member, after a delay, as long as the member keeps its partition.
//
//	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
//	// ...
//	pub, err := kafkapub.New(cl, "stock-events")
//	// ...
//	go reserver.Run(ctx, stock.RunOptions{Publisher: pub}) // the relay, with no Store: the queue path
//
//	// In the service that owns the database:
//	cons, err := kafkapub.NewConsumer("stock-events", "store", nil, kgo.SeedBrokers(brokers...))
//	// ...
//	defer cons.Close()
//	for {
//		msgs, err := cons.Receive(ctx, 64, time.Second)
//		// ...
//		for _, m := range msgs {
//			if m.Err != nil {
//				cons.Ack(ctx, m) // garbage stays garbage: never redeliver it
//				continue
//			}
//			switch err := stock.Consume(ctx, reserver, store, m.Event); {
//			case err == nil, errors.Is(err, stock.ErrInvalid):
//				cons.Ack(ctx, m) // applied (or dead-lettered in Redis by Consume)
//			default:
//				cons.Retry(m) // stock.ErrHeldBack or a temporary error
//			}
//		}
//	}
//
// # What the tests prove, and what they cannot
//
// The tests run on franz-go's in-process fake cluster (kfake): they show that records keep
// their key, value and headers, that an item's records come back in order from one partition,
// that a batch is one produce call with an answer per record, and that a consumer killed
// mid-stream (a child process, SIGKILL) loses nothing, its successor resuming at the first
// unacknowledged message. A fake cannot prove what only a real cluster does: replication and
// acks=all across brokers, leader failover and unclean leader election, the idempotent
// producer's sequence checks across broker restarts, retention and compaction, quotas, or
// throughput. Run the suite against a real cluster before relying on those.
package kafkapub

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/eventwire"
)

// Header names of the records a Publisher produces.
const (
	HeaderType = "stock-type" // the event type
	HeaderSeq  = "stock-seq"  // the event's place in its item's sequence, in decimal
)

// Publisher produces stock events to one topic; it implements stock.Publisher and
// stock.BatchPublisher. It is safe for concurrent use.
type Publisher struct {
	cl    *kgo.Client
	topic string
}

var _ stock.BatchPublisher = (*Publisher)(nil)

// New returns a Publisher that produces to topic through cl. cl's producer must be idempotent
// and use acks=all (franz-go's defaults); New refuses it otherwise, or without a topic, with an
// error wrapping stock.ErrInvalid. New does not contact the cluster, and the topic must exist
// (or the cluster create it on first use).
func New(cl *kgo.Client, topic string) (*Publisher, error) {
	if cl == nil {
		return nil, fmt.Errorf("%w: kafkapub: nil client", stock.ErrInvalid)
	}
	if topic == "" {
		return nil, fmt.Errorf("%w: kafkapub: empty topic", stock.ErrInvalid)
	}
	if acks, ok := cl.OptValue(kgo.RequiredAcks).(kgo.Acks); ok && acks != kgo.AllISRAcks() {
		return nil, fmt.Errorf("%w: kafkapub: the client's producer must use acks=all (kgo.RequiredAcks(kgo.AllISRAcks()))", stock.ErrInvalid)
	}
	if off, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool); off {
		return nil, fmt.Errorf("%w: kafkapub: the client's producer must be idempotent (no kgo.DisableIdempotentWrite)", stock.ErrInvalid)
	}
	return &Publisher{cl: cl, topic: topic}, nil
}

// Topic returns the topic the Publisher produces to.
func (p *Publisher) Topic() string { return p.topic }

// Record returns the record of ev: key the SKU, value its JSON, headers its type and sequence.
// An invalid event gives an error wrapping stock.ErrInvalid.
func (p *Publisher) Record(ev stock.Event) (*kgo.Record, error) {
	data, err := eventwire.Encode("kafkapub", ev)
	if err != nil {
		return nil, err
	}
	return &kgo.Record{
		Topic: p.topic,
		Key:   []byte(ev.SKU),
		Value: data,
		Headers: []kgo.RecordHeader{
			{Key: HeaderType, Value: []byte(ev.Type)},
			{Key: HeaderSeq, Value: []byte(strconv.FormatInt(ev.Seq, 10))},
		},
	}, nil
}

// Publish produces ev and waits until every in-sync replica has it. An invalid event gives an
// error wrapping stock.ErrInvalid; any other error means the record may or may not be
// written, and publishing it again is safe.
func (p *Publisher) Publish(ctx context.Context, ev stock.Event) error {
	return p.PublishBatch(ctx, []stock.Event{ev})[0]
}

// PublishBatch produces evs in one ProduceSync call (franz-go batches the records of one
// partition into one request) and returns one error (or nil) per event, in order. With the
// idempotent producer, a record that fails fails the records of its partition buffered after it
// too, so an item's records are never written out of order.
func (p *Publisher) PublishBatch(ctx context.Context, evs []stock.Event) []error {
	errs := make([]error, len(evs))
	recs := make([]*kgo.Record, 0, len(evs))
	idx := make([]int, 0, len(evs))
	stopped := map[string]bool{} // items with an event that cannot be a record: nothing after it
	for i, ev := range evs {
		if stopped[ev.SKU] {
			errs[i] = fmt.Errorf("kafkapub: publish %s/%s %s to %s: not produced after an earlier failure of the item", ev.SKU, ev.ID, ev.Type, p.topic)
			continue
		}
		r, err := p.Record(ev)
		if err != nil {
			errs[i] = err
			stopped[ev.SKU] = true
			continue
		}
		recs = append(recs, r)
		idx = append(idx, i)
	}
	if len(recs) == 0 {
		return errs
	}
	res := p.cl.ProduceSync(ctx, recs...)
	for j, r := range res {
		if r.Err != nil {
			ev := evs[idx[j]]
			errs[idx[j]] = fmt.Errorf("kafkapub: publish %s/%s %s to %s: %w", ev.SKU, ev.ID, ev.Type, p.topic, r.Err)
		}
	}
	return errs
}

// Decode parses a record value written by a Publisher into the event. The value must be one
// JSON object with a non-empty "type", "sku" and "id", a "qty" between 0 and stock.MaxQty, and
// an "at" time; "user" and "seq" are optional and unknown fields are ignored. Anything else
// gives an error wrapping stock.ErrInvalid: such a record will never decode, so a consumer
// should acknowledge it rather than retry it.
func Decode(value []byte) (stock.Event, error) { return eventwire.Decode("kafkapub", value) }

// ConsumerOptions configures a Consumer. A zero field takes its default; nil options take
// every default.
type ConsumerOptions struct {
	// RetryDelay is how long Retry waits before it hands a message over again. The default
	// is one second.
	RetryDelay time.Duration
}

// A Consumer is one member of a consumer group reading a topic of stock events. Receive, Ack
// and Retry are safe for concurrent use.
type Consumer struct {
	cl         *kgo.Client
	retryDelay time.Duration

	mu      sync.Mutex
	parts   map[tp]*partition
	retries []retry
	closed  bool
}

type tp struct {
	topic string
	part  int32
}

// partition holds the messages of one partition handed over and not yet committed, in offset
// order.
type partition struct {
	pending []*entry
}

type entry struct {
	rec    *kgo.Record
	acked  bool
	parent *partition
}

type retry struct {
	e  *entry
	at time.Time
}

// Message is one record a Consumer received.
type Message struct {
	Record *kgo.Record // the record as received
	Event  stock.Event // the event, when Err is nil
	// Err is non-nil when the record does not hold a valid event (it wraps stock.ErrInvalid):
	// acknowledge it, it will never decode.
	Err error
	e   *entry
}

// NewConsumer returns a member of the consumer group group on topic, with a client made from
// opts (the seed brokers, at least) and the options a Consumer needs: the group and topic,
// its own commits, and a new group starting at the earliest offset. Close it when done.
func NewConsumer(topic, group string, copts *ConsumerOptions, opts ...kgo.Opt) (*Consumer, error) {
	if topic == "" || group == "" {
		return nil, fmt.Errorf("%w: kafkapub: a consumer needs a topic and a group", stock.ErrInvalid)
	}
	c := &Consumer{retryDelay: time.Second, parts: map[tp]*partition{}}
	if copts != nil {
		if copts.RetryDelay < 0 {
			return nil, fmt.Errorf("%w: kafkapub: negative retry delay", stock.ErrInvalid)
		}
		if copts.RetryDelay > 0 {
			c.retryDelay = copts.RetryDelay
		}
	}
	opts = append(append([]kgo.Opt(nil), opts...),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.OnPartitionsRevoked(c.revoked),
		kgo.OnPartitionsLost(c.lost),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafkapub: consumer client: %w", err)
	}
	c.cl = cl
	return c, nil
}

// Client returns the Consumer's franz-go client.
func (c *Consumer) Client() *kgo.Client { return c.cl }

// revoked commits what is acknowledged of the partitions taken away, and forgets them: the next
// member starts at their first unacknowledged message.
func (c *Consumer) revoked(ctx context.Context, cl *kgo.Client, m map[string][]int32) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if !closed {
		_ = c.commit(ctx)
	}
	c.forget(m)
}

// lost forgets the partitions: committing is unlikely to work.
func (c *Consumer) lost(_ context.Context, _ *kgo.Client, m map[string][]int32) { c.forget(m) }

func (c *Consumer) forget(m map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for topic, parts := range m {
		for _, p := range parts {
			delete(c.parts, tp{topic, p})
		}
	}
	kept := c.retries[:0]
	for _, r := range c.retries {
		if c.parts[tp{r.e.rec.Topic, r.e.rec.Partition}] == r.e.parent {
			kept = append(kept, r)
		}
	}
	c.retries = kept
}

// Receive returns the next messages: first those whose Retry delay has passed, then new ones,
// at most max. It waits up to wait for the first and returns none if nothing came. An error
// is a fetch error of the client (the messages received with it are returned too).
func (c *Consumer) Receive(ctx context.Context, max int, wait time.Duration) ([]Message, error) {
	if max < 1 {
		max = 1
	}
	if due := c.due(max); len(due) > 0 {
		return due, nil
	}
	pctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	fs := c.cl.PollRecords(pctx, max)
	var errs []error
	fs.EachError(func(topic string, part int32, err error) {
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("kafkapub: fetch %s/%d: %w", topic, part, err))
		}
	})
	if errors.Is(fs.Err0(), kgo.ErrClientClosed) {
		return nil, fs.Err0()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Message
	fs.EachRecord(func(r *kgo.Record) {
		k := tp{r.Topic, r.Partition}
		p := c.parts[k]
		if p == nil {
			p = &partition{}
			c.parts[k] = p
		}
		e := &entry{rec: r, parent: p}
		p.pending = append(p.pending, e)
		out = append(out, message(e))
	})
	if len(out) == 0 {
		// Nothing new: a retry may have come due while polling.
		c.mu.Unlock()
		out = c.due(max)
		c.mu.Lock()
	}
	return out, errors.Join(errs...)
}

func message(e *entry) Message {
	m := Message{Record: e.rec, e: e}
	m.Event, m.Err = Decode(e.rec.Value)
	return m
}

// due takes up to max messages whose Retry delay has passed.
func (c *Consumer) due(max int) []Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	var out []Message
	kept := c.retries[:0]
	for _, r := range c.retries {
		if len(out) < max && !now.Before(r.at) {
			out = append(out, message(r.e))
			continue
		}
		kept = append(kept, r)
	}
	c.retries = kept
	return out
}

// Ack acknowledges m and commits the partition's offset past every message acknowledged
// without an unacknowledged one before it. A message of a partition this member no longer
// holds is ignored (its new owner gets it again).
func (c *Consumer) Ack(ctx context.Context, m Message) error {
	c.mu.Lock()
	if m.e == nil || c.parts[tp{m.e.rec.Topic, m.e.rec.Partition}] != m.e.parent {
		c.mu.Unlock()
		return nil
	}
	m.e.acked = true
	c.mu.Unlock()
	return c.commit(ctx)
}

// commit commits, for each partition, the offset past its acknowledged prefix.
func (c *Consumer) commit(ctx context.Context) error {
	c.mu.Lock()
	var recs []*kgo.Record
	for _, p := range c.parts {
		n := 0
		for n < len(p.pending) && p.pending[n].acked {
			n++
		}
		if n > 0 {
			recs = append(recs, p.pending[n-1].rec)
			p.pending = p.pending[n:]
		}
	}
	c.mu.Unlock()
	if len(recs) == 0 {
		return nil
	}
	if err := c.cl.CommitRecords(ctx, recs...); err != nil {
		return fmt.Errorf("kafkapub: commit: %w", err)
	}
	return nil
}

// Retry hands m over again from Receive after the retry delay, while this member holds its
// partition; the partition's commit waits for it.
func (c *Consumer) Retry(m Message) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m.e == nil || c.parts[tp{m.e.rec.Topic, m.e.rec.Partition}] != m.e.parent {
		return
	}
	c.retries = append(c.retries, retry{e: m.e, at: time.Now().Add(c.retryDelay)})
}

// Close commits what is acknowledged, leaves the group and closes the client.
func (c *Consumer) Close() {
	_ = c.commit(context.Background())
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.cl.Close()
}

// Abandon closes the client without committing anything more, as a process that dies would
// (except that it leaves the group at once, where a dead process is noticed after the
// session timeout). It is for tests.
func (c *Consumer) Abandon() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.cl.Close()
}
