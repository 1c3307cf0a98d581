package streampub_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/queuetest"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/stockops"
	"github.com/stockres/stock/stocktest"
	"github.com/stockres/stock/streampub"
)

func TestMain(m *testing.M) { os.Exit(redistest.Run(m)) }

// backends runs f on a miniredis (on the wall clock: XAUTOCLAIM counts idle time with it) and,
// when STOCK_REDIS_SERVER is set, on a standalone redis-server and a three-master cluster.
func backends(t *testing.T, f func(t *testing.T, newClient func(t testing.TB) rueidis.Client)) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) { // one at a time: the conformance suite times redeliveries
			if !b.Real() {
				f(t, func(t testing.TB) rueidis.Client {
					m := miniredis.RunT(t)
					c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{m.Addr()}, DisableCache: true})
					require.NoError(t, err)
					t.Cleanup(c.Close)
					return c
				})
				return
			}
			f(t, func(t testing.TB) rueidis.Client { return b.Client(t) })
		})
	}
}

// TestPublisherConformance runs the publisher conformance suite: 4 shards, one consumer group,
// members that claim what a member held for 500 ms.
func TestPublisherConformance(t *testing.T) {
	backends(t, func(t *testing.T, newClient func(t testing.TB) rueidis.Client) {
		stocktest.TestPublisher(t, func(t *testing.T) stocktest.PublisherPair {
			c := newClient(t)
			pub := newGroupPublisher(t, c, "store", streampub.WithShards(4))
			var n atomic.Int64
			return stocktest.PublisherPair{
				Publisher: pub,
				NewConsumer: func(t testing.TB) stocktest.Consumer {
					cons, err := streampub.NewConsumer(c, "store", "c"+strconv.FormatInt(n.Add(1), 10), pub.Streams(),
						&streampub.ConsumerOptions{MinIdle: 500 * time.Millisecond, Poll: 20 * time.Millisecond})
					require.NoError(t, err)
					return &member{c: cons}
				},
				Redelivery: time.Second,
			}
		})
	})
}

// newPublisher is streampub.New on c with opts, failing the test on an error.
func newPublisher(t testing.TB, c rueidis.Client, opts ...streampub.Option) *streampub.Publisher {
	t.Helper()
	pub, err := streampub.New(c, opts...)
	require.NoError(t, err)
	return pub
}

// newGroupPublisher is newPublisher, with the consumer group created on its streams.
func newGroupPublisher(t testing.TB, c rueidis.Client, group string, opts ...streampub.Option) *streampub.Publisher {
	t.Helper()
	pub := newPublisher(t, c, opts...)
	require.NoError(t, streampub.EnsureGroup(context.Background(), c, group, pub.Streams()))
	return pub
}

// pending is how many entries of stream the group's consumers hold unacknowledged (XPENDING).
func pending(t *testing.T, c rueidis.Client, stream, group string) int64 {
	t.Helper()
	pend, err := c.Do(context.Background(), c.B().Xpending().Key(stream).Group(group).Build()).ToArray()
	require.NoError(t, err)
	n, _ := pend[0].AsInt64()
	return n
}

