package memstore

import (
	"context"
	"maps"
	"slices"

	"github.com/stockres/stock"
)

var _ stock.ItemLister = (*Store)(nil)

// ListItems implements stock.ItemLister: up to limit SKUs greater than after, in order.
func (s *Store) ListItems(_ context.Context, after string, limit int) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, sku := range slices.Sorted(maps.Keys(s.remaining)) {
		if sku > after && len(out) < limit {
			out = append(out, sku)
		}
	}
	return out, nil
}
