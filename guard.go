package stock

import (
	"context"

	"github.com/stockres/stock/internal/engine"
)

// ErrFailover is returned by Deduct, Hold and DeductMany while a failover guard (see stockops.FailoverGuard) has seen the
// Redis primaries change (a restart or a promoted replica) and no reconcile pass has run since:
// Redis may have lost acknowledged writes, and selling on it before the reconciler compared it
// with the Store could sell stock that is gone. Restores, confirms and the relay still work.
var ErrFailover = engine.ErrFailover

// Ready waits until Deduct, Hold and DeductMany can take sales as far as a failover guard is
// concerned, and returns nil then, or ctx's error (joined with the reason it waited) when ctx
// ends first. A service calls it after starting Run and before taking traffic, rather than
// guess how long the fence lasts:
//
//	go r.Run(ctx, opts)
//	if err := r.Ready(startCtx); err != nil { // startCtx: a deadline for the start
//		return err // fenced: Redis lost data, and no reconcile pass has run yet
//	}
//
// Sales are taken when Redis's current primaries are the ones recorded as reconciled (the
// epoch, "<prefix>:epoch"), and this Reserver's guard, if it has one, is not fenced. A new
// deployment has its epoch from its first Load (or its guard's first check), so Ready returns
// at once there. After a failover, a restart, or on a deployment with items and no epoch (one
// loaded by an earlier version), it waits for a complete repairing reconcile pass, which Run's
// reconciler starts at once (in this process, or in any other). On a Redis that does not answer
// INFO (miniredis, an ACL without it) no guard can run and Ready returns nil at once. Other
// errors (Redis unreachable) are retried until ctx ends.
func (r *Reserver) Ready(ctx context.Context) error {
	return r.e.Ready(ctx)
}
