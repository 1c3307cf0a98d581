package engine

import (
	"context"
	"strconv"
	"sync"
	"testing"

	"github.com/redis/rueidis"
	"github.com/stockres/stock/internal/protocol"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stretchr/testify/require"
)

// BenchmarkDeductClientCost measures what a Deduct costs the client over the script it sends:
// at one goroutine, on a real standalone Redis (STOCK_REDIS_SERVER; miniredis would count its
// own work in the same process), Deduct against deduct.lua sent bare through the same client
// with the same keys and arguments. The difference of ns/op (noisy on a shared machine:
// compare the two in one run) and of allocs/op (exact) is the Go path's cost.
func BenchmarkDeductClientCost(b *testing.B) {
	var be *redistest.Backend
	for _, x := range redistest.Backends(b) {
		if x.Name == "standalone" {
			be = &x
		}
	}
	if be == nil {
		b.Skip("needs a real standalone Redis: set STOCK_REDIS_SERVER to a redis-server binary")
	}
	for _, user := range []string{"", "u"} {
		name := "anonymous"
		if user != "" {
			name = "buyer-limit-2"
		}
		b.Run(name+"/Deduct", func(b *testing.B) {
			ctx := context.Background()
			opts := []Option{WithEvictionAllowed()}
			if user != "" {
				opts = append(opts, WithUserLimit(2))
			}
			r, err := New(be.Client(b), opts...)
			require.NoError(b, err)
			sku := "cost-" + name
			require.NoError(b, r.Load(ctx, sku, MaxQty))
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				u := user
				if u != "" {
					u += strconv.Itoa(i)
				}
				if _, err := r.Deduct(ctx, Request{SKU: sku, ID: "o" + strconv.Itoa(i), User: u, Qty: 1}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/script", func(b *testing.B) {
			ctx := context.Background()
			c := be.Client(b)
			opts := []Option{WithEvictionAllowed()}
			if user != "" {
				opts = append(opts, WithUserLimit(2))
			}
			r, err := New(c, opts...)
			require.NoError(b, err)
			sku := "bare-" + name
			require.NoError(b, r.Load(ctx, sku, MaxQty))
			k := r.item(sku)
			limit := r.limitArg
			var bc rueidis.Client = c // the caller's client, without the Reserver's wrappers
			backgroundMode(b, bc)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				u := user
				if u != "" {
					u += strconv.Itoa(i)
				}
				res := protocol.Deduct.Exec(ctx, bc, k.ForItem(), []string{limit, r.outboxFlag(), protocol.TakeDeduct, "0", r.clockArg(ctx), "o" + strconv.Itoa(i), "1", u, "0"})
				require.NoError(b, res.Error())
			}
		})
	}
}

// backgroundMode puts c's connection in the mode a client shared by goroutines runs in: rueidis
// reads and writes a connection on the calling goroutine (no hand-off) only until two calls
// overlap; from then on, for good, through goroutines of its own. A Reserver's own goroutines
// (the due-work hints) put its client in that mode; a service's concurrent requests do too.
func backgroundMode(b *testing.B, c rueidis.Client) {
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				if err := c.Do(context.Background(), c.B().Ping().Build()).Error(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
