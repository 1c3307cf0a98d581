package stock

import "github.com/stockres/stock/internal/engine"

// MaxQty is the largest quantity, stock level or limit this package accepts: 2^53-1, the
// largest integer a Lua number (a double) holds exactly.
const MaxQty = engine.MaxQty

// MaxNameLen is the longest SKU, request id, user or prefix accepted, in bytes. A name is 1 to
// MaxNameLen bytes of valid UTF-8 without braces, '|', whitespace, control characters or
// invisible Unicode format characters (category Cf: zero-width spaces and joiners, the byte
// order mark, the soft hyphen, bidirectional controls), else ErrInvalid before anything is
// sent; the letters, marks and symbols of every script are accepted, compared byte for byte.
const MaxNameLen = engine.MaxNameLen

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
type Request = engine.Request

// Receipt is the outcome of one request.
type Receipt = engine.Receipt

// Levels are the counters of one item. Loaded = Available + Held + Sold at every moment.
type Levels = engine.Levels
