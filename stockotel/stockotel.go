// Package stockotel turns the observations of a stock.Reserver, its Relays and Reconcilers
// into OpenTelemetry metrics and, with WithTracerProvider, spans. Wire it in with
// stock.WithObserver:
//
//	obs, err := stockotel.New(otel.GetMeterProvider(), stockotel.WithTracerProvider(otel.GetTracerProvider()))
//	if err != nil { ... }
//	r, err := stock.New(client, stock.WithObserver(obs))
//
// Relays and reconcilers made from r (by Reserver.Run, or stockops.NewRelay and
// stockops.NewReconciler) report through the same observer.
//
// # Traces
//
// With WithTracerProvider, every operation is one span of the tracer
// "github.com/stockres/stock", a child of the span in the caller's context: stock.deduct,
// stock.hold, stock.confirm, stock.cancel, stock.extend, stock.restore, stock.restock,
// stock.deduct_many and stock.hold_many (a cart), stock.relay (one batch of one item's outbox)
// and stock.reconcile (one item of a reconcile pass). The span starts before the operation's
// first Redis command and ends when it returns, and the operation runs on the span's context:
// with a traced Redis client (rueidisotel.NewClient), the EVALSHA, GET and other commands of
// the operation are children of its span. Attributes:
//
//	stock.op         the op ("deduct", ...)
//	stock.outcome    stock.Outcome's label ("ok", "sold_out", ...); relays and reconcilers "ok",
//	                 "error", or "busy" (a reconcile that found a relay holding the item)
//	stock.replayed   true when the call was answered as a replay of an earlier one
//	stock.local      true on a deduct or hold the sold-out fast path answered in-process
//	stock.units      the units moved (see stock.units below); for a cart, of all its lines
//	stock.relay.delivered, stock.relay.lag (seconds)   on stock.relay
//	stock.reconcile.drift                              on stock.reconcile (signed, in units)
//	stock.sku        the item, only with WithSKUAttribute(true), as for the metrics
//
// A refusal (sold_out, conflict, user_limit, ...) is an answer, not a failure: its span's status
// is left unset. The status is Error, with the outcome as its description, for "error",
// "timeout" and "canceled" (the outcome is unknown: retry with the same id), "failover" (the
// Reserver is fenced after a failover), "eviction_policy" (Redis may evict keys: writes are
// refused), "not_replicated" (written, but not acknowledged by enough replicas) and for a relay batch or a reconcile that failed. Load, sweep and the reads (Levels, Ledger, ...) record no
// span.
//
// # Metrics
//
// All instruments come from the meter "github.com/stockres/stock":
//
//	name                      instrument        unit         attributes
//	stock.operations          Int64Counter      {operation}  stock.op, stock.outcome, stock.replayed[, stock.local]
//	stock.operation.duration  Float64Histogram  s            stock.op, stock.outcome
//	stock.units               Int64Counter      {unit}       stock.op
//	stock.relay.batches       Int64Counter      {batch}      stock.outcome
//	stock.relay.delivered     Int64Counter      {event}      (none)
//	stock.relay.lag           Float64Histogram  s            (none)
//	stock.reconcile.passes    Int64Counter      {item}       stock.outcome
//	stock.reconcile.drift     Int64Histogram    {unit}       stock.drift.sign
//
// What each records:
//
//   - stock.operations: one per Reserver call (every op but relay and reconcile).
//   - stock.operation.duration: the time of every Reserver call, and of the reconcile of one
//     item (stock.op "reconcile"); Redis round trips included.
//   - stock.units: the units a successful, not replayed call moved (see below).
//   - stock.relay.batches: one per batch a relay delivered from one item's outbox; outcome
//     "error" when an event of it failed and the item backs off.
//   - stock.relay.delivered: events applied, published and removed from the outbox.
//   - stock.relay.lag: per batch, how long its oldest delivered event had waited in the outbox.
//   - stock.reconcile.passes: one per item a reconciler looked at (an item a relay kept busy
//     counts as "ok" with no drift).
//   - stock.reconcile.drift: per item reconciled without error, the absolute drift between
//     Redis and the store, in units.
//
// Attribute values:
//
//   - stock.op: stock.Observation.Op: "deduct", "hold", "confirm", "cancel", "extend",
//     "restore", "restock", "deduct_many", "hold_many" (carts), "load", "sweep" (only the ones
//     the Reserver reports appear), and "reconcile" on stock.operation.duration.
//   - stock.outcome: stock.Outcome's labels: "ok", "sold_out", "insufficient", "not_loaded",
//     "loaded", "conflict", "restored", "user_limit", "unknown_id", "closed", "expired",
//     "confirmed", "invalid", "refused", "failover" (fenced: nothing sent), "eviction_policy"
//     (Redis may evict keys: nothing sent), "not_replicated" (written, too few replicas
//     acknowledged), and for an unknown outcome (retry with the same
//     id) "canceled", "timeout" or "error". Relays and reconcilers report "ok" or "error".
//   - stock.replayed: true when the call was answered as a replay of an earlier one.
//   - stock.local: present (true) only on deducts and holds answered "sold_out" in-process by
//     the sold-out fast path (stock.WithSoldOutCache), without a round trip to Redis.
//   - stock.drift.sign: "positive" (Redis would sell more than the Store has), "negative"
//     (Redis would sell less) or "zero". A reconcile that failed records no drift.
//   - stock.sku: the item, on every instrument, only with WithSKUAttribute(true).
//
// stock.units counts what the op moved: for deduct and hold, units taken (for deduct_many and
// hold_many, of all the cart's lines); restore and
// cancel, units given back; confirm, held units made final; restock, units added; sweep,
// expired units released; load, units loaded. Extend moves nothing and is not counted, nor are
// replays and failed calls. Read it per stock.op: the ops move stock in different directions.
//
// Histogram buckets are advice, which an SDK View may override: operation durations from
// 100µs to 10s, relay lag from 10ms to 1h, drift from 0 to 100,000 units.
//
// # Cardinality and cost
//
// Without WithSKUAttribute the attribute sets are bounded by the ops and outcomes above (a few
// hundred series at most), whatever the number of items. stock.sku multiplies them by the
// number of items: turn it on only for a catalogue of a few hundred items, or behind a View
// that filters it; the observer also keeps one cache entry per item and attribute combination.
//
// Observe runs on the caller's goroutine after every operation. It builds no attribute set
// on the hot path: the sets of every combination seen are built once and cached (in a
// sync.Map), so an observation costs a cache lookup and the SDK's own aggregation.
package stockotel

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/stockres/stock"
)

