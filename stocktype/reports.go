package stocktype

import (
	"fmt"
	"strings"
)

// RelayStats counts what one pass of a relay did.
type RelayStats struct {
	Claimed   int // events leased from the outboxes
	Delivered int // events applied and published, then removed from the outbox
	Refused   int // deducts the Store refused and that were given back in Redis
	Retried   int // events that failed and were put back with a backoff
	// Orphaned counts events whose ledger entry was gone or unreadable, so that the event
	// could not be built: moved to the dead-letter set (and counted in DeadLettered too), where
	// the reconciler counts them and leaves the item's drift for an operator.
	Orphaned int
	Redelive int // events claimed more than once (a relay died, or a retry)
	// DeadLettered counts events moved to the item's dead-letter set "<prefix>:{sku}:dl" for
	// an operator: the Store rejected them with stock.ErrInvalid (they can never be applied), or
	// they are orphaned.
	DeadLettered int
	// NotLoaded counts events the Store answered stock.ErrNotLoaded for (it does not know their
	// item: loaded in Redis and not in the database of record), and the item's events after
	// them: they stay in the outbox, retried with backoff until the item is loaded in the
	// store, and are never given back (counted in Retried too). The Reserver's logger says so
	// at Error level, once per item per minute.
	NotLoaded int
}

// Add adds o to s.
func (s *RelayStats) Add(o RelayStats) {
	s.Claimed += o.Claimed
	s.Delivered += o.Delivered
	s.Refused += o.Refused
	s.Retried += o.Retried
	s.Orphaned += o.Orphaned
	s.Redelive += o.Redelive
	s.DeadLettered += o.DeadLettered
	s.NotLoaded += o.NotLoaded
}

// Report is what one pass found and did for one item.
type Report struct {
	SKU string
	// Busy is set when a relay held the item for the whole pass, or consumers kept changing the
	// store's records of its events while the pass read them: nothing was compared.
	Busy bool
	// Missing is set when the item's hash was not in Redis (eviction, restart without
	// persistence, a deleted key).
	Missing bool
	// Available and Held are Redis's counters (before any repair).
	Available, Held int64
	// StoreRemaining is the Store's remaining stock.
	StoreRemaining int64
	// Pending counts the events waiting in the outbox. Published counts the events a relay
	// without a Store handed to its Publisher that no consumer has applied yet through stock.Consume
	// (the queue path). InFlight is the net effect, not yet in the Store, of the events Redis
	// has not seen applied (pending, published and dead letters): units deducted in Redis and
	// not in the Store, minus restores and restocks.
	Pending   int
	Published int
	InFlight  int64
	// Orphaned counts undelivered events (pending, published or dead letters) whose ledger
	// entry is gone, such as after an evicted ledger key: the units they took are counted in
	// Redis and nowhere else, so the pass repairs nothing on the item and asks for a human.
	Orphaned int
	// DeadLetters counts events set aside in "<prefix>:{sku}:dl" for an operator: the Store
	// rejected them as invalid, or the relay could not build them (their ledger entry gone).
	// They count as in flight.
	DeadLetters int
	// Drift is Available + Held − (StoreRemaining − InFlight): positive when Redis would sell
	// more than the Store has.
	Drift int64
	// Repairs made (all zero in a dry run).
	Rebuilt    bool  // the item hash was recreated from the Store
	Adjusted   int64 // units added to (or, negative, taken from) Redis's available stock
	Requeued   int   // lost outbox events queued again
	Rerecorded int   // ledger entries the Store has and Redis lost, written back
	Resynced   int   // sales Redis held that the Store had given back (given back in Redis too), and live holds the Store had confirmed (made final) or confirmed and given back (released)
	Settled    int   // published events the Store has applied that Redis still counted as published (it lost a consumer's acknowledgement): settled
	Trimmed    int   // settled ledger entries removed after the retention
	// Retired is set when the item was delisted and its keys are removed (by this pass or an
	// earlier one): it is not compared any more.
	Retired bool
	// Unregistered is set when the item was missing from Redis's registry of items (see
	// stock.ErrRegistryLost); a repairing pass registered it again.
	Unregistered bool
	// NeedsHuman says why something was left for an operator ("" if nothing). For an item the
	// Store does not know it says so; Available, Held, Pending, DeadLetters and InFlight are then
	// Redis's figures (every undelivered event in flight), StoreRemaining and Drift are 0, and
	// nothing is repaired.
	NeedsHuman string
}

