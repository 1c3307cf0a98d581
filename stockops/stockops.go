// Package stockops runs and inspects the background work of a [stock.Reserver] by hand: the
// relay that delivers events to the Store and the Publisher, the reconciler that compares Redis
// with the Store and repairs drift, the failover guard, sweeps of due holds, the recovery of
// half-done carts, and reads of the registry, an item's ledger and its outbox.
//
// Most services need none of it: [stock.Reserver.Run] runs the relay, the reconciler, the
// guard, the sweeper and cart recovery with documented defaults in one goroutine. This
// package is for tools (the stockctl CLI), tests, and deployments that run the pieces in
// separate processes. Everything here is safe for concurrent use and starts no goroutines.
//
// The settings of NewRelay and NewReconciler are [stock.RelayOptions] and
// [stock.ReconcileOptions], in package stock: [stock.RunOptions] carries the same structs (its
// Relay and Reconcile fields), so that one value configures a relay whether Reserver.Run or
// this package runs it, and package stock cannot name a type of this package, which imports it.
package stockops

import (
	"context"
	"fmt"
	"iter"
	"time"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/engine"
	"github.com/stockres/stock/stocktype"
)

// errNilReserver is the error of a constructor given no Reserver.
var errNilReserver = fmt.Errorf("stockops: no Reserver: %w", stock.ErrInvalid)

// A Relay drains the outboxes of a Reserver's items into a Store and/or a Publisher, at least
// once and in order per item: an event is removed from the outbox only after the Store applied
// it and the Publisher accepted it, and an item's events are delivered in the order they
// happened (so a restore reaches the store before a later deduct of the stock it gave back).
// Several relays, in one process or many, may drain the same items: each item is leased to one
// relay at a time, and the events of a relay that died are delivered again after its lease.
// A failed event holds back its item, with backoff, not the other items.
// Because delivery is at least once, the Store must be idempotent (it is, per its contract) and
// consumers of the Publisher must deduplicate on (SKU, ID, Type).
//
// With no Store (the queue path: NewRelay(r, nil, publisher, nil)), an event the Publisher
// accepted is not applied yet: the relay moves it from the outbox to the item's published set,
// where it stays, in flight for the Reconciler, until a consumer applies it through
// [stock.Consume]. stock.Consume also uses that set to apply an item's events in sequence
// (Event.Seq) whatever order the queue delivers them in. Events a Store ignores (held,
// cancelled, expired) leave at once.
//
// An event the relay cannot build, because its ledger entry is gone (an evicted ledger key) or
// unreadable, is moved to the item's dead-letter set, never dropped: it records a sale that is
// counted nowhere else, and the Reconciler leaves such an item for an operator.
//
// When the Store refuses a deduct (stock.ErrRefused), the relay gives the stock back in Redis once
// (the ledger entry becomes refused) and an stock.EventRefused follows through the outbox.
type Relay struct{ rl *engine.Relay }

// NewRelay returns a relay that delivers the events of r's items to store and pub. Either may
// be nil, not both. opts may be nil for the defaults.
func NewRelay(r *stock.Reserver, store stock.Store, pub stock.Publisher, opts *stock.RelayOptions) (*Relay, error) {
	if r == nil {
		return nil, errNilReserver
	}
	rl, err := engine.Of(r).NewRelay(store, pub, opts)
	if err != nil {
		return nil, err
	}
	return &Relay{rl}, nil
}

// Run delivers events until ctx is done, waiting the poll interval after a pass with nothing to
// do. Unlike Once, a pass does not visit every item: it looks at the items whose due-work hints
// are due (the Reserver records an item in them after each of its script calls that may queue
// an event, and the relay when it backs off), and at a few more of the registry (256 a second,
// at least 32 a poll interval, so a catalogue of up to 32 items is looked at whole every poll),
// which finds the events whose hints were lost. Its cost with nothing to deliver does not grow
// with the catalogue. Errors of single items are logged and retried; Run returns ctx's error, or
// an error wrapping stock.ErrReserverClosed once the Reserver is closed.
func (rl *Relay) Run(ctx context.Context) error { return rl.rl.Run(ctx) }

// Once makes one pass over the items: it claims their due events, a batch at a time, until
// none is due, and delivers them. It returns the first error met (after finishing the other
// items); events that failed stay in the outbox for a later pass.
func (rl *Relay) Once(ctx context.Context) (RelayStats, error) {
	return rl.rl.Once(ctx)
}