// MeterName is the name of the meter the instruments are created on.
const MeterName = "github.com/stockres/stock"

// TracerName is the name of the tracer the spans are created on.
const TracerName = "github.com/stockres/stock"

// Attribute keys.
const (
	AttrOp        = attribute.Key("stock.op")
	AttrOutcome   = attribute.Key("stock.outcome")
	AttrReplayed  = attribute.Key("stock.replayed")
	AttrLocal     = attribute.Key("stock.local")
	AttrDriftSign = attribute.Key("stock.drift.sign")
	AttrSKU       = attribute.Key("stock.sku")

	// Span attributes only.
	AttrUnits     = attribute.Key("stock.units")
	AttrDelivered = attribute.Key("stock.relay.delivered")
	AttrLag       = attribute.Key("stock.relay.lag")
	AttrDrift     = attribute.Key("stock.reconcile.drift")
)

// Ops reported by relays and reconcilers.
const (
	opRelay     = "relay"
	opReconcile = "reconcile"
	opExtend    = "extend"
)

// An Option configures an Observer.
type Option func(*config)

type config struct {
	sku bool
	tp  trace.TracerProvider
}

// WithSKUAttribute adds the item (stock.sku) to every measurement. The default is false: an
// attribute per item multiplies the series by the catalogue's size (see the package doc).
func WithSKUAttribute(on bool) Option {
	return func(c *config) { c.sku = on }
}

// WithTracerProvider records a span per operation on tp's tracer "github.com/stockres/stock"
// (see Traces in the package doc). The default records no span.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// Observer is a stock.StartObserver that records OpenTelemetry metrics and, with
// WithTracerProvider, spans. It is safe for concurrent use. Create one with New.
type Observer struct {
	sku    bool
	tracer trace.Tracer // nil: no spans

	ops       metric.Int64Counter
	duration  metric.Float64Histogram
	units     metric.Int64Counter
	batches   metric.Int64Counter
	delivered metric.Int64Counter
	lag       metric.Float64Histogram
	passes    metric.Int64Counter
	drift     metric.Int64Histogram

	cache sync.Map // key -> *sets
}

var _ stock.StartObserver = (*Observer)(nil)

