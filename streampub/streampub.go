// Package streampub publishes stock events to Redis Streams, and reads them back on the
// consumer side with a consumer group. It needs nothing but the rueidis client the Reserver
// already uses, and suits a shop that runs Redis and no other broker.
//
// A [Publisher] is a [stock.Publisher] and a [stock.BatchPublisher]: hand it to the Relay,
// which drains each item's outbox into it. Every event becomes one stream entry with one field,
// "event", holding the JSON of the [stock.Event] (read it with [Decode]). Publish returns once
// Redis has appended the entry; the Relay publishes the events it claimed from one item in one
// call of a fixed script (one round trip), which appends them in order and stops at the first
// that fails.
//
// # Streams, shards and order
//
// The events go to a fixed number of streams, the shards ([WithShards], 16 by default): the
// events of the item sku go to the stream
//
//	<prefix>:{<n>}
//
// where n is the FNV-1a hash of sku modulo the number of shards ([ShardOf]; the prefix is
// "stock:events" unless [WithPrefix] says otherwise). Each shard's key has its own hash tag, so
// on a Redis Cluster the shards spread over the nodes, and every event of one item is in one
// stream, appended in the item's order (Event.Seq). Publisher and consumers must agree on the
// prefix and the number of shards: changing the number of shards moves items to other streams
// while their older events wait in the old ones (stock.Consume still applies each item's
// events in order, so this is safe, but drain the streams first to keep them tidy).
//
// # Trimming
//
// Streams grow until trimmed. Every append trims its stream, approximately (the "~" form, which
// Redis does cheaply, by whole nodes): by length, at most [DefaultMaxLen] entries per shard
// unless [WithMaxLen] says otherwise, or by age with [WithMaxAge] (MINID: entries older than
// the age go). Trimming does not wait for consumers: an entry trimmed before a consumer group
// read and acknowledged it is lost to the queue (the item's event then stays in flight in Redis,
// in its published set, until stock.Consume applies a later event of the item, which applies
// it first, or an operator looks). Size the limit for the longest consumer outage you want to
// survive.
//
// # Consumers
//
// The consumer side is a consumer group per application on every shard ([EnsureGroup] creates
// it, reading from the start of each stream) and a [Consumer] per process, each with its own
// name. [Consumer.Receive] hands over new entries (XREADGROUP) and, first, entries that another
// consumer (or this one) received and did not acknowledge for [ConsumerOptions.MinIdle]: a
// consumer that died, or a message held back, is claimed again with XAUTOCLAIM. There is no
// negative acknowledgement in Redis Streams: to have a message delivered again later, leave it
// unacknowledged and it comes back after MinIdle.
//
//	pub, err := streampub.New(client)
//	// ...
//	go reserver.Run(ctx, stock.RunOptions{Publisher: pub}) // the relay, with no Store: the queue path
//
//	// In the service that owns the database:
//	err = streampub.EnsureGroup(ctx, client, "store", pub.Streams())
//	// ...
//	cons, err := streampub.NewConsumer(client, "store", hostname, pub.Streams(), nil)
//	// ...
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
//				// stock.ErrHeldBack or a temporary error: leave it pending; it is
//				// claimed again after MinIdle.
//			}
//		}
//	}
//
// # At least once, and order
//
// The Relay publishes at least once: after a crash or a lost reply it appends the same event
// again, and Redis Streams has no deduplication, so a consumer may see an event twice; a
// message claimed from a dead consumer arrives after the entries read since. stock.Consume
// copes with both: it is idempotent in (SKU, ID, Type) and applies an item's earlier events
// first, from Redis, so the store gets each item's events once and in order. Several consumers
// per group, reading the same shards, are fine.
package streampub

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/eventwire"
)

// DefaultPrefix is the prefix of the shard streams' keys unless WithPrefix says otherwise.
const DefaultPrefix = "stock:events"

// DefaultShards is the number of shard streams unless WithShards says otherwise.
const DefaultShards = 16

// DefaultMaxLen is the approximate length each shard stream is trimmed to unless WithMaxLen or
// WithMaxAge says otherwise.
const DefaultMaxLen = 1_000_000

// Field is the name of the stream entry field that holds the event's JSON.
const Field = "event"

// An Option configures a Publisher. Options are applied in order by New, which validates them.
type Option func(*config) error

type config struct {
	prefix string
	shards int
	maxLen int64
	maxAge time.Duration
}

