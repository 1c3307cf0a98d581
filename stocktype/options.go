package stocktype

import "time"

// RelayOptions is stock.RelayOptions, documented there; its fields and methods are documented here.
type RelayOptions struct {
	// Items limits the relay to these items. The default is every item in the Reserver's
	// registry (see stockops.Items), read again on every pass.
	Items []string
	// Batch is how many events the relay claims from one item at a time, at most 10,000. The
	// default is 128.
	Batch int
	// Lease is how long a claimed event stays invisible to other relays; an event whose relay
	// died is delivered again after it. It must exceed the time a Store or Publisher call may
	// take. The default is 30s.
	Lease time.Duration
	// MinBackoff and MaxBackoff bound the delay before a failed event is tried again: it
	// starts at MinBackoff and doubles up to MaxBackoff, with a random jitter of up to half so
	// that a recovering database is not hit by every event at once. The defaults are 500ms
	// and 1m.
	MinBackoff, MaxBackoff time.Duration
	// Poll is how long Run waits after a pass that found nothing to do. The default is 100ms.
	Poll time.Duration
}

// ReconcileOptions is stock.ReconcileOptions, documented there; its fields and methods are documented here.
type ReconcileOptions struct {
	// Items limits the reconciler to these items. The default is the registry (and the
	// Store's items the registry lost, when the Store is an ItemLister).
	Items []string
	// DryRun makes the reconciler report only; it repairs nothing.
	DryRun bool
	// RepairLimit leaves a drift larger than this many units unrepaired and reports it as
	// needing a human (an alert threshold). The default, 0, repairs every drift.
	RepairLimit int64
	// Retention is how long settled ledger entries (applied, restored, refused, cancelled,
	// expired, tombstones) are kept before a pass trims them, counted from when the entry
	// settled: the latest of when it was written, a hold's deadline and when a sale was given
	// back (a hold that lives longer than the retention keeps its entry for the retention after
	// its deadline). The idempotency of a request id
	// lasts this long in Redis; after it, a retried deduct is refused by the Store's unique
	// (sku, id) instead. Two things end with it: a Restore (or Cancel) of a trimmed sale answers
	// ErrUnknownID and gives nothing back, the Store keeping the sale (Restock the units
	// instead, see Reserver.Restore); and a tombstone, which lives in Redis only (no event takes
	// it to the Store), no longer refuses a late deduct of its id, which is then sold and
	// applied to the Store. The default (a zero Retention) is 24h; a negative Retention never
	// trims, and then no pass retires a delisted item either (WithRetention(0) of versions
	// before the options structs did both).
	Retention time.Duration
	// Interval is the time between the passes of Run (stockops.Reconciler.Run, and Reserver.Run's
	// reconciler). The default is 5 minutes. A negative Interval turns Reserver.Run's passes off
	// (another process reconciles); stockops.Reconciler.Run refuses it.
	Interval time.Duration
}
