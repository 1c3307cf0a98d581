// Package errs holds the sentinel errors of package stock, which exports each of them under its
// own name (stock.ErrSoldOut is errs.ErrSoldOut) with its documentation; the engine's internal
// packages return them.
package errs

import "errors"

// The sentinels, documented in package stock (errors.go).
var (
	ErrUnknownOutcome = errors.New("stock: outcome unknown")
	ErrSoldOut        = errors.New("stock: sold out")
	ErrInsufficient   = errors.New("stock: insufficient stock")
	ErrNotLoaded      = errors.New("stock: item not loaded")
	ErrLoaded         = errors.New("stock: item already loaded")
	ErrConflict       = errors.New("stock: request id reused with different parameters")
	ErrRestored       = errors.New("stock: request id already restored")
	ErrUserLimit      = errors.New("stock: per-user limit reached")
	ErrUnknownID      = errors.New("stock: unknown request id")
	ErrClosed         = errors.New("stock: item closed")
	ErrExpired        = errors.New("stock: hold expired")
	ErrConfirmed      = errors.New("stock: hold already confirmed")
	ErrNotReplicated  = errors.New("stock: write not acknowledged by enough replicas")
	ErrRunning        = errors.New("stock: Run is already running on this Reserver")
	ErrInvalid        = errors.New("stock: invalid input")
	ErrReserverClosed = errors.New("stock: reserver closed")
	ErrRefused        = errors.New("stock: refused by the store")
	ErrHeldBack       = errors.New("stock: held back until the item's earlier events are applied")
	ErrEvictionPolicy = errors.New("stock: Redis maxmemory-policy can evict keys")
	ErrFailover       = errors.New("stock: Redis primary changed; waiting for a reconcile pass")
	ErrRegistryLost   = errors.New("stock: Redis lost items from its registry")
)