// WithPrefix sets the prefix of the shard streams' keys: <prefix>:{<n>}. The prefix must not be
// empty, nor hold braces, whitespace or control characters.
func WithPrefix(prefix string) Option {
	return func(c *config) error {
		if err := checkPrefix(prefix); err != nil {
			return err
		}
		c.prefix = prefix
		return nil
	}
}

// WithShards sets the number of shard streams, from 1 to 16384. The default is DefaultShards.
func WithShards(n int) Option {
	return func(c *config) error {
		if n < 1 || n > 16384 {
			return fmt.Errorf("%w: streampub: %d shards, want 1 to 16384", stock.ErrInvalid, n)
		}
		c.shards = n
		return nil
	}
}

// WithMaxLen trims each shard stream to about n entries on every append (XADD MAXLEN ~ n); 0
// trims nothing (the streams grow until trimmed by other means). It replaces WithMaxAge. The
// default is DefaultMaxLen.
func WithMaxLen(n int64) Option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("%w: streampub: negative max length %d", stock.ErrInvalid, n)
		}
		c.maxLen, c.maxAge = n, 0
		return nil
	}
}

// WithMaxAge trims from each shard stream, on every append, the entries older than d by the
// Redis clock (XADD MINID ~ <now - d>). d must be at least a millisecond. It replaces
// WithMaxLen.
func WithMaxAge(d time.Duration) Option {
	return func(c *config) error {
		if d < time.Millisecond {
			return fmt.Errorf("%w: streampub: max age %v under a millisecond", stock.ErrInvalid, d)
		}
		c.maxAge, c.maxLen = d, 0
		return nil
	}
}

// Publisher appends stock events to the shard streams; it implements stock.Publisher and
// stock.BatchPublisher. It is safe for concurrent use.
type Publisher struct {
	client rueidis.Client
	cfg    config
}

var _ stock.BatchPublisher = (*Publisher)(nil)

// New returns a Publisher that appends through client. It does not contact Redis. Invalid
// options give an error wrapping stock.ErrInvalid.
func New(client rueidis.Client, opts ...Option) (*Publisher, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: streampub: nil client", stock.ErrInvalid)
	}
	cfg := config{prefix: DefaultPrefix, shards: DefaultShards, maxLen: DefaultMaxLen}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	return &Publisher{client: client, cfg: cfg}, nil
}

// Streams returns the keys of the shard streams, shard 0 first.
func (p *Publisher) Streams() []string {
	out := make([]string, p.cfg.shards)
	for i := range out {
		out[i] = StreamKey(p.cfg.prefix, i)
	}
	return out
}

// Stream returns the key of the stream the events of sku go to.
func (p *Publisher) Stream(sku string) string {
	return StreamKey(p.cfg.prefix, ShardOf(sku, p.cfg.shards))
}

// StreamKey returns the key of shard n: prefix + ":{" + n + "}".
func StreamKey(prefix string, n int) string { return prefix + ":{" + strconv.Itoa(n) + "}" }

// ShardOf returns the shard of sku among shards: the 32-bit FNV-1a hash of sku modulo shards.
func ShardOf(sku string, shards int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(sku))
	return int(h.Sum32() % uint32(shards))
}

// appendScript appends its payloads (ARGV[3:]) to the stream KEYS[1], in order, trimming as
// ARGV[1] ("" none, "MAXLEN", "MINID") and ARGV[2] (the length, or the age in milliseconds)
// say, and stops at the first append that fails. It returns {appended, error text}.
var appendScript = rueidis.NewLuaScript(`
local mode, arg = ARGV[1], ARGV[2]
local minid
if mode == 'MINID' then
  local t = redis.call('TIME')
  local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(arg)
  if ms < 0 then ms = 0 end
  minid = string.format('%d', ms)
end
local n = 0
for i = 3, #ARGV do
  local r
  if mode == 'MAXLEN' then
    r = redis.pcall('XADD', KEYS[1], 'MAXLEN', '~', arg, '*', 'event', ARGV[i])
  elseif mode == 'MINID' then
    r = redis.pcall('XADD', KEYS[1], 'MINID', '~', minid, '*', 'event', ARGV[i])
  else
    r = redis.pcall('XADD', KEYS[1], '*', 'event', ARGV[i])
  end
  if type(r) == 'table' and r.err then
    return {n, r.err}
  end
  n = n + 1
end
return {n, ''}
`)

