package engine

import (
	"context"
	"crypto/sha1"
	"encoding/binary"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	"github.com/stockres/stock/internal/protocol"
)

// The sold-out fast path.
//
// In a flash sale nearly every request arrives after the item is gone. Once a deduct or hold of
// an item has been refused as sold out by Redis, the Reserver reads the item's state through
// rueidis's server-assisted client-side cache (CLIENT TRACKING): the available count, the closed
// flag, the next hold deadline and the item's sold-out filter. While that cached state says
// "nothing available", a new request is answered ErrSoldOut in-process, without a round trip,
// when the filter shows that its id was never in the item's ledger. Redis invalidates the cached
// state as soon as the item changes (a restore, a restock, an expired hold, a repair), and the
// next request goes to Redis again.
//
// What it answers, it answers as the script would: the fast path never admits a request, only
// refuses one the script would refuse with ErrSoldOut. Requests it does not answer go to Redis:
// ids that may be in the ledger (a repeat of a successful id must be a replay, never "sold out"),
// retries (Request.Retry, whose refusal the script records), items with a hold due to expire,
// closed items, items without a complete filter (it is built from the ledger, in bounded
// steps, by the first refusals after the item sells out: see lua/lib.lua).
//
// An item split over buckets (WithBuckets) is answered from the cached state of every bucket,
// after the request has claimed its id (one round trip: see knownSoldOutSplit); a write of this
// Reserver to any bucket renews the reads of all of them.
//
// The window: between a change another process made in Redis and the invalidation reaching this
// process (one network hop; measured in fastpath_test.go and by stockbench), a request can still
// be told "sold out". Changes this Reserver made have no window: see "Own writes" below.

// filterHas reports whether the filter f (2^b bits) may hold id. A filter without its sentinel
// bit (recreated after its key was lost) may hold anything.
func filterHas(f string, b int, id string) bool {
	m := uint32(1) << b
	if !bitSet(f, m) {
		return true
	}
	sum := sha1.Sum([]byte(id))
	return bitSet(f, binary.BigEndian.Uint32(sum[0:4])%m) && bitSet(f, binary.BigEndian.Uint32(sum[4:8])%m)
}

// bitSet reads bit i as SETBIT writes it: the most significant bit of byte 0 is bit 0.
func bitSet(f string, i uint32) bool {
	return int(i>>3) < len(f) && f[i>>3]&(0x80>>(i&7)) != 0
}

// soldOut is the Reserver's fast-path state.
type soldOut struct {
	ttl time.Duration // how long a cached read is trusted without an invalidation
	// items and byKey hold the items refused as sold out by Redis and not since seen in stock:
	// items by SKU for the requests, byKey by item hash key for the scripts (see wrote). Both
	// change under mu, byKey first when an item comes in and last when it goes, so an item the
	// requests can find, the scripts find too.
	items   sync.Map // sku -> *soldOutItem
	byKey   sync.Map // item hash key -> the same *soldOutItem
	mu      sync.Mutex
	version atomic.Uint64 // the last version given to an item's cached reads
	// tracking: 0 not probed yet, 1 the client caches (server-assisted), -1 it does not.
	tracking atomic.Int32
	probing  sync.Mutex
	answered atomic.Int64 // requests answered in-process
	clock    redisClock   // Redis's clock, for the deadlines of a sold-out item's holds
}

// redisClock is Redis's clock as the fast path sees it: a TIME read at most redisClockAge old,
// moved on by the process's monotonic clock since the read was sent (so it runs ahead of
// Redis's, never behind: a hold is taken for due early, never late). The process's wall clock
// plays no part: a process whose clock is behind Redis's would otherwise take a due hold for a
// live one and answer "sold out" while the script would release the hold and take the request.
type redisClock struct {
	mu      sync.Mutex
	base    time.Time // Redis's time at the last read
	at      time.Time // when that read was sent, by the process's monotonic clock
	reading atomic.Bool
}

