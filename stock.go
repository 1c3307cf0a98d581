package stock

import (
	"context"

	"github.com/redis/rueidis"
	"github.com/stockres/stock/internal/engine"
	"github.com/stockres/stock/stocktype"
)

// New returns a Reserver that runs its scripts on client. The client may be a standalone,
// Sentinel or Cluster client; the caller owns it.
func New(client rueidis.Client, opts ...Option) (*Reserver, error) {
	e, err := engine.New(client, opts...)
	if err != nil {
		return nil, err
	}
	return &Reserver{e: e}, nil
}

// Load creates an item with qty units available: the preheat before a sale. It returns
// ErrLoaded, and changes nothing, when the item exists, so a re-run preheat never clobbers a
// live sale; add stock to a live item with Restock. qty may be 0 (an item that is listed but has
// nothing to sell yet). The item is added to the registry (see stockops.Items).
func (r *Reserver) Load(ctx context.Context, sku string, qty int64) error {
	return r.e.Load(ctx, sku, qty)
}

// Levels returns the counters of an item (Levels.Available is what can be taken now), read
// atomically. It returns ErrNotLoaded, never zero counters, for an item Redis does not know.
func (r *Reserver) Levels(ctx context.Context, sku string) (Levels, error) {
	return r.e.Levels(ctx, sku)
}

// Deduct takes req.Qty units of req.SKU for req.ID, exactly once: the check of the id, the
// per-user limit, the stock check, the decrement, the ledger entry and the outbox event are one
// Lua script. A repeat of the same id with the same parameters returns the original receipt
// with Replayed set and changes nothing.
//
// Errors: ErrInvalid, ErrFailover (a failover guard fenced the Reserver) and ErrEvictionPolicy
// (Redis may evict keys): nothing was sent.
// ErrConflict, ErrRestored, ErrUserLimit, ErrNotLoaded, ErrClosed, ErrSoldOut, ErrInsufficient:
// nothing was taken. ErrNotReplicated (with WithReplicaAck): the units were taken and the
// receipt is valid, but fewer replicas than asked acknowledged the write in time.
// ErrUnknownOutcome (Redis unreachable, a broken connection, the call's time ran out, a reply
// not understood), or any other error: the outcome is unknown; retry with the same id and
// Request.Retry set. Each command the call sends is bounded by WithTimeout even when ctx has no
// deadline; a deduct queued behind a hot item's calls in flight (WithCoalescing) waits for one of
// them first, so it may take up to twice the bound (more only when hundreds wait at once). Give
// ctx a deadline to bound the whole call.
func (r *Reserver) Deduct(ctx context.Context, req Request) (rc Receipt, err error) {
	return r.e.Deduct(ctx, req)
}

// Restore gives back exactly what id took from sku, once, with the user's units. A second
// Restore of the same id is a replay (Replayed set, nothing changed). Restore of an id that
// never took anything returns ErrUnknownID and leaves a tombstone, so that a late Deduct with
// that id is refused with ErrRestored: a cancel that overtook its request wins. That holds for
// an item that is not loaded too (a cancel may overtake even the Load, or come after Redis lost
// the item): the tombstone waits in the item's ledger. A live hold is cancelled. Restocks cannot
// be restored (ErrConflict).
//
// Both last as long as the ledger keeps the id (ReconcileOptions.Retention, 24h by default):
//   - A Restore of a sale whose entry was trimmed (a return after the retention) finds no entry:
//     it answers ErrUnknownID, leaves a tombstone, and gives nothing back, in Redis or in the
//     Store, which keeps the sale. Take such a late return in instead: put its units back on
//     sale with Restock (an id of its own, such as "return-" and the order id, so that a repeat
//     is a replay) and settle the order (the refund, the sale's record) in the database of
//     record. A Restore cannot tell this from a return of an id that never took stock; Ledger
//     can, within the retention only.
//   - A tombstone stays in Redis and never reaches the Store (no event carries it). Once a
//     reconcile pass trimmed it, a deduct of that id arriving later still is a new request: it
//     is sold, and the relay applies it to the Store.
func (r *Reserver) Restore(ctx context.Context, sku, id string) (Receipt, error) {
	return r.e.Restore(ctx, sku, id)
}

// Restock adds qty units to a live item, exactly once per id; the addition is ledgered (kind
// restock) and queued for the Store like a deduct. ErrNotLoaded when the item does not exist
// (for an item split over buckets, when one of its buckets does not: a Load cut half way, which
// calling Load again finishes); ErrInvalid, and nothing written, when the item would hold more
// than MaxQty units in all (Levels.Loaded plus qty). A repeat of a restock that was made is a
// replay, even once the item is full.
//
// An item split over buckets (WithBuckets) is restocked in the bucket its id claims (a refused
// restock's id keeps its claim, as WithBuckets says of every request), against the units the
// other buckets hold as read just before (a bucket's loaded count changes only by restocks and
// repairs; moving stock between buckets does not change it). Restocks of the item that run at
// the same time in different buckets may each pass that check: their sum may then take the
// item past MaxQty by at most the restocks that overlapped. Run an item's restocks one at a
// time when it is that close to MaxQty.
func (r *Reserver) Restock(ctx context.Context, sku, id string, qty int64) (rc Receipt, err error) {
	return r.e.Restock(ctx, sku, id, qty)
}

// CloseItem stops selling an item: Deduct and Hold are refused with ErrClosed, while Restore,
// Confirm, Cancel, expiry, the relay and the reconciler go on, so the item's pipeline finishes.
// Closing a closed item does nothing. ErrNotLoaded for an unknown item.
func (r *Reserver) CloseItem(ctx context.Context, sku string) error {
	return r.e.CloseItem(ctx, sku)
}

