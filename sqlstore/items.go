package sqlstore

import (
	"context"
	"fmt"

	"github.com/stockres/stock"
)

var _ stock.ItemLister = (*Store)(nil)

// ListItems implements stock.ItemLister: up to limit SKUs of the items table greater than
// after, in byte order, so that a Reconciler finds the items Redis lost from its registry.
func (s *Store) ListItems(ctx context.Context, after string, limit int) ([]string, error) {
	if limit <= 0 {
		return nil, invalid("list limit %d", limit)
	}
	q := s.d.rebind(`SELECT sku FROM ` + s.d.quote(s.prefix+"items") + ` WHERE sku > ? ORDER BY sku LIMIT ?`)
	rows, err := s.db.QueryContext(ctx, q, after, limit)
	if err != nil {
		return nil, fmt.Errorf("sqlstore: list items: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var sku []byte // VARBINARY on MySQL
		if err := rows.Scan(&sku); err != nil {
			return nil, fmt.Errorf("sqlstore: list items: %w", err)
		}
		out = append(out, string(sku))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlstore: list items: %w", err)
	}
	return out, nil
}