type member struct {
	c    *streampub.Consumer
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

// Crash stops the member: what it holds stays pending until another member claims it.
func (m *member) Crash() { m.dead.Store(true) }

type delivery struct {
	c *streampub.Consumer
	m streampub.Message
}

func (d delivery) Event() (stock.Event, error)   { return d.m.Event, d.m.Err }
func (d delivery) Ack(ctx context.Context) error { return d.c.Ack(ctx, d.m) }
func (d delivery) Retry(context.Context) error   { return nil } // claimed again after MinIdle

func ev(sku, id string, seq int64) stock.Event {
	return stock.Event{Type: stock.EventDeducted, SKU: sku, ID: id, User: "u", Qty: 1, At: time.Now().UTC().Truncate(time.Millisecond), Seq: seq}
}

func TestShards(t *testing.T) {
	pub, err := streampub.New(rueidis.Client(nil) /* rejected */)
	assert.ErrorIs(t, err, stock.ErrInvalid)
	assert.Nil(t, pub)
	assert.Equal(t, "stock:events:{3}", streampub.StreamKey(streampub.DefaultPrefix, 3))
	for _, sku := range []string{"a", "sku-42", "x{y}", ""} {
		s := streampub.ShardOf(sku, 16)
		assert.GreaterOrEqual(t, s, 0)
		assert.Less(t, s, 16)
		assert.Equal(t, s, streampub.ShardOf(sku, 16), "stable")
	}
	_, c := redistest.Miniredis(t)
	for _, o := range []streampub.Option{streampub.WithShards(0), streampub.WithShards(16385), streampub.WithPrefix(""),
		streampub.WithPrefix("a{b"), streampub.WithPrefix("a b"), streampub.WithMaxLen(-1), streampub.WithMaxAge(0)} {
		_, err := streampub.New(c, o)
		assert.ErrorIs(t, err, stock.ErrInvalid)
	}
	p := newPublisher(t, c, streampub.WithPrefix("shop:ev"), streampub.WithShards(2))
	assert.Equal(t, []string{"shop:ev:{0}", "shop:ev:{1}"}, p.Streams())
	assert.Equal(t, streampub.StreamKey("shop:ev", streampub.ShardOf("a", 2)), p.Stream("a"))
}

// TestBatchErrors: an invalid event, or an append that Redis refuses (the shard key holds a
// string), fails that event and the later ones of the same stream, and no other.
func TestBatchErrors(t *testing.T) {
	backends(t, func(t *testing.T, newClient func(t testing.TB) rueidis.Client) {
		ctx := context.Background()
		c := newClient(t)
		pub := newPublisher(t, c, streampub.WithShards(64))
		// Two SKUs on different shards.
		a, b := "a", ""
		for i := range 1000 {
			b = fmt.Sprint("b", i)
			if pub.Stream(b) != pub.Stream(a) {
				break
			}
		}
		require.NoError(t, c.Do(ctx, c.B().Set().Key(pub.Stream(b)).Value("not a stream").Build()).Error())
		bad := ev(a, "bad", 2)
		bad.Qty = -1
		errs := pub.PublishBatch(ctx, []stock.Event{ev(a, "1", 1), bad, ev(b, "1", 1), ev(a, "2", 3), ev(b, "2", 2)})
		require.Len(t, errs, 5)
		assert.NoError(t, errs[0])
		assert.ErrorIs(t, errs[1], stock.ErrInvalid)
		assert.ErrorContains(t, errs[2], "WRONGTYPE")
		assert.ErrorContains(t, errs[3], "not appended after an earlier failure")
		assert.ErrorContains(t, errs[4], "not appended after an earlier failure")
		got := entries(t, ctx, c, pub.Stream(a))
		require.Len(t, got, 1, "a's stream stops at its invalid event")
		assert.Equal(t, "1", got[0].ID)
	})
}

// TestTrim: MAXLEN keeps each stream near its limit; MINID drops the entries older than the age.
func TestTrim(t *testing.T) {
	backends(t, func(t *testing.T, newClient func(t testing.TB) rueidis.Client) {
		ctx := context.Background()
		c := newClient(t)
		pub := newPublisher(t, c, streampub.WithShards(1), streampub.WithMaxLen(10))
		for i := range 30 {
			evs := make([]stock.Event, 20)
			for j := range evs {
				evs[j] = ev("a", fmt.Sprint(i, "-", j), int64(i*20+j+1))
			}
			for _, err := range pub.PublishBatch(ctx, evs) {
				require.NoError(t, err)
			}
		}
		n, err := c.Do(ctx, c.B().Xlen().Key(pub.Stream("a")).Build()).AsInt64()
		require.NoError(t, err)
		assert.LessOrEqual(t, n, int64(10+100), "about 10: Redis trims whole nodes of up to 100 entries")
		assert.GreaterOrEqual(t, n, int64(10))

		old := newPublisher(t, c, streampub.WithShards(1), streampub.WithPrefix("aged"), streampub.WithMaxAge(time.Hour))
		for i := range 300 {
			require.NoError(t, old.Publish(ctx, ev("a", fmt.Sprint(i), int64(i+1))))
		}
		aged := newPublisher(t, c, streampub.WithShards(1), streampub.WithPrefix("aged"), streampub.WithMaxAge(time.Millisecond))
		time.Sleep(5 * time.Millisecond)
		require.NoError(t, aged.Publish(ctx, ev("a", "last", 301)))
		n, err = c.Do(ctx, c.B().Xlen().Key(aged.Stream("a")).Build()).AsInt64()
		require.NoError(t, err)
		assert.LessOrEqual(t, n, int64(1+100), "the entries older than the age go, by whole nodes")
	})
}

// TestConsumerClaimsFromDead: a consumer that took messages and died leaves them pending; another
// claims them after MinIdle, and a message that does not decode comes with an error.
func TestConsumerClaimsFromDead(t *testing.T) {
	backends(t, func(t *testing.T, newClient func(t testing.TB) rueidis.Client) {
		ctx := context.Background()
		c := newClient(t)
		pub := newGroupPublisher(t, c, "g", streampub.WithShards(2))
		require.NoError(t, streampub.EnsureGroup(ctx, c, "g", pub.Streams()), "an existing group is fine")
		for i := range 4 {
			require.NoError(t, pub.Publish(ctx, ev("a", fmt.Sprint(i), int64(i+1))))
		}
		require.NoError(t, c.Do(ctx, c.B().Xadd().Key(pub.Stream("a")).Id("*").FieldValue().FieldValue(streampub.Field, "{").Build()).Error())
		opts := &streampub.ConsumerOptions{MinIdle: 200 * time.Millisecond, Poll: 10 * time.Millisecond}
		dead, err := streampub.NewConsumer(c, "g", "dead", pub.Streams(), opts)
		require.NoError(t, err)
		msgs, err := dead.Receive(ctx, 10, time.Second)
		require.NoError(t, err)
		require.Len(t, msgs, 5)
		require.NoError(t, dead.Ack(ctx, msgs[0]))
		heir, err := streampub.NewConsumer(c, "g", "heir", pub.Streams(), opts)
		require.NoError(t, err)
		got, err := heir.Receive(ctx, 10, 50*time.Millisecond)
		require.NoError(t, err)
		assert.Empty(t, got, "not idle long enough yet")
		time.Sleep(250 * time.Millisecond)
		got, err = heir.Receive(ctx, 10, time.Second)
		require.NoError(t, err)
		require.Len(t, got, 4)
		for i, m := range got[:3] {
			require.NoError(t, m.Err)
			assert.Equal(t, fmt.Sprint(i+1), m.Event.ID)
		}
		assert.ErrorIs(t, got[3].Err, stock.ErrInvalid)
		require.NoError(t, heir.Ack(ctx, got...))
		time.Sleep(250 * time.Millisecond)
		got, err = heir.Receive(ctx, 10, 50*time.Millisecond)
		require.NoError(t, err)
		assert.Empty(t, got, "acknowledged")
		_, err = streampub.NewConsumer(c, "", "x", pub.Streams(), nil)
		assert.True(t, errors.Is(err, stock.ErrInvalid))
	})
}

// parallelBackends runs f in parallel subtests on every backend but Sentinel, with the
// client-side cache off.
func parallelBackends(t *testing.T, f func(t *testing.T, b redistest.Backend)) {
	for _, b := range redistest.Backends(t) {
		if b.Name == "sentinel" {
			continue
		}
		b.DisableCache = true
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			f(t, b)
		})
	}
}

