package stock

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/stockres/stock/internal/protocol"
)

// Hot-item coalescing. Deducts of one item wait for nothing while fewer than the configured
// number of script calls of that item are in flight: they are sent at once, each on its own.
// Only when that many calls are already in flight do further deducts queue; the call that
// finishes first hands the queue, up to maxBatch requests, to the oldest waiter, which sends
// them as one call of deduct.lua. The script applies a batch's requests in order with exactly
// the checks and writes of one call each, so no outcome and no ledger entry changes; only the
// number of script calls (and their fixed cost in Redis) goes down.

// maxBatch is the most requests one coalesced script call carries.
const maxBatch = 64

// batchTimeout bounds a coalesced call, which runs detached from its callers' contexts.
const batchTimeout = 10 * time.Second

// lanes coalesces one kind of script call (an item's deducts, a claims hash's claims) per key:
// the lanes of the keys with calls in flight, and how a batch of queued requests is sent.
type lanes[Req, Res any] struct {
	live    sync.Map  // key -> *lane[Req, Res]
	waiters sync.Pool // of *waiter[Req, Res], each with its channel
	// send sends reqs, all of key, as one script call and puts one answer per request in dst;
	// an error answers them all.
	send func(ctx context.Context, key string, reqs []Req, dst []Res) error
	// unawaited, when set, makes a caller whose context ends once its request is in a batch stop
	// waiting, with the error unawaited makes of the context's; when nil, such a caller waits
	// for the batch's answer (the batch is bounded by batchTimeout).
	unawaited func(ctxErr error) error
}

// lane is the coalescing state of one key while it has calls in flight. A lane whose last call
// finished with nobody queued is dropped from the map (and marked gone, so that a caller holding
// it looks again): idle keys cost no memory, however many keys ever had calls.
type lane[Req, Res any] struct {
	key      string
	mu       sync.Mutex
	inflight int
	gone     bool
	queue    []*waiter[Req, Res]
}

// waiter is a queued request. ch receives nil when the answer is in res/err, or the batch the
// waiter must send itself (it leads it). reqs and dst are a leader's buffers, kept in the pool.
type waiter[Req, Res any] struct {
	req  Req
	res  Res
	err  error
	ch   chan []*waiter[Req, Res]
	reqs []Req
	dst  []Res
}

// join enters the lane of key. While fewer than limit calls of the key are in flight the caller
// sends its own call at once: w is nil, and the caller calls done when its call returned.
// Otherwise req is queued as w, whose answer wait returns.
func (ls *lanes[Req, Res]) join(key string, req Req, limit int) (l *lane[Req, Res], w *waiter[Req, Res]) {
	for {
		v, ok := ls.live.Load(key)
		if !ok {
			v, _ = ls.live.LoadOrStore(key, &lane[Req, Res]{key: key})
		}
		l = v.(*lane[Req, Res])
		l.mu.Lock()
		if !l.gone {
			break
		}
		l.mu.Unlock() // dropped after we found it: a newer lane is (or will be) in the map
	}
	defer l.mu.Unlock()
	if l.inflight < limit {
		l.inflight++
		return l, nil
	}
	w, _ = ls.waiters.Get().(*waiter[Req, Res])
	if w == nil {
		w = &waiter[Req, Res]{ch: make(chan []*waiter[Req, Res], 1)}
	}
	w.req = req
	l.queue = append(l.queue, w)
	return l, w
}

// wait returns the answer of w, queued on l: sent in a batch that another waiter leads, or in
// the batch w is handed to lead. A caller whose context ends while w is queued leaves the queue
// with the context's error, and nothing is sent for it.
func (ls *lanes[Req, Res]) wait(ctx context.Context, l *lane[Req, Res], w *waiter[Req, Res]) (res Res, err error) {
	var batch []*waiter[Req, Res]
	select {
	case batch = <-w.ch:
	case <-ctx.Done():
		l.mu.Lock()
		for i, q := range l.queue {
			if q == w { // still queued: nothing was sent for it
				l.queue = append(l.queue[:i:i], l.queue[i+1:]...)
				l.mu.Unlock()
				ls.put(w)
				return res, ctx.Err()
			}
		}
		if ls.unawaited == nil {
			l.mu.Unlock()
			batch = <-w.ch // already in a batch: its answer is coming
			break
		}
		select {
		case batch = <-w.ch: // done hands a batch to its leader under l.mu: it is here already
			l.mu.Unlock()
			if batch != nil { // w leads it: sent without w waiting (w, in it, stays with it)
				go ls.sendBatch(context.Background(), l, batch)
				return res, ls.unawaited(ctx.Err())
			}
		default: // in a batch another waiter leads, not answered: w stays with it
			l.mu.Unlock()
			return res, ls.unawaited(ctx.Err())
		}
	}
	if batch != nil {
		ls.sendBatch(ctx, l, batch)
	}
	res, err = w.res, w.err
	ls.put(w)
	return res, err
}

