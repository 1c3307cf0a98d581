package stockotel_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
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

func TestMain(m *testing.M) { os.Exit(redistest.Run(m)) }

// tracedClient stands in for rueidisotel.NewClient: a span per Redis command, a child of the
// span in the command's context.
type tracedClient struct {
	rueidis.Client
	tracer trace.Tracer
}

func (c tracedClient) span(ctx context.Context, cmd []string) (context.Context, trace.Span) {
	return c.tracer.Start(ctx, cmd[0], trace.WithSpanKind(trace.SpanKindClient))
}

func (c tracedClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	ctx, sp := c.span(ctx, cmd.Commands())
	defer sp.End()
	return c.Client.Do(ctx, cmd)
}

func (c tracedClient) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	if len(cmds) == 0 {
		return nil
	}
	ctx, sp := c.span(ctx, cmds[0].Commands())
	defer sp.End()
	return c.Client.DoMulti(ctx, cmds...)
}

type traceEnv struct {
	sr     *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	r      *stock.Reserver
	parent trace.Span
	ctx    context.Context // carries parent
}

func newTraceEnv(t *testing.T, c rueidis.Client, opts ...stockotel.Option) *traceEnv {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	obs, err := stockotel.New(sdkmetric.NewMeterProvider(), append(opts, stockotel.WithTracerProvider(tp))...)
	require.NoError(t, err)
	r, err := stock.New(tracedClient{c, tp.Tracer("redis")}, stock.WithObserver(obs), stock.WithOutbox(true))
	require.NoError(t, err)
	ctx, parent := tp.Tracer("app").Start(context.Background(), "checkout")
	return &traceEnv{sr: sr, tp: tp, r: r, parent: parent, ctx: ctx}
}

// ours returns the spans of the stock tracer, in the order they ended.
func (e *traceEnv) ours() []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range e.sr.Ended() {
		if s.InstrumentationScope().Name == stockotel.TracerName {
			out = append(out, s)
		}
	}
	return out
}

// ok returns a function that fails t when the operation whose two results it takes answered
// an error.
func ok(t testing.TB) func(any, error) {
	return func(_ any, err error) {
		t.Helper()
		require.NoError(t, err)
	}
}

func attrs(s sdktrace.ReadOnlySpan) map[string]string {
	out := map[string]string{}
	for _, kv := range s.Attributes() {
		out[string(kv.Key)] = kv.Value.Emit()
	}
	return out
}

