package amqppub_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/amqppub"
)

// BenchmarkPublish measures events/s published one by one (Publish: one confirm waited for
// each) and in batches of 128 events of one item (PublishBatch: 128 messages, then their
// confirms, as the Relay calls it), on the RabbitMQ server of STOCK_TEST_AMQP:
//
//	STOCK_TEST_AMQP=amqp://guest:guest@127.0.0.1:5672/ go test -run '^$' -bench Publish -benchtime 3s ./  (in amqppub/)
func BenchmarkPublish(b *testing.B) {
	u := url(b)
	pub, err := amqppub.New(dial(b, u), layout(b, u, 4)...)
	require.NoError(b, err)
	benchPublish(b, pub)
}

// benchPublish runs the one-by-one and batch sub-benchmarks on p.
func benchPublish(b *testing.B, p stock.BatchPublisher) {
	ctx := context.Background()
	at := time.Now().UTC()
	n := 0
	next := func() stock.Event {
		n++
		return stock.Event{Type: stock.EventDeducted, SKU: "bench", ID: fmt.Sprint("o", n), User: "u", Qty: 1, At: at, Seq: int64(n)}
	}
	b.Run("one", func(b *testing.B) {
		events := 0
		for b.Loop() {
			if err := p.Publish(ctx, next()); err != nil {
				b.Fatal(err)
			}
			events++
		}
		b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
	})
	b.Run("batch128", func(b *testing.B) {
		events := 0
		evs := make([]stock.Event, 128)
		for b.Loop() {
			for i := range evs {
				evs[i] = next()
			}
			for _, err := range p.PublishBatch(ctx, evs) {
				if err != nil {
					b.Fatal(err)
				}
			}
			events += len(evs)
		}
		b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
	})
}
