package stock

import (
	"log/slog"
	"time"

	"github.com/stockres/stock/internal/engine"
)

// An Option configures a Reserver. Options are applied in order by New, which validates them.
type Option = engine.Option

// WithPrefix sets the prefix of every key the Reserver writes. It must be a valid name (no
// braces, '|', whitespace, control characters or Unicode format characters, at most 128 bytes).
// The default is "stock".
func WithPrefix(p string) Option {
	return engine.WithPrefix(p)
}

// WithClock sets the clock of the cutoffs the Reserver computes in the process and compares with
// the times the scripts record on Redis's clock: the age of carts (cart recovery) and the
// reconciler's Retention. (Hold deadlines are judged on Redis's own clock, read with TIME; a
// Deduct that does not read it records this clock plus the difference between the two, measured
// with TIME at most a second before: see Entry.At.) Tests whose Redis runs on a clock of their
// own pass the same clock to every Reserver on it (stocktest does). The default is time.Now. Giving it twice is refused (ErrInvalid): one of the two clocks would be ignored
// without a word (stocktest.New already sets its Env's clock).
func WithClock(now func() time.Time) Option {
	return engine.WithClock(now)
}

// WithEvictionAllowed lets the Reserver write on a Redis whose maxmemory-policy can evict keys
// (every allkeys-* and volatile-* policy), which it otherwise refuses with ErrEvictionPolicy. It
// logs a warning once, through WithLogger's logger, when it finds such a policy. Use it only for
// a Redis that never reaches its maxmemory, and know what an eviction costs: an evicted ledger
// entry sells a repeat of an acknowledged request id again, an evicted buyers' count lets a buyer
// past WithUserLimit, an evicted lease lets two relays deliver one item's events at once. The
// reconciler reports keys Redis evicted as needing a human (stockops.PassResult.NeedsHuman). The
// default is to refuse: see docs/operating.md, "Memory policy".
func WithEvictionAllowed() Option {
	return engine.WithEvictionAllowed()
}

// WithUserLimit sets the most units one user may hold or have bought of one item at a time
// (restores, cancels and expiries give units back). Requests without a User are not limited,
// unless WithUserRequired refuses them. 1 is the usual flash-sale rule of one unit per user.
// The default is 0: no limit.
func WithUserLimit(n int64) Option {
	return engine.WithUserLimit(n)
}

// WithUserRequired refuses, while a per-user limit is set (WithUserLimit above 0), every take
// without a User: a Deduct, a Hold, a DeductMany or a HoldMany whose Request.User or Cart.User
// is empty gets an error wrapping ErrInvalid that names the field, and nothing is sent. Without
// it such a request is taken without being counted against any limit, which is what a service
// that sells to anonymous buyers wants, and a silent hole in the limit when the field is empty
// by mistake. It changes nothing without a limit, nor for Restore, Confirm, Cancel, Extend and
// Restock, which take nothing for a user. The default is off: a request without a User is not
// limited.
func WithUserRequired() Option {
	return engine.WithUserRequired()
}

// WithOutbox decides whether deducts, restores, restocks and holds queue an event in the item's
// outbox, in the same script that changes the stock. The outbox is what a relay drains into a
// Store or Publisher; with it off, nothing records that Redis and the database of record must
// agree, and the outbox never grows. Turn it off only when Redis is the only record. The default
// is true.
func WithOutbox(enabled bool) Option {
	return engine.WithOutbox(enabled)
}

// WithLogger sets the logger of the background work and of rare events. The default is
// slog.Default() as it is when New is called. Normal operation logs nothing at Info or above;
// Warn says a retry or a degraded part (a relay delivery that backs off, a failover fence, a
// failover guard turned off for want of INFO), Error says a person must act (an event moved to
// the dead-letter set, a reconcile report that needs a human, events held back because the
// Store does not know their item). Pass slog.New(slog.DiscardHandler) to log nothing.
func WithLogger(l *slog.Logger) Option {
	return engine.WithLogger(l)
}

// WithCoalescing sets how many script calls of one item's deducts may be in flight at once
// before further deducts of that item queue and are sent together, up to 64 in one script
// call, as soon as one of those calls returns. Coalescing never delays a deduct when fewer
// calls are in flight, and never changes an outcome or a ledger entry: the script applies a
// batch in order with the checks of one call each. It saves Redis the fixed cost of a script
// call per deduct on a hot item. A caller whose context ends while it is queued gets the
// context's error and nothing is sent for it; once its batch is sent, the batch runs to its
// end (bounded by 10s) whatever the callers' contexts. The claims of request ids on an item
// split over buckets (WithBuckets) are coalesced the same way, per claims hash. 0 turns
// coalescing off. The default is 4.
func WithCoalescing(maxInFlight int) Option {
	return engine.WithCoalescing(maxInFlight)
}

// WithReplicaAck makes every write (deduct, hold, confirm, restore, cancel, restock) wait until
// n replicas acknowledged it, or timeout passed: the script and a WAIT are sent on one
// connection. When fewer replicas answer in time, the operation still happened; it returns its
// receipt with an error wrapping ErrNotReplicated, which the caller may treat as "done, but a
// failover could lose it". A replay of such a write (a retry with the same id) waits the same
// way, and answers ErrNotReplicated too until the replicas have the write it replays. A refusal
// is never ErrNotReplicated (which says the units were taken), even when it left a record the
// replicas did not acknowledge: a Request.Retry refused for stock, a Restore or Cancel of an
// unknown id. A failover to a replica without that record loses it, and the late first attempt
// the record was to refuse may then be served. What it guarantees: a write acknowledged by n replicas survives a failover to one of them.
// What it does not: Redis replication stays asynchronous (the primary has applied the write
// before any replica did, and a failover to a replica that did not
// acknowledge loses it), and it costs a dedicated connection and a round trip to the replicas
// per call, and disables coalescing. The default is 0: no waiting.
func WithReplicaAck(n int, timeout time.Duration) Option {
	return engine.WithReplicaAck(n, timeout)
}

