package engine

import (
	"context"
	"errors"
	"time"
)

// An Observation describes one finished operation, for metrics and traces.
type Observation struct {
	// Op is the operation: "deduct", "hold", "restore", "cancel", "confirm", "extend",
	// "restock", "deduct_many" and "hold_many" (a cart; SKU is ""), "load", "sweep", "relay"
	// (one delivered batch of an item), "reconcile" (one item).
	Op string
	// SKU is the item ("" when the input was invalid before an item was known).
	SKU string
	// Outcome is Outcome(err) of the operation; for "relay", "ok" or "error"; for "reconcile",
	// "ok", "error" or "busy" (a relay held the item: nothing was compared).
	Outcome string
	// Replayed is set for an operation answered as a replay.
	Replayed bool
	// Local is set for a deduct or hold answered "sold_out" in-process by the sold-out fast
	// path (WithSoldOutCache), without a round trip to Redis.
	Local bool
	// Duration is how long the call took, Redis round trips included.
	Duration time.Duration
	// Units: the quantity taken or given back (for a cart, of all its lines); for "relay", the
	// events delivered; for
	// "reconcile", the drift found; for "sweep", the units released.
	Units int64
	// Lag, for "relay": how long the oldest delivered event had waited in the outbox (by the
	// Redis clock of its ledger entry against this process's clock).
	Lag time.Duration
}

// An Observer receives an Observation after every operation. Observe is called synchronously
// on the caller's goroutine: it must be fast and safe for concurrent use. The stockotel
// package adapts it to OpenTelemetry metrics and traces.
type Observer interface {
	Observe(ctx context.Context, o Observation)
}

// A StartObserver is an Observer that is also told when an operation starts, for tracing.
// Start is called first, with the caller's context; the operation then runs on the context
// Start returns (its Redis commands included, so a span Start opens there is the parent of the
// spans a traced Redis client records) and passes that same context to Observe when it ends,
// where the span can be ended. Every operation that calls Start calls Observe once, on every
// path. Start is called synchronously on the caller's goroutine, like Observe.
//
// The ops that call Start are the ones with a duration: deduct, hold, confirm, cancel, extend,
// restore, restock, deduct_many, hold_many, relay (one batch of an item) and reconcile (one
// item).
type StartObserver interface {
	Observer
	Start(ctx context.Context, op, sku string) context.Context
}

// ObserverFunc adapts a function to the Observer interface.
type ObserverFunc func(ctx context.Context, o Observation)

// Observe calls f(ctx, o).
func (f ObserverFunc) Observe(ctx context.Context, o Observation) { f(ctx, o) }

// WithObserver sets an observer of every operation. The default observes nothing.
func WithObserver(o Observer) Option {
	return func(opts *options) error {
		if o == nil {
			return invalid("nil observer")
		}
		opts.observer = o
		return nil
	}
}

var outcomeNames = []struct {
	err  error
	name string
}{
	{ErrSoldOut, "sold_out"}, {ErrInsufficient, "insufficient"}, {ErrNotLoaded, "not_loaded"},
	{ErrLoaded, "loaded"}, {ErrConflict, "conflict"}, {ErrRestored, "restored"},
	{ErrUserLimit, "user_limit"}, {ErrUnknownID, "unknown_id"}, {ErrClosed, "closed"},
	{ErrExpired, "expired"}, {ErrConfirmed, "confirmed"}, {ErrInvalid, "invalid"},
	{ErrRefused, "refused"}, {ErrFailover, "failover"}, {ErrNotReplicated, "not_replicated"},
	{ErrReserverClosed, "reserver_closed"}, {ErrEvictionPolicy, "eviction_policy"},
	{context.Canceled, "canceled"}, {context.DeadlineExceeded, "timeout"},
}

// Outcome names the outcome an error stands for, as a short label for metrics: "ok" for nil,
// "sold_out", "insufficient", "not_loaded", "loaded", "conflict", "restored", "user_limit",
// "unknown_id", "closed", "expired", "confirmed", "invalid", "refused", "failover"
// (ErrFailover: nothing was sent), "not_replicated" (ErrNotReplicated: the write was made),
// "reserver_closed" (ErrReserverClosed: nothing was sent) or
// "eviction_policy" (ErrEvictionPolicy: nothing was sent).
// An unknown outcome (ErrUnknownOutcome, or an error that wraps no sentinel) is "canceled" when
// the caller cancelled, "timeout" when the time ran out, and "error" otherwise.
func Outcome(err error) string {
	if err == nil {
		return "ok"
	}
	for _, o := range outcomeNames {
		if errors.Is(err, o.err) {
			return o.name
		}
	}
	return "error"
}

// observe reports an operation to the observer, if there is one.
func (r *Reserver) observe(ctx context.Context, op, sku string, start time.Time, rc Receipt, err error) {
	r.observeTake(ctx, op, sku, start, rc, err, false)
}

// observeTake is observe for deducts and holds, which the sold-out fast path may answer.
func (r *Reserver) observeTake(ctx context.Context, op, sku string, start time.Time, rc Receipt, err error, local bool) {
	if r.opts.observer == nil {
		return
	}
	r.opts.observer.Observe(ctx, Observation{Op: op, SKU: sku, Outcome: Outcome(err), Replayed: rc.Replayed,
		Local: local, Duration: time.Since(start), Units: rc.Qty})
}

// startOp tells a StartObserver that an operation starts and returns the context the
// operation runs on; without one it returns ctx.
func (r *Reserver) startOp(ctx context.Context, op, sku string) context.Context {
	if s, ok := r.opts.observer.(StartObserver); ok {
		return s.Start(ctx, op, sku)
	}
	return ctx
}

// observeCart runs a cart operation (op "deduct_many" or "hold_many") and observes it.
func (r *Reserver) observeCart(ctx context.Context, op string, c Cart, f func(context.Context) (CartReceipt, error)) (CartReceipt, error) {
	if r.opts.observer == nil {
		return f(ctx)
	}
	start := time.Now()
	ctx = r.startOp(ctx, op, "")
	cr, err := f(ctx)
	var units int64
	for _, l := range c.Lines {
		units += l.Qty
	}
	r.opts.observer.Observe(ctx, Observation{Op: op, Outcome: Outcome(err), Replayed: cr.Replayed,
		Duration: time.Since(start), Units: units})
	return cr, err
}

// observeBatch reports one relay batch of an item: its events delivered, the wait of the
// oldest of them, and "error" when the batch stopped at a failure.
func (rl *Relay) observeBatch(ctx context.Context, sku string, start time.Time, cs []claimed, st relayStats, err error) {
	var oldest time.Time
	for _, c := range cs[:min(len(cs), st.Delivered+st.Orphaned)] {
		if c.ok && (oldest.IsZero() || c.ev.At.Before(oldest)) {
			oldest = c.ev.At
		}
	}
	ob := Observation{Op: "relay", SKU: sku, Outcome: "ok", Units: int64(st.Delivered), Duration: time.Since(start)}
	if err != nil {
		ob.Outcome = "error"
	}
	if !oldest.IsZero() {
		ob.Lag = time.Since(oldest)
	}
	rl.r.opts.observer.Observe(ctx, ob)
}
