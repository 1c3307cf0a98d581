package stock

import "github.com/stockres/stock/internal/engine"

// An Observation describes one finished operation, for metrics and traces.
type Observation = engine.Observation

// An Observer receives an Observation after every operation. Observe is called synchronously
// on the caller's goroutine: it must be fast and safe for concurrent use. The stockotel
// package adapts it to OpenTelemetry metrics and traces.
type Observer = engine.Observer

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
type StartObserver = engine.StartObserver

// ObserverFunc adapts a function to the Observer interface.
type ObserverFunc = engine.ObserverFunc

// WithObserver sets an observer of every operation. The default observes nothing.
func WithObserver(o Observer) Option {
	return engine.WithObserver(o)
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
	return engine.Outcome(err)
}
