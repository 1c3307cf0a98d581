// Package lane coalesces script calls per key: while fewer than a limit of calls of one key are
// in flight a call is sent at once, on its own; beyond, calls queue, and the call that finishes
// first hands the queue, up to MaxBatch requests, to the oldest waiter, which sends them as one
// call. Package stock runs an item's deducts (deduct.lua) and a claims hash's claims (route.lua)
// through it; each script applies a batch's requests in order with exactly the checks and writes
// of one call each, so no outcome changes, only the number of script calls.
package lane

import (
	"context"
	"hash/maphash"
	"sync"
	"time"
)

// MaxBatch is the most requests one coalesced script call carries.
const MaxBatch = 64

// BatchTimeout bounds a coalesced call, which runs detached from its callers' contexts.
const BatchTimeout = 10 * time.Second

// Lanes coalesces one kind of script call (an item's deducts, a claims hash's claims) per key:
// the lanes of the keys with calls in flight, and how a batch of queued requests is sent.
type Lanes[Req, Res any] struct {
	shards  [shards]shard[Req, Res] // the live lanes, by a hash of their key
	waiters sync.Pool               // of *waiter[Req, Res], each with its channel
	// Send sends reqs, all of key, as one script call and puts one answer per request in dst;
	// an error answers them all.
	Send func(ctx context.Context, key string, reqs []Req, dst []Res) error
	// SendOne, when set, sends a request that goes at once, on its own (Send's batch of one,
	// without the two slices a call through Send allocates).
	SendOne func(ctx context.Context, key string, req Req) (Res, error)
	// Unawaited, when set, makes a caller whose context ends once its request is in a batch stop
	// waiting, with the error unawaited makes of the context's; when nil, such a caller waits
	// for the batch's answer (the batch is bounded by BatchTimeout).
	Unawaited func(ctxErr error) error
}

// shards is how many shards the lanes of a Lanes are kept in: calls of keys in different shards
// never wait for each other's lock.
const shards = 32

// seed hashes keys to shards.
var seed = maphash.MakeSeed()

// shard holds the lanes of the keys that hash to it. Its mutex guards the map and every field of
// its lanes: a lane is only reached through the map, under the lock, or by a caller that counts
// in it (a call in flight or a queued waiter), so a lane the map dropped, which no caller counts
// in, can be used again for the next key: idle keys cost no memory and no allocation, however
// many keys ever had calls.
type shard[Req, Res any] struct {
	mu   sync.Mutex
	live map[string]*lane[Req, Res]
	free []*lane[Req, Res] // dropped lanes, for the next keys (at most maxFree)
}

// maxFree is the most dropped lanes a shard keeps for reuse.
const maxFree = 8

