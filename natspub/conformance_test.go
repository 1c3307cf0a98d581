package natspub_test

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/natspub"
	"github.com/stockres/stock/stocktest"
)

// TestPublisherConformance runs the publisher conformance suite on natspub: a stream of its
// own per check, and a durable pull consumer whose members fetch from it, with an ack wait of
// one second (a killed member's messages come back after it), and sqlstore on SQLite.
func TestPublisherConformance(t *testing.T) {
	stocktest.TestPublisher(t, func(t *testing.T) stocktest.PublisherPair {
		e := newEnv(t)
		ctx := context.Background()
		const ackWait = time.Second
		_, err := e.js.CreateOrUpdateConsumer(ctx, e.stream, jetstream.ConsumerConfig{
			Durable:       "store",
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       ackWait,
			FilterSubject: e.prefix + ".>",
		})
		require.NoError(t, err)
		return stocktest.PublisherPair{
			Publisher: e.publisher(t, natspub.WithStream(e.stream), natspub.WithTimeout(5*time.Second)),
			NewConsumer: func(t testing.TB) stocktest.Consumer {
				cons, err := e.js.Consumer(context.Background(), e.stream, "store")
				require.NoError(t, err)
				return &jsMember{cons: cons}
			},
			Redelivery: ackWait + 500*time.Millisecond,
			// The consumers apply to sqlstore on a SQLite file, as in production.
			NewStore: func(t testing.TB) stock.Store { return openStore(t, filepath.Join(t.TempDir(), "store.sqlite")) },
		}
	})
}

// jsMember is one member of a durable pull consumer.
type jsMember struct {
	cons jetstream.Consumer
	dead atomic.Bool
}

func (m *jsMember) Receive(_ context.Context, n int, wait time.Duration) ([]stocktest.Delivery, error) {
	if m.dead.Load() {
		return nil, nil
	}
	batch, err := m.cons.Fetch(n, jetstream.FetchMaxWait(max(wait, 100*time.Millisecond)))
	if err != nil {
		return nil, err
	}
	var out []stocktest.Delivery
	for msg := range batch.Messages() {
		out = append(out, jsDelivery{msg})
	}
	return out, batch.Error()
}

// Crash stops the member: what it fetched and did not acknowledge is redelivered after the
// ack wait, as for a killed process.
func (m *jsMember) Crash() { m.dead.Store(true) }

type jsDelivery struct{ m jetstream.Msg }

func (d jsDelivery) Event() (stock.Event, error)   { return natspub.Decode(d.m.Data()) }
func (d jsDelivery) Ack(ctx context.Context) error { return d.m.DoubleAck(ctx) }
func (d jsDelivery) Retry(context.Context) error   { return d.m.NakWithDelay(100 * time.Millisecond) }
