package stock

import "github.com/stockres/stock/internal/errs"

// Errors returned by the Reserver. Each outcome of a script has its own sentinel; test for them
// with errors.Is. ErrUnknownOutcome, and an error that wraps no sentinel (a *rueidis.RedisError,
// a context error from before anything was sent), mean the outcome is unknown: the script may or
// may not have run. The remedy is to retry with the same request id, which is always safe: a
// retry of an operation that did run is answered as a replay and takes nothing twice.
var (
	// ErrUnknownOutcome: the call could not learn what happened, so a write may or may not have
	// been made. Redis was unreachable, the connection broke under the command, the call's time
	// ran out (the caller's deadline, or WithTimeout's bound; rueidis resends some scripts
	// until then), or Redis answered with a reply this package does not understand. The error
	// also wraps the cause: the transport error (a net.Error, io.EOF, …), and
	// context.DeadlineExceeded or context.Canceled when the time ran out or the caller
	// cancelled. Retry with the same request id (Request.Retry set), which is always safe.
	ErrUnknownOutcome = errs.ErrUnknownOutcome
	// ErrSoldOut: the item has no stock available.
	ErrSoldOut = errs.ErrSoldOut
	// ErrInsufficient: the item has some stock, but less than the quantity asked for.
	ErrInsufficient = errs.ErrInsufficient
	// ErrNotLoaded: the item is unknown to Redis (never loaded, or its keys were lost).
	ErrNotLoaded = errs.ErrNotLoaded
	// ErrLoaded: Load was asked to create an item that already exists.
	ErrLoaded = errs.ErrLoaded
	// ErrConflict: the request id was already used on this item with a different quantity, user
	// or operation (or, for a cart, with other lines or another user); nothing was changed.
	// The message says what differs from the id's first use: "was used for a hold, not a
	// deduct", "with quantity 1, not 3", "by another user" (never naming that user), for a cart its
	// kind, user and lines. Request ids are scoped per item: the same id on two items names two
	// requests.
	ErrConflict = errs.ErrConflict
	// ErrRestored: the request id was restored, cancelled, expired or refused, or a restore of it
	// arrived first; the id cannot take stock again.
	ErrRestored = errs.ErrRestored
	// ErrUserLimit: the request would take the user past the per-user limit.
	ErrUserLimit = errs.ErrUserLimit
	// ErrUnknownID: no entry exists for the id. Restore of an unknown id returns it after leaving
	// a tombstone, so that a late deduct with that id is refused with ErrRestored. Past the
	// retention, an id that did take stock is unknown too: its entry was trimmed, and Restore
	// gives nothing back (see Restore for what to do with a late return).
	ErrUnknownID = errs.ErrUnknownID
	// ErrClosed: the item is closed for sale; restores, confirms and the relay still work.
	ErrClosed = errs.ErrClosed
	// ErrExpired: the hold passed its deadline and its stock went back.
	ErrExpired = errs.ErrExpired
	// ErrConfirmed: a cancel arrived for a hold that was already confirmed.
	ErrConfirmed = errs.ErrConfirmed
	// ErrNotReplicated: the write happened, but fewer replicas than WithReplicaAck asked for
	// acknowledged it in time; a failover could lose it. Returned with a valid receipt, by the
	// write and by its replays until the replicas have it.
	ErrNotReplicated = errs.ErrNotReplicated
	// ErrRunning: Reserver.Run was called while another Run of the same Reserver runs. The call
	// started nothing and returned at once; the running Run goes on. Run again once it returned.
	ErrRunning = errs.ErrRunning
	// ErrInvalid: the input was rejected before anything was sent to Redis, or a script refused
	// it before writing anything. Nothing was changed. (A reply this package does not
	// understand is ErrUnknownOutcome: the script may have run.)
	ErrInvalid = errs.ErrInvalid
	// ErrReserverClosed: the Reserver was closed (Reserver.Close); nothing was sent to Redis. It
	// is not ErrClosed, which says that an item is closed for sale.
	ErrReserverClosed = errs.ErrReserverClosed
)

// ErrFailover is returned by Deduct, Hold and DeductMany while a failover guard (see stockops.FailoverGuard) has seen the
// Redis primaries change (a restart or a promoted replica) and no reconcile pass has run since:
// Redis may have lost acknowledged writes, and selling on it before the reconciler compared it
// with the Store could sell stock that is gone. Restores, confirms and the relay still work.
var ErrFailover = errs.ErrFailover

// ErrEvictionPolicy is returned by every method that writes (Deduct, Hold, DeductMany,
// HoldMany, Restore, Cancel, Confirm, Extend, Restock, Load, CloseItem, ReopenItem, Delist, and
// stockops.Refuse), and by Run at once, when a node of the Redis deployment has a
// maxmemory-policy other than noeviction: Redis may evict this package's keys, and an evicted
// ledger entry sells a repeated request id again, an evicted buyers' count lets a buyer past
// WithUserLimit. Nothing was written. The error names the node and its policy. Fix it with
// CONFIG SET maxmemory-policy noeviction (and the same in redis.conf, or your provider's
// parameter group), or accept the risk with WithEvictionAllowed. A refused Reserver checks the
// policy again at most once a second, so it writes again once the policy is fixed.
var ErrEvictionPolicy = errs.ErrEvictionPolicy

// ErrRegistryLost is returned (joined with any other error) by a reconcile pass that found
// items the Store has, and whose keys Redis has or had, missing from Redis's registry of items
// ("<prefix>:items"): Redis lost data (a restart without persistence, FLUSHALL, a deleted
// key). Nothing that walks the registry (relays, passes, sweeps, the failover guard) saw those items.
// A repairing pass has registered them again, and rebuilt from the Store those whose keys were
// gone too; the reports say which (stockops.Report.Unregistered). Sales Redis acknowledged and had not
// yet delivered to the Store were lost with it: a human must look.
var ErrRegistryLost = errs.ErrRegistryLost
