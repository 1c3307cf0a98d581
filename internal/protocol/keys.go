package protocol

import (
	"hash/maphash"
	"strconv"
	"strings"
	"sync"
)

// Key suffixes after an item's base "<prefix>:{<sku>}". Every key of one item shares the hash
// tag {<sku>}, so every script touches a single Redis Cluster slot.
const (
	suffixLedger    = ":l"  // hash: request id -> ledger entry (see ParseEntry)
	suffixUsers     = ":u"  // hash: user -> units held or bought
	suffixOutbox    = ":o"  // sorted set: outbox member ("<event>:<id>") -> sequence
	suffixHolds     = ":h"  // sorted set: hold id -> deadline in ms
	suffixFilter    = ":b"  // string: the sold-out filter, a Bloom filter of the ledger's ids
	suffixTries     = ":r"  // hash: outbox member -> delivery attempts
	suffixLease     = ":rl" // string: the relay or reconciler holding the item, or "backoff"; with a TTL
	suffixDead      = ":dl" // sorted set: events the store rejected as invalid
	suffixPublished = ":p"  // sorted set: events handed to a publisher, not yet applied by a consumer
	suffixTransfers = ":x"  // hash: transfer id -> transfer entry (a bucket of a bucketed item)
	suffixInFlight  = ":xf" // sorted set: transfers out of a bucket not yet ended -> when they began
	suffixClaims    = ":i"  // hash: request id -> its bucket (in the id's home bucket)
	suffixBarriers  = ":xb" // sorted set: a bucket's transfer barriers (see Keys.Barriers)
)

var suffixes = [...]string{"", suffixLedger, suffixUsers, suffixOutbox, suffixHolds, suffixFilter,
	suffixTries, suffixLease, suffixDead, suffixPublished, suffixTransfers, suffixInFlight, suffixClaims, suffixBarriers}

// Keys are the Redis keys of one item. A Keys is immutable once built: share it freely.
type Keys struct {
	Item      string // hash: a available, h held, s sold, l loaded, c closed, n next deadline, ...
	Ledger    string // hash: request id -> ledger entry
	Users     string // hash: user -> units held or bought
	Outbox    string // sorted set: outbox member -> sequence
	Holds     string // sorted set: hold id -> deadline in ms
	Filter    string // string: the sold-out filter
	Tries     string // hash: outbox member -> delivery attempts
	Lease     string // string: the item's relay lease
	Dead      string // sorted set: dead letters
	Published string // sorted set: published events not yet applied
	Transfers string // hash: transfer id -> transfer entry (a bucket's transfers; see xout.lua)
	InFlight  string // sorted set: the bucket's transfers out not yet ended -> when they began
	Claims    string // hash: request id -> its bucket, for the ids whose home is this bucket
	// Barriers is a bucket's sorted set of transfer barriers: member "<donor>|<donor seq>|<tid>"
	// (the donor bucket's index, its outbox sequence when the transfer took the units, the
	// transfer id), scored by this bucket's own sequence when the units came in (xin.lua). This
	// bucket's events above the score may spend units the donor's events up to donor seq gave
	// back: the relay delivers them only after those.
	Barriers string
	item     [6]string
}

// Base is the common part of an item's keys: "<prefix>:{<sku>}", or "<prefix>:{<group>}:{<sku>}"
// for an item in a group (group "" for none). No name contains a brace, so the SKU always ends
// at the first '}' after it and the suffixes that follow can never be read as part of another
// SKU: the keys of two different items never meet, grouped or not. Every other key of a prefix
// (Registry, Epoch, Probe, Carts) starts with "<prefix>:" and a letter, so no item reaches it either.
func Base(prefix, group, sku string) string {
	if group != "" {
		return prefix + ":{" + group + "}:{" + sku + "}"
	}
	return prefix + ":{" + sku + "}"
}

// Slots is the number of Redis Cluster hash slots.
const Slots = 16384

// Slot returns the Redis Cluster hash slot of key, as Redis computes it: CRC16 (XMODEM) of the
// key's hash tag (what is between its first '{' and the first '}' after it, when not empty) or
// of the whole key, mod Slots.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % Slots)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the checksum of Redis Cluster.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// BucketSlots returns the slot range [lo, hi) of bucket i of n: the i-th of n equal contiguous
// ranges of the slot space, so that on a cluster whose masters own equal contiguous ranges (as
// redis-cli --cluster create deals them out) n buckets fall on n masters when n is their number.
func BucketSlots(i, n int) (lo, hi int) {
	return i * Slots / n, (i + 1) * Slots / n
}

