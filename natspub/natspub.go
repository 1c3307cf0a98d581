// Package natspub publishes stock events to NATS JetStream, and decodes them on the consumer
// side.
//
// A [Publisher] is a [stock.Publisher] and a [stock.BatchPublisher]: hand it to the Relay,
// which drains each item's outbox into it, publishing the events it claimed from one item
// asynchronously and then waiting for their acknowledgements together. Every event becomes
// one JetStream message on the subject
//
//	<prefix>.<type>.<sku token>
//
// (for example "stock.events.deducted.sku-42") whose payload is the JSON of the [stock.Event]
// and whose Nats-Msg-Id header is [MsgID] of the event. Publish returns only once JetStream has
// stored the message and acknowledged it, so a nil error means the event is durable in the
// stream; any error makes the Relay retry it later.
//
// # Subjects and SKUs
//
// A SKU is free text to the stock package, but NATS gives '.', '*', '>' and whitespace a meaning
// in subjects. Each variable token of a subject is therefore escaped by [Token]: ASCII letters,
// digits, '-' and '_' stand for themselves and every other byte is written as '%' and two
// upper-case hex digits, as in URL percent-encoding ("a.b*c" becomes "a%2Eb%2Ac"). The escaping
// is one-to-one, so a consumer can subscribe to one item's events with
// prefix+".*."+Token(sku), and url.PathUnescape turns a token back into the SKU. The payload
// always carries the SKU as it is; consumers should read it from there, with [Decode].
//
// # At least once, and the duplicate window
//
// The Relay delivers at least once: after a crash or a lost ack it publishes the same event
// again. Each message carries the id "<sku>/<id>/<type>" (each part escaped like a token, so
// that a '/' inside a SKU or id cannot make two different events share an id) in its
// Nats-Msg-Id header, and JetStream drops a message whose id it has already stored within the
// stream's duplicate window: [EnsureStream] sets that window to [DefaultDuplicateWindow], two
// minutes. A repeat that arrives later than the window after the first copy is stored again,
// so consumers must still deduplicate on (SKU, ID, Type), as a [stock.Store] does by contract.
// The window bounds the duplicates a consumer sees, it does not replace that idempotence.
//
// # Wiring
//
// The relay side (Reserver outbox → Relay → natspub → JetStream), in the deployment where the
// relay only publishes and the service that owns the database consumes:
//
//	nc, err := nats.Connect(url)
//	// ...
//	js, err := jetstream.New(nc)
//	// ...
//	if _, err := natspub.EnsureStream(ctx, js, "STOCK", natspub.DefaultPrefix); err != nil {
//		// ...
//	}
//	pub, err := natspub.New(js, natspub.WithStream("STOCK"), natspub.WithTimeout(5*time.Second))
//	// ...
//	go reserver.Run(ctx, stock.RunOptions{Publisher: pub}) // the relay, with no Store: the queue path
//
// The consumer side (JetStream → durable pull consumer → stock.Consume → Store):
//
//	cons, err := js.CreateOrUpdateConsumer(ctx, "STOCK", jetstream.ConsumerConfig{
//		Durable:       "store",
//		AckPolicy:     jetstream.AckExplicitPolicy,
//		FilterSubject: natspub.DefaultPrefix + ".>",
//	})
//	// ...
//	cc, err := cons.Consume(func(m jetstream.Msg) {
//		ev, err := natspub.Decode(m.Data())
//		if err != nil {
//			m.Term() // garbage stays garbage: never redeliver it
//			return
//		}
//		switch err := stock.Consume(ctx, reserver, store, ev); {
//		case err == nil:
//			m.Ack() // applied, or refused and given back in Redis
//		case errors.Is(err, stock.ErrInvalid):
//			m.Term() // dead-lettered in Redis by Consume
//		default:
//			// stock.ErrHeldBack (a reconcile pass holds the item, or an earlier event
//			// cannot be applied yet) or a temporary error: deliver it again later.
//			m.NakWithDelay(time.Second)
//		}
//	})
//	// ...
//	defer cc.Stop()
//
// stock.Consume is idempotent in (SKU, ID, Type), as the Store's Apply is, so a redelivery or
// a duplicate that escaped the window is harmless.
//
// # Order
//
// JetStream redelivers a message that a consumer did not acknowledge (it crashed, or its
// AckWait ran out) after messages delivered since, so a consumer may be handed an item's
// events out of order: a deduct before the restore that freed its unit. The payload carries
// the event's place in its item's sequence ("seq", [stock.Event].Seq), and stock.Consume
// applies the item's earlier events first, from Redis, so the store gets them in order; when
// it cannot (a reconcile pass holds the item, or an earlier event's ledger entry is gone) it
// answers stock.ErrHeldBack: nak with a delay, as above, and leave MaxDeliver unlimited (the
// default). Several consumers, or several messages in flight per consumer, are fine: the order
// is kept in Redis, not in the consumer.
package natspub

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/eventwire"
)

