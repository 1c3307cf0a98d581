package stocktype

import (
	"context"
	"time"
)

// EventType says what happened to an id.
type EventType string

// Event types. A Store applies EventDeducted, EventConfirmed, EventRestocked, EventRestored and
// EventRefused; the others are for publishers only, and a Store must accept and ignore them.
const (
	EventDeducted  EventType = "deducted"  // Deduct took stock: decrement, conditionally
	EventConfirmed EventType = "confirmed" // a hold was confirmed: decrement, like EventDeducted
	EventRestocked EventType = "restocked" // Restock added stock: increment
	EventRestored  EventType = "restored"  // an id's stock was given back: undo its decrement if applied
	EventRefused   EventType = "refused"   // the Store refused the id and Redis gave the stock back
	EventHeld      EventType = "held"      // Hold took stock until a deadline
	EventCancelled EventType = "cancelled" // Cancel gave a hold back
	EventExpired   EventType = "expired"   // a hold passed its deadline and was given back
)

// Event is stock.Event, documented there; its fields and methods are documented here.
type Event struct {
	Type EventType `json:"type"`
	SKU  string    `json:"sku"`
	ID   string    `json:"id"`
	User string    `json:"user,omitempty"`
	Qty  int64     `json:"qty"`
	At   time.Time `json:"at"` // when the operation ran, by the Redis clock (its ledger entry's At)
	Seq  int64     `json:"seq,omitempty"`
}

// Store is stock.Store, documented there; its fields and methods are documented here.
type Store interface {
	// Apply applies one event, as described above.
	Apply(ctx context.Context, ev Event) error
	// Remaining returns the stock of sku the database holds; ErrNotLoaded if it has no row.
	Remaining(ctx context.Context, sku string) (int64, error)
	// Records returns what the store recorded for the given ids of sku. Ids it has no record
	// of are absent from the map.
	Records(ctx context.Context, sku string, ids []string) (map[string]Record, error)
}

// Record is what a Store holds for one id of one item.
type Record struct {
	SKU, ID, User string
	Type          EventType // the event that created the record
	Qty           int64
	// Status is one of three States: StateApplied (the decrement, or restock, was applied),
	// StateRestored (given back, or a tombstone of a restore seen first) or StateRefused (the
	// store could not cover the deduct). A Store records no other State; the other four
	// (held, reserved, cancelled, expired) are states of Redis's ledger entries only.
	Status State
	At     time.Time // when the record was created, by the database's clock
}

// RecordLister is stock.RecordLister, documented there; its fields and methods are documented here.
type RecordLister interface {
	List(ctx context.Context, sku, after string, limit int) ([]Record, error)
}

// BatchStore is stock.BatchStore, documented there; its fields and methods are documented here.
type BatchStore interface {
	ApplyBatch(ctx context.Context, evs []Event) []error
}

// Publisher is stock.Publisher, documented there; its fields and methods are documented here.
type Publisher interface {
	Publish(ctx context.Context, ev Event) error
}

// BatchPublisher is stock.BatchPublisher, documented there; its fields and methods are documented here.
type BatchPublisher interface {
	Publisher
	PublishBatch(ctx context.Context, evs []Event) []error
}

// PublisherFunc adapts a function to the Publisher interface.
type PublisherFunc func(ctx context.Context, ev Event) error

// Publish calls f(ctx, ev).
func (f PublisherFunc) Publish(ctx context.Context, ev Event) error { return f(ctx, ev) }

// ItemLister is stock.ItemLister, documented there; its fields and methods are documented here.
type ItemLister interface {
	ListItems(ctx context.Context, after string, limit int) ([]string, error)
}
