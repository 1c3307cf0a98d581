package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/stockres/stock/internal/protocol"
)

// MaxHoldTTL is stock.MaxHoldTTL, documented there: checkTTL's upper bound.
const MaxHoldTTL = 7 * 24 * time.Hour

func checkTTL(ttl time.Duration) error {
	if ttl < time.Millisecond || ttl > MaxHoldTTL {
		return invalid("hold ttl %v out of range [1ms, %v]", ttl, MaxHoldTTL)
	}
	return nil
}

// Hold is stock.Reserver.Hold.
func (r *Reserver) Hold(ctx context.Context, req Request, ttl time.Duration) (rc Receipt, err error) {
	if err := r.enter(); err != nil {
		return Receipt{SKU: req.SKU, ID: req.ID}, err
	}
	defer r.calls.Leave()
	local := false // answered by the sold-out fast path
	if r.opts.observer != nil {
		ctx = r.startOp(ctx, "hold", req.SKU)
		defer func(start time.Time) { r.observeTake(ctx, "hold", req.SKU, start, rc, err, local) }(time.Now())
	}
	if err := checkRequest(req); err != nil {
		return Receipt{SKU: req.SKU, ID: req.ID}, err
	}
	if err := r.checkUser("request", req.SKU, req.ID, req.User); err != nil {
		return Receipt{SKU: req.SKU, ID: req.ID}, err
	}
	if err := checkTTL(ttl); err != nil {
		return Receipt{SKU: req.SKU, ID: req.ID}, err
	}
	if r.isFenced(ctx) {
		return Receipt{SKU: req.SKU, ID: req.ID}, ErrFailover
	}
	if err := r.checkEviction(ctx); err != nil {
		return Receipt{SKU: req.SKU, ID: req.ID}, err
	}
	if n := r.bucketsOf(req.SKU); n > 0 {
		return r.takeBucketed(ctx, protocol.TakeHold, req, ttl.Milliseconds(), n)
	}
	if r.knownSoldOut(ctx, req) {
		local = true
		return Receipt{SKU: req.SKU, ID: req.ID, Qty: req.Qty}, ErrSoldOut
	}
	return r.take(ctx, protocol.TakeHold, req, ttl.Milliseconds())
}

// Confirm is stock.Reserver.Confirm.
func (r *Reserver) Confirm(ctx context.Context, sku, id string) (Receipt, error) {
	if err := r.enter(); err != nil {
		return Receipt{SKU: sku, ID: id}, err
	}
	defer r.calls.Leave()
	return r.confirm(ctx, sku, id)
}

// confirm is Confirm, for the calls of r that are in flight already (a cart's).
func (r *Reserver) confirm(ctx context.Context, sku, id string) (rc Receipt, err error) {
	if r.opts.observer != nil {
		ctx = r.startOp(ctx, "confirm", sku)
		defer func(start time.Time) { r.observe(ctx, "confirm", sku, start, rc, err) }(time.Now())
	}
	if err := checkSKUID(sku, id); err != nil {
		return Receipt{SKU: sku, ID: id}, err
	}
	return r.onHold(ctx, "confirm", protocol.Confirm, sku, id, []string{id, r.outboxFlag()},
		func(name string) { r.noteEvents(name) })
}

// Cancel is stock.Reserver.Cancel.
func (r *Reserver) Cancel(ctx context.Context, sku, id string) (Receipt, error) {
	if err := r.enter(); err != nil {
		return Receipt{SKU: sku, ID: id}, err
	}
	defer r.calls.Leave()
	return r.cancel(ctx, sku, id)
}

// cancel is Cancel, for the calls of r that are in flight already.
func (r *Reserver) cancel(ctx context.Context, sku, id string) (rc Receipt, err error) {
	if r.opts.observer != nil {
		ctx = r.startOp(ctx, "cancel", sku)
		defer func(start time.Time) { r.observe(ctx, "cancel", sku, start, rc, err) }(time.Now())
	}
	if err := r.writable(ctx, sku, id); err != nil {
		return Receipt{SKU: sku, ID: id}, err
	}
	return r.giveBack(ctx, sku, id, protocol.ReasonCancel)
}

