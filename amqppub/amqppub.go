// Package amqppub publishes stock events to RabbitMQ (AMQP 0-9-1) with publisher confirms, and
// reads them back on the consumer side.
//
// A [Publisher] is a [stock.Publisher] and a [stock.BatchPublisher]: hand it to the Relay,
// which drains each item's outbox into it. Every event becomes one persistent message whose
// body is the JSON of the [stock.Event] (read it with [Decode]), whose message id is
// "<sku>/<id>/<type>" (each part percent-escaped) and whose headers carry the event type and
// its place in the item's sequence. Publish returns once the broker has confirmed the message
// (publisher confirms: the queue has it, on disk for a durable queue); the Relay publishes the
// events it claimed from one item together, waiting for all their confirms at once.
//
// # Layout, and order per item
//
// RabbitMQ keeps a queue's order only for one consumer at a time, so the events are spread
// over N queues (the shards, [WithQueues], 4 by default) and each queue has a single active
// consumer:
//
//   - a durable direct exchange, "stock.events" unless [WithExchange] says otherwise;
//   - N durable classic queues "<exchange>.0" ... "<exchange>.<N-1>", each declared with
//     x-single-active-consumer and bound to the exchange with its number as routing key;
//   - the publisher sends an event of sku with routing key [ShardOf](sku, N), the FNV-1a hash
//     of the SKU modulo N: all of an item's events go to one queue, in order.
//
// Every consumer process consumes from all N queues ([NewConsumer]); RabbitMQ makes one
// consumer active per queue and hands the queue over to another when it goes away, so the
// shards spread over the processes and fail over between them. [Declare] declares the layout;
// New and NewConsumer call it (declaring is idempotent), so that no message is published to
// an exchange with no queue bound (RabbitMQ would confirm and drop it). Publisher and
// consumers must agree on the exchange and N. Classic queues are used because quorum queues
// drop (or dead-letter) a message after a delivery limit (20 by default from RabbitMQ 4.0),
// and a message held back by stock.Consume may be delivered many times.
//
// # Consumers
//
//	conn, err := amqp.Dial(url)
//	// ...
//	pub, err := amqppub.New(conn)
//	// ...
//	go reserver.Run(ctx, stock.RunOptions{Publisher: pub}) // the relay, with no Store: the queue path
//
//	// In the service that owns the database:
//	cons, err := amqppub.NewConsumer(conn2, nil)
//	// ...
//	defer cons.Close()
//	for {
//		msgs, err := cons.Receive(ctx, 64, time.Second)
//		// ...
//		for _, m := range msgs {
//			if m.Err != nil {
//				cons.Ack(m) // garbage stays garbage: never redeliver it
//				continue
//			}
//			switch err := stock.Consume(ctx, reserver, store, m.Event); {
//			case err == nil, errors.Is(err, stock.ErrInvalid):
//				cons.Ack(m) // applied (or dead-lettered in Redis by Consume)
//			default:
//				cons.Retry(m) // stock.ErrHeldBack or a temporary error: requeued after a delay
//			}
//		}
//	}
//
// A consumer that dies (its connection closes) leaves its unacknowledged messages to the
// broker, which requeues them for the queue's next active consumer; they may come after
// messages delivered since. The Relay publishes at least once, and RabbitMQ does not
// deduplicate. stock.Consume copes with both: it is idempotent in (SKU, ID, Type) and applies
// an item's earlier events first, from Redis, so the store gets each item's events once and in
// order.
package amqppub

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/eventwire"
)

// DefaultExchange is the exchange unless WithExchange says otherwise.
const DefaultExchange = "stock.events"

// DefaultQueues is the number of queues unless WithQueues says otherwise.
const DefaultQueues = 4

// Header names of the messages a Publisher sends.
const (
	HeaderType = "stock-type" // the event type
	HeaderSeq  = "stock-seq"  // the event's place in its item's sequence
)

// An Option configures a Publisher or a Consumer.
type Option func(*config) error

type config struct {
	exchange string
	queues   int
}

