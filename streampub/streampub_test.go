package streampub_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
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
			pub, err := streampub.New(c, streampub.WithShards(4))
			require.NoError(t, err)
			require.NoError(t, streampub.EnsureGroup(context.Background(), c, "store", pub.Streams()))
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
	p, err := streampub.New(c, streampub.WithPrefix("shop:ev"), streampub.WithShards(2))
	require.NoError(t, err)
	assert.Equal(t, []string{"shop:ev:{0}", "shop:ev:{1}"}, p.Streams())
	assert.Equal(t, streampub.StreamKey("shop:ev", streampub.ShardOf("a", 2)), p.Stream("a"))
}

// TestBatchErrors: an invalid event, or an append that Redis refuses (the shard key holds a
// string), fails that event and the later ones of the same stream, and no other.
func TestBatchErrors(t *testing.T) {
	backends(t, func(t *testing.T, newClient func(t testing.TB) rueidis.Client) {
		ctx := context.Background()
		c := newClient(t)
		pub, err := streampub.New(c, streampub.WithShards(64))
		require.NoError(t, err)
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
		n, err := c.Do(ctx, c.B().Xlen().Key(pub.Stream(a)).Build()).AsInt64()
		require.NoError(t, err)
		require.Equal(t, int64(1), n, "a's stream stops at its invalid event")
		entries, err := c.Do(ctx, c.B().Xrange().Key(pub.Stream(a)).Start("-").End("+").Build()).AsXRange()
		require.NoError(t, err)
		got, err := streampub.Decode([]byte(entries[0].FieldValues[streampub.Field]))
		require.NoError(t, err)
		assert.Equal(t, "1", got.ID)
	})
}

// TestTrim: MAXLEN keeps each stream near its limit; MINID drops the entries older than the age.
func TestTrim(t *testing.T) {
	backends(t, func(t *testing.T, newClient func(t testing.TB) rueidis.Client) {
		ctx := context.Background()
		c := newClient(t)
		pub, err := streampub.New(c, streampub.WithShards(1), streampub.WithMaxLen(10))
		require.NoError(t, err)
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

		old, err := streampub.New(c, streampub.WithShards(1), streampub.WithPrefix("aged"), streampub.WithMaxAge(time.Hour))
		require.NoError(t, err)
		for i := range 300 {
			require.NoError(t, old.Publish(ctx, ev("a", fmt.Sprint(i), int64(i+1))))
		}
		aged, err := streampub.New(c, streampub.WithShards(1), streampub.WithPrefix("aged"), streampub.WithMaxAge(time.Millisecond))
		require.NoError(t, err)
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
		pub, err := streampub.New(c, streampub.WithShards(2))
		require.NoError(t, err)
		require.NoError(t, streampub.EnsureGroup(ctx, c, "g", pub.Streams()))
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
