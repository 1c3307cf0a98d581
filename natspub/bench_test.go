package natspub_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stockres/stock"
	"github.com/stockres/stock/natspub"
)

// BenchmarkPublish measures events/s published one by one (Publish: one acknowledgement waited
// for each) and in batches of 128 events of one item (PublishBatch: 128 asynchronous publishes,
// then their acknowledgements, as the Relay calls it), on the server of STOCK_TEST_NATS:
//
//	STOCK_TEST_NATS=nats://127.0.0.1:4222 go test -run '^$' -bench Publish -benchtime 3s ./natspub
func BenchmarkPublish(b *testing.B) {
	e := newEnv(b)
	p, err := natspub.New(e.js, natspub.WithPrefix(e.prefix), natspub.WithStream(e.stream))
	if err != nil {
		b.Fatal(err)
	}
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