func (p *Publisher) trimArgs() []string {
	switch {
	case p.cfg.maxAge > 0:
		return []string{"MINID", strconv.FormatInt(p.cfg.maxAge.Milliseconds(), 10)}
	case p.cfg.maxLen > 0:
		return []string{"MAXLEN", strconv.FormatInt(p.cfg.maxLen, 10)}
	}
	return []string{"", "0"}
}

// Publish appends ev to its item's shard stream. It returns nil once Redis has appended it.
// An event without a type, SKU or id, or with a quantity out of range, gives an error wrapping
// stock.ErrInvalid; any other error means the event may or may not be appended, and
// publishing it again is safe.
func (p *Publisher) Publish(ctx context.Context, ev stock.Event) error {
	return p.PublishBatch(ctx, []stock.Event{ev})[0]
}

// PublishBatch appends evs, each to its item's shard stream, in order, in one round trip per
// Redis node: the events of one stream are appended by one script call that stops at the first
// failure, so an error for an event means that it and every later event of the same stream in
// evs were not appended (or, after a lost reply, may have been). It returns one error (or
// nil) per event, as Publish would.
func (p *Publisher) PublishBatch(ctx context.Context, evs []stock.Event) []error {
	errs := make([]error, len(evs))
	type group struct {
		key  string
		idx  []int
		args []string
	}
	var groups []*group
	byKey := map[string]*group{}
	stopped := map[string]bool{} // streams with an event that cannot be encoded: nothing after it
	for i, ev := range evs {
		k := p.Stream(ev.SKU)
		if stopped[k] {
			errs[i] = fmt.Errorf("streampub: publish %s/%s %s to %s: not appended after an earlier failure", ev.SKU, ev.ID, ev.Type, k)
			continue
		}
		data, err := eventwire.Encode("streampub", ev)
		if err != nil {
			errs[i] = err
			stopped[k] = true
			continue
		}
		g := byKey[k]
		if g == nil {
			g = &group{key: k, args: p.trimArgs()}
			byKey[k] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
		g.args = append(g.args, string(data))
	}
	if len(groups) == 0 {
		return errs
	}
	execs := make([]rueidis.LuaExec, len(groups))
	for j, g := range groups {
		execs[j] = rueidis.LuaExec{Keys: []string{g.key}, Args: g.args}
	}
	res := appendScript.ExecMulti(ctx, p.client, execs...)
	for j, g := range groups {
		n, why, err := appended(res[j])
		for k, i := range g.idx {
			ev := evs[i]
			switch {
			case err != nil:
				errs[i] = fmt.Errorf("streampub: publish %s/%s %s to %s: %w", ev.SKU, ev.ID, ev.Type, g.key, err)
			case k < n:
			case k == n:
				errs[i] = fmt.Errorf("streampub: publish %s/%s %s to %s: %s", ev.SKU, ev.ID, ev.Type, g.key, why)
			default:
				errs[i] = fmt.Errorf("streampub: publish %s/%s %s to %s: not appended after an earlier failure", ev.SKU, ev.ID, ev.Type, g.key)
			}
		}
	}
	return errs
}

func appended(r rueidis.RedisResult) (int, string, error) {
	vs, err := r.ToArray()
	if err != nil {
		return 0, "", err
	}
	if len(vs) != 2 {
		return 0, "", fmt.Errorf("unexpected reply of %d values", len(vs))
	}
	n, err := vs[0].AsInt64()
	if err != nil {
		return 0, "", err
	}
	why, _ := vs[1].ToString()
	return int(n), why, nil
}

// Decode parses the "event" field of a stream entry written by a Publisher into the event. The
// value must be one JSON object with a non-empty "type", "sku" and "id", a "qty" between 0 and
// stock.MaxQty, and an "at" time; "user" and "seq" are optional and unknown fields are
// ignored. Anything else gives an error wrapping stock.ErrInvalid: such an entry will never
// decode, so a consumer should acknowledge it rather than leave it to be claimed again.
func Decode(value []byte) (stock.Event, error) { return eventwire.Decode("streampub", value) }

// EnsureGroup creates the consumer group named group on each stream, reading from the start of
// the stream (creating the stream if it does not exist yet); a group that exists is left as it
// is. Since a new group reads from the start, a group created after the Relay began to publish
// still gets every entry not yet trimmed.
func EnsureGroup(ctx context.Context, client rueidis.Client, group string, streams []string) error {
	if client == nil || group == "" || len(streams) == 0 {
		return fmt.Errorf("%w: streampub: EnsureGroup needs a client, a group and streams", stock.ErrInvalid)
	}
	cmds := make(rueidis.Commands, len(streams))
	for i, s := range streams {
		cmds[i] = client.B().XgroupCreate().Key(s).Group(group).Id("0").Mkstream().Build()
	}
	for i, r := range client.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
			return fmt.Errorf("streampub: create group %q on %s: %w", group, streams[i], err)
		}
	}
	return nil
}

