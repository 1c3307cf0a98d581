package kafkapub_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/kafkapub"
)

// BenchmarkPublish measures events/s published one by one (Publish: one ProduceSync of one
// record each) and in batches of 128 events of one item (PublishBatch: one ProduceSync of 128
// records, as the Relay calls it), on the in-process fake cluster: a figure of the client and
// the protocol round trips, not of a real cluster's disks and replication.
//
//	go test -run '^$' -bench Publish -benchtime 3s ./  (in kafkapub/)
func BenchmarkPublish(b *testing.B) {
	pub, err := kafkapub.New(producer(b, fakeCluster(b)), topic)
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
