package stockotel_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
	"github.com/stockres/stock/stockotel"
)

// collect reads every metric of the reader, by name.
func collect(t *testing.T, rdr *sdkmetric.ManualReader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, rdr.Collect(context.Background(), &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		assert.Equal(t, stockotel.MeterName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// label renders an attribute set as "k=v,k=v" in key order, for readable assertions.
func label(s attribute.Set) string {
	var parts []string
	for _, kv := range s.ToSlice() {
		parts = append(parts, string(kv.Key)+"="+kv.Value.Emit())
	}
	return strings.Join(parts, ",")
}

// sums returns a counter's values by attribute set.
func sums(t *testing.T, m metricdata.Metrics) map[string]int64 {
	t.Helper()
	s, ok := m.Data.(metricdata.Sum[int64])
	require.True(t, ok, "%s is a %T", m.Name, m.Data)
	assert.True(t, s.IsMonotonic, m.Name)
	out := map[string]int64{}
	for _, dp := range s.DataPoints {
		out[label(dp.Attributes)] = dp.Value
	}
	return out
}

// counts returns a histogram's data point counts by attribute set.
func counts[N int64 | float64](t *testing.T, m metricdata.Metrics) map[string]uint64 {
	t.Helper()
	h, ok := m.Data.(metricdata.Histogram[N])
	require.True(t, ok, "%s is a %T", m.Name, m.Data)
	out := map[string]uint64{}
	for _, dp := range h.DataPoints {
		out[label(dp.Attributes)] = dp.Count
	}
	return out
}

// newObserver returns an observer with opts on a meter provider read by the reader it returns.
func newObserver(t testing.TB, opts ...stockotel.Option) (*stockotel.Observer, *sdkmetric.ManualReader) {
	t.Helper()
	rdr := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(rdr))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	obs, err := stockotel.New(mp, opts...)
	require.NoError(t, err)
	return obs, rdr
}

// setup returns a Reserver on miniredis that reports to an observer with opts, and the
// observer's reader.
func setup(t *testing.T, opts ...stockotel.Option) (*stock.Reserver, *sdkmetric.ManualReader) {
	t.Helper()
	obs, rdr := newObserver(t, opts...)
	_, c := redistest.Miniredis(t)
	r, err := stock.New(c, stock.WithObserver(obs))
	require.NoError(t, err)
	return r, rdr
}

// scenario: 2 units; deducts o0, o1 (ok), o2 (sold out), o0 again (replay), a restore of o1,
// a restock, a relay pass into a store and a reconcile pass against a store that lost a unit.
func scenario(t *testing.T, r *stock.Reserver) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, r.Load(ctx, "A", 2))
	must := ok(t)
	for i := range 2 {
		must(r.Deduct(ctx, stock.Request{SKU: "A", ID: fmt.Sprint("o", i), Qty: 1}))
	}
	_, err := r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", Qty: 1})
	require.ErrorIs(t, err, stock.ErrSoldOut)
	rc, err := r.Deduct(ctx, stock.Request{SKU: "A", ID: "o0", Qty: 1})
	require.NoError(t, err)
	require.True(t, rc.Replayed)
	must(r.Restore(ctx, "A", "o1"))
	must(r.Restock(ctx, "A", "r1", 3))

	store := memstore.New()
	require.NoError(t, store.Load(ctx, "A", 2))
	rl, err := stockops.NewRelay(r, store, nil, nil)
	require.NoError(t, err)
	st, err := rl.Once(ctx)
	require.NoError(t, err)
	require.Equal(t, 4, st.Delivered) // o0, o1, restore of o1, r1
	// A pass that finds nothing releases the item's relay lease, which the reconciler needs.
	st, err = rl.Once(ctx)
	require.NoError(t, err)
	require.Zero(t, st.Claimed)

	store.Set("A", 3) // the store lost a unit: Redis has 4 available, the store 3
	rec, err := stockops.NewReconciler(r, store, &stock.ReconcileOptions{DryRun: true})
	require.NoError(t, err)
	reps, err := rec.Once(ctx)
	require.NoError(t, err)
	require.Len(t, reps, 1)
	require.Equal(t, int64(1), reps[0].Drift)
}

func TestMetrics(t *testing.T) {
	r, rdr := setup(t)
	scenario(t, r)
	ms := collect(t, rdr)

	assert.Equal(t, map[string]int64{
		"stock.op=deduct,stock.outcome=ok,stock.replayed=false":       2,
		"stock.op=deduct,stock.outcome=ok,stock.replayed=true":        1,
		"stock.op=deduct,stock.outcome=sold_out,stock.replayed=false": 1,
		"stock.op=restore,stock.outcome=ok,stock.replayed=false":      1,
		"stock.op=restock,stock.outcome=ok,stock.replayed=false":      1,
	}, sums(t, ms["stock.operations"]))
	assert.Equal(t, map[string]uint64{
		"stock.op=deduct,stock.outcome=ok":       3,
		"stock.op=deduct,stock.outcome=sold_out": 1,
		"stock.op=restore,stock.outcome=ok":      1,
		"stock.op=restock,stock.outcome=ok":      1,
		"stock.op=reconcile,stock.outcome=ok":    1,
	}, counts[float64](t, ms["stock.operation.duration"]))
	assert.Equal(t, "s", ms["stock.operation.duration"].Unit)
	assert.Equal(t, map[string]int64{
		"stock.op=deduct":  2, // the replay and the sold-out answer moved nothing
		"stock.op=restore": 1,
		"stock.op=restock": 3,
	}, sums(t, ms["stock.units"]))

	assert.Equal(t, map[string]int64{"stock.outcome=ok": 1}, sums(t, ms["stock.relay.batches"]))
	assert.Equal(t, map[string]int64{"": 4}, sums(t, ms["stock.relay.delivered"]))
	assert.Equal(t, map[string]uint64{"": 1}, counts[float64](t, ms["stock.relay.lag"]))
	lag := ms["stock.relay.lag"].Data.(metricdata.Histogram[float64]).DataPoints[0]
	assert.Positive(t, lag.Sum)
	assert.Less(t, lag.Sum, time.Minute.Seconds())

	assert.Equal(t, map[string]int64{"stock.outcome=ok": 1}, sums(t, ms["stock.reconcile.passes"]))
	assert.Equal(t, map[string]uint64{"stock.drift.sign=positive": 1}, counts[int64](t, ms["stock.reconcile.drift"]))
	drift := ms["stock.reconcile.drift"].Data.(metricdata.Histogram[int64]).DataPoints[0]
	assert.Equal(t, int64(1), drift.Sum)

	for _, name := range []string{"stock.operation.duration", "stock.relay.lag"} {
		h := ms[name].Data.(metricdata.Histogram[float64])
		for _, dp := range h.DataPoints {
			assert.NotEmpty(t, dp.Bounds, name)
			assert.Positive(t, dp.Count, name)
		}
	}
}

