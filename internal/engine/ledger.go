package engine

import (
	"context"
	"fmt"
	"iter"
	"time"

	"github.com/redis/rueidis"
	"github.com/stockres/stock/internal/protocol"
)

// Kind says what operation created a ledger entry.
type Kind string

// Kinds of ledger entries.
const (
	KindDeduct    Kind = "deduct"    // Deduct: stock sold at once
	KindHold      Kind = "hold"      // Hold: stock held until a deadline, then confirmed or released
	KindRestock   Kind = "restock"   // Restock: stock added to a live item
	KindTombstone Kind = "tombstone" // a Restore or Cancel of an id that had taken nothing
)

// State is where a ledger entry is in its life (Entry.State), and what a Store recorded of an id
// (Record.Status).
//
// A Redis ledger entry takes any of the seven states. A Store uses three of them only:
// StateApplied, StateRestored and StateRefused (see Record.Status); held, reserved, cancelled
// and expired are Redis's alone (a hold reaches the Store only once confirmed, and a Store
// records nothing for a cancelled or expired hold).
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

var kindCodes = map[byte]Kind{
	protocol.KindDeduct: KindDeduct, protocol.KindHold: KindHold,
	protocol.KindRestock: KindRestock, protocol.KindTombstone: KindTombstone,
}

var stateCodes = map[byte]State{
	protocol.StateHeld: StateHeld, protocol.StateReserved: StateReserved, protocol.StateApplied: StateApplied,
	protocol.StateRestored: StateRestored, protocol.StateRefused: StateRefused,
	protocol.StateCancelled: StateCancelled, protocol.StateExpired: StateExpired,
}

// Entry is one ledger entry: what one request id did to one item. Entries are kept in Redis,
// in a hash per item, for the retention period (see the package doc).
type Entry struct {
	ID, SKU, User string
	Kind          Kind
	State         State
	Qty           int64     // units taken (or added, for a restock)
	Before, After int64     // available stock before and after the operation
	At            time.Time // when the operation ran, by the Redis server's clock (ms)
	// Deadline is, for holds only, when the hold expires (zero otherwise); for a confirmed hold
	// given back after its deadline, when it was given back (the retention counts from it).
	Deadline time.Time
	// settledAt is when a sale was given back (a deduct's last field, which holds use for
	// their deadline); zero otherwise.
	settledAt time.Time
}

// retainedFrom is when the retention of a settled entry starts: the latest of when it ran, its
// deadline (a hold settles at the latest then) and when it was given back.
func (e Entry) retainedFrom() time.Time {
	t := e.At
	for _, u := range [...]time.Time{e.Deadline, e.settledAt} {
		if u.After(t) {
			t = u
		}
	}
	return t
}

// Taken reports whether the entry currently holds or has sold stock (it is held, reserved or
// applied, and not a restock).
func (e Entry) Taken() bool {
	return e.Kind != KindRestock && (e.State == StateHeld || e.State == StateReserved || e.State == StateApplied)
}

// parseEntry decodes a ledger entry as lua/lib.lua writes it (protocol.ParseEntry).
func parseEntry(sku, id, s string) (Entry, error) {
	w, err := protocol.ParseEntry(s)
	if err != nil {
		return Entry{}, fmt.Errorf("%w: ledger entry %q of %s/%s: %v", ErrInvalid, s, sku, id, err)
	}
	e := Entry{ID: id, SKU: sku, User: w.User, Kind: kindCodes[w.Kind], State: stateCodes[w.State],
		Qty: w.Qty, Before: w.Before(), After: w.After, At: time.UnixMilli(w.At)}
	switch {
	case !w.HasDeadline:
	case w.Kind == protocol.KindHold:
		e.Deadline = time.UnixMilli(w.Deadline)
	default:
		e.settledAt = time.UnixMilli(w.Deadline)
	}
	return e, nil
}

// Ledger returns the ledger entry of one request id. It returns ErrUnknownID when the item has
// no entry for the id (never used, or trimmed after the retention period).
func (r *Reserver) Ledger(ctx context.Context, sku, id string) (Entry, error) {
	if err := r.enter(); err != nil {
		return Entry{}, err
	}
	defer r.calls.Leave()
	return r.ledger(ctx, sku, id)
}

// ledger is Ledger, for the calls of r that are in flight already.
func (r *Reserver) ledger(ctx context.Context, sku, id string) (Entry, error) {
	if err := checkName("sku", sku); err != nil {
		return Entry{}, err
	}
	if err := checkName("id", id); err != nil {
		return Entry{}, err
	}
	name, err := r.holder(ctx, sku, id)
	if err != nil {
		return Entry{}, err
	}
	s, err := r.client.Do(ctx, r.client.B().Hget().Key(r.item(name).Ledger).Field(id).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return Entry{}, fmt.Errorf("%w: %s/%s", ErrUnknownID, sku, id)
	}
	if err != nil {
		return Entry{}, fmt.Errorf("stock: ledger %s/%s: %w", sku, id, err)
	}
	return parseEntry(sku, id, s)
}

// entries is stockops.Entries: the entries of every bucket of an item split over buckets.
func (r *Reserver) entries(ctx context.Context, sku string) iter.Seq2[Entry, error] {
	return func(yield func(Entry, error) bool) {
		if err := checkName("sku", sku); err != nil {
			yield(Entry{}, err)
			return
		}
		for _, name := range r.names(sku) {
			for e, err := range r.ledgerOf(ctx, name) {
				if !yield(e, err) || err != nil {
					return
				}
			}
		}
	}
}

// ledgerOf returns the entries of the ledger of item name (an item, or a bucket: its entries
// name the item it belongs to).
func (r *Reserver) ledgerOf(ctx context.Context, name string) iter.Seq2[Entry, error] {
	return func(yield func(Entry, error) bool) {
		sku := parentOf(name)
		key := r.item(name).Ledger
		var cursor uint64
		for {
			se, err := r.client.Do(ctx, r.client.B().Hscan().Key(key).Cursor(cursor).Count(256).Build()).AsScanEntry()
			if err != nil {
				yield(Entry{}, fmt.Errorf("stock: ledger scan %s: %w", name, err))
				return
			}
			for i := 0; i+1 < len(se.Elements); i += 2 {
				if protocol.IsMark(se.Elements[i]) {
					continue // never a request id
				}
				e, err := parseEntry(sku, se.Elements[i], se.Elements[i+1])
				if !yield(e, err) || err != nil {
					return
				}
			}
			if se.Cursor == 0 {
				return
			}
			cursor = se.Cursor
		}
	}
}