// entries reads every entry of a stream and decodes it.
func entries(t *testing.T, ctx context.Context, c rueidis.Client, stream string) []stock.Event {
	t.Helper()
	res, err := c.Do(ctx, c.B().Xrange().Key(stream).Start("-").End("+").Build()).AsXRange()
	require.NoError(t, err, "XRANGE %s", stream)
	var out []stock.Event
	for _, e := range res {
		ev, err := streampub.Decode([]byte(e.FieldValues[streampub.Field]))
		require.NoError(t, err, "entry %s of %s does not decode", e.ID, stream)
		out = append(out, ev)
	}
	return out
}

// TestPublishBatchInvalidStopsStream: a batch of one item with an invalid event in the middle:
// the doc promises that an error for an event means that it and every later event of the same
// stream in the batch were not appended. Another item's events in the same batch (another
// stream) are unaffected.
func TestPublishBatchInvalidStopsStream(t *testing.T) {
	parallelBackends(t, func(t *testing.T, b redistest.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		pub := newPublisher(t, c, streampub.WithShards(64))
		skuA, skuB := "a:1~ü", "b:2"
		if pub.Stream(skuA) == pub.Stream(skuB) {
			t.Fatal("pick SKUs on two shards")
		}
		bad := queuetest.Ev(skuA, "", 2) // no id: invalid
		evs := []stock.Event{queuetest.Ev(skuA, "1", 1), queuetest.Ev(skuB, "1", 1), bad, queuetest.Ev(skuB, "2", 2), queuetest.Ev(skuA, "3", 3)}
		errs := pub.PublishBatch(ctx, evs)
		require.Len(t, errs, len(evs))
		for _, i := range []int{0, 1, 3} {
			assert.NoError(t, errs[i], "a valid event before the bad one, or of another stream")
		}
		assert.ErrorIs(t, errs[2], stock.ErrInvalid)
		assert.Len(t, entries(t, ctx, c, pub.Stream(skuB)), 2, "the other item's stream")
		// Appended after a failure of its stream, the event would be out of order.
		assert.Error(t, errs[4], "the event after the invalid one")
		assert.Len(t, entries(t, ctx, c, pub.Stream(skuA)), 1, "the item's stream")
	})
}