// TestSpans: one span per operation, a child of the caller's span, with the outcome, the
// replay flag and the units as attributes, and the Redis commands of the operation as its
// children; no stock.sku unless asked for.
func TestSpans(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		e := newTraceEnv(t, b.Client(t))
		ctx, r := e.ctx, e.r
		bg := context.Background() // Load records no span: its commands are left out of the trace
		require.NoError(t, r.Load(bg, "A", 3))
		require.NoError(t, r.Load(bg, "B", 3))
		req := stock.Request{SKU: "A", ID: "o1", User: "u", Qty: 2}
		must := ok(t)
		must(r.Deduct(ctx, req))
		must(r.Deduct(ctx, req)) // a replay
		_, err := r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", Qty: 2})
		require.ErrorIs(t, err, stock.ErrInsufficient)
		must(r.Hold(ctx, stock.Request{SKU: "A", ID: "h1", Qty: 1}, time.Minute))
		must(r.Extend(ctx, "A", "h1", time.Minute))
		must(r.Confirm(ctx, "A", "h1"))
		must(r.Restore(ctx, "A", "o1"))
		must(r.Restock(ctx, "A", "r1", 5))
		must(r.Hold(ctx, stock.Request{SKU: "B", ID: "h2", Qty: 1}, time.Minute))
		must(r.Cancel(ctx, "B", "h2"))
		must(r.DeductMany(ctx, stock.Cart{ID: "c1", User: "u", Lines: []stock.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 2}}}))
		must(r.HoldMany(ctx, stock.Cart{ID: "c2", Lines: []stock.Line{{SKU: "B", Qty: 1}}}, time.Minute))
		store := memstore.New()
		require.NoError(t, store.Load(ctx, "A", 3))
		require.NoError(t, store.Load(ctx, "B", 3))
		relay, err := stockops.NewRelay(r, store, nil, &stock.RelayOptions{Items: []string{"A"}})
		require.NoError(t, err)
		// The relay runs in a loop of its own: its batch span is a child of the loop's span,
		// and the claims that look for events (before a batch starts) stay under the loop.
		lctx, loop := e.tp.Tracer("app").Start(context.Background(), "relay-loop")
		must(relay.Once(lctx))
		loop.End()
		rec, err := stockops.NewReconciler(r, store, &stock.ReconcileOptions{Items: []string{"A"}, DryRun: true})
		require.NoError(t, err)
		must(rec.Once(ctx))
		e.parent.End()

		type want struct{ name, outcome, replayed, units string }
		wants := []want{
			{"stock.deduct", "ok", "false", "2"},
			{"stock.deduct", "ok", "true", "2"},
			{"stock.deduct", "insufficient", "false", ""},
			{"stock.hold", "ok", "false", "1"},
			{"stock.extend", "ok", "false", ""},
			{"stock.confirm", "ok", "false", "1"},
			{"stock.restore", "ok", "false", "2"},
			{"stock.restock", "ok", "false", "5"},
			{"stock.hold", "ok", "false", "1"},
			{"stock.cancel", "ok", "false", "1"},
			{"stock.deduct_many", "ok", "false", "3"},
			{"stock.hold_many", "ok", "false", "1"},
			{"stock.relay", "ok", "", ""},
			{"stock.reconcile", "ok", "", ""},
		}
		spans := e.ours()
		require.Len(t, spans, len(wants), "one span per operation")
		parent := e.parent.SpanContext()
		for i, w := range wants {
			s := spans[i]
			a := attrs(s)
			assert.Equal(t, w.name, s.Name(), "span %d", i)
			caller := parent
			if w.name == "stock.relay" {
				caller = loop.SpanContext()
			}
			assert.Equal(t, caller.SpanID(), s.Parent().SpanID(), "%s: a child of the caller's span", w.name)
			assert.Equal(t, caller.TraceID(), s.SpanContext().TraceID(), w.name)
			assert.Equal(t, trace.SpanKindInternal, s.SpanKind(), w.name)
			assert.Equal(t, strings.TrimPrefix(w.name, "stock."), a["stock.op"], w.name)
			assert.Equal(t, w.outcome, a["stock.outcome"], w.name)
			if w.replayed != "" {
				assert.Equal(t, w.replayed, a["stock.replayed"], "%s %d", w.name, i)
			}
			if w.units != "" {
				assert.Equal(t, w.units, a["stock.units"], "%s %d", w.name, i)
			}
			assert.NotContains(t, a, "stock.sku", "%s: no item unless asked for", w.name)
			assert.Equal(t, codes.Unset, s.Status().Code, "%s: an answer is not a failure", w.name)
			assert.False(t, s.EndTime().Before(s.StartTime()), w.name)
		}
		relaySpan, recSpan := attrs(spans[12]), attrs(spans[13])
		assert.NotEmpty(t, relaySpan["stock.relay.delivered"])
		assert.Equal(t, "0", recSpan["stock.reconcile.drift"])

		// The Redis commands of an operation are the children of its span.
		children := map[trace.SpanID][]string{}
		for _, s := range e.sr.Ended() {
			if s.InstrumentationScope().Name == "redis" {
				children[s.Parent().SpanID()] = append(children[s.Parent().SpanID()], s.Name())
			}
		}
		for i, s := range spans {
			if (s.Name() == "stock.reconcile" || s.Name() == "stock.relay") && len(children[s.SpanContext().SpanID()]) == 0 {
				t.Errorf("span %d %s has no Redis command under it", i, s.Name())
			}
			if s.Name() == "stock.deduct" || s.Name() == "stock.confirm" {
				// FCALL where the server has functions, EVALSHA or EVAL where it has not.
				assert.Regexp(t, `\b(FCALL|EVALSHA|EVAL)\b`, strings.Join(children[s.SpanContext().SpanID()], " "), "%s %d: its script call is its child", s.Name(), i)
			}
		}
		assert.NotContains(t, children, parent.SpanID(), "no Redis command of an operation is left directly under the caller's span")
	})
}

// With WithSKUAttribute the spans carry the item; a failure of unknown outcome sets the
// status to Error.
func TestSpansSKUAndError(t *testing.T) {
	m, c := redistest.Miniredis(t)
	e := newTraceEnv(t, c, stockotel.WithSKUAttribute(true))
	require.NoError(t, e.r.Load(e.ctx, "A", 3))
	_, err := e.r.Deduct(e.ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1})
	require.NoError(t, err)
	m.Close()
	ctx, cancel := context.WithTimeout(e.ctx, 200*time.Millisecond)
	defer cancel()
	_, err = e.r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", Qty: 1})
	require.Error(t, err)
	spans := e.ours()
	require.Len(t, spans, 2)
	assert.Equal(t, "A", attrs(spans[0])["stock.sku"])
	assert.Equal(t, codes.Unset, spans[0].Status().Code)
	out := attrs(spans[1])["stock.outcome"]
	assert.Contains(t, []string{"error", "timeout"}, out)
	assert.Equal(t, codes.Error, spans[1].Status().Code)
	assert.Equal(t, out, spans[1].Status().Description)
}

// Without WithTracerProvider, Start hands the context back unchanged and no span is recorded.
func TestNoTracer(t *testing.T) {
	obs, err := stockotel.New(sdkmetric.NewMeterProvider())
	require.NoError(t, err)
	ctx := context.WithValue(context.Background(), ctxKey{}, 1)
	assert.Equal(t, ctx, obs.Start(ctx, "deduct", "A"))
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	obs2, err := stockotel.New(sdkmetric.NewMeterProvider(), stockotel.WithTracerProvider(tp))
	require.NoError(t, err)
	// An observation whose op Start did not open ends no span (not even the caller's).
	pctx, parent := tp.Tracer("app").Start(context.Background(), "p")
	sctx := obs2.Start(pctx, "cart", "")
	obs2.Observe(sctx, stock.Observation{Op: "deduct", SKU: "A", Outcome: "ok"})
	obs2.Observe(pctx, stock.Observation{Op: "deduct", SKU: "A", Outcome: "ok"})
	assert.Empty(t, sr.Ended())
	parent.End()
}

type ctxKey struct{}
