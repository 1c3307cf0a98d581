// Package errs holds the sentinel errors of package stock, which exports each of them under its
// own name (stock.ErrSoldOut is errs.SoldOut) with its documentation; the engine's internal
// packages return them.
package errs

import "errors"

// The sentinels, documented in package stock (errors.go).
var (
	UnknownOutcome = errors.New("stock: outcome unknown")
	SoldOut        = errors.New("stock: sold out")
	Insufficient   = errors.New("stock: insufficient stock")
	NotLoaded      = errors.New("stock: item not loaded")
	Loaded         = errors.New("stock: item already loaded")
	Conflict       = errors.New("stock: request id reused with different parameters")
	Restored       = errors.New("stock: request id already restored")
	UserLimit      = errors.New("stock: per-user limit reached")
	UnknownID      = errors.New("stock: unknown request id")
	Closed         = errors.New("stock: item closed")
	Expired        = errors.New("stock: hold expired")
	Confirmed      = errors.New("stock: hold already confirmed")
	NotReplicated  = errors.New("stock: write not acknowledged by enough replicas")
	Running        = errors.New("stock: Run is already running on this Reserver")
	Invalid        = errors.New("stock: invalid input")
	ReserverClosed = errors.New("stock: reserver closed")
	Refused        = errors.New("stock: refused by the store")
	HeldBack       = errors.New("stock: held back until the item's earlier events are applied")
	EvictionPolicy = errors.New("stock: Redis maxmemory-policy can evict keys")
	Failover       = errors.New("stock: Redis primary changed; waiting for a reconcile pass")
	RegistryLost   = errors.New("stock: Redis lost items from its registry")
)