// TestPublishCancelledContext: with a cancelled context, whatever PublishBatch and Publish
// answer, an event answered nil must be in its stream.
func TestPublishCancelledContext(t *testing.T) {
	parallelBackends(t, func(t *testing.T, b redistest.Backend) {
		c := b.Client(t)
		pub := newPublisher(t, c, streampub.WithShards(4))
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		evs := []stock.Event{queuetest.Ev("c", "1", 1), queuetest.Ev("c", "2", 2), queuetest.Ev("d", "1", 1)}
		errs := pub.PublishBatch(ctx, evs)
		require.Len(t, errs, len(evs))
		perr := pub.Publish(ctx, queuetest.Ev("c", "9", 9))
		in := map[string]bool{}
		for _, s := range pub.Streams() {
			for _, ev := range entries(t, context.Background(), c, s) {
				in[ev.SKU+"/"+ev.ID] = true
			}
		}
		evs, errs = append(evs, queuetest.Ev("c", "9", 9)), append(errs, perr) // Publish's event last
		for i, ev := range evs {
			if errs[i] == nil {
				assert.True(t, in[ev.SKU+"/"+ev.ID], "event %s/%s answered nil on a cancelled context, not in its stream", ev.SKU, ev.ID)
			}
		}
	})
}

// TestConsumerGarbageEntries: entries that are not events, in a shard stream (another writer, a
// bug): Receive hands them over with Err, the valid ones with their event, and keeps reading
// the stream.
func TestConsumerGarbageEntries(t *testing.T) {
	parallelBackends(t, func(t *testing.T, b redistest.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		pub := newGroupPublisher(t, c, "g", streampub.WithShards(1))
		s := pub.Streams()[0]
		add := func(fv ...string) {
			cmd := c.B().Xadd().Key(s).Id("*").FieldValue()
			for i := 0; i+1 < len(fv); i += 2 {
				cmd = cmd.FieldValue(fv[i], fv[i+1])
			}
			require.NoError(t, c.Do(ctx, cmd.Build()).Error())
		}
		add("other", "x")
		add(streampub.Field, "{not json")
		add(streampub.Field, `{"type":"deducted","sku":"g","id":"1","qty":-5,"at":"2024-01-01T00:00:00Z"}`)
		add(streampub.Field, `{"type":"deducted","sku":"g","id":"2","qty":1,"at":"2024-01-01T00:00:00Z"} {"x":1}`)
		add(streampub.Field, `{"type":"deducted","sku":"g","id":"3","qty":1,"at":"2024-01-01T00:00:00Z"}`, "extra", "y")
		require.NoError(t, pub.Publish(ctx, queuetest.Ev("g", "4", 4)))
		cons, err := streampub.NewConsumer(c, "g", "one", pub.Streams(), &streampub.ConsumerOptions{Poll: 10 * time.Millisecond})
		require.NoError(t, err)
		var good, garbage []string
		for i := 0; i < 10 && len(good)+len(garbage) < 6; i++ {
			msgs, err := cons.Receive(ctx, 10, 100*time.Millisecond)
			require.NoError(t, err, "Receive")
			for _, m := range msgs {
				if m.Err != nil {
					assert.ErrorIs(t, m.Err, stock.ErrInvalid, "garbage entry %s", m.ID)
					garbage = append(garbage, m.ID)
				} else {
					good = append(good, m.Event.ID)
				}
				require.NoError(t, cons.Ack(ctx, m))
			}
		}
		assert.Len(t, garbage, 4, "garbage entries")
		assert.Equal(t, []string{"3", "4"}, good, "events")
		assert.Zero(t, pending(t, c, s, "g"), "entries still pending after every one was acknowledged")
	})
}