// RelayStats counts what one pass of a relay did (its fields: stocktype.RelayStats).
type RelayStats = stocktype.RelayStats

// A Reconciler compares each item in Redis (available + held, and the events Redis has not seen
// applied: pending in its outbox, published to a queue and not yet applied through stock.Consume, or
// set aside as dead letters) with the Store (remaining, and what it recorded of those events),
// reports drift, lost keys, lost ledger entries and lost events, and repairs them. Events still
// in flight are not drift, on either path: a pass while a queue's consumers are down adds no
// stock for the sales waiting in the queue.
//
// Repairs are safe under live traffic: while it looks at an item the reconciler holds the item's
// relay lease, so no relay delivers and stock.Consume holds the item's events back, and it reads the
// Store after Redis, until two reads of the Store's records agree, so that both describe the
// same events; Redis may change, and so every repair is made by a script that adjusts by a
// delta or writes only what is missing, never by overwriting a value computed before a
// concurrent change. An item with undelivered events whose ledger entries are gone is not
// repaired at all: their sales are counted nowhere but in Redis's counters.
type Reconciler struct{ rc *engine.Reconciler }

// NewReconciler returns a reconciler of r's items against store. opts may be nil for the
// defaults.
func NewReconciler(r *stock.Reserver, store stock.Store, opts *stock.ReconcileOptions) (*Reconciler, error) {
	if r == nil {
		return nil, errNilReserver
	}
	rc, err := engine.Of(r).NewReconciler(store, opts)
	if err != nil {
		return nil, err
	}
	return &Reconciler{rc}, nil
}

// Run reconciles every interval (stock.ReconcileOptions.Interval) until ctx is done, and returns
// ctx's error, or an error wrapping stock.ErrReserverClosed once the Reserver is closed. Reports go to the Reserver's logger; errors are logged and the next pass
// retries.
func (rc *Reconciler) Run(ctx context.Context) error { return rc.rc.Run(ctx) }

// Once reconciles every item once (the registry, the Store's items the registry lost when the
// Store is a [stock.ItemLister], or the items given by stock.ReconcileOptions.Items) and returns one
// report per item. It goes on after an item's error and returns the first, joined with
// stock.ErrRegistryLost when Redis had lost items from its registry. Pass says more, item by item.
func (rc *Reconciler) Once(ctx context.Context) ([]Report, error) {
	return rc.rc.Once(ctx)
}

// Item reconciles one item.
func (rc *Reconciler) Item(ctx context.Context, sku string) (Report, error) {
	return rc.rc.Item(ctx, sku)
}

// Pass reconciles every item once, as Once does, and returns what it found item by item.
// Besides the registry's items it reconciles the Store's items the registry lost, when the
// Store is an stock.ItemLister (see stock.ErrRegistryLost and PassResult). A complete repairing pass (not
// a dry run, not limited by stock.ReconcileOptions.Items) records the current Redis primaries as
// reconciled, which lifts every FailoverGuard's fence, wherever the pass runs (a guard in
// another process, the stockctl CLI): this Reserver's at once, the others' at their next
// check. The error joins the first item's error, stock.ErrRegistryLost when items were missing from
// the registry, and, when the Reserver has a FailoverGuard, the failure to record the
// primaries.
func (rc *Reconciler) Pass(ctx context.Context) (PassResult, error) {
	return rc.rc.Pass(ctx)
}

// Report is what one reconcile pass found and did for one item (its fields:
// stocktype.Report).
type Report = stocktype.Report

// PassResult is what one reconcile pass over every item found and did (its fields:
// stocktype.PassResult).
type PassResult = stocktype.PassResult

// A FailoverGuard notices that a Redis primary restarted (its run id changed) or was replaced
// (its replication id changed), and then fences the Reserver: new deducts and holds are refused
// with stock.ErrFailover until a repairing Reconciler pass over all items completes, in this process
// or any other one (stockctl reconcile -apply included). The primaries' identities last
// reconciled are kept in Redis ("<prefix>:epoch"), so every process sharing the Redis agrees.
// Call Check (or Run) regularly; the fence comes only as promptly as the checks. Once fenced,
// the Reserver's refused requests check the guard too, at most once a second, so a pass in
// another process lifts the fence even when nothing calls Check any more (a Run that ended).
type FailoverGuard struct{ g *engine.FailoverGuard }