// WithGroups puts items in groups that share one Redis Cluster slot: group(sku) names the group
// of an item ("" for none; a name that is not valid counts as none). The keys of a grouped item
// are "<prefix>:{<group>}:{<sku>}..." instead of "<prefix>:{<sku>}...", so a cart (DeductMany,
// HoldMany) whose items are all in one group is taken by a single script, atomically, instead of
// a saga. A group is one slot: it is served by one Redis core, so group items that sell together
// (the pieces of a bundle, the sizes of one shoe), not a whole catalogue. The function must
// always give the same answer for an item, in every process: changing it moves the item to other
// keys. The default puts every item in its own slot.
func WithGroups(group func(sku string) string) Option {
	return engine.WithGroups(group)
}

// WithBuckets splits items over several Redis Cluster slots, so that one hot item is served by
// several Redis cores: buckets(sku) is the number of buckets of an item (1 or less: not split;
// at most 64, a larger number counts as 64). Like WithGroups' function, it must give the same
// answer for an item in every process, from its Load to its end: a Reserver that does not
// split an item split in Redis finds it not loaded.
//
// Bucket i of item X is kept as the item "X|i" with keys of its own slot ("|" is never in a
// name). A request goes to its buyer's bucket (its id's when it has no buyer), so a buyer's
// units and limit live in one bucket and WithUserLimit stays exact; the first request of an id
// claims a bucket for it (even when it is refused), so a later request of that id by a buyer
// of another bucket is ErrConflict, never a second take, and Restore, Cancel, Confirm, Extend
// and Ledger find it. A request releases the due holds of its own bucket, as on a plain item; a
// bucket short of stock first releases the due holds of the others, then moves stock from them
// (a transfer, recorded in both buckets and completed by the sweeper of Run should its process
// die half way) before it answers ErrSoldOut or ErrInsufficient: a request is refused only when
// the buckets together could not serve it. Levels sums the buckets (due holds of other buckets
// count as held until a sweep or a short bucket releases them); Receipt.Remaining and
// Entry.After are what is left in the request's bucket. The relay
// hands the Store and the Publisher the item, each bucket's events in order (Event.Seq orders
// the events of one bucket) and, across buckets, a bucket's events that may spend units a
// transfer brought only after the other bucket's events that gave those units back (a restock,
// a restore), so the Store never refuses an acknowledged sale for want of them (Consume keeps
// the same order); the reconciler compares the buckets as one with the Store.
//
// Carts (DeductMany, HoldMany) take a split item's line in its buyer's bucket too, as a saga:
// a split item is never in a group (WithGroups), so a cart with a split line is never taken by
// one script. Delist delists every bucket, and the reconciler retires them together (see
// Delist).
//
// Bucket i of n keeps its keys in the i-th of n equal ranges of the cluster's slots, so that on a
// cluster of n masters dealt equal ranges (as redis-cli deals them) each bucket has its own.
//
// Costs and limits: each request also claims its id (a script call in the id's home bucket,
// before the take; with WithCoalescing, claims of one home bucket queued behind calls in
// flight go out as one call); the sold-out fast path (WithSoldOutCache) answers for a split
// item too, but with that one round trip.
func WithBuckets(buckets func(sku string) int) Option {
	return engine.WithBuckets(buckets)
}

// WithTimeout bounds every Redis command and script call the Reserver sends, and those of its
// relays, reconcilers and failover guards: each ends after d at the latest, or at the caller's
// deadline if that comes first, so no call waits forever on an unreachable Redis, even with a
// context that has no deadline (the commands of a context that is never cancelled share their
// deadlines, which may then come up to d/64 sooner). Below about 10 ms the bound is not kept
// when the connection breaks while Redis does not answer: rueidis's redial may take about a
// second whatever the context. The bound covers the whole command: rueidis's resends of a
// retryable script after a broken connection, and its dials, happen within it. A method sends
// one command in most cases (a few for a cart, many for a relay batch or a reconcile pass,
// each bounded); when Redis is unreachable the first one fails. A command that runs out of
// time, or whose connection broke, returns an error wrapping ErrUnknownOutcome, the transport
// error, and context.DeadlineExceeded when the time ran out. d is from 1 ms to 1 hour; the
// default is DefaultTimeout (10 s).
func WithTimeout(d time.Duration) Option {
	return engine.WithTimeout(d)
}

// DefaultTimeout bounds every Redis command and script call a Reserver (and its relays,
// reconcilers and failover guards) sends, unless WithTimeout says otherwise. It covers the
// whole call, rueidis's own resends of a retryable script after a broken connection and its
// dials included (rueidis dials for up to 5 s by default), and is long enough to ride out a
// restart of Redis or a quick failover.
const DefaultTimeout = engine.DefaultTimeout

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
//
// For an item split over buckets (WithBuckets) the answer is not in-process: the request still
// claims its id for its bucket (one small script; a later request of the id by a buyer of
// another bucket is ErrConflict, as after a refusal by Redis), then the cached state of every
// bucket answers; it saves the take, the reads of the buckets and the last take.
func WithSoldOutCache(ttl time.Duration) Option {
	return engine.WithSoldOutCache(ttl)
}
