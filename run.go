package stock

import (
	"context"

	"github.com/stockres/stock/internal/engine"
)

// RunOptions configures Reserver.Run. A zero field takes its default; a negative interval
// turns its loop off. The intervals are real time; with WithClock, a loop also runs once its
// interval has passed on that clock (looked at every 50 ms).
type RunOptions = engine.RunOptions

// Run runs the background work of r until ctx ends: a relay (with a Store or a Publisher), a
// reconciler and a failover guard (with a Store), a sweeper of due holds, and the recovery of
// carts a crash left half done. One goroutine serves a whole service:
//
//	go func() {
//		if err := r.Run(ctx, stock.RunOptions{Store: store}); err != nil && ctx.Err() == nil {
//			log.Printf("stock: background work stopped: %v", err) // options out of range
//		}
//	}()
//
// Options that are out of range are an ErrInvalid error at once, and nothing runs: read
// Run's error, or check the options first with RunOptions.Validate. On a Redis whose
// maxmemory-policy can evict keys, Run returns ErrEvictionPolicy at once and nothing runs
// (unless WithEvictionAllowed); it reads the policy before it starts anything, and waits for
// a Redis it cannot reach until it can (see docs/operating.md, "Memory policy"). Errors of a
// pass are logged through WithLogger and the next pass retries. When ctx ends, Run stops the loops,
// lets the relay deliver what is due (see RunOptions.Drain), and returns the first error a
// loop met, or ctx's error when none did. It returns at the latest Drain after ctx ended
// (WithTimeout's bound when Drain is negative), even when a Store or Publisher call ignores
// its context: such a call goes on in the background after Run returned, and the error says
// so. Run may be called once per Reserver at a time: a Run called while another Run of the
// Reserver runs returns ErrRunning at once and starts nothing (the running one goes on); once
// that one returned, Run may be called again. The Reserver's other methods stay usable
// meanwhile, and more relays and reconcilers (stockops), in this process or others, and Runs of
// other Reservers, may run beside it. Close stops Run as the end of ctx does (the drain
// included) and waits for it; Run then returns ErrReserverClosed, and at once, running nothing,
// on a closed Reserver.
func (r *Reserver) Run(ctx context.Context, opts RunOptions) error {
	return r.e.Run(ctx, opts)
}
