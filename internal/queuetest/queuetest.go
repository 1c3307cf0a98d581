// Package queuetest holds the test code the publisher adapters (amqppub, kafkapub, natspub,
// streampub) share: the publishing benchmark, a queue pipeline that checks a store against
// Redis and the acknowledged answers (the adapters' batch and crash tests), and a rig whose
// consumers are child processes killed by SIGKILL (the kill tests). Each adapter's tests keep only what is its
// broker's: how to publish, how to start a consumer, how to receive and acknowledge.
//
// It is internal to github.com/stockres/stock and imported only by tests; it needs nothing the
// root module does not already require (rueidis, miniredis, testify). The kill rig's store is a
// [Store] the adapter opens (sqlstore on a SQLite file), so that this module needs neither
// sqlstore nor a SQLite driver.
package queuetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
)

// BenchPublish runs the one-by-one ("one") and batch ("batch128") sub-benchmarks of an
// adapter's BenchmarkPublish on p: events/s published with Publish, each waiting for the
// broker, and with PublishBatch in batches of 128 events of one item, as the Relay calls it.
func BenchPublish(b *testing.B, p stock.BatchPublisher) {
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
			require.NoError(b, p.Publish(ctx, next()))
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
				require.NoError(b, err)
			}
			events += len(evs)
		}
		b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
	})
}