// WithExchange sets the exchange, and the queues' names "<exchange>.<n>". The default is
// DefaultExchange.
func WithExchange(name string) Option {
	return func(c *config) error {
		if name == "" || strings.ContainsAny(name, " \t\r\n") {
			return fmt.Errorf("%w: amqppub: invalid exchange name %q", stock.ErrInvalid, name)
		}
		c.exchange = name
		return nil
	}
}

// WithQueues sets the number of queues (shards), from 1 to 1024. The default is DefaultQueues.
func WithQueues(n int) Option {
	return func(c *config) error {
		if n < 1 || n > 1024 {
			return fmt.Errorf("%w: amqppub: %d queues, want 1 to 1024", stock.ErrInvalid, n)
		}
		c.queues = n
		return nil
	}
}

func newConfig(opts []Option) (config, error) {
	cfg := config{exchange: DefaultExchange, queues: DefaultQueues}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

// Queue returns the name of queue n of exchange: exchange + "." + n.
func Queue(exchange string, n int) string { return exchange + "." + strconv.Itoa(n) }

// ShardOf returns the queue of sku among queues: the 32-bit FNV-1a hash of sku modulo queues.
func ShardOf(sku string, queues int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(sku))
	return int(h.Sum32() % uint32(queues))
}

// Declare declares the layout on ch: the durable direct exchange and its queues, each durable,
// with a single active consumer, bound with its number as routing key. It is idempotent; it
// fails if an exchange or queue of the same name exists with other settings.
func Declare(ch *amqp.Channel, opts ...Option) error {
	cfg, err := newConfig(opts)
	if err != nil {
		return err
	}
	return declare(ch, cfg)
}

func declare(ch *amqp.Channel, cfg config) error {
	if err := ch.ExchangeDeclare(cfg.exchange, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		return fmt.Errorf("amqppub: declare exchange %q: %w", cfg.exchange, err)
	}
	for n := range cfg.queues {
		q := Queue(cfg.exchange, n)
		if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{
			"x-single-active-consumer": true,
			"x-queue-type":             "classic",
		}); err != nil {
			return fmt.Errorf("amqppub: declare queue %q: %w", q, err)
		}
		if err := ch.QueueBind(q, strconv.Itoa(n), cfg.exchange, false, nil); err != nil {
			return fmt.Errorf("amqppub: bind queue %q: %w", q, err)
		}
	}
	return nil
}

// Publisher publishes stock events with publisher confirms; it implements stock.Publisher and
// stock.BatchPublisher. It is safe for concurrent use. It opens a channel of its own on the
// connection, and opens another when that one closes.
type Publisher struct {
	conn *amqp.Connection
	cfg  config

	mu sync.Mutex
	ch *amqp.Channel
}

var _ stock.BatchPublisher = (*Publisher)(nil)

