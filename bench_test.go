package stock_test

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
)

// BenchmarkDeduct drives Deduct with unique ids on one hot item from many goroutines, on each
// backend (miniredis always; real standalone and cluster with STOCK_REDIS_SERVER). Compare
// runs with benchstat; the ops/s of one run only mean something against a baseline measured in
// the same run (see cmd/stockbench).
func BenchmarkDeduct(b *testing.B) {
	benchDeducts(b, stock.MaxQty, "u", nil)
}

// BenchmarkDeductSoldOut measures the sold-out path, which dominates a flash sale.
func BenchmarkDeductSoldOut(b *testing.B) {
	benchDeducts(b, 0, "", stock.ErrSoldOut)
}

// benchDeducts runs Deducts of new ids of one item loaded with qty, from many goroutines, on
// each backend; every Deduct must answer want.
func benchDeducts(b *testing.B, qty int64, user string, want error) {
	for _, be := range redistest.Backends(b) {
		b.Run(be.Name, func(b *testing.B) {
			r, err := stock.New(be.Client(b))
			require.NoError(b, err)
			require.NoError(b, r.Load(ctx, "hot", qty))
			if be.Real() {
				b.SetParallelism(64) // many goroutines: rueidis pipelines their scripts
			}
			var seq atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					id := "o" + strconv.FormatInt(seq.Add(1), 10)
					if _, err := r.Deduct(ctx, stock.Request{SKU: "hot", ID: id, User: user, Qty: 1}); err != want {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "deducts/s")
		})
	}
}

// TestLedgerBytesPerEntry reports the Redis memory one ledger entry takes for an item of a
// realistic size (5,000 units, ids like an order number, a user each), on a real server, and
// guards it against growing: the hash of entries is what a sale keeps for its retention.
func TestLedgerBytesPerEntry(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skip("real-server test: set STOCK_REDIS_SERVER to run it (miniredis has no MEMORY USAGE)")
	}
	for _, be := range redistest.Backends(t) {
		if be.Name != "standalone" {
			continue // miniredis has no MEMORY USAGE; a cluster node would say the same
		}
		c := be.Client(t)
		r, err := stock.New(c)
		require.NoError(t, err)
		const units = 5000
		require.NoError(t, r.Load(ctx, "mem", units))
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				for i := w; i < units; i += 16 {
					req := stock.Request{SKU: "mem", ID: fmt.Sprintf("order-%07d", i), User: fmt.Sprintf("user-%05d", i), Qty: 1}
					if _, err := r.Deduct(ctx, req); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		n, err := c.Do(ctx, c.B().MemoryUsage().Key("stock:{mem}:l").Samples(0).Build()).AsInt64()
		require.NoError(t, err)
		per := float64(n) / units
		t.Logf("ledger of %d entries: %d bytes, %.1f bytes per entry", units, n, per)
		if per > 110 {
			t.Errorf("%.1f bytes per ledger entry: the compact entry grew", per)
		}
	}
}
