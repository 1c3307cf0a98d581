package stock

import (
	"time"

	"github.com/stockres/stock/internal/engine"
)

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
