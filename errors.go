package stock

import "github.com/stockres/stock/internal/engine"

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
	ErrUnknownOutcome = engine.ErrUnknownOutcome
	// ErrSoldOut: the item has no stock available.
	ErrSoldOut = engine.ErrSoldOut
	// ErrInsufficient: the item has some stock, but less than the quantity asked for.
	ErrInsufficient = engine.ErrInsufficient
	// ErrNotLoaded: the item is unknown to Redis (never loaded, or its keys were lost).
	ErrNotLoaded = engine.ErrNotLoaded
	// ErrLoaded: Load was asked to create an item that already exists.
	ErrLoaded = engine.ErrLoaded
	// ErrConflict: the request id was already used on this item with a different quantity, user
	// or operation (or, for a cart, with other lines or another user); nothing was changed.
	// The message says what differs from the id's first use: "was used for a hold, not a
	// deduct", "with quantity 1, not 3", "by another user" (never naming that user), for a cart its
	// kind, user and lines. Request ids are scoped per item: the same id on two items names two
	// requests.
	ErrConflict = engine.ErrConflict
	// ErrRestored: the request id was restored, cancelled, expired or refused, or a restore of it
	// arrived first; the id cannot take stock again.
	ErrRestored = engine.ErrRestored
	// ErrUserLimit: the request would take the user past the per-user limit.
	ErrUserLimit = engine.ErrUserLimit
	// ErrUnknownID: no entry exists for the id. Restore of an unknown id returns it after leaving
	// a tombstone, so that a late deduct with that id is refused with ErrRestored. Past the
	// retention, an id that did take stock is unknown too: its entry was trimmed, and Restore
	// gives nothing back (see Restore for what to do with a late return).
	ErrUnknownID = engine.ErrUnknownID
	// ErrClosed: the item is closed for sale; restores, confirms and the relay still work.
	ErrClosed = engine.ErrClosed
	// ErrExpired: the hold passed its deadline and its stock went back.
	ErrExpired = engine.ErrExpired
	// ErrConfirmed: a cancel arrived for a hold that was already confirmed.
	ErrConfirmed = engine.ErrConfirmed
	// ErrNotReplicated: the write happened, but fewer replicas than WithReplicaAck asked for
	// acknowledged it in time; a failover could lose it. Returned with a valid receipt, by the
	// write and by its replays until the replicas have it.
	ErrNotReplicated = engine.ErrNotReplicated
	// ErrRunning: Reserver.Run was called while another Run of the same Reserver runs. The call
	// started nothing and returned at once; the running Run goes on. Run again once it returned.
	ErrRunning = engine.ErrRunning
	// ErrInvalid: the input was rejected before anything was sent to Redis, or a script refused
	// it before writing anything. Nothing was changed. (A reply this package does not
	// understand is ErrUnknownOutcome: the script may have run.)
	ErrInvalid = engine.ErrInvalid
	// ErrReserverClosed: the Reserver was closed (Reserver.Close); nothing was sent to Redis. It
	// is not ErrClosed, which says that an item is closed for sale.
	ErrReserverClosed = engine.ErrReserverClosed
)
