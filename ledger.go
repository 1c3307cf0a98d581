package stock

import (
	"context"

	"github.com/stockres/stock/stocktype"
)

// Kind says what operation created a ledger entry.
// Each of its values is documented in [stocktype.Kind].
type Kind = stocktype.Kind

// Kinds of ledger entries.
const (
	KindDeduct    = stocktype.KindDeduct
	KindHold      = stocktype.KindHold
	KindRestock   = stocktype.KindRestock
	KindTombstone = stocktype.KindTombstone
)

// State is where a ledger entry is in its life (Entry.State), and what a Store recorded of an id
// (Record.Status).
//
// A Redis ledger entry takes any of the seven states. A Store uses three of them only:
// StateApplied, StateRestored and StateRefused (see Record.Status); held, reserved, cancelled
// and expired are Redis's alone (a hold reaches the Store only once confirmed, and a Store
// records nothing for a cancelled or expired hold).
// Each of its values is documented in [stocktype.State].
type State = stocktype.State

// States of ledger entries; the three a Store records are StateApplied, StateRestored and
// StateRefused.
const (
	StateHeld      = stocktype.StateHeld
	StateReserved  = stocktype.StateReserved
	StateApplied   = stocktype.StateApplied
	StateRestored  = stocktype.StateRestored
	StateRefused   = stocktype.StateRefused
	StateCancelled = stocktype.StateCancelled
	StateExpired   = stocktype.StateExpired
)

// Entry is one ledger entry: what one request id did to one item. Entries are kept in Redis,
// in a hash per item, for the retention period (see the package doc).
// Its fields and its method Taken are documented in [stocktype.Entry].
type Entry = stocktype.Entry

// Ledger returns the ledger entry of one request id. It returns ErrUnknownID when the item has
// no entry for the id (never used, or trimmed after the retention period).
func (r *Reserver) Ledger(ctx context.Context, sku, id string) (Entry, error) {
	return r.e.Ledger(ctx, sku, id)
}
