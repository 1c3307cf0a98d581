package engine

import (
	"context"
	"time"
)

// unknownLogEvery is how often, at most, the events of one item held back because the Store
// does not know the item are logged.
const unknownLogEvery = time.Minute

// storeUnknown logs, at Error level and at most once per item per unknownLogEvery, that the
// Store does not know sku (its Apply answered ErrNotLoaded): a configuration error (the item was
// loaded in Redis and not in the database of record), not a refusal. The item's events stay in
// Redis, retried with backoff, until the item is loaded in the store; no sale is given back.
func (r *Reserver) storeUnknown(ctx context.Context, sku string, err error) {
	sku = parentOf(sku) // a bucket stands for its item
	now := r.opts.now()
	v, loaded := r.unknownAt.LoadOrStore(sku, now)
	if loaded {
		last := v.(time.Time)
		if d := now.Sub(last); d >= 0 && d < unknownLogEvery {
			return
		}
		if !r.unknownAt.CompareAndSwap(sku, last, now) {
			return // another goroutine logs it
		}
	}
	r.opts.logger.ErrorContext(ctx, "stock: the store does not know the item: its sales wait in Redis's outbox, retried with backoff, and none is given back; load the item in the store (its Load, or stockops.Preheat)",
		"sku", sku, "err", err)
}