// redisClockAge is how long a TIME read serves before the next request that needs it reads
// again: one TIME per second at most, and only while a sold-out item has holds.
const redisClockAge = time.Second

// now returns Redis's time, reading TIME when the last read is too old. It reports false when
// it does not know (the read failed, or another request is reading): the request goes to Redis.
func (rc *redisClock) now(ctx context.Context, r *Reserver) (time.Time, bool) {
	rc.mu.Lock()
	base, at := rc.base, rc.at
	rc.mu.Unlock()
	if !at.IsZero() && time.Since(at) < redisClockAge {
		return base.Add(time.Since(at)), true
	}
	if !rc.reading.CompareAndSwap(false, true) {
		return time.Time{}, false
	}
	defer rc.reading.Store(false)
	sent := time.Now()
	t, err := r.serverNow(ctx)
	if err != nil {
		return time.Time{}, false
	}
	rc.mu.Lock()
	rc.base, rc.at = t, sent
	rc.mu.Unlock()
	return t.Add(time.Since(sent)), true
}

// soldOutItem is the fast-path state of one item, from a refusal as sold out by Redis until the
// item is seen in stock again: one item hash and filter, or one per bucket for an item split over
// buckets (index i is bucket i).
type soldOutItem struct {
	keys, filterKeys []string
	reads            atomic.Pointer[soldOutReads]
}

// soldOutReads are an item's cached reads (one state and one filter read per bucket), of one
// version each (see renew).
type soldOutReads struct {
	state, filter []rueidis.Cacheable
}

// filterEnd is past the end of the largest sold-out filter (2^23 bits and the sentinel bit), so
// that GETRANGE filter 0 filterEnd+version reads all of it whatever the version.
const filterEnd = 1 << 30

// stateFields are the item hash fields the fast path reads (the version field is added last):
// available, closed, next hold deadline, filter bits, filter cursor, net units transferred.
var stateFields = []string{"a", "c", "n", "b", "bc", "t"}

// renew gives the item's state reads (and its filter reads too, with filter, or when it has none)
// a new version: a read of a command no cached read has used, so its first use goes to Redis
// and is answered after everything this process saw acknowledged. The version is a field the
// item hash never has ("v<n>", read as nil) and, for the filter, the end offset of GETRANGE. A
// split item's buckets are renewed together: a write to any of them renews them all.
func (it *soldOutItem) renew(so *soldOut, c rueidis.Client, filter bool) {
	for {
		old := it.reads.Load()
		v := so.version.Add(1)
		vf := "v" + strconv.FormatUint(v, 10)
		nr := &soldOutReads{state: make([]rueidis.Cacheable, len(it.keys))}
		for i, k := range it.keys {
			nr.state[i] = c.B().Hmget().Key(k).Field(append(slices.Clone(stateFields), vf)...).Cache().Pin()
		}
		if filter || old == nil {
			nr.filter = make([]rueidis.Cacheable, len(it.filterKeys))
			for i, k := range it.filterKeys {
				nr.filter[i] = c.B().Getrange().Key(k).Start(0).End(filterEnd + int64(v)).Cache().Pin()
			}
		} else {
			nr.filter = old.filter
		}
		if it.reads.CompareAndSwap(old, nr) {
			return
		}
	}
}

// soldOutAnswers is stockops.SoldOutAnswers.
func (r *Reserver) soldOutAnswers() int64 {
	if r.soldOut == nil {
		return 0
	}
	return r.soldOut.answered.Load()
}

// markSoldOut records that Redis refused a request for sku as sold out: the fast path answers
// for the item from now on, from reads made after this refusal. ks are the item's keys, or its
// buckets' (in bucket order) for an item split over buckets.
func (r *Reserver) markSoldOut(sku string, ks ...*protocol.Keys) {
	so := r.soldOut
	if so == nil {
		return
	}
	if _, ok := so.items.Load(sku); ok {
		return
	}
	so.mu.Lock()
	defer so.mu.Unlock()
	if _, ok := so.items.Load(sku); ok {
		return
	}
	it := &soldOutItem{}
	for _, k := range ks {
		it.keys = append(it.keys, k.Item)
		it.filterKeys = append(it.filterKeys, k.Filter)
	}
	it.renew(so, r.client, true)
	for _, k := range it.keys {
		so.byKey.Store(k, it)
	}
	so.items.Store(sku, it)
}

