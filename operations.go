package stock

import (
	"context"
	"iter"
	"time"

	"github.com/stockres/stock/internal/ops"
)

// Package stockops runs and inspects the background work by hand (relays, reconcilers, guards,
// sweeps, the ledger's entries); it reaches a Reserver's operations through ops.Of, so that
// they stay out of this package's API, which most callers use alone.
func init() {
	ops.Of = func(r any) ops.Ops { return operations{r.(*Reserver)} }
}

type operations struct{ r *Reserver }

func (o operations) NewRelay(store, pub, opts any) (ops.Relay, error) {
	s, _ := store.(Store)
	p, _ := pub.(Publisher)
	op, _ := opts.(*RelayOptions)
	if o.r.isClosed() {
		return nil, ErrReserverClosed
	}
	rl, err := o.r.newRelay(s, p, op)
	if err != nil {
		return nil, err
	}
	return rl, nil
}

func (o operations) NewReconciler(store, opts any) (ops.Reconciler, error) {
	s, _ := store.(Store)
	op, _ := opts.(*ReconcileOptions)
	if o.r.isClosed() {
		return nil, ErrReserverClosed
	}
	rc, err := o.r.newReconciler(s, op)
	if err != nil {
		return nil, err
	}
	return rc, nil
}

func (o operations) NewFailoverGuard() ops.Guard { return o.r.newFailoverGuard() }

func (o operations) Pending(ctx context.Context, sku string) (int64, int64, error) {
	if err := o.r.enter(); err != nil {
		return 0, 0, err
	}
	defer o.r.calls.Leave()
	return o.r.pendingCounts(ctx, sku)
}

func (o operations) Items(ctx context.Context) iter.Seq2[string, error] { return o.r.items(ctx) }

func (o operations) Entries(ctx context.Context, sku string) any { return o.r.entries(ctx, sku) }

func (o operations) Sweep(ctx context.Context, skus ...string) (int64, error) {
	if err := o.r.enter(); err != nil {
		return 0, err
	}
	defer o.r.calls.Leave()
	return o.r.sweepItems(ctx, skus...)
}

func (o operations) RecoverCarts(ctx context.Context, olderThan time.Duration) (int, error) {
	if err := o.r.enter(); err != nil {
		return 0, err
	}
	defer o.r.calls.Leave()
	return o.r.recoverCarts(ctx, olderThan)
}

func (o operations) Refuse(ctx context.Context, sku, id string) (any, error) {
	if err := o.r.enter(); err != nil {
		return Receipt{SKU: sku, ID: id}, err
	}
	defer o.r.calls.Leave()
	return o.r.refuse(ctx, sku, id)
}

func (o operations) SoldOutAnswers() int64 { return o.r.soldOutAnswers() }
