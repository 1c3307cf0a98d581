package stock

import (
	"context"
	"time"

	"github.com/stockres/stock/internal/engine"
	"github.com/stockres/stock/stocktype"
)

// RunOptions configures Reserver.Run. A zero field takes its default; a negative interval
// turns its loop off. The intervals are real time; with WithClock, a loop also runs once its
// interval has passed on that clock (looked at every 50 ms).
type RunOptions struct {
	// Store is the database of record. With a Store, Run runs a relay that applies the items'
	// events to it, a reconciler and a failover guard. Without one, and without a Publisher,
	// Run only sweeps holds and recovers carts.
	Store Store
	// Publisher, when set, receives every event the relay delivers. With no Store it is the
	// queue path: consumers apply the events through Consume.
	Publisher Publisher
	// Relay configures the relay; nil takes its defaults.
	Relay *RelayOptions
	// Reconcile configures the reconciler (its Interval, 5 minutes by default, is the time
	// between passes, the first of which runs at once; a negative Interval turns the passes
	// off, for a deployment where another process reconciles); nil takes its defaults.
	Reconcile *ReconcileOptions
	// SweepInterval is the time between sweeps of the holds past their deadline. A sweep looks
	// at the items whose due-work hints say a hold is due and at a few more of the registry
	// (see stockops.Relay.Run), not at every item as stockops.Sweep does. The default is 1s.
	SweepInterval time.Duration
	// GuardInterval is the time between the failover guard's checks (see stockops.FailoverGuard). The
	// guard runs only with a Store, whose reconcile passes lift its fence, and only on a Redis
	// that answers INFO (not miniredis, nor a user whose ACL denies it: Run then logs that the
	// guard is off). The default is 1s.
	GuardInterval time.Duration
	// RecoverCartsAfter is the age past which a cart whose saga never ended is undone (see
	// stockops.RecoverCarts); carts are looked at every half of it. It must be well above the longest
	// DeductMany or HoldMany call. The default is 5 minutes.
	RecoverCartsAfter time.Duration
	// Drain bounds the relay's last delivery after ctx ends: Run delivers the events that are
	// due until none is left or Drain has passed, and returns by then. The default is 5s; a
	// negative Drain delivers nothing more (Run still waits, up to WithTimeout's bound, for
	// the calls in progress).
	Drain time.Duration
}

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
	return r.e.Run(ctx, engine.RunOptions(opts))
}

// Validate returns the error Run would return at once for o, before it starts anything: an
// error wrapping ErrInvalid when Relay or Reconcile holds a value out of range or an invalid
// item name, or nil. (Run also returns ErrRunning at once while another Run of its Reserver
// runs, which depends on the Reserver, not on o.) It makes the same checks as Run (Relay's with a Store or a Publisher,
// Reconcile's with a Store) and needs no Reserver, so a service can check its options where it
// can still refuse to start. A Run started in a goroutine whose error nobody reads would
// otherwise run nothing and say nothing:
//
//	opts := stock.RunOptions{Store: store}
//	if err := opts.Validate(); err != nil {
//		return err // the service does not start
//	}
//	go func() {
//		if err := r.Run(ctx, opts); err != nil && ctx.Err() == nil {
//			log.Printf("stock: background work stopped: %v", err)
//		}
//	}()
func (o RunOptions) Validate() error { return engine.RunOptions(o).Validate() }

// RelayOptions configures a relay (Reserver.Run's, or stockops.NewRelay's). A zero field takes
// its default; nil options take every default. It lives in this package, not in stockops,
// because RunOptions.Relay carries it. Its fields are documented in [stocktype.RelayOptions].
type RelayOptions = stocktype.RelayOptions