// String is one readable line.
func (rp Report) String() string {
	if rp.Busy {
		return fmt.Sprintf("%s: busy (a relay held it), not compared", rp.SKU)
	}
	if rp.Retired && rp.Trimmed == 0 {
		return fmt.Sprintf("%s: retired", rp.SKU)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: redis %d+%d held, store %d, in flight %d (%d pending", rp.SKU, rp.Available, rp.Held, rp.StoreRemaining, rp.InFlight, rp.Pending)
	if rp.Published > 0 {
		fmt.Fprintf(&b, ", %d published", rp.Published)
	}
	if rp.DeadLetters > 0 {
		fmt.Fprintf(&b, ", %d dead letters", rp.DeadLetters)
	}
	fmt.Fprintf(&b, "), drift %d", rp.Drift)
	if rp.Missing {
		b.WriteString(", key missing")
	}
	if rp.Unregistered {
		b.WriteString(", NOT IN THE REGISTRY (Redis lost it)")
	}
	var fixes []string
	if rp.Rebuilt {
		fixes = append(fixes, "rebuilt")
	}
	if rp.Adjusted != 0 {
		fixes = append(fixes, fmt.Sprintf("adjusted %+d", rp.Adjusted))
	}
	if rp.Requeued > 0 {
		fixes = append(fixes, fmt.Sprintf("requeued %d", rp.Requeued))
	}
	if rp.Rerecorded > 0 {
		fixes = append(fixes, fmt.Sprintf("rerecorded %d", rp.Rerecorded))
	}
	if rp.Resynced > 0 {
		fixes = append(fixes, fmt.Sprintf("resynced %d", rp.Resynced))
	}
	if rp.Settled > 0 {
		fixes = append(fixes, fmt.Sprintf("settled %d published", rp.Settled))
	}
	if rp.Trimmed > 0 {
		fixes = append(fixes, fmt.Sprintf("trimmed %d", rp.Trimmed))
	}
	if rp.Retired {
		fixes = append(fixes, "retired")
	}
	if len(fixes) > 0 {
		b.WriteString("; repaired: " + strings.Join(fixes, ", "))
	}
	if rp.NeedsHuman != "" {
		b.WriteString("; NEEDS A HUMAN: " + rp.NeedsHuman)
	}
	return b.String()
}

// PassResult is what one reconcile pass over every item found and did.
type PassResult struct {
	// Reports has one report per item reconciled: the registry's items, then the Store's items
	// the registry had lost.
	Reports []Report
	// Errors[i] is the error of Reports[i], or nil.
	Errors []error
	// Unregistered lists the items the Store has and Redis's registry did not (see
	// stock.ErrRegistryLost), registered again unless the pass was a dry run.
	Unregistered []string
	// StoreOnly lists the items the Store has and Redis never had as far as anything shows:
	// no registry entry, no keys, and no record in the Store of an event that came through
	// Redis (an item the Store was loaded with ahead of its sale, or one lost before its first
	// sale). The pass leaves them alone; stock.Reserver.Load puts them on sale.
	StoreOnly []string
	// Complete is set when the pass compared every item without an error and found none busy.
	Complete bool
	// EpochRecorded is set when a complete repairing pass recorded the Redis primaries as
	// reconciled ("<prefix>:epoch"), which lifts the fence of every FailoverGuard on this
	// Redis, in any process, at its next check. EpochErr says why a complete repairing pass
	// did not (the primaries changed during the pass, or INFO failed).
	EpochRecorded bool
	EpochErr      error
	// NeedsHuman says what the pass found of Redis as a whole that an operator must look at
	// ("" if nothing): a maxmemory-policy that can evict keys (the Reserver's writes are then
	// refused with stock.ErrEvictionPolicy, unless stock.WithEvictionAllowed), and keys Redis
	// evicted (INFO stats evicted_keys grew since the Reserver's last pass, or is above zero at
	// its first): ledger entries (idempotency records) and per-user counts may be lost, so a
	// repeated request id may have sold again and a buyer may have passed the limit. The pass
	// logs it as an error too.
	NeedsHuman string
}
