package engine

import (
	"context"
	"fmt"
	"iter"
	"time"

	"github.com/redis/rueidis"
	"github.com/stockres/stock/internal/protocol"
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

// retainedFrom is when the retention of a settled entry starts: the latest of when it ran, its
// deadline (a hold settles at the latest then) and when it was given back.
func retainedFrom(e Entry) time.Time {
	t := e.At
	for _, u := range [...]time.Time{e.Deadline, e.GivenBack} {
		if u.After(t) {
			t = u
		}
	}
	return t
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
		e.GivenBack = time.UnixMilli(w.Deadline)
	}
	return e, nil
}

// Ledger is stock.Reserver.Ledger.
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
