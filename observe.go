package stock

import (
	"github.com/stockres/stock/internal/engine"
	"github.com/stockres/stock/stocktype"
)

// An Observation describes one finished operation, for metrics and traces.
// Its fields are documented in [stocktype.Observation].
type Observation = stocktype.Observation

// An Observer receives an Observation after every operation. Observe is called synchronously
// on the caller's goroutine: it must be fast and safe for concurrent use. The stockotel
// package adapts it to OpenTelemetry metrics and traces.
// Its methods are documented in [stocktype.Observer].
type Observer = stocktype.Observer

// A StartObserver is an Observer that is also told when an operation starts, for tracing.
// Start is called first, with the caller's context; the operation then runs on the context
// Start returns (its Redis commands included, so a span Start opens there is the parent of the
// spans a traced Redis client records) and passes that same context to Observe when it ends,
// where the span can be ended. Every operation that calls Start calls Observe once, on every
// path. Start is called synchronously on the caller's goroutine, like Observe.
//
// The ops that call Start are the ones with a duration: deduct, hold, confirm, cancel, extend,
// restore, restock, deduct_many, hold_many, relay (one batch of an item) and reconcile (one
// item). Its methods are documented in [stocktype.StartObserver].
type StartObserver = stocktype.StartObserver

// ObserverFunc adapts a function to the Observer interface.
// It is defined, with its method, in [stocktype.ObserverFunc].
type ObserverFunc = stocktype.ObserverFunc

// WithObserver sets an observer of every operation. The default observes nothing.
func WithObserver(o Observer) Option {
	return engine.WithObserver(o)
}