// New returns a Publisher on conn and declares the layout (see Declare). Invalid options give
// an error wrapping stock.ErrInvalid.
func New(conn *amqp.Connection, opts ...Option) (*Publisher, error) {
	if conn == nil {
		return nil, fmt.Errorf("%w: amqppub: nil connection", stock.ErrInvalid)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	p := &Publisher{conn: conn, cfg: cfg}
	ch, err := p.channel()
	if err != nil {
		return nil, err
	}
	if err := declare(ch, cfg); err != nil {
		return nil, err
	}
	return p, nil
}

// channel returns the publishing channel, in confirm mode, opening one if needed.
func (p *Publisher) channel() (*amqp.Channel, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ch != nil && !p.ch.IsClosed() {
		return p.ch, nil
	}
	ch, err := p.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("amqppub: open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("amqppub: confirm mode: %w", err)
	}
	p.ch = ch
	return ch, nil
}

// MsgID returns the message id of ev: the SKU, id and type, each percent-escaped (every byte
// but ASCII letters, digits, '-' and '_'), joined by '/'.
func MsgID(ev stock.Event) string {
	return eventwire.Escape(ev.SKU) + "/" + eventwire.Escape(ev.ID) + "/" + eventwire.Escape(string(ev.Type))
}

// Publish publishes ev and waits for the broker's confirm. An invalid event gives an error
// wrapping stock.ErrInvalid; any other error (a negative confirm, a closed channel, ctx's
// error) means the message may or may not be queued, and publishing it again is safe.
func (p *Publisher) Publish(ctx context.Context, ev stock.Event) error {
	return p.PublishBatch(ctx, []stock.Event{ev})[0]
}

// PublishBatch publishes evs, in order, and waits for all their confirms at once: one round
// trip for the batch. It returns one error (or nil) per event. After an event fails to be
// sent, the later events of the same item are not sent (their error says so), so that a queue
// never gets an item's events out of order.
func (p *Publisher) PublishBatch(ctx context.Context, evs []stock.Event) []error {
	errs := make([]error, len(evs))
	ch, err := p.channel()
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	confirms := make([]*amqp.DeferredConfirmation, len(evs))
	failed := map[string]bool{} // items with an event not sent
	for i, ev := range evs {
		if failed[ev.SKU] {
			errs[i] = fmt.Errorf("amqppub: publish %s/%s %s: not sent after an earlier failure of the item", ev.SKU, ev.ID, ev.Type)
			continue
		}
		body, err := eventwire.Encode("amqppub", ev)
		if err != nil {
			errs[i] = err
			failed[ev.SKU] = true
			continue
		}
		msg := amqp.Publishing{
			ContentType:  "application/json",
			DeliveryMode: amqp.Persistent,
			MessageId:    MsgID(ev),
			Type:         string(ev.Type),
			Timestamp:    ev.At,
			Headers:      amqp.Table{HeaderType: string(ev.Type), HeaderSeq: ev.Seq},
			Body:         body,
		}
		key := strconv.Itoa(ShardOf(ev.SKU, p.cfg.queues))
		confirms[i], err = ch.PublishWithDeferredConfirmWithContext(ctx, p.cfg.exchange, key, false, false, msg)
		if err != nil {
			errs[i] = fmt.Errorf("amqppub: publish %s/%s %s: %w", ev.SKU, ev.ID, ev.Type, err)
			failed[ev.SKU] = true
		}
	}
	for i, c := range confirms {
		if c == nil {
			continue
		}
		ev := evs[i]
		acked, err := c.WaitContext(ctx)
		switch {
		case err != nil:
			errs[i] = fmt.Errorf("amqppub: publish %s/%s %s: confirm: %w", ev.SKU, ev.ID, ev.Type, err)
		case !acked:
			errs[i] = fmt.Errorf("amqppub: publish %s/%s %s: the broker did not confirm it", ev.SKU, ev.ID, ev.Type)
		}
	}
	return errs
}

// Decode parses a message body written by a Publisher into the event. The body must be one
// JSON object with a non-empty "type", "sku" and "id", a "qty" between 0 and stock.MaxQty, and
// an "at" time; "user" and "seq" are optional and unknown fields are ignored. Anything else
// gives an error wrapping stock.ErrInvalid: such a message will never decode, so a consumer
// should acknowledge it (or reject it without requeueing) rather than retry it.
func Decode(body []byte) (stock.Event, error) { return eventwire.Decode("amqppub", body) }

// ConsumerOptions configures a Consumer. A zero field takes its default; nil options take
// every default.
type ConsumerOptions struct {
	// Prefetch is how many unacknowledged messages the broker hands this consumer at most,
	// per queue it is active on. The default is 64.
	Prefetch int
	// RetryDelay is how long Retry waits before it requeues a message. The default is one
	// second.
	RetryDelay time.Duration
	// Options are the layout's options (exchange, number of queues), as given to New.
	Options []Option
}

// A Consumer consumes from every queue of the layout on a channel of its own; the broker makes
// it the active consumer of some of them. Receive, Ack and Retry are safe for concurrent use.
type Consumer struct {
	ch         *amqp.Channel
	retryDelay time.Duration
	in         chan amqp.Delivery
	done       chan struct{}
	closeOnce  sync.Once
	wg         sync.WaitGroup
}

// Message is one message a Consumer received.
type Message struct {
	Delivery amqp.Delivery // the message as delivered
	Event    stock.Event   // the event, when Err is nil
	// Err is non-nil when the body is not a valid event (it wraps stock.ErrInvalid):
	// acknowledge it, it will never decode.
	Err error
}

// NewConsumer opens a channel on conn, declares the layout and consumes from its queues.
// Close it when done; closing conn closes it too, and the broker requeues what it did not
// acknowledge.
func NewConsumer(conn *amqp.Connection, opts *ConsumerOptions) (*Consumer, error) {
	if conn == nil {
		return nil, fmt.Errorf("%w: amqppub: nil connection", stock.ErrInvalid)
	}
	var o ConsumerOptions
	if opts != nil {
		o = *opts
	}
	if o.Prefetch < 0 || o.RetryDelay < 0 {
		return nil, fmt.Errorf("%w: amqppub: negative consumer option", stock.ErrInvalid)
	}
	if o.Prefetch == 0 {
		o.Prefetch = 64
	}
	if o.RetryDelay == 0 {
		o.RetryDelay = time.Second
	}
	cfg, err := newConfig(o.Options)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("amqppub: open channel: %w", err)
	}
	if err := declare(ch, cfg); err != nil {
		_ = ch.Close()
		return nil, err
	}
	if err := ch.Qos(o.Prefetch, 0, false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("amqppub: qos: %w", err)
	}
	c := &Consumer{ch: ch, retryDelay: o.RetryDelay, in: make(chan amqp.Delivery), done: make(chan struct{})}
	for n := range cfg.queues {
		q := Queue(cfg.exchange, n)
		ds, err := ch.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			_ = ch.Close()
			return nil, fmt.Errorf("amqppub: consume %q: %w", q, err)
		}
		c.wg.Go(func() {
			for d := range ds {
				select {
				case c.in <- d:
				case <-c.done:
					return
				}
			}
		})
	}
	return c, nil
}