// Extend is stock.Reserver.Extend.
func (r *Reserver) Extend(ctx context.Context, sku, id string, ttl time.Duration) (rc Receipt, err error) {
	if err := r.enter(); err != nil {
		return Receipt{SKU: sku, ID: id}, err
	}
	defer r.calls.Leave()
	if r.opts.observer != nil {
		ctx = r.startOp(ctx, "extend", sku)
		defer func(start time.Time) { r.observe(ctx, "extend", sku, start, rc, err) }(time.Now())
	}
	if err := checkSKUID(sku, id); err != nil {
		return Receipt{SKU: sku, ID: id}, err
	}
	if err := checkTTL(ttl); err != nil {
		return Receipt{SKU: sku, ID: id}, err
	}
	args := []string{id, strconv.FormatInt(ttl.Milliseconds(), 10), r.outboxFlag()}
	return r.onHold(ctx, "extend", protocol.Extend, sku, id, args, r.noteHold)
}

// onHold runs script (confirm.lua or extend.lua, op in errors) with args on the hold id of sku,
// whose names were checked, and answers its receipt; note records the due-work hint the script
// calls for on the item (or bucket) that has the hold.
func (r *Reserver) onHold(ctx context.Context, op string, script *protocol.Script, sku, id string, args []string, note func(name string)) (Receipt, error) {
	rc := Receipt{SKU: sku, ID: id}
	if err := r.checkEviction(ctx); err != nil {
		return rc, err
	}
	name, err := r.holder(ctx, sku, id)
	if err != nil {
		return rc, err
	}
	res, ackErr := r.exec(ctx, script, r.item(name).ForItem(), args)
	note(name)
	o, err := decodeOne(res)
	if err != nil {
		return rc, fmt.Errorf("stock: %s %s/%s: %w", op, sku, id, err)
	}
	return r.conflictReceipt(ctx, name, rc, o, ackErr, conflictWant{kind: KindHold})
}

// sweepBatch is the most holds one sweep script releases: a bounded step that never blocks
// Redis for long.
const sweepBatch = 256

// sweepItems is stockops.Sweep.
func (r *Reserver) sweepItems(ctx context.Context, skus ...string) (int64, error) {
	if err := checkSKUs(skus); err != nil {
		return 0, err
	}
	var total int64
	var errs []error
	sweep := func(sku string) bool {
		n, err := r.sweep(ctx, sku)
		total += n
		if err != nil {
			errs = append(errs, err)
		}
		// A bucket of a split item: the transfers out of it that a dead process left in flight
		// are completed too, as Run's sweeper does.
		if parent, i := splitBucket(sku); i >= 0 && i < r.bucketsOf(parent) {
			if _, err := r.recoverTransfers(ctx, parent, i, r.bucketsOf(parent), transferGrace); err != nil {
				errs = append(errs, err)
			}
		}
		return ctx.Err() == nil
	}
	if len(skus) > 0 {
		for _, sku := range skus {
			for _, name := range r.names(sku) {
				if !sweep(name) {
					return total, errors.Join(errs...)
				}
			}
		}
		return total, errors.Join(errs...)
	}
	for sku, err := range r.items(ctx) {
		if err != nil {
			return total, errors.Join(append(errs, err)...)
		}
		if !sweep(sku) {
			break
		}
	}
	return total, errors.Join(errs...)
}