// BucketTag returns the hash tag of the keys of bucket i of n of item sku (the item kept as
// "<sku>|<i>"): "<sku>|<i>|<k>" for the first counter k >= 0 whose slot is in the middle half of
// BucketSlots(i, n).
// Names never contain '|', so the tag of a bucket meets no item's and no other bucket's. It is a
// pure function of its arguments: every process finds the same keys.
func BucketTag(sku string, i, n int) string {
	head := sku + "|" + strconv.Itoa(i) + "|"
	if i < 0 || i >= n || n > Slots {
		return head // not a bucket of n: no range to aim at
	}
	lo, hi := BucketSlots(i, n)
	// Aim at the middle half of the range: tools deal out the slots with different roundings
	// (redis-cli gives 0-5460, 5461-10922, 10923-16383 to three masters), never by a quarter.
	w := (hi - lo) / 4
	lo, hi = lo+w, hi-w
	for k := 0; ; k++ {
		tag := head + strconv.Itoa(k)
		if s := int(crc16(tag) % Slots); s >= lo && s < hi {
			return tag
		}
	}
}

// BucketBase is Base for bucket i of n of item sku: "<prefix>:{<BucketTag>}". A bucket is never
// in a group.
func BucketBase(prefix, sku string, i, n int) string {
	return prefix + ":{" + BucketTag(sku, i, n) + "}"
}

// NewKeys returns the keys of the item whose base is base. Every key is a slice of one string:
// one allocation for the text.
func NewKeys(base string) *Keys {
	var b strings.Builder
	b.Grow(len(suffixes)*len(base) + 16)
	var ends [len(suffixes)]int
	for i, s := range suffixes {
		b.WriteString(base)
		b.WriteString(s)
		ends[i] = b.Len()
	}
	all := b.String()
	var ks [len(suffixes)]string
	start := 0
	for i, end := range ends {
		ks[i], start = all[start:end], end
	}
	k := &Keys{Item: ks[0], Ledger: ks[1], Users: ks[2], Outbox: ks[3], Holds: ks[4], Filter: ks[5],
		Tries: ks[6], Lease: ks[7], Dead: ks[8], Published: ks[9], Transfers: ks[10], InFlight: ks[11], Claims: ks[12],
		Barriers: ks[13]}
	k.item = [6]string{k.Item, k.Ledger, k.Users, k.Outbox, k.Holds, k.Filter}
	return k
}

// All returns every key of the item, in a new slice.
func (k *Keys) All() []string {
	return []string{k.Item, k.Ledger, k.Users, k.Outbox, k.Holds, k.Filter, k.Tries, k.Lease, k.Dead, k.Published,
		k.Transfers, k.InFlight, k.Claims, k.Barriers}
}

// The KEYS of each script, in the order the script reads them. ForItem is built once per Keys
// and does not allocate: its capacity is its length, so an append copies it, and a caller must
// never write to it. The others are built on each call (they serve the relay and the
// reconciler, not the requests).

// ForItem: deduct, deductmany (six per line), restore, restock, confirm, extend, sweep.
func (k *Keys) ForItem() []string { return k.item[:6:6] }

// ForLoad: load.
func (k *Keys) ForLoad() []string { return []string{k.Item, k.Filter} }

// ForMarks: close and delist (the item hash and the ledger, which keeps the marks).
func (k *Keys) ForMarks() []string { return []string{k.Item, k.Ledger} }

// ForAdjust: adjust.
func (k *Keys) ForAdjust() []string { return []string{k.Item} }

// ForSnapshot: snapshot and requeue.
func (k *Keys) ForSnapshot() []string {
	return []string{k.Item, k.Ledger, k.Users, k.Outbox, k.Holds, k.Dead, k.Published}
}

// ForRebuild: rebuild.
func (k *Keys) ForRebuild() []string {
	return []string{k.Item, k.Ledger, k.Users, k.Outbox, k.Holds, k.Filter, k.Published, k.Dead}
}

// ForRetire: retire.
func (k *Keys) ForRetire() []string {
	return []string{k.Item, k.Ledger, k.Users, k.Outbox, k.Holds, k.Dead, k.Tries, k.Lease, k.Filter}
}

// ForTrim: trim.
func (k *Keys) ForTrim() []string { return []string{k.Ledger, k.Outbox, k.Published, k.Dead} }

// ForRerecord: rerecord.
func (k *Keys) ForRerecord() []string { return []string{k.Ledger, k.Item, k.Filter} }

// ForClaim: claim.
func (k *Keys) ForClaim() []string { return []string{k.Outbox, k.Ledger, k.Tries, k.Lease} }

// ForAck: ack.
func (k *Keys) ForAck() []string { return []string{k.Outbox, k.Ledger, k.Tries, k.Published} }

// ForTurn: turn.
func (k *Keys) ForTurn() []string { return []string{k.Outbox, k.Published, k.Lease, k.Ledger} }

// ForDeadLetter: deadletter, moving events out of from (the outbox or the published set).
func (k *Keys) ForDeadLetter(from string) []string { return []string{from, k.Tries, k.Dead} }