// settle applies msgs through the pipeline's stock.Consume and acknowledges what it settled;
// the rest stays pending, to be claimed again after MinIdle.
func settle(t *testing.T, p *queuetest.Pipeline, cons *streampub.Consumer, msgs []streampub.Message) {
	for _, m := range msgs {
		if p.Settle(t, fmt.Sprintf("entry %s of %s", m.ID, m.Stream), m.Event, m.Err) {
			_ = cons.Ack(context.Background(), m)
		}
	}
}

// TestConsumerTrimmedWhilePending: a consumer dies holding entries; the streams are trimmed
// (MAXLEN ~ 5) far past them while it is dead; later events of every item follow. Its successor
// must not be stuck on the trimmed entries (XAUTOCLAIM of deleted ids), the group's pending
// list must empty, and through stock.Consume the store must still get every acknowledged
// operation once: a trimmed event is applied from Redis before a later event of its item.
func TestConsumerTrimmedWhilePending(t *testing.T) {
	parallelBackends(t, func(t *testing.T, b redistest.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		skus := []string{"t:1", "t~2", "ü:3", "t.4"}
		p := queuetest.NewPipeline(t, c, skus)
		rng := rand.New(rand.NewPCG(18, 1))
		pub := newGroupPublisher(t, c, "store", streampub.WithShards(2), streampub.WithMaxLen(5))
		rl, err := stockops.NewRelay(p.R, nil, pub, nil)
		require.NoError(t, err)
		p.Traffic(t, 60, rng)
		p.Drain(t, rl)
		opts := &streampub.ConsumerOptions{MinIdle: 300 * time.Millisecond, Poll: 10 * time.Millisecond}
		dead, err := streampub.NewConsumer(c, "store", "dead", pub.Streams(), opts)
		require.NoError(t, err)
		held, err := dead.Receive(ctx, 1000, time.Second)
		require.NoError(t, err)
		require.NotEmpty(t, held, "the first consumer's entries")
		// It dies holding them. Much more traffic trims the streams past them.
		p.Traffic(t, 600, rng)
		p.Drain(t, rl)
		for _, sku := range skus { // one last event per item, kept by any trim
			p.Deduct(t, sku, "last", 1)
		}
		p.Drain(t, rl)
		// The trim reached the dead consumer's entries.
		gone := 0
		for _, m := range held {
			res, err := c.Do(ctx, c.B().Xrange().Key(m.Stream).Start(m.ID).End(m.ID).Build()).AsXRange()
			require.NoError(t, err)
			if len(res) == 0 {
				gone++
			}
		}
		require.NotZero(t, gone, "none of the %d entries the dead consumer holds was trimmed: the trim did not happen", len(held))
		t.Logf("the dead consumer holds %d entries, %d of them trimmed", len(held), gone)
		time.Sleep(400 * time.Millisecond) // past MinIdle for the dead consumer's entries
		redistest.Sleep(c, 400*time.Millisecond)
		next, err := streampub.NewConsumer(c, "store", "next", pub.Streams(), opts)
		require.NoError(t, err)
		var rerr error
		deadline := time.Now().Add(8 * time.Second)
		quiet := 0
		for time.Now().Before(deadline) && quiet < 3 {
			msgs, err := next.Receive(ctx, 200, 200*time.Millisecond)
			if err != nil {
				rerr = err
			}
			if len(msgs) == 0 {
				quiet++
				continue
			}
			quiet = 0
			settle(t, p, next, msgs)
		}
		assert.NoError(t, rerr, "Receive after the trim")
		for _, s := range pub.Streams() {
			assert.Zero(t, pending(t, c, s, "store"), "stream %s: entries still pending in the group after the drain", s)
		}
		p.Verify(t)
	})
}

