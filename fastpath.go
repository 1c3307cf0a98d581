package stock

import (
	"context"
	"crypto/sha1"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
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
// The window: between a change in Redis and the invalidation reaching this process (one network
// hop; measured in fastpath_test.go and by stockbench), a request can still be told "sold out".

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
	ttl   time.Duration // how long a cached read is trusted without an invalidation
	items sync.Map      // sku -> *soldOutItem: refused as sold out by Redis, not since seen in stock
	// tracking: 0 not probed yet, 1 the client caches (server-assisted), -1 it does not.
	tracking atomic.Int32
	probing  sync.Mutex
	answered atomic.Int64 // requests answered in-process
}

// soldOutItem holds the two cached reads of an item, built once and pinned for reuse.
type soldOutItem struct {
	state, filter rueidis.Cacheable
}

// SoldOutAnswers returns how many requests this Reserver answered ErrSoldOut in-process, without
// a round trip to Redis (see WithSoldOutCache).
func (r *Reserver) SoldOutAnswers() int64 {
	if r.soldOut == nil {
		return 0
	}
	return r.soldOut.answered.Load()
}

// markSoldOut records that Redis refused a request for sku as sold out.
func (r *Reserver) markSoldOut(sku string) {
	if r.soldOut == nil {
		return
	}
	if _, ok := r.soldOut.items.Load(sku); ok {
		return
	}
	k := r.keys(sku)
	r.soldOut.items.LoadOrStore(sku, &soldOutItem{
		state:  r.client.B().Hmget().Key(k[0]).Field("a", "c", "n", "b", "bc").Cache().Pin(),
		filter: r.client.B().Get().Key(k[5]).Cache().Pin(),
	})
}

// knownSoldOut reports whether req can be answered ErrSoldOut without running the script.
func (r *Reserver) knownSoldOut(ctx context.Context, req Request) bool {
	so := r.soldOut
	if so == nil || req.Retry {
		return false
	}
	v, ok := so.items.Load(req.SKU)
	if !ok {
		return false
	}
	if !so.caches(ctx, r.client, r.opts.prefix) {
		return false
	}
	it := v.(*soldOutItem)
	st, err := r.client.DoCache(ctx, it.state, so.ttl).ToArray()
	if err != nil || len(st) != 5 {
		return false
	}
	a, err := st[0].AsInt64()
	if err != nil || a != 0 {
		so.items.Delete(req.SKU) // back in stock (or gone): Redis answers from now on
		return false
	}
	if c, _ := st[1].ToString(); c == "1" {
		return false
	}
	if n, err := st[2].AsInt64(); err == nil && n <= time.Now().Add(time.Second).UnixMilli() {
		return false // a hold is due: the script releases it
	}
	b, err := st[3].AsInt64()
	if err != nil || b < 12 || b > 23 || !st[4].IsNil() {
		return false // no filter, or one still being built
	}
	f, err := r.client.DoCache(ctx, it.filter, so.ttl).ToString()
	if err != nil || filterHas(f, int(b), req.ID) {
		return false
	}
	so.answered.Add(1)
	return true
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
		res := client.DoCache(ctx, client.B().Get().Key(prefix+":probe").Cache(), time.Minute)
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

// WithSoldOutCache sets how long the sold-out fast path trusts a cached read of an item's state
// when no invalidation arrives: a bound on staleness should an invalidation be lost, not the
// window (that is the invalidation's own delay). 0 turns the fast path off. The default is
// one second.
//
// The fast path needs a client with server-assisted client-side caching (rueidis's default;
// Redis 6 or later). With a client made with DisableCache (miniredis, some proxies) it turns
// itself off after one probe and every request goes to Redis, with the same results. Do not
// combine it with a client that sends cached reads to replicas (SendToReplicas): a lagging
// replica widens the window.
func WithSoldOutCache(ttl time.Duration) Option {
	return func(o *options) error {
		if ttl < 0 {
			return invalid("sold-out cache time %v is negative", ttl)
		}
		o.soldOutTTL = ttl
		return nil
	}
}
