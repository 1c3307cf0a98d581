package stock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// MaxHoldTTL is the longest time a hold may last before it must be extended.
const MaxHoldTTL = 7 * 24 * time.Hour

func checkTTL(ttl time.Duration) error {
	if ttl < time.Millisecond || ttl > MaxHoldTTL {
		return invalid("hold ttl %v out of range [1ms, %v]", ttl, MaxHoldTTL)
	}
	return nil
}

// Hold takes req.Qty units like Deduct, but as held until now + ttl (by the Redis clock): the
// try of a try-confirm-cancel checkout. Confirm makes it final and only then queues it for the
// Store; Cancel gives it back; a hold past its deadline is released by Sweep, and also by the
// item's next Deduct, Hold, Confirm or Extend (at most 64 holds per call, and always the hold
// the call's own id names), so expiry is prompt even with no sweeper. A Deduct or Hold that
// would otherwise be refused for stock or for the per-user limit first releases up to 10,000
// due holds, so a refusal does not depend on how many holds are due.
//
// A repeat of the same id and parameters is a replay (of the hold, or of its confirmation);
// past the hold's deadline it is ErrExpired (and the hold is released, however many other holds
// are due), after a cancel ErrRestored. The errors are Deduct's.
func (r *Reserver) Hold(ctx context.Context, req Request, ttl time.Duration) (rc Receipt, err error) {
	local := false // answered by the sold-out fast path
	if r.opts.observer != nil {
		ctx = r.startOp(ctx, "hold", req.SKU)
		defer func(start time.Time) { r.observeTake(ctx, "hold", req.SKU, start, rc, err, local) }(time.Now())
	}
	if err := req.check(); err != nil {
		return Receipt{SKU: req.SKU, ID: req.ID}, err
	}
	if err := checkTTL(ttl); err != nil {
		return Receipt{SKU: req.SKU, ID: req.ID}, err
	}
	if r.fenced.Load() {
		return Receipt{SKU: req.SKU, ID: req.ID}, ErrFailover
	}
	if r.knownSoldOut(ctx, req) {
		local = true
		return Receipt{SKU: req.SKU, ID: req.ID, Qty: req.Qty}, ErrSoldOut
	}
	return r.take(ctx, "H", req, ttl.Milliseconds())
}

// Confirm makes a live hold final: its units move from held to sold and an EventConfirmed is
// queued for the Store. A second Confirm is a replay. A hold past its deadline is refused with
// ErrExpired (and released, if the sweep had not yet); a cancelled one with ErrRestored; an id
// with no hold with ErrUnknownID; an id that is not a hold with ErrConflict. Like Deduct, it
// first releases the item's other holds past their deadline (at most 64).
func (r *Reserver) Confirm(ctx context.Context, sku, id string) (rc Receipt, err error) {
	if r.opts.observer != nil {
		ctx = r.startOp(ctx, "confirm", sku)
		defer func(start time.Time) { r.observe(ctx, "confirm", sku, start, rc, err) }(time.Now())
	}
	rc = Receipt{SKU: sku, ID: id}
	if err := checkSKUID(sku, id); err != nil {
		return rc, err
	}
	res, ackErr := r.exec(ctx, confirmScript, r.keys(sku), []string{id, r.outboxFlag()})
	o, err := decodeOne(res)
	if err != nil {
		return rc, fmt.Errorf("stock: confirm %s/%s: %w", sku, id, err)
	}
	return r.receiptAck(rc, o, ackErr)
}

// Cancel gives a live hold back. A second Cancel, or a Cancel of a hold that already expired,
// is a replay. A Cancel of a confirmed hold is refused with ErrConfirmed (use Restore to give
// back a sale). A Cancel of an id that holds nothing returns ErrUnknownID and leaves a
// tombstone, so the hold it overtook is refused with ErrRestored.
func (r *Reserver) Cancel(ctx context.Context, sku, id string) (rc Receipt, err error) {
	if r.opts.observer != nil {
		ctx = r.startOp(ctx, "cancel", sku)
		defer func(start time.Time) { r.observe(ctx, "cancel", sku, start, rc, err) }(time.Now())
	}
	return r.giveBack(ctx, sku, id, "c")
}

// Extend moves a live hold's deadline to now + ttl. ErrExpired past the deadline (the hold is
// released), ErrConfirmed after Confirm, ErrRestored after Cancel, ErrUnknownID for no hold.
// Like Deduct, it first releases the item's other holds past their deadline (at most 64).
func (r *Reserver) Extend(ctx context.Context, sku, id string, ttl time.Duration) (rc Receipt, err error) {
	if r.opts.observer != nil {
		ctx = r.startOp(ctx, "extend", sku)
		defer func(start time.Time) { r.observe(ctx, "extend", sku, start, rc, err) }(time.Now())
	}
	rc = Receipt{SKU: sku, ID: id}
	if err := checkSKUID(sku, id); err != nil {
		return rc, err
	}
	if err := checkTTL(ttl); err != nil {
		return rc, err
	}
	args := []string{id, strconv.FormatInt(ttl.Milliseconds(), 10), r.outboxFlag()}
	res, ackErr := r.exec(ctx, extendScript, r.keys(sku), args)
	o, err := decodeOne(res)
	if err != nil {
		return rc, fmt.Errorf("stock: extend %s/%s: %w", sku, id, err)
	}
	return r.receiptAck(rc, o, ackErr)
}

// sweepBatch is the most holds one sweep script releases: a bounded step that never blocks
// Redis for long.
const sweepBatch = 256

// Sweep releases the holds of sku past their deadline, in bounded steps, and returns the units
// released. Holds index their deadlines per item, so a sweep looks only at expired holds. A
// corrupt ledger entry among them is an error that names its id, and that step releases nothing
// (the scripts check everything they read before their first write).
func (r *Reserver) Sweep(ctx context.Context, sku string) (int64, error) {
	if err := checkName("sku", sku); err != nil {
		return 0, err
	}
	var total int64
	for {
		res := sweepScript.Exec(ctx, r.client, r.keys(sku), []string{strconv.Itoa(sweepBatch), r.outboxFlag()})
		code, more, err := decodePair(res)
		if err != nil {
			return total, fmt.Errorf("stock: sweep %s: %w", sku, err)
		}
		total += code
		if more == 0 {
			return total, nil
		}
	}
}

// SweepAll sweeps every item of the registry and returns the units released. An item that
// fails does not stop the others: the errors of all items are joined.
func (r *Reserver) SweepAll(ctx context.Context) (int64, error) {
	var total int64
	var errs []error
	for sku, err := range r.Items(ctx) {
		if err != nil {
			return total, errors.Join(append(errs, err)...)
		}
		n, err := r.Sweep(ctx, sku)
		total += n
		if err != nil {
			if ctx.Err() != nil {
				return total, errors.Join(append(errs, err)...)
			}
			errs = append(errs, err)
		}
	}
	return total, errors.Join(errs...)
}

// RunSweeper calls SweepAll every interval until ctx is done, and returns ctx's error. Errors
// of a pass are logged and the next pass retries.
func (r *Reserver) RunSweeper(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return invalid("sweep interval %v", interval)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := r.SweepAll(ctx); err != nil && ctx.Err() == nil {
			r.opts.logger.WarnContext(ctx, "stock: sweep", "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

func checkSKUID(sku, id string) error {
	if err := checkName("sku", sku); err != nil {
		return err
	}
	return checkName("id", id)
}