// DefaultPrefix is the subject prefix a Publisher uses unless WithPrefix says otherwise.
const DefaultPrefix = "stock.events"

// DefaultDuplicateWindow is the duplicate window EnsureStream gives the stream: JetStream
// drops a message whose Nats-Msg-Id it stored less than this long ago. It is also the NATS
// server's own default.
const DefaultDuplicateWindow = 2 * time.Minute

// An Option configures a Publisher. Options are applied in order by New, which validates them.
type Option func(*config) error

type config struct {
	prefix  string
	stream  string
	timeout time.Duration
}

// WithPrefix sets the subject prefix: events go to <prefix>.<type>.<sku token>. The prefix is
// one or more dot-separated tokens, none empty, with no whitespace and no wildcards ('*', '>').
// The default is DefaultPrefix.
func WithPrefix(prefix string) Option {
	return func(c *config) error {
		if err := checkPrefix(prefix); err != nil {
			return err
		}
		c.prefix = prefix
		return nil
	}
}

// WithStream makes every publish expect that the stream named name stores it (JetStream's
// Nats-Expected-Stream header): if the subject is bound to another stream, Publish fails
// instead of storing the event there. By default any stream bound to the subject will do.
func WithStream(name string) Option {
	return func(c *config) error {
		if err := checkStreamName(name); err != nil {
			return err
		}
		c.stream = name
		return nil
	}
}

// WithTimeout bounds each Publish, acknowledgement included, to d, whatever the caller's
// context allows (an earlier deadline of the context still applies). The default is 0: no
// bound of its own, so a context without a deadline gets the JetStream context's default
// timeout (jetstream.WithDefaultTimeout, 5 s unless set).
func WithTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("%w: natspub: negative timeout %v", stock.ErrInvalid, d)
		}
		c.timeout = d
		return nil
	}
}

// Publisher publishes stock events to JetStream; it implements stock.Publisher and
// stock.BatchPublisher. It is safe for concurrent use.
type Publisher struct {
	js  jetstream.JetStream
	cfg config
}

var _ stock.BatchPublisher = (*Publisher)(nil)

// New returns a Publisher that publishes through js. The stream that stores the events must
// exist (see EnsureStream); New does not contact the server. Invalid options give an error
// wrapping stock.ErrInvalid.
func New(js jetstream.JetStream, opts ...Option) (*Publisher, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: natspub: nil JetStream", stock.ErrInvalid)
	}
	cfg := config{prefix: DefaultPrefix}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	return &Publisher{js: js, cfg: cfg}, nil
}

// Prefix returns the subject prefix the Publisher publishes under.
func (p *Publisher) Prefix() string { return p.cfg.prefix }

// Publish publishes ev and waits for JetStream's acknowledgement. It returns nil once the
// stream has stored the event, or recognised it as a duplicate of one it stored within its
// duplicate window. An event without a type, SKU or id, or with a quantity out of range or a
// negative sequence number, gives an error wrapping stock.ErrInvalid; any other error (no
// stream bound to the subject, a timeout, a closed connection, ctx's error) means the event may
// or may not be stored, and publishing it again is safe.
func (p *Publisher) Publish(ctx context.Context, ev stock.Event) error {
	subject, data, opts, err := p.message(ev)
	if err != nil {
		return err
	}
	if p.cfg.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.timeout)
		defer cancel()
	}
	if _, err := p.js.Publish(ctx, subject, data, opts...); err != nil {
		return fmt.Errorf("natspub: publish %s/%s %s to %q: %w", ev.SKU, ev.ID, ev.Type, subject, err)
	}
	return nil
}

