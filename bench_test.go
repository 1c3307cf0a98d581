package stock_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
)

// BenchmarkDeduct drives Deduct with unique ids on one hot item from many goroutines, on each
// backend (miniredis always; real standalone and cluster with STOCK_REDIS_SERVER). Compare
// runs with benchstat; the ops/s of one run only mean something against a baseline measured in
// the same run (see cmd/stockbench).
func BenchmarkDeduct(b *testing.B) {
	for _, be := range redistest.Backends(b) {
		b.Run(be.Name, func(b *testing.B) {
			ctx := context.Background()
			r, err := stock.New(be.Client(b))
			if err != nil {
				b.Fatal(err)
			}
			if err := r.Load(ctx, "hot", stock.MaxQty); err != nil {
				b.Fatal(err)
			}
			if be.Real() {
				b.SetParallelism(64) // many goroutines: rueidis pipelines their scripts
			}
			var seq atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					id := "o" + strconv.FormatInt(seq.Add(1), 10)
					if _, err := r.Deduct(ctx, stock.Request{SKU: "hot", ID: id, User: "u", Qty: 1}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "deducts/s")
		})
	}
}

// BenchmarkDeductSoldOut measures the sold-out path, which dominates a flash sale.
func BenchmarkDeductSoldOut(b *testing.B) {
	for _, be := range redistest.Backends(b) {
		b.Run(be.Name, func(b *testing.B) {
			ctx := context.Background()
			r, err := stock.New(be.Client(b))
			if err != nil {
				b.Fatal(err)
			}
			if err := r.Load(ctx, "gone", 0); err != nil {
				b.Fatal(err)
			}
			if be.Real() {
				b.SetParallelism(64)
			}
			var seq atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					id := "o" + strconv.FormatInt(seq.Add(1), 10)
					if _, err := r.Deduct(ctx, stock.Request{SKU: "gone", ID: id, Qty: 1}); err != stock.ErrSoldOut {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "deducts/s")
		})
	}
}
