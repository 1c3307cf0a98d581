package engine

import "github.com/stockres/stock/internal/errs"

// ErrRefused is returned by a Store whose database of record cannot cover a deduct (its
// remaining stock is lower than the quantity). The relay and Consume then give the stock back
// in Redis, once, and publish an EventRefused. An item the store does not know is not a
// refusal: its Apply answers ErrNotLoaded (see Store).
var ErrRefused = errs.ErrRefused

// ErrHeldBack is returned by Consume for an event it did not apply, because it must not be
// applied yet: a reconcile pass holds the item, or an earlier event of the item (in the item's
// sequence, Event.Seq) is not applied and Consume cannot apply it first (its ledger entry is
// gone from Redis, so only its own message can tell what it was; or too many are waiting).
// Nothing was changed for the event: have the queue deliver it again later (a negative
// acknowledgement with a short delay).
var ErrHeldBack = errs.ErrHeldBack