// PublishBatch publishes evs asynchronously, in order, and then waits for all their
// acknowledgements: the batch costs about one round trip instead of one per event. It returns
// one error (or nil) per event, with the meaning of Publish's. After an event cannot be sent,
// the later events of the same item are not sent (their error says so), so that the stream
// never gets an item's events out of order from one batch. WithTimeout bounds the whole batch.
func (p *Publisher) PublishBatch(ctx context.Context, evs []stock.Event) []error {
	errs := make([]error, len(evs))
	if p.cfg.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.timeout)
		defer cancel()
	}
	futures := make([]jetstream.PubAckFuture, len(evs))
	failed := map[string]bool{}
	for i, ev := range evs {
		if failed[ev.SKU] {
			errs[i] = fmt.Errorf("natspub: publish %s/%s %s: not sent after an earlier failure of the item", ev.SKU, ev.ID, ev.Type)
			continue
		}
		subject, data, opts, err := p.message(ev)
		if err != nil {
			errs[i] = err
			failed[ev.SKU] = true
			continue
		}
		futures[i], err = p.js.PublishAsync(subject, data, opts...)
		if err != nil {
			errs[i] = fmt.Errorf("natspub: publish %s/%s %s to %q: %w", ev.SKU, ev.ID, ev.Type, subject, err)
			failed[ev.SKU] = true
		}
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		ev := evs[i]
		select {
		case <-f.Ok():
		case err := <-f.Err():
			errs[i] = fmt.Errorf("natspub: publish %s/%s %s: %w", ev.SKU, ev.ID, ev.Type, err)
		case <-ctx.Done():
			errs[i] = fmt.Errorf("natspub: publish %s/%s %s: %w", ev.SKU, ev.ID, ev.Type, ctx.Err())
		}
	}
	return errs
}

// message returns the subject, the payload and the publish options of ev, or an error wrapping
// stock.ErrInvalid for an event no adapter publishes (see eventwire.Check).
func (p *Publisher) message(ev stock.Event) (subject string, data []byte, opts []jetstream.PublishOpt, err error) {
	data, err = eventwire.Encode("natspub", ev)
	if err != nil {
		return "", nil, nil, err
	}
	opts = []jetstream.PublishOpt{jetstream.WithMsgID(MsgID(ev))}
	if p.cfg.stream != "" {
		opts = append(opts, jetstream.WithExpectStream(p.cfg.stream))
	}
	return Subject(p.cfg.prefix, ev.Type, ev.SKU), data, opts, nil
}

// Subject returns the subject an event of type typ for sku is published on:
// prefix + "." + Token(typ) + "." + Token(sku).
func Subject(prefix string, typ stock.EventType, sku string) string {
	return prefix + "." + Token(string(typ)) + "." + Token(sku)
}

// MsgID returns the JetStream message id of ev, Token(SKU)+"/"+Token(ID)+"/"+Token(Type):
// the same for every copy of one event, and different for any two different events.
func MsgID(ev stock.Event) string {
	return Token(ev.SKU) + "/" + Token(ev.ID) + "/" + Token(string(ev.Type))
}

// Token escapes s for use as one token of a NATS subject: ASCII letters, digits, '-' and '_'
// are kept and every other byte becomes '%' followed by two upper-case hex digits. The result
// never holds '.', '*', '>', '/', '%' other than as an escape, or whitespace, and distinct
// strings give distinct tokens. url.PathUnescape reverses it. Token("") is "".
func Token(s string) string { return eventwire.Escape(s) }

// StreamConfig returns the configuration EnsureStream creates: a stream named name over the
// subjects prefix+".>", with a duplicate window of DefaultDuplicateWindow and the server's
// defaults for everything else (file storage, limits retention, no limits). Callers that want
// other limits can change it and create the stream themselves.
func StreamConfig(name, prefix string) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        name,
		Description: "stock events published by natspub",
		Subjects:    []string{prefix + ".>"},
		Duplicates:  DefaultDuplicateWindow,
	}
}