// ConsumerOptions configures a Consumer. A zero field takes its default; nil options take
// every default.
type ConsumerOptions struct {
	// MinIdle is how long a message stays with the consumer it was delivered to without an
	// acknowledgement before Receive claims it again (XAUTOCLAIM), for this consumer or
	// another: the consumer died, or left the message unacknowledged to have it delivered
	// again (stock.ErrHeldBack). It must exceed the time a consumer takes to handle a
	// message. The default is 30s.
	MinIdle time.Duration
	// Poll is how long Receive waits between two looks at the streams while nothing comes.
	// The default is 100ms.
	Poll time.Duration
}

// A Consumer is one member of a consumer group on the shard streams. It is safe for concurrent
// use, but one goroutine calling Receive is the usual way.
type Consumer struct {
	client  rueidis.Client
	group   string
	name    string
	streams []string
	minIdle time.Duration
	poll    time.Duration

	mu        sync.Mutex
	cursors   []string // XAUTOCLAIM cursor per stream
	lastClaim time.Time
}

// Message is one stream entry a Consumer received.
type Message struct {
	Stream string      // the stream's key
	ID     string      // the entry's id in the stream
	Event  stock.Event // the event, when Err is nil
	// Err is non-nil when the entry does not hold a valid event (it wraps stock.ErrInvalid):
	// acknowledge it, it will never decode.
	Err error
}

// NewConsumer returns a member named name of the consumer group group on streams (see
// EnsureGroup). Every process needs its own name; a name used again after a restart takes over
// the messages its predecessor held. Invalid arguments give an error wrapping
// stock.ErrInvalid.
func NewConsumer(client rueidis.Client, group, name string, streams []string, opts *ConsumerOptions) (*Consumer, error) {
	if client == nil || group == "" || name == "" || len(streams) == 0 {
		return nil, fmt.Errorf("%w: streampub: a consumer needs a client, a group, a name and streams", stock.ErrInvalid)
	}
	c := &Consumer{client: client, group: group, name: name, streams: append([]string(nil), streams...),
		minIdle: 30 * time.Second, poll: 100 * time.Millisecond}
	if opts != nil {
		if opts.MinIdle < 0 || opts.Poll < 0 {
			return nil, fmt.Errorf("%w: streampub: negative consumer option", stock.ErrInvalid)
		}
		if opts.MinIdle > 0 {
			c.minIdle = opts.MinIdle
		}
		if opts.Poll > 0 {
			c.poll = opts.Poll
		}
	}
	c.cursors = make([]string, len(c.streams))
	for i := range c.cursors {
		c.cursors[i] = "0-0"
	}
	return c, nil
}

// Receive returns the next messages for this consumer: first those idle for MinIdle in any
// consumer's hands (claimed for this one), then new ones, at most count from each stream. It
// waits up to wait for the first, looking every Poll, and returns none if nothing came (or
// ctx ended). An error means Redis could not be read; what was received before it is
// returned with it.
func (c *Consumer) Receive(ctx context.Context, count int, wait time.Duration) ([]Message, error) {
	if count < 1 {
		count = 1
	}
	deadline := time.Now().Add(wait)
	for {
		msgs, err := c.claim(ctx, count)
		if err != nil || len(msgs) > 0 {
			return msgs, err
		}
		msgs, err = c.read(ctx, count)
		if err != nil || len(msgs) > 0 {
			return msgs, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, nil
		}
		t := time.NewTimer(min(left, c.poll))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, nil
		case <-t.C:
		}
	}
}

