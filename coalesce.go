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

// lane is the coalescing state of one item while it has calls in flight. A lane whose last call
// finished with nobody queued is dropped from the Reserver's map (and marked gone, so that a
// caller holding it looks again): idle items cost no memory, however many items ever sold.
type lane struct {
	sku      string
	keys     *protocol.Keys
	mu       sync.Mutex
	inflight int
	gone     bool
	queue    []*waiter
}

// waiter is a queued deduct. ch receives nil when the result is in res/err, or the batch the
// waiter must send itself (it leads it).
type waiter struct {
	req Request
	res outcome
	err error
	ch  chan []*waiter
}

var waiters = sync.Pool{New: func() any { return &waiter{ch: make(chan []*waiter, 1)} }}

// lockLane returns the item's live lane, locked.
func (r *Reserver) lockLane(k *protocol.Keys, sku string) *lane {
	for {
		v, ok := r.lanes.Load(sku)
		if !ok {
			v, _ = r.lanes.LoadOrStore(sku, &lane{sku: sku, keys: k})
		}
		l := v.(*lane)
		l.mu.Lock()
		if !l.gone {
			return l
		}
		l.mu.Unlock() // dropped after we found it: a newer lane is (or will be) in the map
	}
}

// deductCoalesced runs one deduct through the item's lane.
func (r *Reserver) deductCoalesced(ctx context.Context, k *protocol.Keys, req Request) (outcome, error) {
	l := r.lockLane(k, req.SKU)
	if l.inflight < r.opts.inflight {
		l.inflight++
		l.mu.Unlock()
		var o [1]outcome
		err := r.execDeducts(ctx, k, []Request{req}, o[:])
		r.handoff(l)
		return o[0], err
	}
	w := waiters.Get().(*waiter)
	w.req = req
	l.queue = append(l.queue, w)
	l.mu.Unlock()

	var batch []*waiter
	select {
	case batch = <-w.ch:
	case <-ctx.Done():
		l.mu.Lock()
		for i, q := range l.queue {
			if q == w { // still queued: nothing was sent for it
				l.queue = append(l.queue[:i:i], l.queue[i+1:]...)
				l.mu.Unlock()
				w.req = Request{}
				waiters.Put(w)
				return outcome{}, ctx.Err()
			}
		}
		l.mu.Unlock()
		batch = <-w.ch // already in a batch: its outcome is coming
	}
	if batch != nil {
		r.sendBatch(ctx, l, batch)
	}
	o, err := w.res, w.err
	*w = waiter{ch: w.ch}
	waiters.Put(w)
	return o, err
}

// sendBatch sends a batch led by batch[0], hands the results out, then hands the lane on.
func (r *Reserver) sendBatch(ctx context.Context, l *lane, batch []*waiter) {
	reqs := make([]Request, len(batch))
	for i, w := range batch {
		reqs[i] = w.req
	}
	outs := make([]outcome, len(batch))
	// The batch carries other callers' requests: it is not cut short by the leader's context
	// being cancelled (the leader may have been cancelled while it waited in the queue).
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), batchTimeout)
	err := r.execDeducts(bctx, l.keys, reqs, outs)
	cancel()
	for i, w := range batch {
		w.res, w.err = outs[i], err
		if i > 0 {
			w.ch <- nil
		}
	}
	r.handoff(l)
}

