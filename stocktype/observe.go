package stocktype

import (
	"context"
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

// Observer is stock.Observer, documented there; its fields and methods are documented here.
type Observer interface {
	Observe(ctx context.Context, o Observation)
}

// StartObserver is stock.StartObserver, documented there; its fields and methods are documented here.
type StartObserver interface {
	Observer
	Start(ctx context.Context, op, sku string) context.Context
}

// ObserverFunc adapts a function to the Observer interface.
type ObserverFunc func(ctx context.Context, o Observation)

// Observe calls f(ctx, o).
func (f ObserverFunc) Observe(ctx context.Context, o Observation) { f(ctx, o) }