// lane is the coalescing state of one key while it has calls in flight or queued.
type lane[Req, Res any] struct {
	key      string
	sh       *shard[Req, Res]
	inflight int
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
func (ls *Lanes[Req, Res]) join(key string, req Req, limit int) (l *lane[Req, Res], w *waiter[Req, Res]) {
	sh := ls.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	l = sh.live[key]
	if l == nil {
		if n := len(sh.free); n > 0 {
			l, sh.free = sh.free[n-1], sh.free[:n-1]
		} else {
			l = &lane[Req, Res]{sh: sh}
		}
		l.key = key
		if sh.live == nil {
			sh.live = map[string]*lane[Req, Res]{}
		}
		sh.live[key] = l
	}
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

// shard returns the shard of key's lane.
func (ls *Lanes[Req, Res]) shard(key string) *shard[Req, Res] {
	return &ls.shards[maphash.String(seed, key)%shards]
}

// wait returns the answer of w, queued on l: sent in a batch that another waiter leads, or in
// the batch w is handed to lead. A caller whose context ends while w is queued leaves the queue
// with the context's error, and nothing is sent for it.
func (ls *Lanes[Req, Res]) wait(ctx context.Context, l *lane[Req, Res], w *waiter[Req, Res]) (res Res, err error) {
	var batch []*waiter[Req, Res]
	select {
	case batch = <-w.ch:
	case <-ctx.Done():
		l.sh.mu.Lock()
		for i, q := range l.queue {
			if q == w { // still queued: nothing was sent for it
				l.queue = append(l.queue[:i:i], l.queue[i+1:]...)
				l.sh.mu.Unlock()
				ls.put(w)
				return res, ctx.Err()
			}
		}
		if ls.Unawaited == nil {
			l.sh.mu.Unlock()
			batch = <-w.ch // already in a batch: its answer is coming
			break
		}
		select {
		case batch = <-w.ch: // done hands a batch to its leader under the lock: it is here already
			l.sh.mu.Unlock()
			if batch != nil { // w leads it: sent without w waiting (w, in it, stays with it)
				go ls.sendBatch(context.Background(), l, batch)
				return res, ls.Unawaited(ctx.Err())
			}
		default: // in a batch another waiter leads, not answered: w stays with it
			l.sh.mu.Unlock()
			return res, ls.Unawaited(ctx.Err())
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
func (ls *Lanes[Req, Res]) put(w *waiter[Req, Res]) {
	clear(w.reqs) // no request's strings kept alive by the pool
	*w = waiter[Req, Res]{ch: w.ch, reqs: w.reqs[:0], dst: w.dst[:0]}
	ls.waiters.Put(w)
}

// sendBatch sends a batch led by batch[0], hands the answers out, then hands the lane on.
func (ls *Lanes[Req, Res]) sendBatch(ctx context.Context, l *lane[Req, Res], batch []*waiter[Req, Res]) {
	lead := batch[0]
	reqs := lead.reqs[:0]
	for _, w := range batch {
		reqs = append(reqs, w.req)
	}
	dst := append(lead.dst[:0], make([]Res, len(batch))...)
	lead.reqs, lead.dst = reqs, dst
	// The batch carries other callers' requests: it is not cut short by the leader's context
	// being cancelled (the leader may have been cancelled while it waited in the queue).
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), BatchTimeout)
	err := ls.Send(bctx, l.key, reqs, dst)
	cancel()
	for i, w := range batch {
		w.res, w.err = dst[i], err
		if i > 0 {
			w.ch <- nil
		}
	}
	ls.done(l)
}

// done is called when a call of the lane finished: the oldest waiters (up to MaxBatch) are handed
// the next batch, or the lane has one call fewer in flight.
func (ls *Lanes[Req, Res]) done(l *lane[Req, Res]) {
	sh := l.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if len(l.queue) == 0 {
		l.inflight--
		if l.inflight == 0 { // nobody counts in l any more: drop it, keep it for another key
			delete(sh.live, l.key)
			l.key = ""
			if len(sh.free) < maxFree {
				sh.free = append(sh.free, l)
			}
		}
		return
	}
	n := min(len(l.queue), MaxBatch)
	batch := make([]*waiter[Req, Res], n)
	copy(batch, l.queue)
	l.queue = append(l.queue[:0], l.queue[n:]...)
	batch[0].ch <- batch // never blocks: a queued waiter's channel is empty
}

// Do runs req, of key, through key's lane: at once when fewer than limit calls of key are in
// flight (sent as a batch of one, with ctx), otherwise queued and answered by the batch that
// carries it. It is the one way callers use a Lanes.
func (ls *Lanes[Req, Res]) Do(ctx context.Context, key string, req Req, limit int) (Res, error) {
	l, w := ls.join(key, req, limit)
	if w != nil {
		return ls.wait(ctx, l, w)
	}
	var res Res
	var err error
	if ls.SendOne != nil {
		res, err = ls.SendOne(ctx, key, req)
	} else {
		out := []Res{res}
		err = ls.Send(ctx, key, []Req{req}, out)
		res = out[0]
	}
	ls.done(l)
	return res, err
}

// Queued is how many requests of key wait in its queue (0 when key has no calls in flight).
func (ls *Lanes[Req, Res]) Queued(key string) int {
	sh := ls.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if l := sh.live[key]; l != nil {
		return len(l.queue)
	}
	return 0
}

// Live is how many keys have a lane: calls in flight or queued. An idle key has none.
func (ls *Lanes[Req, Res]) Live() int {
	n := 0
	for i := range ls.shards {
		sh := &ls.shards[i]
		sh.mu.Lock()
		n += len(sh.live)
		sh.mu.Unlock()
	}
	return n
}