// key identifies one combination of attribute values.
type key struct {
	op, outcome, sku string
	replayed, local  bool
	sign             int8 // reconcile: the drift's sign
}

// sets are the measurement options of one key, built once. Which instrument each serves
// depends on the op (see Observe).
type sets struct {
	count []metric.AddOption    // operations | relay.batches | reconcile.passes
	dur   []metric.RecordOption // operation.duration
	units []metric.AddOption    // units | relay.delivered
	value []metric.RecordOption // relay.lag | reconcile.drift
}

// Bucket boundaries, as advice to the SDK.
var (
	durationBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	lagBuckets      = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}
	driftBuckets    = []float64{0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10000, 100000}
)

// New creates the instruments on mp's meter "github.com/stockres/stock" and returns an
// observer that records to them.
func New(mp metric.MeterProvider, opts ...Option) (*Observer, error) {
	if mp == nil {
		return nil, fmt.Errorf("stockotel: nil meter provider")
	}
	var c config
	for _, o := range opts {
		o(&c)
	}
	m := mp.Meter(MeterName)
	o := &Observer{sku: c.sku}
	if c.tp != nil {
		o.tracer = c.tp.Tracer(TracerName)
	}
	// Each instrument is created even after another failed; their errors are joined.
	var errs [8]error
	o.ops, errs[0] = m.Int64Counter("stock.operations", metric.WithUnit("{operation}"),
		metric.WithDescription("Reserver calls, by op, outcome and whether the call was a replay."))
	o.duration, errs[1] = m.Float64Histogram("stock.operation.duration", metric.WithUnit("s"),
		metric.WithDescription("How long a Reserver call (or the reconcile of one item) took, Redis round trips included."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	o.units, errs[2] = m.Int64Counter("stock.units", metric.WithUnit("{unit}"),
		metric.WithDescription("Units of stock moved by successful calls: taken (deduct, hold), given back (restore, cancel), confirmed, restocked, released (sweep), loaded."))
	o.batches, errs[3] = m.Int64Counter("stock.relay.batches", metric.WithUnit("{batch}"),
		metric.WithDescription("Outbox batches a relay delivered for one item; outcome error when an event failed and the item backs off."))
	o.delivered, errs[4] = m.Int64Counter("stock.relay.delivered", metric.WithUnit("{event}"),
		metric.WithDescription("Outbox events delivered to the store and publisher and removed from the outbox."))
	o.lag, errs[5] = m.Float64Histogram("stock.relay.lag", metric.WithUnit("s"),
		metric.WithDescription("How long the oldest event of a delivered batch waited in the outbox."),
		metric.WithExplicitBucketBoundaries(lagBuckets...))
	o.passes, errs[6] = m.Int64Counter("stock.reconcile.passes", metric.WithUnit("{item}"),
		metric.WithDescription("Items a reconciler compared with the store, by outcome."))
	o.drift, errs[7] = m.Int64Histogram("stock.reconcile.drift", metric.WithUnit("{unit}"),
		metric.WithDescription("Absolute drift between Redis and the store found per reconciled item; stock.drift.sign says which way."),
		metric.WithExplicitBucketBoundaries(driftBuckets...))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, fmt.Errorf("stockotel: %w", err)
	}
	return o, nil
}

// spanKey is the context key of the span Start opened.
type spanKey struct{}

// opSpan is a span Start opened, with the op it was opened for.
type opSpan struct {
	span trace.Span
	op   string
}

// Start opens the operation's span, a child of the span in ctx, and returns the context that
// carries it (see Traces in the package doc). Without WithTracerProvider it returns ctx. It
// implements stock.StartObserver.
func (o *Observer) Start(ctx context.Context, op, sku string) context.Context {
	if o.tracer == nil {
		return ctx
	}
	attrs := []attribute.KeyValue{AttrOp.String(op)}
	if o.sku && sku != "" {
		attrs = append(attrs, AttrSKU.String(sku))
	}
	ctx, span := o.tracer.Start(ctx, "stock."+op, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	return context.WithValue(ctx, spanKey{}, &opSpan{span: span, op: op})
}

// endSpan ends the span Start opened for ob's operation, if there is one.
func (o *Observer) endSpan(ctx context.Context, ob stock.Observation) {
	os, ok := ctx.Value(spanKey{}).(*opSpan)
	if !ok || os.op != ob.Op {
		return // no span: an op Start was not called for (an observation of a parent op's context is not its span)
	}
	span := os.span
	attrs := []attribute.KeyValue{AttrOutcome.String(ob.Outcome)}
	switch ob.Op {
	case opRelay:
		attrs = append(attrs, AttrDelivered.Int64(ob.Units))
		if ob.Lag > 0 {
			attrs = append(attrs, AttrLag.Float64(ob.Lag.Seconds()))
		}
	case opReconcile:
		attrs = append(attrs, AttrDrift.Int64(ob.Units))
	default:
		attrs = append(attrs, AttrReplayed.Bool(ob.Replayed), AttrUnits.Int64(ob.Units))
		if ob.Local {
			attrs = append(attrs, AttrLocal.Bool(true))
		}
	}
	span.SetAttributes(attrs...)
	switch ob.Outcome {
	case "error", "timeout", "canceled", "failover", "not_replicated", "eviction_policy":
		span.SetStatus(codes.Error, ob.Outcome)
	}
	span.End()
}

// Observe records one observation and ends its span. It implements stock.Observer.
func (o *Observer) Observe(ctx context.Context, ob stock.Observation) {
	if o.tracer != nil {
		o.endSpan(ctx, ob)
	}
	k := key{op: ob.Op, outcome: ob.Outcome}
	if o.sku {
		k.sku = ob.SKU
	}
	switch ob.Op {
	case opRelay:
		s := o.sets(k)
		o.batches.Add(ctx, 1, s.count...)
		if ob.Units > 0 {
			o.delivered.Add(ctx, ob.Units, s.units...)
		}
		if ob.Lag > 0 {
			o.lag.Record(ctx, ob.Lag.Seconds(), s.value...)
		}
	case opReconcile:
		drift := ob.Units
		switch {
		case drift > 0:
			k.sign = 1
		case drift < 0:
			k.sign, drift = -1, -drift
		}
		s := o.sets(k)
		o.passes.Add(ctx, 1, s.count...)
		o.duration.Record(ctx, ob.Duration.Seconds(), s.dur...)
		if ob.Outcome == "ok" {
			o.drift.Record(ctx, drift, s.value...)
		}
	default:
		k.replayed, k.local = ob.Replayed, ob.Local
		s := o.sets(k)
		o.ops.Add(ctx, 1, s.count...)
		o.duration.Record(ctx, ob.Duration.Seconds(), s.dur...)
		if ob.Outcome == "ok" && !ob.Replayed && ob.Units > 0 && ob.Op != opExtend {
			o.units.Add(ctx, ob.Units, s.units...)
		}
	}
}

// sets returns the cached measurement options of k, building them on first use.
func (o *Observer) sets(k key) *sets {
	if v, ok := o.cache.Load(k); ok {
		return v.(*sets)
	}
	v, _ := o.cache.LoadOrStore(k, build(k))
	return v.(*sets)
}

func build(k key) *sets {
	with := func(kvs ...attribute.KeyValue) metric.MeasurementOption {
		if k.sku != "" {
			kvs = append(kvs, AttrSKU.String(k.sku))
		}
		return metric.WithAttributeSet(attribute.NewSet(kvs...))
	}
	both := func(m metric.MeasurementOption) ([]metric.AddOption, []metric.RecordOption) {
		return []metric.AddOption{m}, []metric.RecordOption{m}
	}
	s := &sets{}
	switch k.op {
	case opRelay:
		s.count = []metric.AddOption{with(AttrOutcome.String(k.outcome))}
		s.units, s.value = both(with())
	case opReconcile:
		outcome := with(AttrOutcome.String(k.outcome))
		s.count = []metric.AddOption{outcome}
		s.dur = []metric.RecordOption{with(AttrOp.String(k.op), AttrOutcome.String(k.outcome))}
		sign := "zero"
		switch k.sign {
		case 1:
			sign = "positive"
		case -1:
			sign = "negative"
		}
		s.value = []metric.RecordOption{with(AttrDriftSign.String(sign))}
	default:
		kvs := []attribute.KeyValue{AttrOp.String(k.op), AttrOutcome.String(k.outcome), AttrReplayed.Bool(k.replayed)}
		if k.local {
			kvs = append(kvs, AttrLocal.Bool(true))
		}
		s.count = []metric.AddOption{with(kvs...)}
		s.dur = []metric.RecordOption{with(AttrOp.String(k.op), AttrOutcome.String(k.outcome))}
		s.units = []metric.AddOption{with(AttrOp.String(k.op))}
	}
	return s
}