// ReopenItem lets a closed item sell again. A delisted item is closed for good: ReopenItem
// refuses it with ErrClosed (and changes nothing), since the reconciler is to retire it, ledger
// and all.
func (r *Reserver) ReopenItem(ctx context.Context, sku string) error {
	return r.e.ReopenItem(ctx, sku)
}

// Delist ends an item's sale for good: it is closed (ErrClosed for new deducts and holds) and
// stamped with the time. Its pipeline finishes as with CloseItem; once the retention has passed
// (ReconcileOptions.Retention, 24h by default) and a reconcile pass finds
// Redis and the Store in agreement with nothing pending, that pass retires the item: its keys,
// ledger included, are removed in bounded steps, and its report says Retired. A retired item
// answers ErrNotLoaded and may be loaded again. Delisting twice does nothing. A delisted item
// cannot be reopened (ReopenItem returns ErrClosed); only a closed, delisted item is ever retired.
//
// An item split over buckets (WithBuckets) is delisted whole: every bucket is closed, then
// stamped. The buckets are in different slots, so a Delist cut while it closes them (an error)
// may leave some of them on sale; one cut after they are all closed leaves the item closed.
// Either way calling Delist again finishes it, and meanwhile ReopenItem refuses an item with a
// delisted bucket (ErrClosed) and reopens no bucket.
// The reconciler retires the buckets together, once every one is delisted; a pass cut between
// buckets is finished by the next pass, and until then Load refuses the item with ErrLoaded.
func (r *Reserver) Delist(ctx context.Context, sku string) error {
	return r.e.Delist(ctx, sku)
}

func init() {
	engine.Of = func(r any) *engine.Reserver { return r.(*Reserver).e }
}

// MaxQty is the largest quantity, stock level or limit this package accepts: 2^53-1, the
// largest integer a Lua number (a double) holds exactly.
const MaxQty = 1<<53 - 1

// MaxNameLen is the longest SKU, request id, user or prefix accepted, in bytes. A name is 1 to
// MaxNameLen bytes of valid UTF-8 without braces, '|', whitespace, control characters or
// invisible Unicode format characters (category Cf: zero-width spaces and joiners, the byte
// order mark, the soft hyphen, bidirectional controls), else ErrInvalid before anything is
// sent; the letters, marks and symbols of every script are accepted, compared byte for byte.
const MaxNameLen = 128

// Reserver takes, gives back and records stock atomically in Redis. It is safe for concurrent
// use by multiple goroutines. It never closes the client it was given, and starts no
// long-lived goroutines but Run's (its methods start only short ones, see the package doc).
// Create one with New; the zero value is not usable. Close it when done (a service's shutdown,
// a test's clean-up): Close waits for the writes its methods left in the background, and
// nothing is written after it.
//
// Most callers need a few methods:
//   - Load puts an item on sale, once, with the stock the database of record holds.
//   - Deduct takes stock for a request id, exactly once; Restore gives it back.
//   - Hold takes stock until a deadline; Confirm keeps it, Cancel gives it back, and a hold
//     past its deadline goes back by itself.
//   - DeductMany and HoldMany take a cart: every line or none.
//   - Run, in one goroutine, delivers every change to the Store (and a Publisher), checks
//     Redis against the Store, releases due holds and recovers carts.
//   - Levels and Ledger tell an item's counters and what happened to a request id.
//
// The rest serve the shop's operations: Restock, Extend, ConfirmMany, CancelMany, CloseItem,
// ReopenItem and Delist. Package stockops runs the background work by hand and reads the
// registry, the ledger and the outboxes.
type Reserver struct{ e *engine.Reserver }

// Request asks to take Qty units of an item, exactly once per ID.
// Its fields are documented in [stocktype.Request].
type Request = stocktype.Request

// Receipt is the outcome of one request. Its fields are documented in [stocktype.Receipt].
type Receipt = stocktype.Receipt

// Levels are the counters of one item. Loaded = Available + Held + Sold at every moment.
// Its fields are documented in [stocktype.Levels].
type Levels = stocktype.Levels

// Close ends r's use: it refuses new calls, stops a Run in progress (as if its context ended:
// the relay delivers what is due, for up to RunOptions.Drain), waits for the calls in flight,
// for the due-work hints they left (written a moment after a call returns, by a goroutine of
// the Reserver) and for the work that goes on detached from its caller (a batch of coalesced
// claims, a Store call Run stopped waiting for: its later commands are refused). Once Close
// returned nil, r writes nothing more to Redis: a test or a service may remove its keys.
//
// After Close, every method (Run, Consume and the operations of package stockops too) returns
// an error wrapping ErrReserverClosed and sends nothing; a call already in flight when Close
// began runs to its end. Close never closes the client, which the caller owns.
//
// ctx bounds only the wait: when it ends first, Close returns its error (the Reserver is closed
// all the same, and what was in flight may still write until it ends; a later Close waits
// again). The wait is bounded anyway: by Drain for a Run, by WithTimeout for each command.
// Close is idempotent and safe for concurrent use with every other method.
func (r *Reserver) Close(ctx context.Context) error {
	return r.e.Close(ctx)
}

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
// errors (Redis unreachable) are retried until ctx ends. Once Close began, Ready returns an
// error wrapping ErrReserverClosed (at once, or at its next look while it waits).
func (r *Reserver) Ready(ctx context.Context) error {
	return r.e.Ready(ctx)
}
