package engine

import (
	"context"
	"errors"
	"time"
)

// ErrRefused is returned by a Store whose database of record cannot cover a deduct (its
// remaining stock is lower than the quantity). The relay and Consume then give the stock back
// in Redis, once, and publish an EventRefused. An item the store does not know is not a
// refusal: its Apply answers ErrNotLoaded (see Store).
var ErrRefused = errors.New("stock: refused by the store")

// ErrHeldBack is returned by Consume for an event it did not apply, because it must not be
// applied yet: a reconcile pass holds the item, or an earlier event of the item (in the item's
// sequence, Event.Seq) is not applied and Consume cannot apply it first (its ledger entry is
// gone from Redis, so only its own message can tell what it was; or too many are waiting).
// Nothing was changed for the event: have the queue deliver it again later (a negative
// acknowledgement with a short delay).
var ErrHeldBack = errors.New("stock: held back until the item's earlier events are applied")

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

// Event is one change of stock that must reach the database of record or a message queue. The
// pair (SKU, ID) identifies the operation (in Redis and in the Store alike): a deduct, a hold
// or a restock, and the events that follow it (a restore, a refusal). Each id has at most one
// event of each type; an id used for one kind of operation cannot be reused for another
// (Redis answers ErrConflict), so a Store may key its records on (SKU, ID).
//
// Seq is the event's place in its item's sequence: the script that makes the event numbers it
// after every earlier event of the item, so an item's events sorted by Seq are in the order they
// happened (a restore before the deduct that bought the unit it gave back). Numbers may skip
// (an event a relay set aside) and start again lower after Redis lost data; they are not
// comparable across items. Consume applies an item's events in this order whatever order a
// queue hands them over in; a publisher may use it to check or keep an item's order. 0 for an
// event that did not come from an outbox.
type Event struct {
	Type EventType `json:"type"`
	SKU  string    `json:"sku"`
	ID   string    `json:"id"`
	User string    `json:"user,omitempty"`
	Qty  int64     `json:"qty"`
	At   time.Time `json:"at"` // when the operation ran, by the Redis clock
	Seq  int64     `json:"seq,omitempty"`
}

// A Store is the database of record. Implementations must be safe for concurrent use and must
// promise:
//
//   - Apply is idempotent in (ev.SKU, ev.ID): applying an event twice, or concurrently from
//     several processes, has the effect of applying it once, and a repeat answers as the
//     first application did.
//   - EventDeducted and EventConfirmed decrement the item's remaining stock only if
//     remaining >= ev.Qty, and record the id, in one transaction. When the stock does not
//     cover it, Apply records the refusal and returns an error wrapping ErrRefused; so does
//     every later Apply of that id.
//   - An item the store has no row for is a setup error, not a refusal: Apply of its
//     EventDeducted, EventConfirmed or EventRestocked records nothing and returns an error
//     wrapping ErrNotLoaded. The relay (and Consume) then keep the event, and the item's later
//     events, in Redis, retried with backoff until the item is loaded in the store: nothing is
//     given back in Redis, nothing is dead-lettered, and the Reserver's logger says so at
//     Error level, once per item per minute (stockops.RelayStats.NotLoaded counts them). Load
//     an item in the store before, or with, Redis: stockops.Preheat does both.
//   - EventRestored and EventRefused give back what the id's decrement took, if it was
//     applied and not already given back; for an id the store has not seen they record a
//     tombstone, so that a late deduct of that id changes nothing.
//   - EventRestocked increments the remaining stock, once.
//   - Other event types are accepted and ignored.
//   - Remaining never goes below zero.
//
// A Store keeps one Record per (sku, id), whose Status is StateApplied, StateRestored or
// StateRefused: no other State (see Record).
//
// An error wrapping ErrInvalid says the event can never be applied: the relay moves it to the
// item's dead-letter set and reports it (stockops.RelayStats.DeadLettered, stockops.Report.DeadLetters). Any
// other error is taken as temporary: the event, and the item's later events, are retried with
// backoff.
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

// A RecordLister is a Store that can list an item's records, in pages ordered by id (byte-wise,
// as Go compares strings), for the
// reconciler to find records Redis has lost. List returns up to limit records of sku whose id
// is greater than after ("" for the first page).
type RecordLister interface {
	List(ctx context.Context, sku, after string, limit int) ([]Record, error)
}

// A BatchStore is a Store that can apply several events in one round trip. It applies them in
// order and stops at the first error that is not a refusal: the events after it must be left
// unapplied (an item's events must reach the store in order). The result has one error (or nil)
// per event, in order, with the same meaning as Store.Apply's; unapplied events get an error.
type BatchStore interface {
	ApplyBatch(ctx context.Context, evs []Event) []error
}

// A Publisher hands events to a message queue or another service. Publish must be safe for
// concurrent use. Delivery is at least once: the same event may be published more than once
// (after a crash or a retry), so consumers deduplicate on (SKU, ID, Type). An error makes the
// relay retry the event later with backoff.
type Publisher interface {
	Publish(ctx context.Context, ev Event) error
}

// A BatchPublisher is a Publisher that can publish several events in one round trip to its
// queue. The relay uses PublishBatch, when a Publisher has it, to publish the events it
// claimed from one item together (all of one SKU, in their sequence, Event.Seq); it falls back
// to Publish for a single event. The result has one error (or nil) per event, in order, with
// the same meaning as Publish's: nil means the queue has that event. The relay keeps the
// events before the first failed one as published, and retries the failed one and those
// after it later, with backoff, one after the other as it does with Publish: an implementation
// that can should stop at an item's first failure and answer an error for the events after it
// without publishing them, so that the queue gets the item's events in order (Consume keeps
// the order for the store either way). A result of the wrong length fails the whole batch.
// PublishBatch must be safe for concurrent use.
type BatchPublisher interface {
	Publisher
	PublishBatch(ctx context.Context, evs []Event) []error
}

// PublisherFunc adapts a function to the Publisher interface.
type PublisherFunc func(ctx context.Context, ev Event) error

// Publish calls f(ctx, ev).
func (f PublisherFunc) Publish(ctx context.Context, ev Event) error { return f(ctx, ev) }
