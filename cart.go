package stock

import (
	"context"
	"time"

	"github.com/stockres/stock/stocktype"
)

// A Line is one item of a cart. Its fields are documented in [stocktype.Line].
type Line = stocktype.Line

// Cart asks to take several items at once, all or nothing, exactly once per ID.
// Its fields are documented in [stocktype.Cart].
type Cart = stocktype.Cart

// CartReceipt is the outcome of a cart: one receipt per item, in SKU order.
// Its fields are documented in [stocktype.CartReceipt].
type CartReceipt = stocktype.CartReceipt

// A CartError says which line refused a cart; the lines taken before it were given back.
// Its fields and methods are documented in [stocktype.CartError].
type CartError = stocktype.CartError

// DeductMany takes every line of a cart or none. A cart has 1 to 100 lines; lines naming the
// same item are summed first (two lines of one item must not each pass their own check).
//
// Items live in different Redis Cluster slots, so a cart is a saga: a log record of the cart
// (its kind, user and lines; one slot shared by all carts) is written first, then each item is
// taken under the cart's id, in SKU order; when an item refuses, the cart is recorded as undone,
// the items already taken are given back and the error is a *CartError wrapping the item's
// refusal. A cart id has one outcome, decided once by whichever copy of the cart gets there
// first, and every copy, concurrent or later, answers it:
//   - taken: a retry answers the cart's receipts, Replayed, and never takes or gives back
//     anything, even if one of its lines was restored since; for a cart of holds (HoldMany) the
//     retry answers the holds' state, as Hold does: the receipts while every hold is live or
//     confirmed, else a *CartError wrapping ErrExpired or ErrRestored for the first line whose
//     hold expired or was cancelled (still giving nothing back);
//   - undone: a retry gives back whatever is left and answers the *CartError that undid the cart
//     (ErrRestored when cart recovery undid it).
//
// The same id with other lines, another kind or another user is ErrConflict and changes
// nothing: one user's cart id can never reach another user's cart. The undo gives back only
// entries that are the cart's own line (same kind, quantity and user) and tombstones the lines
// not taken, so a slow copy of the saga cannot take them later. Carts whose process died
// mid-saga and that nobody retries are undone by cart recovery (Reserver.Run, or stockops.RecoverCarts).
//
// A line of an item split over buckets (WithBuckets) is taken as a Deduct or a Hold of it is, in
// its buyer's bucket (the cart id's without a buyer): it refuses the cart for stock only when
// the buckets together could not serve it. The undo gives it back in the bucket it was taken
// in; a line never taken gets its tombstone in the bucket the cart id is claimed for, so a slow
// copy of the saga is refused there too (ErrRestored). Such a cart is always a saga.
//
// With WithGroups, a cart whose items are all in one group is taken by one script instead,
// atomically and with no cart log: every line or nothing. Its refusal changes nothing and, as
// for Deduct, records nothing, so a later copy may be taken if stock came back; a retry of a
// cart whose every line is still this cart's entry answers Replayed. Such a cart is checked
// against the id's entries in its own items only: give every cart an id of its own (an order id),
// as a one-script cart and a saga cart over other items under one id are not seen as a conflict.
func (r *Reserver) DeductMany(ctx context.Context, c Cart) (CartReceipt, error) {
	return r.e.DeductMany(ctx, c)
}

// HoldMany holds every line of a cart until now + ttl, or none, like DeductMany. Confirm or
// Cancel the items with ConfirmMany or CancelMany under the cart's id.
func (r *Reserver) HoldMany(ctx context.Context, c Cart, ttl time.Duration) (CartReceipt, error) {
	return r.e.HoldMany(ctx, c, ttl)
}

// ConfirmMany confirms the holds of a cart's items, in SKU order. A hold that expired makes it
// return ErrExpired after cancelling the others: a cart is confirmed whole or not at all...
// except when a confirm fails for an unknown outcome, which a retry resolves. A retry of a cart
// undone because a hold expired answers ErrExpired again.
func (r *Reserver) ConfirmMany(ctx context.Context, id string, skus ...string) ([]Receipt, error) {
	return r.e.ConfirmMany(ctx, id, skus...)
}

// CancelMany cancels the holds of a cart's items.
func (r *Reserver) CancelMany(ctx context.Context, id string, skus ...string) ([]Receipt, error) {
	return r.e.CancelMany(ctx, id, skus...)
}