// NewFailoverGuard returns a guard for r. Every complete repairing Reconciler pass over every
// item records that the current primaries are reconciled, whether its Reserver has a guard or
// not (another process, the stockctl CLI); a guard makes r's passes fail when they cannot. A
// pass of r's own that records them checks r's latest guard at once, which lifts r's fence
// without waiting for the guard's next check.
func NewFailoverGuard(r *stock.Reserver) *FailoverGuard {
	return &FailoverGuard{engine.Of(r).NewFailoverGuard()}
}

// Check reads the primaries' identities and fences or unfences the Reserver. It reports whether
// the Reserver is fenced. A Redis with no recorded epoch is a new deployment only when no item
// is loaded and this guard saw no other primaries before: then Check records the current
// primaries as reconciled. Otherwise (a guard added to a live deployment, or the epoch lost with
// the data in a restart without persistence) nothing tells which writes were lost, so it fences
// until a complete repairing Reconciler pass records the primaries.
func (g *FailoverGuard) Check(ctx context.Context) (fenced bool, err error) { return g.g.Check(ctx) }

// Run calls Check every interval until ctx is done and returns ctx's error, or an error wrapping
// stock.ErrReserverClosed once the Reserver is closed.
func (g *FailoverGuard) Run(ctx context.Context, interval time.Duration) error {
	return g.g.Run(ctx, interval)
}

// Sweep releases the holds past their deadline of the given items, or of every item in the
// registry when none is given, in bounded steps, and returns the units released. Holds index
// their deadlines per item, so a sweep looks only at expired holds. An item that fails does not
// stop the others: the errors of all items are joined. A corrupt ledger entry is an error that
// names its id, and that step releases nothing (the scripts check everything they read before
// their first write). For an item split over buckets (stock.WithBuckets) it sweeps every bucket
// and also completes the transfers of stock between its buckets that began more than 5 s ago
// and are still in flight (their process died between the two halves), as Reserver.Run's
// sweeper does. Reserver.Run sweeps every second; Deduct and Hold also release due holds of the
// item they touch.
func Sweep(ctx context.Context, r *stock.Reserver, skus ...string) (int64, error) {
	return engine.Of(r).Sweep(ctx, skus...)
}

// RecoverCarts undoes the carts whose saga started more than olderThan ago and never ended
// (the process died, and nobody retried the cart id), and finishes undos that a crash cut short:
// their items are given back, and a late retry of such a cart returns stock.ErrRestored. It returns the
// number of carts this call undid (a cart undone by a concurrent call or a retry is not
// counted, so concurrent calls add up to the carts undone). Reserver.Run calls it; a process
// that calls it itself should do so periodically with olderThan well above the longest
// checkout call.
func RecoverCarts(ctx context.Context, r *stock.Reserver, olderThan time.Duration) (int, error) {
	return engine.Of(r).RecoverCarts(ctx, olderThan)
}

// Refuse gives back the stock of an id that the database of record refused (stock.ErrRefused), once.
// The entry becomes refused and an stock.EventRefused is queued for the publisher. [stock.Consume]
// and the Relay call it themselves; it is for a consumer that applies a queue's events without
// stock.Consume.
func Refuse(ctx context.Context, r *stock.Reserver, sku, id string) (stock.Receipt, error) {
	return engine.Of(r).Refuse(ctx, sku, id)
}

// Pending returns the number of events waiting in an item's outbox (not yet delivered by a
// relay) and in its dead-letter set (rejected by the store as invalid, or orphaned).
func Pending(ctx context.Context, r *stock.Reserver, sku string) (pending, dead int64, err error) {
	return engine.Of(r).Pending(ctx, sku)
}

// Items iterates over the registry of loaded items (SSCAN, in pages), in no particular order.
func Items(ctx context.Context, r *stock.Reserver) iter.Seq2[string, error] {
	return engine.Of(r).Items(ctx)
}

// Entries iterates over an item's ledger in no particular order, with HSCAN in pages of about
// 256 entries, so a ledger of millions of entries never blocks Redis. An entry changed during
// the scan may be seen in either state; an entry added during the scan may be missed. Iteration
// stops at the first error, which is yielded with a zero Entry.
func Entries(ctx context.Context, r *stock.Reserver, sku string) iter.Seq2[stock.Entry, error] {
	return engine.Of(r).Entries(ctx, sku)
}

// SoldOutAnswers returns how many requests r answered stock.ErrSoldOut by the sold-out fast path:
// in-process, without a round trip to Redis, or for an item split over buckets after the one
// round trip of its id's claim (see stock.WithSoldOutCache).
func SoldOutAnswers(r *stock.Reserver) int64 { return engine.Of(r).SoldOutAnswers() }
