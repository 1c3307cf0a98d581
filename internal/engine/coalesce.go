package engine

import (
	"context"
	"fmt"
	"strconv"

	"github.com/stockres/stock/internal/protocol"
)

// Hot-item coalescing (package lane): an item's deducts, and a claims hash's claims, run through
// a lane per key (Reserver.deducts, Reserver.claims); this file is what each lane sends.

// sendDeducts is the deducts' lanes' send: deducts of item sku.
func (r *Reserver) sendDeducts(ctx context.Context, sku string, reqs []Request, dst []outcome) error {
	return r.execDeducts(ctx, r.item(sku), reqs, dst)
}

// sendDeduct is the deducts' lanes' SendOne: one deduct of item sku, sent at once.
func (r *Reserver) sendDeduct(ctx context.Context, sku string, req Request) (outcome, error) {
	var o [1]outcome
	err := r.execDeducts(ctx, r.item(sku), []Request{req}, o[:])
	return o[0], err
}

// execDeducts runs deduct.lua for reqs, all of the item k, and decodes one outcome per request.
func (r *Reserver) execDeducts(ctx context.Context, k *protocol.Keys, reqs []Request, dst []outcome) error {
	args := make([]string, 5, 5+4*len(reqs))
	args[0], args[1], args[2], args[3], args[4] = r.limitArg, r.outboxFlag(), protocol.TakeDeduct, "0", r.clockArg(ctx)
	for _, q := range reqs {
		args = append(args, q.ID, strconv.FormatInt(q.Qty, 10), q.User, retryFlag(q.Retry))
	}
	res := protocol.Deduct.Exec(ctx, r.client, k.ForItem(), args)
	r.noteEvents(reqs[0].SKU)
	if err := decodeOutcomes(res, dst); err != nil {
		return fmt.Errorf("stock: deduct %s: %w", reqs[0].SKU, err)
	}
	return nil
}

func retryFlag(retry bool) string {
	if retry {
		return "1"
	}
	return "0"
}

// Coalesced claims. Every request of an item split over buckets first claims its id's bucket
// (route, route.lua) in the claims hash of the id's home bucket. Claims of one home bucket are
// coalesced as deducts are: while fewer than the configured number of route calls of that hash
// are in flight a claim is sent at once; beyond, claims queue, and the call that finishes
// first sends the queue (up to maxBatch) as one call of route.lua, which answers each pair in
// order. A queued caller waits no longer than its context allows: it leaves the queue when
// nothing was sent for it, or stops waiting for a batch already sent (whose claim is written or
// not: the error wraps ErrUnknownOutcome; a later request of the id reads the claim). An error of
// a batch answers every claim of it.

// claimReq is one claim of a claims hash: the id, and the claim it would make.
type claimReq struct{ id, claim string }

// claimUnawaited is the error of a claim whose caller stopped waiting for its batch.
func claimUnawaited(ctxErr error) error {
	return fmt.Errorf("%w: claim sent, its answer not awaited: %w", ErrUnknownOutcome, ctxErr)
}

// execClaims runs route.lua for claims, whose ids share the claims hash key, and puts each id's
// claim in dst.
func (r *Reserver) execClaims(ctx context.Context, key string, claims []claimReq, dst []string) error {
	args := make([]string, 0, 2*len(claims))
	for _, c := range claims {
		args = append(args, c.id, c.claim)
	}
	msgs, err := replyArray(protocol.Route.Exec(ctx, r.client, []string{key}, args), len(claims))
	if err != nil {
		return err
	}
	for i, m := range msgs {
		if dst[i], err = m.ToString(); err != nil {
			return fmt.Errorf("%w: malformed route reply: %v", ErrUnknownOutcome, err)
		}
	}
	return nil
}