// ForXOut: xout (a transfer's donor).
func (k *Keys) ForXOut() []string { return []string{k.Item, k.Transfers, k.InFlight} }

// ForXIn: xin (a transfer's target).
func (k *Keys) ForXIn() []string { return []string{k.Item, k.Transfers, k.Barriers} }

// ForXDone: xdone (a transfer's donor).
func (k *Keys) ForXDone() []string { return []string{k.Transfers, k.InFlight} }

// ForRoute: route (the id's home bucket).
func (k *Keys) ForRoute() []string { return []string{k.Claims} }

// ForLease: refresh and unlock.
func (k *Keys) ForLease() []string { return []string{k.Lease} }

// AckMark is the key a write that waits for replicas (WithReplicaAck) sets beside the item
// whose hash is hashKey, in its slot, so that a replay, which writes nothing, has a write of its
// own to wait for. It expires by itself.
func AckMark(hashKey string) string { return hashKey + ":w" }

// Registry is the set of a prefix's items.
func Registry(prefix string) string { return prefix + ":items" }

// Epoch is the key of the primaries' identities last reconciled (the failover fence).
func Epoch(prefix string) string { return prefix + ":epoch" }

// Probe is a key nobody writes, read by the sold-out fast path to learn whether the client
// caches reads.
func Probe(prefix string) string { return prefix + ":probe" }

// DueShards is how many shards the due-work hints of a prefix are split into (see RelayDue).
const DueShards = 16

// DueShard is the shard of an item's due-work hints: FNV-1a of its name, mod DueShards.
func DueShard(sku string) int {
	h := uint32(2166136261)
	for i := 0; i < len(sku); i++ {
		h ^= uint32(sku[i])
		h *= 16777619
	}
	return int(h % DueShards)
}

// RelayDue is shard n of the relay's due-work hints: a sorted set of items that may have events
// to deliver, scored by when to look (0: now). HoldsDue is shard n of the sweeper's: items that
// may have holds due, scored by the earliest deadline in ms. Both start with "<prefix>:d" or
// "<prefix>:h", never "<prefix>:{" as every item key does. They are hints, written after the
// scripts: a hint lost only delays the work until a slow walk of the registry finds it.
func RelayDue(prefix string, n int) string { return prefix + ":due{~" + strconv.Itoa(n) + "}" }

// HoldsDue: see RelayDue.
func HoldsDue(prefix string, n int) string { return prefix + ":holdsdue{~" + strconv.Itoa(n) + "}" }

// Carts returns the KEYS of cart.lua: the carts hash and the pending sorted set, in one slot of
// their own. They start with "<prefix>:c", never "<prefix>:{" as every item key does, so no item
// can reach them.
func Carts(prefix string) []string {
	base := prefix + ":carts{~}"
	return []string{base, base + ":p"}
}

// keyShards splits a KeyCache so that lookups of different items rarely meet on one lock.
const keyShards = 16

// A KeyCache holds the Keys of recently used items, at most about its capacity of them. It is
// safe for concurrent use; a lookup of a cached item does not allocate.
//
// Each shard keeps two generations: lookups fill the current one; when it is full it becomes
// the old one and the previous old one is dropped. An item found in the old generation moves
// to the current one, so items in use stay and items no longer used leave within two
// generations.
type KeyCache struct {
	base   func(sku string) string
	seed   maphash.Seed
	per    int // entries per generation per shard
	shards [keyShards]keyShard
}

type keyShard struct {
	mu       sync.RWMutex
	cur, old map[string]*Keys
}

// NewKeyCache returns a cache of at most capacity items (at least 2*16), whose keys are
// NewKeys(base(sku)). base must give the same answer for the same sku every time.
func NewKeyCache(capacity int, base func(sku string) string) *KeyCache {
	c := &KeyCache{base: base, seed: maphash.MakeSeed(), per: max(1, capacity/(2*keyShards))}
	for i := range c.shards {
		c.shards[i].cur = make(map[string]*Keys)
	}
	return c
}

// Get returns the keys of sku.
func (c *KeyCache) Get(sku string) *Keys {
	s := &c.shards[maphash.String(c.seed, sku)%keyShards]
	s.mu.RLock()
	k, ok := s.cur[sku]
	if !ok {
		k = s.old[sku]
	}
	s.mu.RUnlock()
	if ok {
		return k
	}
	if k == nil {
		k = NewKeys(c.base(sku))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if k2, ok := s.cur[sku]; ok {
		return k2 // another lookup put it there meanwhile
	}
	if len(s.cur) >= c.per {
		s.old, s.cur = s.cur, make(map[string]*Keys, c.per)
	}
	s.cur[strings.Clone(sku)] = k
	return k
}

// Len returns the number of items cached.
func (c *KeyCache) Len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.RLock()
		n += len(s.cur) + len(s.old)
		s.mu.RUnlock()
	}
	return n
}