// put returns w, answered or never sent, to the pool.
func (ls *lanes[Req, Res]) put(w *waiter[Req, Res]) {
	clear(w.reqs) // no request's strings kept alive by the pool
	*w = waiter[Req, Res]{ch: w.ch, reqs: w.reqs[:0], dst: w.dst[:0]}
	ls.waiters.Put(w)
}

// sendBatch sends a batch led by batch[0], hands the answers out, then hands the lane on.
func (ls *lanes[Req, Res]) sendBatch(ctx context.Context, l *lane[Req, Res], batch []*waiter[Req, Res]) {
	lead := batch[0]
	reqs := lead.reqs[:0]
	for _, w := range batch {
		reqs = append(reqs, w.req)
	}
	dst := append(lead.dst[:0], make([]Res, len(batch))...)
	lead.reqs, lead.dst = reqs, dst
	// The batch carries other callers' requests: it is not cut short by the leader's context
	// being cancelled (the leader may have been cancelled while it waited in the queue).
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), batchTimeout)
	err := ls.send(bctx, l.key, reqs, dst)
	cancel()
	for i, w := range batch {
		w.res, w.err = dst[i], err
		if i > 0 {
			w.ch <- nil
		}
	}
	ls.done(l)
}

// done is called when a call of the lane finished: the oldest waiters (up to maxBatch) are handed
// the next batch, or the lane has one call fewer in flight.
func (ls *lanes[Req, Res]) done(l *lane[Req, Res]) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.queue) == 0 {
		l.inflight--
		if l.inflight == 0 {
			l.gone = true
			ls.live.CompareAndDelete(l.key, l)
		}
		return
	}
	n := min(len(l.queue), maxBatch)
	batch := make([]*waiter[Req, Res], n)
	copy(batch, l.queue)
	l.queue = append(l.queue[:0], l.queue[n:]...)
	batch[0].ch <- batch // never blocks: a queued waiter's channel is empty
}

// deductCoalesced runs one deduct through the item's lane.
func (r *Reserver) deductCoalesced(ctx context.Context, k *protocol.Keys, req Request) (outcome, error) {
	l, w := r.deducts.join(req.SKU, req, r.opts.inflight)
	if w != nil {
		return r.deducts.wait(ctx, l, w)
	}
	var o [1]outcome
	err := r.execDeducts(ctx, k, []Request{req}, o[:])
	r.deducts.done(l)
	return o[0], err
}

// sendDeducts is the deducts' lanes' send: deducts of item sku.
func (r *Reserver) sendDeducts(ctx context.Context, sku string, reqs []Request, dst []outcome) error {
	return r.execDeducts(ctx, r.item(sku), reqs, dst)
}

// execDeducts runs deduct.lua for reqs, all of the item k, and decodes one outcome per request.
func (r *Reserver) execDeducts(ctx context.Context, k *protocol.Keys, reqs []Request, dst []outcome) error {
	args := make([]string, 4, 4+4*len(reqs))
	args[0], args[1], args[2], args[3] = r.limitArg, r.outboxFlag(), protocol.TakeDeduct, "0"
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

// claimCoalesced runs one claim of id through the lane of claims hash key and returns the id's
// claim.
func (r *Reserver) claimCoalesced(ctx context.Context, key, id, c string) (string, error) {
	l, w := r.claims.join(key, claimReq{id, c}, r.opts.inflight)
	if w != nil {
		return r.claims.wait(ctx, l, w)
	}
	var out [1]string
	err := r.execClaims(ctx, key, []claimReq{{id, c}}, out[:])
	r.claims.done(l)
	return out[0], err
}

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