// unmark ends the fast path's answers for sku (it is in stock again, or gone) if it is still
// the item it.
func (so *soldOut) unmark(sku string, it *soldOutItem) {
	so.mu.Lock()
	defer so.mu.Unlock()
	if so.items.CompareAndDelete(sku, it) {
		for _, k := range it.keys {
			so.byKey.CompareAndDelete(k, it)
		}
	}
}

// soldOutItemFor returns the fast-path state of sku if the fast path may answer for it (a
// request that is not a retry, of an item Redis refused as sold out, with n hashes: 1, or its
// buckets), with its current reads.
func (r *Reserver) soldOutItemFor(ctx context.Context, req Request, n int) (*soldOutItem, *soldOutReads, bool) {
	so := r.soldOut
	if so == nil || req.Retry {
		return nil, nil, false
	}
	v, ok := so.items.Load(req.SKU)
	if !ok {
		return nil, nil, false
	}
	it := v.(*soldOutItem)
	if len(it.keys) != n || !so.caches(ctx, r.client, r.opts.prefix) {
		return nil, nil, false
	}
	return it, it.reads.Load(), true
}

// soldOutState reads the cached state of every hash of the item (one, or every bucket) and
// reports whether it says what a take refused as sold out needs: every hash available 0 and no
// units in a transfer between buckets (the sum of the net units transferred is 0), none closed,
// no hold due (or about to be) anywhere. It returns each hash's filter size in bits (log2), or
// -1 for a filter that is missing or still being built. A hash seen with stock (or gone) ends
// the fast path's answers for the item.
func (r *Reserver) soldOutState(ctx context.Context, sku string, it *soldOutItem, rd *soldOutReads) ([]int, bool) {
	so := r.soldOut
	cmds := make([]rueidis.CacheableTTL, len(rd.state))
	for i, c := range rd.state {
		cmds[i] = rueidis.CT(c, so.ttl)
	}
	bits := make([]int, len(rd.state))
	var moved, next int64 // next: the earliest hold deadline of the hashes (0: no live hold)
	for i, res := range r.client.DoMultiCache(ctx, cmds...) {
		st, err := res.ToArray()
		if err != nil || len(st) != len(stateFields)+1 || !st[len(stateFields)].IsNil() {
			return nil, false
		}
		a, err := st[0].AsInt64()
		if err != nil || a != 0 {
			so.unmark(sku, it) // back in stock (or gone): Redis answers from now on
			return nil, false
		}
		if c, _ := st[1].ToString(); c == "1" {
			return nil, false
		}
		if !st[2].IsNil() {
			d, err := st[2].AsInt64()
			if err != nil {
				return nil, false
			}
			if next == 0 || d < next {
				next = d
			}
		}
		if !st[5].IsNil() {
			t, err := st[5].AsInt64()
			if err != nil {
				return nil, false
			}
			moved += t
		}
		bits[i] = -1
		if b, err := st[3].AsInt64(); err == nil && b >= 12 && b <= 23 && st[4].IsNil() {
			bits[i] = int(b)
		}
	}
	if moved != 0 {
		return nil, false // units in flight between buckets: the take moves them in
	}
	if next != 0 {
		// Holds are live somewhere: answer only when none is due (or about to be). The
		// script releases its bucket's due holds, a short bucket the others'.
		now, ok := so.clock.now(ctx, r)
		if !ok || next <= now.Add(time.Second).UnixMilli() {
			return nil, false
		}
	}
	return bits, true
}

