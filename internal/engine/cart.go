package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/rueidis"
	"github.com/stockres/stock/internal/protocol"
)

// DeductMany is stock.Reserver.DeductMany.
func (r *Reserver) DeductMany(ctx context.Context, c Cart) (CartReceipt, error) {
	return r.observeCart(ctx, "deduct_many", c, func(ctx context.Context) (CartReceipt, error) { return r.cart(ctx, protocol.TakeDeduct, c, 0) })
}

// HoldMany is stock.Reserver.HoldMany.
func (r *Reserver) HoldMany(ctx context.Context, c Cart, ttl time.Duration) (CartReceipt, error) {
	return r.observeCart(ctx, "hold_many", c, func(ctx context.Context) (CartReceipt, error) {
		if err := checkTTL(ttl); err != nil {
			return CartReceipt{ID: c.ID}, err
		}
		return r.cart(ctx, protocol.TakeHold, c, ttl.Milliseconds())
	})
}

// ConfirmMany is stock.Reserver.ConfirmMany.
func (r *Reserver) ConfirmMany(ctx context.Context, id string, skus ...string) ([]Receipt, error) {
	if err := r.enter(); err != nil {
		return nil, err
	}
	defer r.calls.Leave()
	skus = sortedUnique(skus)
	var out []Receipt
	for i, sku := range skus {
		rc, err := r.confirm(ctx, sku, id)
		if err != nil && (errors.Is(err, ErrExpired) || errors.Is(err, ErrRestored)) {
			if errors.Is(err, ErrRestored) {
				// Maybe a retry of a cart undone because a line expired: that is its answer.
				for _, s := range skus {
					if e, lerr := r.ledger(ctx, s, id); lerr == nil && e.State == StateExpired {
						sku, err = s, ErrExpired
						break
					}
				}
			}
			// Undo: the confirmed ones are restored, the held ones cancelled.
			for _, s := range skus[:i] {
				if _, uerr := r.restore(ctx, s, id); uerr != nil {
					return out, errors.Join(&CartError{SKU: sku, Err: err}, uerr)
				}
			}
			for _, s := range skus[i+1:] {
				if _, uerr := r.cancel(ctx, s, id); uerr != nil && !errors.Is(uerr, ErrUnknownID) {
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
	if err := r.enter(); err != nil {
		return nil, err
	}
	defer r.calls.Leave()
	var out []Receipt
	for _, sku := range sortedUnique(skus) {
		rc, err := r.cancel(ctx, sku, id)
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

// cartKeys: the carts hash and the pending zset, in one slot of their own. They start with
// "<prefix>:c", never "<prefix>:{" as every item key does, so no item can reach them.
func (r *Reserver) cartKeys() []string {
	return protocol.Carts(r.opts.prefix)
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

// encodeCart is a cart as the cart log records it (protocol.EncodeCart), lines in SKU order.
func encodeCart(kind, user string, lines []Line) string {
	pl := make([]protocol.CartLine, len(lines))
	for i, l := range lines {
		pl[i] = protocol.CartLine(l)
	}
	return protocol.EncodeCart(kind, user, pl)
}

// cartOp runs one operation of lua/cart.lua and returns its code and the cart's undo cause.
func (r *Reserver) cartOp(ctx context.Context, op, id, arg string) (int64, string, error) {
	code, why, _, err := r.cartOpAck(ctx, op, id, arg)
	return code, why, err
}

// cartOpAck is cartOp, with the replica acknowledgement's error (WithReplicaAck) of the write.
func (r *Reserver) cartOpAck(ctx context.Context, op, id, arg string) (int64, string, error, error) {
	res, ackErr := r.exec(ctx, protocol.Cart, r.cartKeys(), []string{op, id, arg})
	code, why, err := cartReply(res, id)
	return code, why, ackErr, err
}

// cartReply decodes cart.lua's reply about cart id.
func cartReply(res rueidis.RedisResult, id string) (int64, string, error) {
	msgs, err := replyArray(res, 2)
	if err != nil {
		return 0, "", err
	}
	code, err := replyInt(msgs[0])
	if err != nil {
		return 0, "", fmt.Errorf("%w: cart log reply: %v", ErrInvalid, err)
	}
	why, err := msgs[1].ToString()
	if err != nil {
		return 0, "", fmt.Errorf("%w: cart log reply: %v", ErrInvalid, err)
	}
	if code == protocol.Invalid {
		return 0, "", fmt.Errorf("%w: cart %s: %s", ErrInvalid, id, why)
	}
	return code, why, nil
}

// cause is how the cart log records why a cart was undone: "code:sku" of the refusing item.
func cause(sku string, err error) string {
	for code, e := range codeErrs {
		if e != nil && errors.Is(err, e) {
			return protocol.EncodeCause(int64(code), sku)
		}
	}
	return ""
}

// causeErr is the error every copy of an undone cart answers: the refusal recorded by the
// attempt that undid it, or ErrRestored for a cart undone by cart recovery.
func causeErr(id, why string) error {
	c, sku, ok := protocol.ParseCause(why)
	if !ok || c <= protocol.Replay || c >= int64(len(codeErrs)) || codeErrs[c] == nil {
		return fmt.Errorf("%w: cart %s was undone", ErrRestored, id)
	}
	return &CartError{SKU: sku, Err: codeErrs[c]}
}

func (r *Reserver) cart(ctx context.Context, kind string, c Cart, ttlMs int64) (CartReceipt, error) {
	if err := r.enter(); err != nil {
		return CartReceipt{ID: c.ID}, err
	}
	defer r.calls.Leave()
	out := CartReceipt{ID: c.ID}
	lines, err := sumLines(c)
	if err != nil {
		return out, err
	}
	if err := r.checkUser("cart", "", c.ID, c.User); err != nil {
		return out, err
	}
	if r.isFenced(ctx) {
		return out, ErrFailover
	}
	if err := r.checkEviction(ctx); err != nil {
		return out, err
	}
	if r.oneSlot(lines) {
		return r.cartOneSlot(ctx, kind, c, lines, ttlMs)
	}
	code, why, err := r.cartOp(ctx, "begin", c.ID, encodeCart(kind, c.User, lines))
	if err != nil {
		return out, fmt.Errorf("stock: cart %s: %w", c.ID, err)
	}
	switch code {
	case protocol.Conflict:
		return out, r.cartConflict(ctx, kind, c, lines)
	case protocol.Restored:
		// Finish the undo (a crash may have cut it short; it is idempotent) and answer as every
		// copy of the cart does.
		return r.undoCart(ctx, kind, c, lines, ttlMs, why, causeErr(c.ID, why))
	case protocol.Confirmed:
		return r.cartDone(ctx, kind, c, lines, ttlMs)
	case protocol.OK, protocol.Replay:
	default:
		return out, codeErr(code)
	}
	var notReplicated error // WithReplicaAck: a line was taken, but not acknowledged in time
	for _, l := range lines {
		req := Request{SKU: l.SKU, ID: c.ID, User: c.User, Qty: l.Qty}
		rc, err := r.takeLine(ctx, kind, req, ttlMs)
		if errors.Is(err, ErrNotReplicated) {
			notReplicated, err = err, nil // the line was taken: go on with the others
		}
		if err != nil {
			if isRefusal(err) {
				return r.undoCart(ctx, kind, c, lines, ttlMs, cause(l.SKU, err), &CartError{SKU: l.SKU, Err: err})
			}
			return out, err // unknown outcome: a retry with the same cart id goes on from here
		}
		out.Items = append(out.Items, rc)
	}
	// With WithReplicaAck the done mark waits for the replicas too: a failover that lost it
	// would leave the cart pending, and cart recovery would undo it.
	code, why, ackErr, err := r.cartOpAck(ctx, "done", c.ID, "")
	if err != nil {
		return out, fmt.Errorf("stock: cart %s: %w", c.ID, err)
	}
	if ackErr != nil && notReplicated == nil {
		notReplicated = ackErr
	}
	if code == protocol.Restored {
		// A concurrent copy of the cart found a refusal and undid it first: its outcome is the
		// cart's. Give back what this attempt took (its undo may have run before our takes).
		return r.undoCart(ctx, kind, c, lines, ttlMs, why, causeErr(c.ID, why))
	}
	// The copy that completed the cart is the one not replayed, as for Deduct: of many copies of
	// one cart id exactly one answers Replayed false, whichever took which line.
	out.Replayed = code == protocol.Replay
	return out, notReplicated
}

// oneSlot reports whether a cart of lines is taken by one script: it has two lines or more, all
// of items in one group (WithGroups). An item split over buckets (WithBuckets) is in no group,
// whatever the group function says of it, so a cart with a split line is a saga.
func (r *Reserver) oneSlot(lines []Line) bool {
	if len(lines) < 2 {
		return false
	}
	g := r.group(lines[0].SKU)
	if g == "" {
		return false
	}
	for _, l := range lines {
		if r.bucketsOf(l.SKU) > 0 || r.group(l.SKU) != g {
			return false
		}
	}
	return true
}

// takeLine takes one line of a saga cart (or answers it again, for a retry of a done cart of
// holds). A line of an item split over buckets goes to its buyer's bucket like a Deduct or a
// Hold (takeBucketed): it is refused for stock only when the buckets together could not serve
// it, and a tombstone a cart undo left for it, in whatever bucket, answers ErrRestored.
func (r *Reserver) takeLine(ctx context.Context, kind string, req Request, ttlMs int64) (Receipt, error) {
	if n := r.bucketsOf(req.SKU); n > 0 {
		return r.takeBucketed(ctx, kind, req, ttlMs, n)
	}
	return r.take(ctx, kind, req, ttlMs)
}

// cartDone answers a retry of a cart the log records as done. Nothing is given back, whatever
// happened to a line since. A cart of deducts answers its receipts, read from the ledger,
// replayed: a line restored since stays restored, the others stay taken. A cart of holds answers
// as a Hold of each line would: its receipts while every hold is live or confirmed, else a
// *CartError wrapping ErrExpired or ErrRestored for the first line whose hold expired or was
// cancelled (a hold past its deadline is released as expired by that look).
func (r *Reserver) cartDone(ctx context.Context, kind string, c Cart, lines []Line, ttlMs int64) (CartReceipt, error) {
	out := CartReceipt{ID: c.ID, Replayed: true}
	for _, l := range lines {
		if kind == protocol.TakeHold {
			rc, err := r.takeLine(ctx, protocol.TakeHold, Request{SKU: l.SKU, ID: c.ID, User: c.User, Qty: l.Qty}, ttlMs)
			if err != nil {
				if isRefusal(err) {
					return CartReceipt{ID: c.ID}, &CartError{SKU: l.SKU, Err: err}
				}
				return CartReceipt{ID: c.ID}, err
			}
			rc.Replayed = true
			out.Items = append(out.Items, rc)
			continue
		}
		rc := Receipt{SKU: l.SKU, ID: c.ID, Qty: l.Qty, Replayed: true}
		e, err := r.ledger(ctx, l.SKU, c.ID)
		switch {
		case err == nil:
			rc.Remaining = e.After
		case !errors.Is(err, ErrUnknownID) && !errors.Is(err, ErrNotLoaded):
			return CartReceipt{ID: c.ID}, fmt.Errorf("stock: cart %s: %w", c.ID, err)
		}
		out.Items = append(out.Items, rc)
	}
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

// undoCart undoes a cart and returns its outcome. It first records the cart as undone with why
// (unless a copy of the cart recorded it done first: then the cart's receipts are the outcome and
// nothing is given back), then gives back every line (a line never taken gets a tombstone, so a
// slow copy of the saga that still runs cannot take it later; an entry of the same id that is
// not this cart's line, by kind, quantity and user, is left alone), then takes the cart off the
// pending set. It returns failed, or the refusal recorded by the copy that undid the cart first.
func (r *Reserver) undoCart(ctx context.Context, kind string, c Cart, lines []Line, ttlMs int64, why string, failed error) (CartReceipt, error) {
	out, _, err := r.undoCartMoved(ctx, kind, c, lines, ttlMs, why, failed)
	return out, err
}

// undoCartMoved is undoCart; moved reports whether this call is the one that recorded the cart
// as undone (cart recovery counts those only).
func (r *Reserver) undoCartMoved(ctx context.Context, kind string, c Cart, lines []Line, ttlMs int64, why string, failed error) (out CartReceipt, moved bool, err error) {
	id, user := c.ID, c.User
	out = CartReceipt{ID: id}
	code, recorded, err := r.cartOp(ctx, "undo", id, why)
	if err != nil {
		return out, false, errors.Join(failed, fmt.Errorf("stock: cart %s: %w", id, err))
	}
	if code == protocol.Confirmed {
		out, err := r.cartDone(ctx, kind, c, lines, ttlMs)
		return out, false, err
	}
	moved = code == protocol.OK
	if recorded != why {
		failed = causeErr(id, recorded)
	}
	for _, l := range lines {
		var err error
		if kind == protocol.TakeHold {
			_, err = r.giveBackChecked(ctx, l.SKU, id, protocol.ReasonCancel, kind, l.Qty, user)
			if errors.Is(err, ErrConfirmed) {
				_, err = r.giveBackChecked(ctx, l.SKU, id, protocol.ReasonRestore, kind, l.Qty, user)
			}
		} else {
			_, err = r.giveBackChecked(ctx, l.SKU, id, protocol.ReasonRestore, kind, l.Qty, user)
		}
		if err != nil && !errors.Is(err, ErrUnknownID) && !errors.Is(err, ErrConflict) && !errors.Is(err, ErrNotLoaded) {
			return out, moved, errors.Join(failed, fmt.Errorf("stock: cart %s: undo %s: %w", id, l.SKU, err))
		}
	}
	if _, _, err := r.cartOp(ctx, "end", id, ""); err != nil {
		return out, moved, errors.Join(failed, fmt.Errorf("stock: cart %s: %w", id, err))
	}
	return out, moved, failed
}

// recoverCarts is stockops.RecoverCarts.
func (r *Reserver) recoverCarts(ctx context.Context, olderThan time.Duration) (int, error) {
	keys := r.cartKeys()
	cutoff := r.opts.now().Add(-olderThan).UnixMilli()
	ids, err := r.client.Do(ctx, r.client.B().Zrangebyscore().Key(keys[1]).Min("-inf").
		Max(strconv.FormatInt(cutoff, 10)).Limit(0, 256).Build()).AsStrSlice()
	if err != nil {
		return 0, fmt.Errorf("stock: recover carts: %w", err)
	}
	n := 0
	for _, id := range ids {
		rec, err := r.client.Do(ctx, r.client.B().Hget().Key(keys[0]).Field(id).Build()).ToString()
		if isNil(err) {
			continue // ended meanwhile
		}
		if err != nil {
			return n, fmt.Errorf("stock: recover cart %s: %w", id, err)
		}
		kind, user, lines, err := parseCartRecord(rec)
		if err != nil {
			r.opts.logger.ErrorContext(ctx, "stock: unreadable cart record; left for an operator", "cart", id, "err", err)
			continue
		}
		_, moved, err := r.undoCartMoved(ctx, kind, Cart{ID: id, User: user}, lines, 0, "", nil)
		if err != nil && !isRefusal(err) {
			return n, err
		}
		if moved {
			n++
		}
	}
	return n, nil
}

// parseCartRecord reads a cart log record as lua/cart.lua writes it (protocol.ParseCartRecord).
func parseCartRecord(rec string) (kind, user string, lines []Line, err error) {
	kind, user, pl, err := protocol.ParseCartRecord(rec)
	if err != nil {
		return "", "", nil, fmt.Errorf("%w: cart record %q", ErrInvalid, rec)
	}
	lines = make([]Line, len(pl))
	for i, l := range pl {
		lines[i] = Line(l)
	}
	return kind, user, lines, nil
}

// cartOneSlot takes a cart whose items are all in one group with one script: all or nothing,
// atomically; no saga and no cart log are needed.
func (r *Reserver) cartOneSlot(ctx context.Context, kind string, c Cart, lines []Line, ttlMs int64) (CartReceipt, error) {
	out := CartReceipt{ID: c.ID}
	keys := make([]string, 0, 6*len(lines))
	args := []string{r.limitArg, r.outboxFlag(), kind, strconv.FormatInt(ttlMs, 10), c.ID, c.User}
	for _, l := range lines {
		keys = append(keys, r.item(l.SKU).ForItem()...)
		args = append(args, strconv.FormatInt(l.Qty, 10))
	}
	outs := make([]outcome, len(lines))
	res, ackErr := r.exec(ctx, protocol.DeductMany, keys, args)
	for _, l := range lines {
		if kind == protocol.TakeHold {
			r.noteHold(l.SKU)
		} else {
			r.noteEvents(l.SKU)
		}
	}
	if err := decodeOutcomes(res, outs); err != nil {
		return out, fmt.Errorf("stock: cart %s: %w", c.ID, err)
	}
	replayed := true
	for i, o := range outs {
		if o.code == protocol.Untaken || o.code == protocol.OK || o.code == protocol.Replay {
			replayed = replayed && o.code == protocol.Replay
			continue
		}
		rc, err := r.receipt(Receipt{SKU: lines[i].SKU, ID: c.ID}, o)
		if o.code == protocol.Conflict {
			err = r.conflict(ctx, r.item(lines[i].SKU).Ledger, rc, takeWant(kind, Request{Qty: lines[i].Qty, User: c.User}))
		}
		return out, &CartError{SKU: lines[i].SKU, Err: err}
	}
	for i, o := range outs {
		rc, _ := r.receipt(Receipt{SKU: lines[i].SKU, ID: c.ID}, o)
		out.Items = append(out.Items, rc)
	}
	out.Replayed = replayed
	if ackErr != nil { // a replay is no safer than the write it replays
		return out, ackErr
	}
	return out, nil
}