// EnsureStream makes sure the stream named name exists and stores the events published under
// prefix, with a duplicate window of at least DefaultDuplicateWindow. A missing stream is
// created from StreamConfig(name, prefix). An existing one keeps the rest of its configuration
// (limits, storage, replicas): EnsureStream only adds prefix+".>" to its subjects if no
// subject of it is exactly that, and raises its duplicate window to DefaultDuplicateWindow if
// it is shorter (or to the stream's MaxAge, if that is shorter still: the server allows no
// longer window), updating the stream only when something changed. It returns the stream.
// Invalid arguments give an error wrapping stock.ErrInvalid.
func EnsureStream(ctx context.Context, js jetstream.JetStream, name, prefix string) (jetstream.Stream, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: natspub: nil JetStream", stock.ErrInvalid)
	}
	if err := checkStreamName(name); err != nil {
		return nil, err
	}
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		s, err := js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			s, err = js.CreateStream(ctx, StreamConfig(name, prefix))
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) && attempt == 0 {
				continue // created concurrently: update that one
			}
			if err != nil {
				return nil, fmt.Errorf("natspub: create stream %q: %w", name, err)
			}
			return s, nil
		}
		if err != nil {
			return nil, fmt.Errorf("natspub: look up stream %q: %w", name, err)
		}
		cfg := s.CachedInfo().Config
		changed := false
		subject := prefix + ".>"
		found := false
		for _, sub := range cfg.Subjects {
			if sub == subject {
				found = true
				break
			}
		}
		if !found {
			cfg.Subjects = append(cfg.Subjects, subject)
			changed = true
		}
		window := DefaultDuplicateWindow
		if cfg.MaxAge > 0 && cfg.MaxAge < window {
			window = cfg.MaxAge // the server refuses a window longer than the stream's MaxAge
		}
		if cfg.Duplicates < window {
			cfg.Duplicates = window
			changed = true
		}
		if !changed {
			return s, nil
		}
		s, err = js.UpdateStream(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("natspub: update stream %q: %w", name, err)
		}
		return s, nil
	}
}

// Decode parses a message payload written by a Publisher into the event. The payload must be
// one JSON object with a non-empty "type", "sku" and "id", a "qty" between 0 and
// stock.MaxQty, and an "at" time; "user" and "seq" (the event's place in its item's sequence,
// not negative; 0 when absent) are optional and unknown fields are ignored (so that newer
// publishers can add some). Anything else gives an error wrapping stock.ErrInvalid: such
// a message will never decode, so a consumer should terminate it rather than ask for
// redelivery. Decode accepts event types it does not know, as a Store must.
func Decode(msg []byte) (stock.Event, error) { return eventwire.Decode("natspub", msg) }

func checkPrefix(prefix string) error {
	if prefix == "" {
		return fmt.Errorf("%w: natspub: empty subject prefix", stock.ErrInvalid)
	}
	for _, tok := range strings.Split(prefix, ".") {
		if tok == "" {
			return fmt.Errorf("%w: natspub: subject prefix %q has an empty token", stock.ErrInvalid, prefix)
		}
		if strings.ContainsAny(tok, "*>") {
			return fmt.Errorf("%w: natspub: subject prefix %q has a wildcard", stock.ErrInvalid, prefix)
		}
		for i := 0; i < len(tok); i++ {
			if tok[i] <= ' ' || tok[i] == 0x7f {
				return fmt.Errorf("%w: natspub: subject prefix %q has whitespace or a control character",
					stock.ErrInvalid, prefix)
			}
		}
	}
	return nil
}

func checkStreamName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: natspub: empty stream name", stock.ErrInvalid)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c <= ' ' || c == 0x7f || strings.IndexByte(".*>/\\", c) >= 0 {
			return fmt.Errorf("%w: natspub: invalid stream name %q", stock.ErrInvalid, name)
		}
	}
	return nil
}
