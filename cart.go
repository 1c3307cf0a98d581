package stock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A Line is one item of a cart.
type Line struct {
	SKU string
	Qty int64
}

// Cart asks to take several items at once, all or nothing, exactly once per ID.
type Cart struct {
	ID    string // the idempotency key of the whole cart; each item's ledger records it
	User  string // optional; the per-user limit applies per item
	Lines []Line // lines naming the same item are summed before any check
}

// CartReceipt is the outcome of a cart: one receipt per item, in SKU order.
type CartReceipt struct {
	ID       string
	Items    []Receipt
	Replayed bool // the cart had already been taken: nothing changed
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

// DeductMany takes every line of a cart or none. Lines of the same item are summed first (two
// lines of one item must not each pass their own check). Items live in different Redis Cluster
// slots, so a cart is a saga: a log record of the cart (one slot shared by all carts) is
// written first, then each item is deducted under the cart's id, in SKU order; when an item
// refuses, the items already taken are restored and the error is a *CartError wrapping the
// item's refusal. The saga is idempotent: a retry of the same cart id (after a timeout or a
// crash) replays the items already taken and finishes the cart, or, if the cart was undone,
// undoes whatever is left and returns ErrRestored; it never takes a second cart. Carts whose
// process died mid-saga and that nobody retries are undone by RecoverCarts.
func (r *Reserver) DeductMany(ctx context.Context, c Cart) (CartReceipt, error) {
	return r.cart(ctx, "D", c, 0)
}

// HoldMany holds every line of a cart until now + ttl, or none, like DeductMany. Confirm or
// Cancel the items with ConfirmMany or CancelMany under the cart's id.
func (r *Reserver) HoldMany(ctx context.Context, c Cart, ttl time.Duration) (CartReceipt, error) {
	if err := checkTTL(ttl); err != nil {
		return CartReceipt{ID: c.ID}, err
	}
	return r.cart(ctx, "H", c, ttl.Milliseconds())
}

// ConfirmMany confirms the holds of a cart's items, in SKU order. A hold that expired makes it
// return ErrExpired after cancelling the others: a cart is confirmed whole or not at all...
// except when a confirm fails for an unknown outcome, which a retry resolves.
func (r *Reserver) ConfirmMany(ctx context.Context, id string, skus ...string) ([]Receipt, error) {
	skus = sortedUnique(skus)
	var out []Receipt
	for i, sku := range skus {
		rc, err := r.Confirm(ctx, sku, id)
		if err != nil && (errors.Is(err, ErrExpired) || errors.Is(err, ErrRestored)) {
			// Undo: the confirmed ones are restored, the held ones cancelled.
			for _, s := range skus[:i] {
				if _, uerr := r.Restore(ctx, s, id); uerr != nil {
					return out, errors.Join(&CartError{SKU: sku, Err: err}, uerr)
				}
			}
			for _, s := range skus[i+1:] {
				if _, uerr := r.Cancel(ctx, s, id); uerr != nil && !errors.Is(uerr, ErrUnknownID) {
					return out, errors.Join(&CartError{SKU: sku, Err: err}, uerr)
				}
			}
			return out, &CartError{SKU: sku, Err: err}
		}
		if err != nil {
			return out, err
		}
		out = append(out, rc)
	}
	return out, nil
}

// CancelMany cancels the holds of a cart's items.
func (r *Reserver) CancelMany(ctx context.Context, id string, skus ...string) ([]Receipt, error) {
	var out []Receipt
	for _, sku := range sortedUnique(skus) {
		rc, err := r.Cancel(ctx, sku, id)
		if err != nil && !errors.Is(err, ErrUnknownID) {
			return out, err
		}
		out = append(out, rc)
	}
	return out, nil
}

func sortedUnique(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

// cartKeys: the carts hash and the pending zset, in one slot of their own.
func (r *Reserver) cartKeys() []string {
	base := r.opts.prefix + ":{~carts}"
	return []string{base, base + ":p"}
}

// sumLines checks a cart and sums its lines per item, in SKU order.
func sumLines(c Cart) ([]Line, error) {
	if err := checkName("id", c.ID); err != nil {
		return nil, err
	}
	if c.User != "" {
		if err := checkName("user", c.User); err != nil {
			return nil, err
		}
	}
	if len(c.Lines) == 0 || len(c.Lines) > 100 {
		return nil, invalid("a cart has 1 to 100 lines, not %d", len(c.Lines))
	}
	sum := map[string]int64{}
	for _, l := range c.Lines {
		if err := checkName("sku", l.SKU); err != nil {
			return nil, err
		}
		if err := checkQty(l.Qty); err != nil {
			return nil, err
		}
		sum[l.SKU] += l.Qty
		if sum[l.SKU] > MaxQty {
			return nil, invalid("item %s: %d units in all", l.SKU, sum[l.SKU])
		}
	}
	lines := make([]Line, 0, len(sum))
	for sku, q := range sum {
		lines = append(lines, Line{SKU: sku, Qty: q})
	}
	slices.SortFunc(lines, func(a, b Line) int { return cmp.Compare(a.SKU, b.SKU) })
	return lines, nil
}

func encodeLines(kind string, lines []Line) string {
	var b strings.Builder
	b.WriteString(kind)
	b.WriteByte('|')
	for i, l := range lines {
		if i > 0 {
			b.WriteByte('|') // '|' is the one separator no SKU may contain
		}
		b.WriteString(l.SKU)
		b.WriteByte(':')
		b.WriteString(strconv.FormatInt(l.Qty, 10))
	}
	return b.String()
}

func (r *Reserver) cartLog(ctx context.Context, args ...string) (int64, error) {
	code, _, err := decodePair(cartScript.Exec(ctx, r.client, r.cartKeys(), args))
	return code, err
}

func (r *Reserver) cart(ctx context.Context, kind string, c Cart, ttlMs int64) (CartReceipt, error) {
	out := CartReceipt{ID: c.ID}
	lines, err := sumLines(c)
	if err != nil {
		return out, err
	}
	if r.fenced.Load() {
		return out, ErrFailover
	}
	if g := r.group(lines[0].SKU); g != "" && len(lines) > 1 && !slices.ContainsFunc(lines, func(l Line) bool { return r.group(l.SKU) != g }) {
		return r.cartOneSlot(ctx, kind, c, lines, ttlMs)
	}
	code, err := r.cartLog(ctx, "begin", c.ID, encodeLines(kind, lines))
	if err != nil {
		return out, fmt.Errorf("stock: cart %s: %w", c.ID, err)
	}
	switch code {
	case codeConflict:
		return out, fmt.Errorf("%w: cart %s was used with other lines", ErrConflict, c.ID)
	case codeRestored:
		return out, r.undoCart(ctx, c.ID, kind, lines, ErrRestored)
	case codeOK, codeReplay, codeConfirmed:
	default:
		return out, codeErr(code)
	}
	replayed := true
	for _, l := range lines {
		req := Request{SKU: l.SKU, ID: c.ID, User: c.User, Qty: l.Qty}
		var rc Receipt
		if kind == "H" {
			rc, err = r.take(ctx, "H", req, ttlMs)
		} else {
			rc, err = r.take(ctx, "D", req, 0)
		}
		if err != nil {
			if isRefusal(err) {
				return out, r.undoCart(ctx, c.ID, kind, lines, &CartError{SKU: l.SKU, Err: err})
			}
			return out, err // unknown outcome: a retry with the same cart id goes on from here
		}
		replayed = replayed && rc.Replayed
		out.Items = append(out.Items, rc)
	}
	if code != codeConfirmed {
		if _, err := r.cartLog(ctx, "end", c.ID, "d"); err != nil {
			return out, fmt.Errorf("stock: cart %s: %w", c.ID, err)
		}
	}
	out.Replayed = replayed
	return out, nil
}

// isRefusal reports whether err is a definite answer of an item (not an unknown outcome).
func isRefusal(err error) bool {
	for _, e := range []error{ErrSoldOut, ErrInsufficient, ErrUserLimit, ErrNotLoaded, ErrClosed,
		ErrConflict, ErrRestored, ErrExpired} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// undoCart gives back every line of a cart (a line never taken gets a tombstone, so a slow
// saga that still runs cannot take it later; an entry of the same id that is not this cart's
// line is left alone), marks the cart undone and returns cause.
func (r *Reserver) undoCart(ctx context.Context, id, kind string, lines []Line, cause error) error {
	for _, l := range lines {
		var err error
		if kind == "H" {
			_, err = r.giveBackChecked(ctx, l.SKU, id, "c", kind, l.Qty)
			if errors.Is(err, ErrConfirmed) {
				_, err = r.giveBackChecked(ctx, l.SKU, id, "x", kind, l.Qty)
			}
		} else {
			_, err = r.giveBackChecked(ctx, l.SKU, id, "x", kind, l.Qty)
		}
		if err != nil && !errors.Is(err, ErrUnknownID) && !errors.Is(err, ErrConflict) {
			return errors.Join(cause, fmt.Errorf("stock: cart %s: undo %s: %w", id, l.SKU, err))
		}
	}
	if _, err := r.cartLog(ctx, "end", id, "u"); err != nil {
		return errors.Join(cause, fmt.Errorf("stock: cart %s: %w", id, err))
	}
	return cause
}

// RecoverCarts undoes the carts whose saga started more than olderThan ago and never ended
// (the process died, and nobody retried the cart id): their items are given back, and a late
// retry of such a cart returns ErrRestored. It returns the number of carts undone. Run it
// periodically with olderThan well above the longest checkout call.
func (r *Reserver) RecoverCarts(ctx context.Context, olderThan time.Duration) (int, error) {
	keys := r.cartKeys()
	cutoff := time.Now().Add(-olderThan).UnixMilli()
	ids, err := r.client.Do(ctx, r.client.B().Zrangebyscore().Key(keys[1]).Min("-inf").
		Max(strconv.FormatInt(cutoff, 10)).Limit(0, 256).Build()).AsStrSlice()
	if err != nil {
		return 0, fmt.Errorf("stock: recover carts: %w", err)
	}
	n := 0
	for _, id := range ids {
		rec, err := r.client.Do(ctx, r.client.B().Hget().Key(keys[0]).Field(id).Build()).ToString()
		if err != nil {
			return n, fmt.Errorf("stock: recover cart %s: %w", id, err)
		}
		kind, lines, err := parseCartRecord(rec)
		if err != nil {
			r.opts.logger.ErrorContext(ctx, "stock: unreadable cart record; left for an operator", "cart", id, "err", err)
			continue
		}
		if err := r.undoCart(ctx, id, kind, lines, nil); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// parseCartRecord reads a cart log record, "state|started|K|sku:qty|sku:qty...", as written by
// lua/cart.lua from encodeLines. No SKU contains '|', and the quantity follows the last ':'.
func parseCartRecord(rec string) (kind string, lines []Line, err error) {
	parts := strings.SplitN(rec, "|", 4)
	if len(parts) != 4 || parts[3] == "" {
		return "", nil, fmt.Errorf("%w: cart record %q", ErrInvalid, rec)
	}
	for _, f := range strings.Split(parts[3], "|") {
		i := strings.LastIndexByte(f, ':')
		if i <= 0 {
			return "", nil, fmt.Errorf("%w: cart record %q", ErrInvalid, rec)
		}
		q, perr := strconv.ParseInt(f[i+1:], 10, 64)
		if perr != nil || q <= 0 {
			return "", nil, fmt.Errorf("%w: cart record %q", ErrInvalid, rec)
		}
		lines = append(lines, Line{SKU: f[:i], Qty: q})
	}
	return parts[2], lines, nil
}

// cartOneSlot takes a cart whose items are all in one group with one script: all or nothing,
// atomically; no saga and no cart log are needed.
func (r *Reserver) cartOneSlot(ctx context.Context, kind string, c Cart, lines []Line, ttlMs int64) (CartReceipt, error) {
	out := CartReceipt{ID: c.ID}
	keys := make([]string, 0, 6*len(lines))
	args := []string{r.limitArg, r.outboxFlag(), kind, strconv.FormatInt(ttlMs, 10), c.ID, c.User}
	for _, l := range lines {
		keys = append(keys, r.keys(l.SKU)...)
		args = append(args, strconv.FormatInt(l.Qty, 10))
	}
	outs := make([]outcome, len(lines))
	if err := decodeOutcomes(manyScript.Exec(ctx, r.client, keys, args), outs); err != nil {
		return out, fmt.Errorf("stock: cart %s: %w", c.ID, err)
	}
	replayed := true
	for i, o := range outs {
		if o.code == -1 || o.code == codeOK || o.code == codeReplay {
			replayed = replayed && o.code == codeReplay
			continue
		}
		_, err := r.receipt(Receipt{SKU: lines[i].SKU, ID: c.ID}, o)
		return out, &CartError{SKU: lines[i].SKU, Err: err}
	}
	for i, o := range outs {
		rc, _ := r.receipt(Receipt{SKU: lines[i].SKU, ID: c.ID}, o)
		out.Items = append(out.Items, rc)
	}
	out.Replayed = replayed
	return out, nil
}
