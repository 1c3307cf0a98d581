package stock

import (
	"context"

	"github.com/stockres/stock/internal/engine"
)

// RelayOptions configures a relay (Reserver.Run's, or stockops.NewRelay's). A zero field takes
// its default; nil options take every default. It lives in this package, not in stockops,
// because RunOptions.Relay carries it.
type RelayOptions = engine.RelayOptions

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