// handoff is called when a call of the lane finished: the oldest waiters get the next batch,
// or the lane has one call fewer in flight.
func (r *Reserver) handoff(l *lane) {
	l.mu.Lock()
	if len(l.queue) == 0 {
		l.inflight--
		if l.inflight == 0 {
			l.gone = true
			r.lanes.CompareAndDelete(l.sku, l)
		}
		l.mu.Unlock()
		return
	}
	n := min(len(l.queue), maxBatch)
	batch := make([]*waiter, n)
	copy(batch, l.queue)
	l.queue = append(l.queue[:0], l.queue[n:]...)
	l.mu.Unlock()
	batch[0].ch <- batch
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

// claimLane is the coalescing state of one claims hash while it has route calls in flight;
// dropped, like a lane, when its last call finished with nobody queued.
type claimLane struct {
	key      string
	mu       sync.Mutex
	inflight int
	gone     bool
	queue    []*claimCall
}

// claimCall is one claim: the id and the claim it would make; res and err are its answer once
// done is closed.
type claimCall struct {
	id, claim string
	res       string
	err       error
	done      chan struct{}
}

// lockClaimLane returns the live lane of claims hash key, locked.
func (r *Reserver) lockClaimLane(key string) *claimLane {
	for {
		v, ok := r.claims.Load(key)
		if !ok {
			v, _ = r.claims.LoadOrStore(key, &claimLane{key: key})
		}
		l := v.(*claimLane)
		l.mu.Lock()
		if !l.gone {
			return l
		}
		l.mu.Unlock()
	}
}

// claimCoalesced runs one claim of id through the lane of claims hash key and returns the id's
// claim.
func (r *Reserver) claimCoalesced(ctx context.Context, key, id, claim string) (string, error) {
	l := r.lockClaimLane(key)
	if l.inflight < r.opts.inflight {
		l.inflight++
		l.mu.Unlock()
		var out [1]string
		err := r.execClaims(ctx, key, []*claimCall{{id: id, claim: claim}}, out[:])
		r.claimHandoff(l)
		return out[0], err
	}
	c := &claimCall{id: id, claim: claim, done: make(chan struct{})}
	l.queue = append(l.queue, c)
	l.mu.Unlock()
	select {
	case <-c.done:
		return c.res, c.err
	case <-ctx.Done():
	}
	l.mu.Lock()
	for i, q := range l.queue {
		if q == c { // still queued: nothing was sent for it
			l.queue = append(l.queue[:i:i], l.queue[i+1:]...)
			l.mu.Unlock()
			return "", ctx.Err()
		}
	}
	l.mu.Unlock()
	select {
	case <-c.done: // answered meanwhile
		return c.res, c.err
	default:
		return "", fmt.Errorf("%w: claim sent, its answer not awaited: %w", ErrUnknownOutcome, ctx.Err())
	}
}

// claimHandoff is called when a route call of the lane finished: the queued claims (up to
// maxBatch) go out as one call, or the lane has one call fewer in flight.
func (r *Reserver) claimHandoff(l *claimLane) {
	l.mu.Lock()
	if len(l.queue) == 0 {
		l.inflight--
		if l.inflight == 0 {
			l.gone = true
			r.claims.CompareAndDelete(l.key, l)
		}
		l.mu.Unlock()
		return
	}
	n := min(len(l.queue), maxBatch)
	batch := make([]*claimCall, n)
	copy(batch, l.queue)
	l.queue = append(l.queue[:0], l.queue[n:]...)
	l.mu.Unlock()
	go r.sendClaims(l, batch) // the finished call's caller goes on with its own answer
}

// sendClaims sends a batch of queued claims, answers each, then hands the lane on. It runs
// detached from its callers' contexts (each stops waiting when its own ends).
func (r *Reserver) sendClaims(l *claimLane, batch []*claimCall) {
	out := make([]string, len(batch))
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	err := r.execClaims(ctx, l.key, batch, out)
	cancel()
	for i, c := range batch {
		c.res, c.err = out[i], err
		close(c.done)
	}
	r.claimHandoff(l)
}

// execClaims runs route.lua for calls, whose ids share the claims hash key, and puts each id's
// claim in dst.
func (r *Reserver) execClaims(ctx context.Context, key string, calls []*claimCall, dst []string) error {
	args := make([]string, 0, 2*len(calls))
	for _, c := range calls {
		args = append(args, c.id, c.claim)
	}
	msgs, err := replyArray(protocol.Route.Exec(ctx, r.client, []string{key}, args), len(calls))
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
