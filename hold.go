package stock

import (
	"context"
	"time"

	"github.com/stockres/stock/internal/engine"
)

// MaxHoldTTL is the longest time a hold may last before it must be extended.
const MaxHoldTTL = engine.MaxHoldTTL

// Hold takes req.Qty units like Deduct, but as held until now + ttl (by the Redis clock): the
// try of a try-confirm-cancel checkout. Confirm makes it final and only then queues it for the
// Store; Cancel gives it back; a hold past its deadline is released by Reserver.Run's sweeper, and also by the
// item's next Deduct, Hold, Confirm or Extend (at most 64 holds per call, and always the hold
// the call's own id names), so expiry is prompt even with no sweeper. A Deduct or Hold that
// would otherwise be refused for stock or for the per-user limit first releases up to 10,000
// due holds, so a refusal does not depend on how many holds are due.
//
// A repeat of the same id and parameters is a replay (of the hold, or of its confirmation);
// past the hold's deadline it is ErrExpired (and the hold is released, however many other holds
// are due), after a cancel ErrRestored. The errors are Deduct's.
func (r *Reserver) Hold(ctx context.Context, req Request, ttl time.Duration) (rc Receipt, err error) {
	return r.e.Hold(ctx, req, ttl)
}

// Confirm makes a live hold final: its units move from held to sold and an EventConfirmed is
// queued for the Store. A second Confirm is a replay. A hold past its deadline is refused with
// ErrExpired (and released, if the sweep had not yet); a cancelled one with ErrRestored; an id
// with no hold with ErrUnknownID; an id that is not a hold with ErrConflict. Like Deduct, it
// first releases the item's other holds past their deadline (at most 64).
func (r *Reserver) Confirm(ctx context.Context, sku, id string) (Receipt, error) {
	return r.e.Confirm(ctx, sku, id)
}

// Cancel gives a live hold back. A second Cancel, or a Cancel of a hold that already expired,
// is a replay. A Cancel of a confirmed hold is refused with ErrConfirmed (use Restore to give
// back a sale). A Cancel of an id that holds nothing returns ErrUnknownID and leaves a
// tombstone, so the hold it overtook is refused with ErrRestored.
func (r *Reserver) Cancel(ctx context.Context, sku, id string) (Receipt, error) {
	return r.e.Cancel(ctx, sku, id)
}

// Extend moves a live hold's deadline to now + ttl. ErrExpired past the deadline (the hold is
// released), ErrConfirmed after Confirm, ErrRestored after Cancel, ErrUnknownID for no hold.
// Like Deduct, it first releases the item's other holds past their deadline (at most 64).
func (r *Reserver) Extend(ctx context.Context, sku, id string, ttl time.Duration) (rc Receipt, err error) {
	return r.e.Extend(ctx, sku, id, ttl)
}