func TestSKUAttribute(t *testing.T) {
	r, rdr := setup(t, stockotel.WithSKUAttribute(true))
	scenario(t, r)
	ms := collect(t, rdr)
	ops := sums(t, ms["stock.operations"])
	assert.Equal(t, int64(2), ops["stock.op=deduct,stock.outcome=ok,stock.replayed=false,stock.sku=A"])
	assert.Equal(t, map[string]int64{"stock.sku=A": 4}, sums(t, ms["stock.relay.delivered"]))
	assert.Equal(t, map[string]uint64{"stock.drift.sign=positive,stock.sku=A": 1}, counts[int64](t, ms["stock.reconcile.drift"]))
	for name, m := range ms {
		switch d := m.Data.(type) {
		case metricdata.Sum[int64]:
			for _, dp := range d.DataPoints {
				assert.Equal(t, "A", attrValue(dp.Attributes, stockotel.AttrSKU), name)
			}
		case metricdata.Histogram[float64]:
			for _, dp := range d.DataPoints {
				assert.Equal(t, "A", attrValue(dp.Attributes, stockotel.AttrSKU), name)
			}
		}
	}
}

func attrValue(s attribute.Set, k attribute.Key) string {
	v, _ := s.Value(k)
	return v.Emit()
}

func TestSigns(t *testing.T) {
	obs, rdr := newObserver(t)
	ctx := context.Background()
	for _, d := range []int64{-3, 0, 0, 7} {
		obs.Observe(ctx, stock.Observation{Op: "reconcile", SKU: "A", Outcome: "ok", Units: d, Duration: time.Millisecond})
	}
	obs.Observe(ctx, stock.Observation{Op: "reconcile", SKU: "A", Outcome: "error", Duration: time.Millisecond})
	obs.Observe(ctx, stock.Observation{Op: "relay", SKU: "A", Outcome: "error"}) // nothing delivered, no lag
	obs.Observe(ctx, stock.Observation{Op: "extend", SKU: "A", Outcome: "ok", Units: 2, Duration: time.Millisecond})
	ms := collect(t, rdr)
	assert.Equal(t, map[string]uint64{
		"stock.drift.sign=negative": 1, "stock.drift.sign=zero": 2, "stock.drift.sign=positive": 1,
	}, counts[int64](t, ms["stock.reconcile.drift"]))
	var total int64
	for _, dp := range ms["stock.reconcile.drift"].Data.(metricdata.Histogram[int64]).DataPoints {
		total += dp.Sum
	}
	assert.Equal(t, int64(10), total, "|drift| is recorded")
	assert.Equal(t, map[string]int64{"stock.outcome=ok": 4, "stock.outcome=error": 1}, sums(t, ms["stock.reconcile.passes"]))
	assert.Equal(t, map[string]int64{"stock.outcome=error": 1}, sums(t, ms["stock.relay.batches"]))
	assert.NotContains(t, ms, "stock.relay.delivered", "no event delivered")
	assert.NotContains(t, ms, "stock.relay.lag")
	assert.NotContains(t, ms, "stock.units", "extend moves no stock")
}

func TestNilProvider(t *testing.T) {
	_, err := stockotel.New(nil)
	assert.Error(t, err)
}

func BenchmarkObserve(b *testing.B) {
	for _, sku := range []bool{false, true} {
		b.Run(fmt.Sprintf("sku=%v", sku), func(b *testing.B) {
			obs, _ := newObserver(b, stockotel.WithSKUAttribute(sku))
			ctx := context.Background()
			ob := stock.Observation{Op: "deduct", SKU: "sneaker-42", Outcome: "ok", Duration: 300 * time.Microsecond, Units: 1}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					obs.Observe(ctx, ob)
				}
			})
		})
	}
}

// TestMetricsLocal: answers of the sold-out fast path carry stock.local.
func TestMetricsLocal(t *testing.T) {
	obs, rdr := newObserver(t)
	ctx := context.Background()
	for _, local := range []bool{true, true, false} {
		obs.Observe(ctx, stock.Observation{Op: "deduct", SKU: "A", Outcome: "sold_out", Local: local})
	}
	assert.Equal(t, map[string]int64{
		"stock.local=true,stock.op=deduct,stock.outcome=sold_out,stock.replayed=false": 2,
		"stock.op=deduct,stock.outcome=sold_out,stock.replayed=false":                  1,
	}, sums(t, collect(t, rdr)["stock.operations"]))
}
