package stock

import (
	"context"

	"github.com/stockres/stock/internal/engine"
	"github.com/stockres/stock/internal/errs"
	"github.com/stockres/stock/stocktype"
)

// ErrRefused is returned by a Store whose database of record cannot cover a deduct (its
// remaining stock is lower than the quantity). The relay and Consume then give the stock back
// in Redis, once, and publish an EventRefused. An item the store does not know is not a
// refusal: its Apply answers ErrNotLoaded (see Store).
var ErrRefused = errs.ErrRefused

// ErrHeldBack is returned by Consume for an event it did not apply, because it must not be
// applied yet: a reconcile pass holds the item, or an earlier event of the item (in the item's
// sequence, Event.Seq) is not applied and Consume cannot apply it first (its ledger entry is
// gone from Redis, so only its own message can tell what it was; or too many are waiting).
// Nothing was changed for the event: have the queue deliver it again later (a negative
// acknowledgement with a short delay).
var ErrHeldBack = errs.ErrHeldBack

// EventType says what happened to an id. Each of its values is documented in [stocktype.EventType].
type EventType = stocktype.EventType

// Event types. A Store applies EventDeducted, EventConfirmed, EventRestocked, EventRestored and
// EventRefused; the others are for publishers only, and a Store must accept and ignore them.
const (
	EventDeducted  = stocktype.EventDeducted
	EventConfirmed = stocktype.EventConfirmed
	EventRestocked = stocktype.EventRestocked
	EventRestored  = stocktype.EventRestored
	EventRefused   = stocktype.EventRefused
	EventHeld      = stocktype.EventHeld
	EventCancelled = stocktype.EventCancelled
	EventExpired   = stocktype.EventExpired
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
// event that did not come from an outbox. Its fields are documented in [stocktype.Event].
type Event = stocktype.Event

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
// backoff. Its methods are documented in [stocktype.Store].
type Store = stocktype.Store

// Record is what a Store holds for one id of one item.
// Its fields are documented in [stocktype.Record].
type Record = stocktype.Record

// A RecordLister is a Store that can list an item's records, in pages ordered by id (byte-wise,
// as Go compares strings), for the
// reconciler to find records Redis has lost. List returns up to limit records of sku whose id
// is greater than after ("" for the first page).
// Its methods are documented in [stocktype.RecordLister].
type RecordLister = stocktype.RecordLister

// A BatchStore is a Store that can apply several events in one round trip. It applies them in
// order and stops at the first error that is not a refusal: the events after it must be left
// unapplied (an item's events must reach the store in order). The result has one error (or nil)
// per event, in order, with the same meaning as Store.Apply's; unapplied events get an error.
// Its methods are documented in [stocktype.BatchStore].
type BatchStore = stocktype.BatchStore

// A Publisher hands events to a message queue or another service. Publish must be safe for
// concurrent use. Delivery is at least once: the same event may be published more than once
// (after a crash or a retry), so consumers deduplicate on (SKU, ID, Type). An error makes the
// relay retry the event later with backoff. Its methods are documented in [stocktype.Publisher].
type Publisher = stocktype.Publisher

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
// Its methods are documented in [stocktype.BatchPublisher].
type BatchPublisher = stocktype.BatchPublisher

// PublisherFunc adapts a function to the Publisher interface.
// It is defined, with its method, in [stocktype.PublisherFunc].
type PublisherFunc = stocktype.PublisherFunc

// An ItemLister is a Store that can list its items, in pages ordered by SKU (byte-wise, as Go
// compares strings). ListItems returns up to limit SKUs greater than after ("" for the first
// page). A reconciler whose Store is an ItemLister (and a RecordLister) finds the items Redis
// lost from its registry, even when Redis lost everything; with another Store, a pass sees only
// the items the registry still lists. Its methods are documented in [stocktype.ItemLister].
type ItemLister = stocktype.ItemLister

// Consume applies one event received from a message queue to store, for the deployment in
// which the Reserver's relay only publishes (Reserver → relay with no Store → Publisher → queue
// → a consumer in the service that owns the database). Its answer says what to do with the
// message:
//
//   - nil: the event is applied (or is a repeat of one applied), or the store refused a deduct
//     and Consume gave the stock back in Redis through r, once (an EventRefused follows): ack.
//   - an error wrapping ErrHeldBack: the event must wait (a reconcile pass holds the item, or
//     an earlier event of the item is not applied and cannot be applied from Redis). Nothing
//     changed for it: deliver it again later (a negative ack with a delay of about a second).
//   - an error wrapping ErrInvalid: the event can never be applied. It is moved to the item's
//     dead-letter set, for the reconciler and an operator, so that it no longer holds back the
//     item's later events: terminate the message, never redeliver it.
//   - any other error: temporary (the store or Redis is unreachable, or the store does not know
//     the item: an error wrapping ErrNotLoaded, logged at Error level once per item per minute):
//     do not ack; the message must be delivered again. Nothing is given back in Redis.
//
// In order per item: the relay hands an item's events to the publisher in their sequence
// (Event.Seq) and, once published, keeps each one in the item's published set in Redis until a
// consumer has applied it through Consume. Before applying an event, Consume looks for earlier
// events of the item that a Store applies (deducts, confirms, restores, refusals, restocks)
// still in the published set or the outbox, and applies them first, in sequence, built from
// their ledger entries as the relay builds them (their own messages, when they come, are
// repeats). So a queue may redeliver in any order, run several consumers, or hand one event to
// two of them: the store still gets each item's events in the order they happened, a restore
// reaches it before the deduct that bought the unit it gave back, and a consumer that died
// holding messages does not delay its successor until the queue redelivers them. For an item
// split over buckets (WithBuckets), the order holds across buckets where it matters: an event
// of a bucket that may spend units a transfer brought from another bucket is held back
// (ErrHeldBack) until that bucket's events before the transfer (the restocks and restores that
// gave those units back) are applied, so the store never refuses such a sale for want of them. A held-back
// event relies on the queue to deliver it again: let it redeliver without a limit
// (JetStream's MaxDeliver -1, the default).
//
// In flight for the reconciler: an event published and not yet applied through Consume stays
// in flight for the reconciler, so a pass while consumers are down or behind sees no drift and
// adds no stock. While a pass holds an item, Consume holds the item's events back
// (ErrHeldBack), so that the store stays still while the pass compares it with Redis.
//
// Consume is idempotent in (ev.SKU, ev.ID, ev.Type), as queues redeliver. An event without a
// sequence (Seq 0, from an older relay) is applied as it comes, without the order check.
// Consume costs a script call before the store's Apply and one after (more when it catches
// up).
func Consume(ctx context.Context, r *Reserver, store Store, ev Event) error {
	return engine.Consume(ctx, r.e, store, ev)
}
