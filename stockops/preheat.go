package stockops

import (
	"context"
	"errors"
	"fmt"

	"github.com/stockres/stock"
)

// A StoreLoader is a Store that can create an item: memstore.Store and sqlstore.Store are.
// Load creates sku with qty remaining and returns an error wrapping stock.ErrLoaded, changing
// nothing, when the store has the item already.
type StoreLoader interface {
	stock.Store
	Load(ctx context.Context, sku string, qty int64) error
}

// Preheat puts an item on sale in the database of record and in Redis, in that order: it
// creates the item in store with qty units (a store that has the item keeps its row: the
// database of record's stock wins), then loads Redis with the store's remaining stock. It
// returns that stock. The item is then known on both sides before the first sale, so the
// relay can deliver every sale (an item the store does not know holds its sales back in
// Redis; see stock.Store).
//
// Like Reserver.Load, a Preheat run again does not clobber a live sale: when Redis has the item
// already it returns the store's stock and an error wrapping stock.ErrLoaded, and changes
// nothing in Redis (add stock to a live item with Reserver.Restock). Run it before the sale,
// not while Redis takes sales of the item in another process: the store's remaining stock
// does not yet count sales still in the outbox. An invalid name, or qty out of range [0,
// stock.MaxQty], is an error wrapping stock.ErrInvalid, and nothing changes.
func Preheat(ctx context.Context, r *stock.Reserver, store StoreLoader, sku string, qty int64) (int64, error) {
	if r == nil {
		return 0, errNilReserver
	}
	if store == nil {
		return 0, fmt.Errorf("stockops: preheat %s: no store: %w", sku, stock.ErrInvalid)
	}
	if qty < 0 || qty > stock.MaxQty {
		return 0, fmt.Errorf("stockops: preheat %s: quantity %d out of range [0, %d]: %w", sku, qty, stock.MaxQty, stock.ErrInvalid)
	}
	if _, err := r.Levels(ctx, sku); errors.Is(err, stock.ErrInvalid) || errors.Is(err, stock.ErrReserverClosed) {
		return 0, err // a name Redis refuses, or a closed Reserver: nothing written to the store either
	}
	if err := store.Load(ctx, sku, qty); err != nil && !errors.Is(err, stock.ErrLoaded) {
		return 0, fmt.Errorf("stockops: preheat %s: store: %w", sku, err)
	}
	n, err := store.Remaining(ctx, sku)
	if err != nil {
		return 0, fmt.Errorf("stockops: preheat %s: store: %w", sku, err)
	}
	if err := r.Load(ctx, sku, n); err != nil {
		return n, fmt.Errorf("stockops: preheat %s: %w", sku, err)
	}
	return n, nil
}