// sweepDue is Run's sweep: the items whose hold hints are due, and a step of the slow walk of
// the registry (see hints.go). It reads the earliest deadline of each (one pipelined read),
// sweeps those with a hold due, and records the next deadline of each in the hints.
func (r *Reserver) sweepDue(ctx context.Context, w *registryWalk) (int64, error) {
	var errs []error
	// Deadlines are on Redis's clock (the scripts read TIME), and so are the hints' scores.
	var clock serverClock
	now := clock.read(ctx, r).UnixMilli()
	skus, err := r.takeDue(ctx, protocol.HoldsDue, now, 256)
	if err != nil {
		errs = append(errs, fmt.Errorf("stock: sweep: due-work hints: %w", err))
	}
	more, err := w.step(ctx, r)
	if err != nil {
		errs = append(errs, fmt.Errorf("stock: sweep: %w", err))
	}
	skus = uniq(append(skus, more...))
	heads, err := r.nextDeadlines(ctx, skus)
	if err != nil {
		return 0, errors.Join(append(errs, err)...)
	}
	// The buckets with a transfer in flight for longer than transferGrace: a process died
	// between its halves; the others are looked at again when they would be.
	if xheads, err := r.transferHeads(ctx, skus); err != nil {
		errs = append(errs, err)
	} else {
		for sku, at := range xheads {
			if at > now {
				if h, ok := heads[sku]; !ok || at < h {
					heads[sku] = at
				}
				continue
			}
			parent, i := splitBucket(sku)
			if _, err := r.recoverTransfers(ctx, parent, i, r.bucketsOf(parent), transferGrace); err != nil {
				errs = append(errs, err)
				heads[sku] = now + transferGrace.Milliseconds()
			}
		}
	}
	var total int64
	var swept []string
	for _, sku := range skus {
		if at, ok := heads[sku]; !ok || at > now || ctx.Err() != nil {
			continue
		}
		n, err := r.sweep(ctx, sku)
		total += n
		if err != nil {
			errs = append(errs, err)
		}
		swept = append(swept, sku)
	}
	if len(swept) > 0 {
		after, err := r.nextDeadlines(ctx, swept)
		if err != nil {
			return total, errors.Join(append(errs, err)...)
		}
		for _, sku := range swept {
			delete(heads, sku)
			if at, ok := after[sku]; ok {
				heads[sku] = at
			}
		}
	}
	if len(heads) > 0 {
		if err := r.writeHints(ctx, nil, heads, 0); err != nil {
			errs = append(errs, fmt.Errorf("stock: sweep: due-work hints: %w", err))
		}
	}
	return total, errors.Join(errs...)
}

// nextDeadlines returns the earliest hold deadline (ms) of each item that has a hold, in one
// pipelined read.
func (r *Reserver) nextDeadlines(ctx context.Context, skus []string) (map[string]int64, error) {
	c := r.client
	cmds := make(rueidis.Commands, len(skus))
	for i, sku := range skus {
		cmds[i] = c.B().Zrange().Key(r.item(sku).Holds).Min("0").Max("0").Withscores().Build()
	}
	out := map[string]int64{}
	for i, res := range c.DoMulti(ctx, cmds...) {
		vs, err := res.AsZScores()
		if err != nil {
			return out, fmt.Errorf("stock: sweep %s: next deadline: %w", skus[i], err)
		}
		if len(vs) > 0 {
			out[skus[i]] = int64(vs[0].Score)
		}
	}
	return out, nil
}

// uniq drops the repeats of s, keeping the order.
func uniq(s []string) []string {
	seen := make(map[string]bool, len(s))
	out := s[:0]
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// sweep releases one item's due holds.
func (r *Reserver) sweep(ctx context.Context, sku string) (int64, error) {
	var total int64
	for {
		res := protocol.Sweep.Exec(ctx, r.client, r.item(sku).ForItem(), []string{strconv.Itoa(sweepBatch), r.outboxFlag()})
		code, more, err := decodePair(res)
		if err != nil || code > 0 {
			r.noteEvents(sku) // expiries queued (or perhaps: the outcome is unknown)
		}
		if err != nil {
			return total, fmt.Errorf("stock: sweep %s: %w", sku, err)
		}
		total += code
		if more == 0 {
			return total, nil
		}
		if code == 0 {
			// A batch that released nothing and says more are due would say so again: stop,
			// and let the next sweep try (every call is bounded).
			return total, fmt.Errorf("stock: sweep %s: a batch released no hold though more are due", sku)
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}

func checkSKUID(sku, id string) error {
	if err := checkName("sku", sku); err != nil {
		return err
	}
	return checkName("id", id)
}
