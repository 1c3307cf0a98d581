package engine

import (
	"context"
	"iter"
	"time"
)

// Of returns the engine of a *stock.Reserver (package stock sets it): package stockops reaches
// the operations below through it, so that they stay out of package stock's API, which most
// callers use alone. It panics when r is not a *stock.Reserver.
var Of func(r any) *Reserver

// The operations package stockops runs by hand, documented there: each is refused with
// ErrReserverClosed once Close began.

// NewRelay is stockops.NewRelay.
func (r *Reserver) NewRelay(store Store, pub Publisher, opts *RelayOptions) (*Relay, error) {
	if r.isClosed() {
		return nil, ErrReserverClosed
	}
	return r.newRelay(store, pub, opts)
}

// NewReconciler is stockops.NewReconciler.
func (r *Reserver) NewReconciler(store Store, opts *ReconcileOptions) (*Reconciler, error) {
	if r.isClosed() {
		return nil, ErrReserverClosed
	}
	return r.newReconciler(store, opts)
}

// NewFailoverGuard is stockops.NewFailoverGuard.
func (r *Reserver) NewFailoverGuard() *FailoverGuard { return r.newFailoverGuard() }

// Pending is stockops.Pending.
func (r *Reserver) Pending(ctx context.Context, sku string) (pending, dead int64, err error) {
	if err := r.enter(); err != nil {
		return 0, 0, err
	}
	defer r.calls.Leave()
	return r.pendingCounts(ctx, sku)
}

// Items is stockops.Items.
func (r *Reserver) Items(ctx context.Context) iter.Seq2[string, error] { return r.items(ctx) }

// Entries is stockops.Entries.
func (r *Reserver) Entries(ctx context.Context, sku string) iter.Seq2[Entry, error] {
	return r.entries(ctx, sku)
}

// Sweep is stockops.Sweep.
func (r *Reserver) Sweep(ctx context.Context, skus ...string) (int64, error) {
	if err := r.enter(); err != nil {
		return 0, err
	}
	defer r.calls.Leave()
	return r.sweepItems(ctx, skus...)
}

// RecoverCarts is stockops.RecoverCarts.
func (r *Reserver) RecoverCarts(ctx context.Context, olderThan time.Duration) (int, error) {
	if err := r.enter(); err != nil {
		return 0, err
	}
	defer r.calls.Leave()
	return r.recoverCarts(ctx, olderThan)
}

// Refuse is stockops.Refuse.
func (r *Reserver) Refuse(ctx context.Context, sku, id string) (Receipt, error) {
	if err := r.enter(); err != nil {
		return Receipt{SKU: sku, ID: id}, err
	}
	defer r.calls.Leave()
	return r.refuse(ctx, sku, id)
}

// SoldOutAnswers is stockops.SoldOutAnswers.
func (r *Reserver) SoldOutAnswers() int64 { return r.soldOutAnswers() }