// claim takes over the entries idle for MinIdle, looking at most every MinIdle/4.
func (c *Consumer) claim(ctx context.Context, count int) ([]Message, error) {
	c.mu.Lock()
	if time.Since(c.lastClaim) < c.minIdle/4 {
		c.mu.Unlock()
		return nil, nil
	}
	c.lastClaim = time.Now()
	cursors := append([]string(nil), c.cursors...)
	c.mu.Unlock()
	cmds := make(rueidis.Commands, len(c.streams))
	for i, s := range c.streams {
		cmds[i] = c.client.B().Xautoclaim().Key(s).Group(c.group).Consumer(c.name).
			MinIdleTime(strconv.FormatInt(c.minIdle.Milliseconds(), 10)).Start(cursors[i]).Count(int64(count)).Build()
	}
	var out []Message
	var errs []error
	for i, r := range c.client.DoMulti(ctx, cmds...) {
		vs, err := r.ToArray()
		if err != nil {
			errs = append(errs, fmt.Errorf("streampub: claim from %s: %w", c.streams[i], err))
			continue
		}
		if len(vs) < 2 {
			errs = append(errs, fmt.Errorf("streampub: claim from %s: unexpected reply", c.streams[i]))
			continue
		}
		if next, err := vs[0].ToString(); err == nil {
			c.mu.Lock()
			c.cursors[i] = next
			c.mu.Unlock()
		}
		entries, err := vs[1].ToArray()
		if err != nil {
			continue
		}
		var gone []string
		for _, e := range entries {
			x, err := e.AsXRangeEntry()
			if err != nil || x.FieldValues == nil {
				// An entry trimmed or deleted while pending (Redis 6.2 answers it without
				// fields): nothing to deliver; settle it.
				if x.ID != "" {
					gone = append(gone, x.ID)
				}
				continue
			}
			out = append(out, message(c.streams[i], x))
		}
		if len(gone) > 0 {
			_ = c.client.Do(ctx, c.client.B().Xack().Key(c.streams[i]).Group(c.group).Id(gone...).Build()).Error()
		}
	}
	return out, errors.Join(errs...)
}

// read reads new entries of every stream.
func (c *Consumer) read(ctx context.Context, count int) ([]Message, error) {
	cmds := make(rueidis.Commands, len(c.streams))
	for i, s := range c.streams {
		cmds[i] = c.client.B().Xreadgroup().Group(c.group, c.name).Count(int64(count)).Streams().Key(s).Id(">").Build()
	}
	var out []Message
	var errs []error
	for i, r := range c.client.DoMulti(ctx, cmds...) {
		m, err := r.AsXRead()
		if rueidis.IsRedisNil(err) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("streampub: read %s: %w", c.streams[i], err))
			continue
		}
		for s, entries := range m {
			for _, x := range entries {
				out = append(out, message(s, x))
			}
		}
	}
	return out, errors.Join(errs...)
}

func message(stream string, x rueidis.XRangeEntry) Message {
	m := Message{Stream: stream, ID: x.ID}
	v, ok := x.FieldValues[Field]
	if !ok {
		m.Err = fmt.Errorf("%w: streampub: entry %s of %s has no %q field", stock.ErrInvalid, x.ID, stream, Field)
		return m
	}
	m.Event, m.Err = Decode([]byte(v))
	return m
}

// Ack acknowledges msgs (XACK): the group will not deliver them again. Acknowledge a message
// once stock.Consume applied it (or answered stock.ErrInvalid), or when it does not decode.
func (c *Consumer) Ack(ctx context.Context, msgs ...Message) error {
	ids := map[string][]string{}
	var order []string
	for _, m := range msgs {
		if _, ok := ids[m.Stream]; !ok {
			order = append(order, m.Stream)
		}
		ids[m.Stream] = append(ids[m.Stream], m.ID)
	}
	if len(order) == 0 {
		return nil
	}
	cmds := make(rueidis.Commands, len(order))
	for i, s := range order {
		cmds[i] = c.client.B().Xack().Key(s).Group(c.group).Id(ids[s]...).Build()
	}
	var errs []error
	for i, r := range c.client.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			errs = append(errs, fmt.Errorf("streampub: ack on %s: %w", order[i], err))
		}
	}
	return errors.Join(errs...)
}

func checkPrefix(prefix string) error {
	if prefix == "" {
		return fmt.Errorf("%w: streampub: empty prefix", stock.ErrInvalid)
	}
	for i := 0; i < len(prefix); i++ {
		if c := prefix[i]; c <= ' ' || c == 0x7f || c == '{' || c == '}' {
			return fmt.Errorf("%w: streampub: prefix %q holds a brace, whitespace or a control character", stock.ErrInvalid, prefix)
		}
	}
	return nil
}