// soldOutFilter reports whether hash i's filter (of 2^bits bits) shows that id was never in
// its ledger.
func (r *Reserver) soldOutFilter(ctx context.Context, rd *soldOutReads, i, bits int, id string) bool {
	if bits < 0 {
		return false // no filter, or one still being built
	}
	f, err := r.client.DoCache(ctx, rd.filter[i], r.soldOut.ttl).ToString()
	return err == nil && !filterHas(f, bits, id)
}

// knownSoldOut reports whether req, on an item that is not split over buckets, can be answered
// ErrSoldOut without running the script.
func (r *Reserver) knownSoldOut(ctx context.Context, req Request) bool {
	it, rd, ok := r.soldOutItemFor(ctx, req, 1)
	if !ok {
		return false
	}
	bits, ok := r.soldOutState(ctx, req.SKU, it, rd)
	if !ok || !r.soldOutFilter(ctx, rd, 0, bits[0], req.ID) {
		return false
	}
	r.soldOut.answered.Add(1)
	return true
}

// Items split over buckets (WithBuckets). Redis refuses a take of a split item as sold out
// (takeBucketed) when the item as a whole has nothing: the take in the id's bucket is refused,
// then no bucket has a due hold to release or stock to give. The fast path answers such a take
// from the cached state of every bucket (soldOutState), but not in-process: the request still
// claims its id (route.lua, one round trip), because a refused request's claim is part of the
// contract (WithBuckets: a later request of the id by a buyer of another bucket is
// ErrConflict), and the claim's answer says what the take would meet: an id claimed for another
// bucket, or by a give-back, goes to Redis (ErrConflict, ErrRestored, a replay: the ledger of
// the claimed bucket answers); an id claimed for the request's own bucket is answered from that
// bucket's filter, whose ledger is the only one the take reads. What is saved is the take, the
// reads of every bucket and the last take of takeBucketed: one small script call instead of
// four or more. A request the fast path does not answer claims its id a second time (a replay
// of the claim) on its way to Redis.

// knownSoldOutSplit reports whether req, on an item split over n buckets, can be answered
// ErrSoldOut without the take; it claims the id's bucket first (see above).
func (r *Reserver) knownSoldOutSplit(ctx context.Context, req Request, n int) bool {
	it, rd, ok := r.soldOutItemFor(ctx, req, n)
	if !ok {
		return false
	}
	bits, ok := r.soldOutState(ctx, req.SKU, it, rd)
	if !ok {
		return false
	}
	want := bucketOf(req.ID, n)
	if req.User != "" {
		want = bucketOf(req.User, n)
	}
	b, byGiveBack, err := r.route(ctx, req.SKU, req.ID, n, want, false)
	if err != nil || b != want || byGiveBack || !r.soldOutFilter(ctx, rd, b, bits[b], req.ID) {
		return false
	}
	r.soldOut.answered.Add(1)
	return true
}

// takeBucketedFast is the fast path's part of takeBucketed: it answers req (true) when it is
// known sold out, and otherwise returns a function for takeBucketed to defer, that starts the
// fast path for the item when Redis answers ErrSoldOut (*err).
func (r *Reserver) takeBucketedFast(ctx context.Context, req Request, n int) (Receipt, bool, func(err *error)) {
	if r.soldOut == nil {
		return Receipt{}, false, func(*error) {}
	}
	if r.knownSoldOutSplit(ctx, req, n) {
		return Receipt{SKU: req.SKU, ID: req.ID, Qty: req.Qty}, true, nil
	}
	return Receipt{}, false, func(err *error) {
		if errors.Is(*err, ErrSoldOut) {
			ks := make([]*protocol.Keys, n)
			for i := range ks {
				ks[i] = r.item(bucketName(req.SKU, i))
			}
			r.markSoldOut(req.SKU, ks...)
		}
	}
}

