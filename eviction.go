package stock

import "github.com/stockres/stock/internal/engine"

// ErrEvictionPolicy is returned by every method that writes (Deduct, Hold, DeductMany,
// HoldMany, Restore, Cancel, Confirm, Extend, Restock, Load, CloseItem, ReopenItem, Delist, and
// stockops.Refuse), and by Run at once, when a node of the Redis deployment has a
// maxmemory-policy other than noeviction: Redis may evict this package's keys, and an evicted
// ledger entry sells a repeated request id again, an evicted buyers' count lets a buyer past
// WithUserLimit. Nothing was written. The error names the node and its policy. Fix it with
// CONFIG SET maxmemory-policy noeviction (and the same in redis.conf, or your provider's
// parameter group), or accept the risk with WithEvictionAllowed. A refused Reserver checks the
// policy again at most once a second, so it writes again once the policy is fixed.
var ErrEvictionPolicy = engine.ErrEvictionPolicy
