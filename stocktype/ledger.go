package stocktype

import "time"

// Kind says what operation created a ledger entry.
type Kind string

// Kinds of ledger entries.
const (
	KindDeduct    Kind = "deduct"    // Deduct: stock sold at once
	KindHold      Kind = "hold"      // Hold: stock held until a deadline, then confirmed or released
	KindRestock   Kind = "restock"   // Restock: stock added to a live item
	KindTombstone Kind = "tombstone" // a Restore or Cancel of an id that had taken nothing
)

// State is stock.State, documented there; its fields and methods are documented here.
type State string

// States of ledger entries; the three a Store records are StateApplied, StateRestored and
// StateRefused.
const (
	StateHeld      State = "held"      // a live hold
	StateReserved  State = "reserved"  // taken in Redis, not yet applied in the Store
	StateApplied   State = "applied"   // taken in Redis and applied in the Store
	StateRestored  State = "restored"  // given back by Restore (tombstones too)
	StateRefused   State = "refused"   // refused by the Store and given back
	StateCancelled State = "cancelled" // a hold given back by Cancel
	StateExpired   State = "expired"   // a hold given back at its deadline
)

// Entry is stock.Entry, documented there; its fields and methods are documented here.
type Entry struct {
	ID, SKU, User string
	Kind          Kind
	State         State
	Qty           int64 // units taken (or added, for a restock)
	Before, After int64 // available stock before and after the operation
	// At is when the operation ran (ms), by the Redis server's clock. A deduct on an item with
	// no live hold records the Reserver's estimate of that clock instead of reading it: its own
	// clock (stock.WithClock) plus the difference between the two, measured with TIME at most a
	// second before, so At may differ from Redis's clock by that second's drift and the round
	// trip, whatever the Reserver's clock says. At serves the retention and display, never the
	// order of an item's events (their sequence).
	At time.Time
	// Deadline is, for holds only, when the hold expires (zero otherwise); for a confirmed hold
	// given back after its deadline, when it was given back (the retention counts from it).
	Deadline time.Time
	// GivenBack is, for a deduct, when its sale was given back (restored or refused); zero
	// otherwise. A hold's entry has Deadline only: a confirmed hold given back after its
	// deadline records then in Deadline, one given back before it records no time. The
	// retention of a settled entry counts from the latest of At, Deadline and GivenBack.
	GivenBack time.Time
}

// Taken reports whether the entry currently holds or has sold stock (it is held, reserved or
// applied, and not a restock).
func (e Entry) Taken() bool {
	return e.Kind != KindRestock && (e.State == StateHeld || e.State == StateReserved || e.State == StateApplied)
}