// Own writes. Redis invalidates a cached read when the key changes, but the invalidation comes
// on the connection that made the read, after the writing script's reply (Redis sends a
// script's invalidations once it has run), and rueidis runs scripts on any of its connections.
// So the reply of a write of this Reserver can arrive before the invalidation of the reads it
// made stale, and a request that follows the write could be answered from them: a tombstone or a
// deduct just acknowledged answered "sold out". Every command of a Reserver with the fast path
// goes through trackedClient, and every script call that names an item the fast path answers
// for renews the item's reads before it returns (wrote): what the fast path answers after a
// write of this Reserver returned comes from reads sent after it. Only another process's
// writes are left to the invalidation, and its window.

// Script effects on the sold-out filter, to renew the filter's read only when it may have
// changed (it is large: up to 1 MiB; the state read is renewed after every script call).
const (
	filterMayChange = iota // the default: the script may add ids to the filter or replace it
	filterIfTaken          // deduct.lua, deductmany.lua: an id goes in the filter when taken (code OK), or as a retry's recorded refusal (its SETBITs invalidate the cached filter)
	filterKept             // the script never writes the filter
)

// scriptEffects maps each script's SHA-1, source and function name (EVALSHA, EVAL after
// NOSCRIPT, FCALL) to its effect on the filter.
var scriptEffects = sync.OnceValue(func() map[string]int {
	m := map[string]int{}
	add := func(e int, ss ...*protocol.Script) {
		for _, s := range ss {
			m[s.SHA1], m[s.Source], m[s.Func] = e, e, e
		}
	}
	add(filterIfTaken, protocol.Deduct, protocol.DeductMany)
	add(filterKept, protocol.Confirm, protocol.Extend, protocol.Sweep, protocol.Close, protocol.Delist,
		protocol.Adjust, protocol.Requeue, protocol.Snapshot, protocol.Ack, protocol.Claim, protocol.DeadLetter, protocol.Trim)
	return m
})

// scriptCall is what wrote needs of a script command, copied before the command is sent (rueidis
// recycles a command once it has run): its keys, in few when they fit (no allocation: deduct.lua
// names six), else in more.
type scriptCall struct {
	effect int
	n      int
	few    [8]string
	more   []string
}

// keys returns the keys of the call.
func (sc *scriptCall) keys() []string {
	if sc.more != nil {
		return sc.more
	}
	return sc.few[:sc.n]
}

// scriptOf returns the script call cmd makes, or false if it is not one.
func scriptOf(cmd rueidis.Completed) (scriptCall, bool) {
	cs := cmd.Commands()
	if len(cs) < 3 || (cs[0] != "EVALSHA" && cs[0] != "EVAL" && cs[0] != "FCALL") {
		return scriptCall{}, false
	}
	n, err := strconv.Atoi(cs[2])
	if err != nil || n <= 0 || 3+n > len(cs) {
		return scriptCall{}, false
	}
	e, ok := scriptEffects()[cs[1]]
	if !ok {
		e = filterMayChange
	}
	sc := scriptCall{effect: e, n: n}
	if n <= len(sc.few) {
		copy(sc.few[:], cs[3:3+n])
	} else {
		sc.more = slices.Clone(cs[3 : 3+n])
	}
	return sc, true
}

// wrote renews the reads of the items the script call names, once its reply res is in.
func (so *soldOut) wrote(c rueidis.Client, sc scriptCall, res rueidis.RedisResult) {
	filter := sc.effect == filterMayChange
	if sc.effect == filterIfTaken {
		// A reply in triples (code, remaining, qty); anything else: assume an id was taken.
		vs, err := res.ToArray()
		filter = err != nil || len(vs)%3 != 0
		for i := 0; !filter && i < len(vs); i += 3 {
			code, err := vs[i].AsInt64()
			filter = err != nil || code == protocol.OK
		}
	}
	for _, k := range sc.keys() {
		if v, ok := so.byKey.Load(k); ok {
			v.(*soldOutItem).renew(so, c, filter)
		}
	}
}

// trackedClient is the client a Reserver with the sold-out fast path runs its commands on: the
// caller's client, with wrote after every script call.
type trackedClient struct {
	rueidis.Client
	so *soldOut
}

