package engine

import "github.com/stockres/stock/internal/errs"

// ErrRefused is stock.ErrRefused, documented there: a Store's answer to a deduct it cannot
// cover, on which the relay (relay.go) and Consume give the stock back in Redis.
var ErrRefused = errs.ErrRefused

// ErrHeldBack is stock.ErrHeldBack, documented there: Consume's answer (relay.go) for an event
// that must wait for a reconcile pass or for the item's earlier events.
var ErrHeldBack = errs.ErrHeldBack
