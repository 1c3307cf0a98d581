package streampub_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/queuetest"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/stockops"
	"github.com/stockres/stock/streampub"
)

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
					if err != nil {
						b.Fatal(err)
					}
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