// TestConsumersCrashMidStream: three consumers while the relay publishes and traffic runs; one
// crashes mid-stream holding entries and a new member with the crashed one's name takes over;
// another crashes and is not replaced. The store must end equal to Redis and to the
// acknowledged answers.
func TestConsumersCrashMidStream(t *testing.T) {
	parallelBackends(t, func(t *testing.T, b redistest.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		skus := []string{"m:1", "m:2", "m~3", "m:ü4", "m:5", "m:6"}
		p := queuetest.NewPipeline(t, c, skus)
		pub := newGroupPublisher(t, c, "store", streampub.WithShards(3))
		stopRelay := p.RunRelay(t, pub)
		opts := &streampub.ConsumerOptions{MinIdle: 300 * time.Millisecond, Poll: 5 * time.Millisecond}
		var wg sync.WaitGroup
		var crashedHolding atomic.Int64
		stopAll := make(chan struct{})
		// member runs a consumer; if crashAfter > 0 it crashes (stops, holding its last batch
		// unacknowledged) after that many batches.
		member := func(name string, crashAfter int) {
			defer wg.Done()
			cons, err := streampub.NewConsumer(c, "store", name, pub.Streams(), opts)
			if err != nil {
				t.Error(err)
				return
			}
			for batch := 0; ; batch++ {
				select {
				case <-stopAll:
					return
				default:
				}
				msgs, err := cons.Receive(ctx, 8, 50*time.Millisecond)
				if err != nil {
					t.Errorf("%s: Receive: %v", name, err)
					return
				}
				if len(msgs) == 0 {
					continue
				}
				if crashAfter > 0 && batch >= crashAfter {
					crashedHolding.Add(int64(len(msgs)))
					return // dies holding msgs
				}
				settle(t, p, cons, msgs)
			}
		}
		wg.Add(3)
		go member("a", 5)
		go member("b", 0)
		go member("c", 9)
		rng := rand.New(rand.NewPCG(18, 2))
		p.Traffic(t, 400, rng)
		time.Sleep(200 * time.Millisecond)
		wg.Add(1)
		go member("a", 0) // "a" restarts under its name
		p.Traffic(t, 200, rng)
		// Wait until every event is applied, or give up. miniredis's clock stands still until
		// moved (redistest.Miniredis), and with it the idle time XAUTOCLAIM reads: move it
		// between looks, or the last events a crashed member held are never claimed again. On a
		// real server this sleeps once more.
		p.WaitApplied(t, 12*time.Second, func() { redistest.Sleep(c, 50*time.Millisecond) })
		close(stopAll)
		wg.Wait()
		stopRelay()
		p.VerifyCrashed(t, crashedHolding.Load())
	})
}

// BenchmarkPublish measures events/s published one by one (Publish, one round trip each) and in
// batches of 128 events of one item (PublishBatch, as the Relay calls it), on a redis-server
// when STOCK_REDIS_SERVER is set, else on miniredis:
//
//	STOCK_REDIS_SERVER=$(which redis-server) go test -run '^$' -bench Publish -benchtime 3s ./streampub
func BenchmarkPublish(b *testing.B) {
	var c rueidis.Client
	if redistest.ServerBinary(b) != "" {
		c = redistest.StartServer(b).Client(b)
	} else {
		_, c = redistest.Miniredis(b)
	}
	pub, err := streampub.New(c)
	require.NoError(b, err)
	queuetest.BenchPublish(b, pub)
}

// BenchmarkRelay measures events/s through a Relay with no store (claim, publish, ack) into
// the shard streams, with the publisher's PublishBatch (one script call per item's batch of up
// to 128) and with Publish only (one call per event), on one redis-server holding both the
// items and the streams. Each round queues 1,024 deducts of one item, untimed, then times the
// relay draining them:
//
//	STOCK_REDIS_SERVER=$(which redis-server) go test -run '^$' -bench Relay -benchtime 20x ./streampub
func BenchmarkRelay(b *testing.B) {
	if redistest.ServerBinary(b) == "" {
		b.Skip("needs STOCK_REDIS_SERVER: miniredis's Lua would be the figure")
	}
	c := redistest.StartServer(b).Client(b)
	r, err := stock.New(c)
	require.NoError(b, err)
	pub, err := streampub.New(c)
	require.NoError(b, err)
	ctx := context.Background()
	require.NoError(b, r.Load(ctx, "bench", 1<<40))
	n := 0
	for _, tc := range []struct {
		name string
		pub  stock.Publisher
	}{{"one", stock.PublisherFunc(pub.Publish)}, {"batch", pub}} {
		b.Run(tc.name, func(b *testing.B) {
			rl, err := stockops.NewRelay(r, nil, tc.pub, &stock.RelayOptions{Batch: 128, Items: []string{"bench"}})
			require.NoError(b, err)
			events := 0
			var spent time.Duration
			for b.Loop() {
				b.StopTimer()
				for range 1024 {
					n++
					if _, err := r.Deduct(ctx, stock.Request{SKU: "bench", ID: fmt.Sprint("o", n), Qty: 1}); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				start := time.Now()
				for {
					st, err := rl.Once(ctx)
					require.NoError(b, err)
					if st.Claimed == 0 {
						break
					}
					events += st.Delivered
				}
				spent += time.Since(start)
			}
			b.ReportMetric(float64(events)/spent.Seconds(), "events/s")
		})
	}
}