// Do runs cmd, then renews the reads of the items a script call names.
func (c *trackedClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	sc, ok := scriptOf(cmd)
	res := c.Client.Do(ctx, cmd)
	if ok {
		c.so.wrote(c.Client, sc, res)
	}
	return res
}

// DoMulti runs cmds, then renews the reads of the items their script calls name.
func (c *trackedClient) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	return doMultiTracked(ctx, c.so, c.Client, c.Client.DoMulti, cmds)
}

// StockFunctions is the wrapped client's: whether the scripts run as Redis functions.
func (c *trackedClient) StockFunctions() *protocol.Functions {
	if h, ok := c.Client.(protocol.FunctionsHolder); ok {
		return h.StockFunctions()
	}
	return nil
}

// Dedicated runs fn on a dedicated connection whose script calls are tracked too.
func (c *trackedClient) Dedicated(fn func(rueidis.DedicatedClient) error) error {
	return c.Client.Dedicated(func(d rueidis.DedicatedClient) error {
		return fn(&trackedDedicated{DedicatedClient: d, so: c.so, c: c.Client})
	})
}

// Dedicate returns a dedicated connection whose script calls are tracked too.
func (c *trackedClient) Dedicate() (rueidis.DedicatedClient, func()) {
	d, cancel := c.Client.Dedicate()
	return &trackedDedicated{DedicatedClient: d, so: c.so, c: c.Client}, cancel
}

// trackedDedicated is a dedicated connection of a trackedClient.
type trackedDedicated struct {
	rueidis.DedicatedClient
	so *soldOut
	c  rueidis.Client // builds the renewed reads
}

// Do runs cmd, then renews the reads of the items a script call names.
func (d *trackedDedicated) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	sc, ok := scriptOf(cmd)
	res := d.DedicatedClient.Do(ctx, cmd)
	if ok {
		d.so.wrote(d.c, sc, res)
	}
	return res
}

// DoMulti runs cmds, then renews the reads of the items their script calls name.
func (d *trackedDedicated) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	return doMultiTracked(ctx, d.so, d.c, d.DedicatedClient.DoMulti, cmds)
}

func doMultiTracked(ctx context.Context, so *soldOut, c rueidis.Client,
	do func(context.Context, ...rueidis.Completed) []rueidis.RedisResult, cmds []rueidis.Completed) []rueidis.RedisResult {
	var calls map[int]scriptCall
	for i, cmd := range cmds {
		if sc, ok := scriptOf(cmd); ok {
			if calls == nil {
				calls = map[int]scriptCall{}
			}
			calls[i] = sc
		}
	}
	res := do(ctx, cmds...)
	for i, sc := range calls {
		if i < len(res) {
			so.wrote(c, sc, res[i])
		}
	}
	return res
}

// caches reports whether client keeps server-assisted cached reads (a client made with
// DisableCache, as miniredis needs, does not: every read would be a round trip). It finds out
// once, with two cached reads of a key nobody writes ("<prefix>:probe").
func (so *soldOut) caches(ctx context.Context, client rueidis.Client, prefix string) bool {
	switch so.tracking.Load() {
	case 1:
		return true
	case -1:
		return false
	}
	so.probing.Lock()
	defer so.probing.Unlock()
	if t := so.tracking.Load(); t != 0 {
		return t == 1
	}
	for range 2 {
		res := client.DoCache(ctx, client.B().Get().Key(protocol.Probe(prefix)).Cache(), time.Minute)
		if err := res.Error(); err != nil && !isNil(err) {
			return false // try again on a later call
		}
		if res.IsCacheHit() {
			so.tracking.Store(1)
			return true
		}
	}
	so.tracking.Store(-1)
	return false
}

// WithSoldOutCache is stock.WithSoldOutCache.
func WithSoldOutCache(ttl time.Duration) Option {
	return func(o *options) error {
		if ttl < 0 {
			return invalid("sold-out cache time %v is negative", ttl)
		}
		o.soldOutTTL = ttl
		return nil
	}
}