// Receive returns the next messages, at most max, waiting up to wait for the first; none if
// nothing came (or ctx ended). After the channel closed it returns an error wrapping
// amqp.ErrClosed.
func (c *Consumer) Receive(ctx context.Context, max int, wait time.Duration) ([]Message, error) {
	if max < 1 {
		max = 1
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	var out []Message
	select {
	case d := <-c.in:
		out = append(out, message(d))
	case <-t.C:
		return nil, c.closedErr()
	case <-ctx.Done():
		return nil, nil
	case <-c.done:
		return nil, amqp.ErrClosed
	}
	for len(out) < max {
		select {
		case d := <-c.in:
			out = append(out, message(d))
		default:
			return out, nil
		}
	}
	return out, nil
}

func (c *Consumer) closedErr() error {
	if c.ch.IsClosed() {
		return fmt.Errorf("amqppub: consumer channel: %w", amqp.ErrClosed)
	}
	return nil
}

func message(d amqp.Delivery) Message {
	m := Message{Delivery: d}
	m.Event, m.Err = Decode(d.Body)
	return m
}

// Ack acknowledges m: the broker forgets it.
func (c *Consumer) Ack(m Message) error {
	if err := m.Delivery.Ack(false); err != nil {
		return fmt.Errorf("amqppub: ack: %w", err)
	}
	return nil
}

// Retry requeues m after the retry delay (a negative acknowledgement with requeue): the queue's
// active consumer gets it again.
func (c *Consumer) Retry(m Message) {
	time.AfterFunc(c.retryDelay, func() { _ = m.Delivery.Nack(false, true) })
}

// Close closes the consumer's channel: the broker requeues what it did not acknowledge.
func (c *Consumer) Close() error {
	var err error
	c.closeOnce.Do(func() {
		close(c.done)
		err = c.ch.Close()
		c.wg.Wait()
	})
	if err != nil && !errors.Is(err, amqp.ErrClosed) {
		return fmt.Errorf("amqppub: close: %w", err)
	}
	return nil
}
