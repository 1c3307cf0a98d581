package stocktype

import "fmt"

// A Line is one item of a cart.
type Line struct {
	SKU string
	Qty int64
}

// Cart asks to take several items at once, all or nothing, exactly once per ID.
type Cart struct {
	ID    string // the idempotency key of the whole cart; each item's ledger records it
	User  string // the per-user limit applies per item; optional unless WithUserRequired
	Lines []Line // lines naming the same item are summed before any check
}

// CartReceipt is the outcome of a cart: one receipt per item, in SKU order.
type CartReceipt struct {
	ID    string
	Items []Receipt
	// Replayed is false for the one call that completed the cart (of concurrent copies of a
	// cart id, exactly one), true for every other answer of a taken cart.
	Replayed bool
}

// A CartError says which line refused a cart; the lines taken before it were given back.
type CartError struct {
	SKU string // the item that refused
	Err error  // why: ErrSoldOut, ErrInsufficient, ErrUserLimit, ...
}

// Error says which item refused the cart and why.
func (e *CartError) Error() string { return fmt.Sprintf("stock: cart refused by %s: %v", e.SKU, e.Err) }

// Unwrap returns the item's error, so errors.Is(err, ErrSoldOut) works on a cart's error.
func (e *CartError) Unwrap() error { return e.Err }
