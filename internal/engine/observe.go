package engine

import (
	"context"
	"errors"
	"time"
)

// WithObserver is stock.WithObserver.
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

// Outcome is stock.Outcome.
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
