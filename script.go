package stock

import "github.com/stockres/stock/internal/engine"

// Outcome names the outcome an error stands for, as a short label for metrics: "ok" for nil,
// "sold_out", "insufficient", "not_loaded", "loaded", "conflict", "restored", "user_limit",
// "unknown_id", "closed", "expired", "confirmed", "invalid", "refused", "failover"
// (ErrFailover: nothing was sent), "not_replicated" (ErrNotReplicated: the write was made),
// "reserver_closed" (ErrReserverClosed: nothing was sent) or
// "eviction_policy" (ErrEvictionPolicy: nothing was sent).
// An unknown outcome (ErrUnknownOutcome, or an error that wraps no sentinel) is "canceled" when
// the caller cancelled, "timeout" when the time ran out, and "error" otherwise.
func Outcome(err error) string {
	return engine.Outcome(err)
}
