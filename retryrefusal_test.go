package stock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
)

// A retry's refusal is the final answer for its id, of the kind the retry was told: a repeat
// after a restock answers ErrInsufficient (or ErrSoldOut) again, with the Remaining of then,
// never the other kind and never a take. On a plain item, a split one, and with the sold-out
// fast path answering for the item.
func TestRetryRefusalKeepsItsKind(t *testing.T) {
	configs := []struct {
		name string
		opts []stock.Option
	}{
		{"plain", nil},
		{"split", []stock.Option{stock.WithBuckets(func(string) int { return 3 })}},
		{"fastpath", []stock.Option{stock.WithSoldOutCache(time.Minute)}},
	}
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		for _, cf := range configs {
			t.Run(cf.name, func(t *testing.T) {
				ctx := context.Background()
				r := newReserver(t, c, append([]stock.Option{stock.WithPrefix("rr-" + cf.name)}, cf.opts...)...)
				repeat := func(sku, id string, qty int64, want error, remaining int64) {
					t.Helper()
					for _, retry := range []bool{true, false, true} {
						rc := mustFail(t, want, "%s/%s retry=%v", sku, id, retry)(
							r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: qty, Retry: retry}))
						require.Equal(t, remaining, rc.Remaining, "%s/%s: the stock of the recorded refusal", sku, id)
					}
				}

				// Insufficient, then a restock that would serve it.
				require.NoError(t, r.Load(ctx, "A", 3))
				repeat("A", "big", 5, stock.ErrInsufficient, 3)
				must(t)(r.Restock(ctx, "A", "more", 10))
				repeat("A", "big", 5, stock.ErrInsufficient, 3)
				require.Equal(t, int64(13), levels(t, r, "A").Available, "the repeats took nothing")

				// Sold out, then a restock.
				require.NoError(t, r.Load(ctx, "B", 1))
				must(t)(r.Deduct(ctx, stock.Request{SKU: "B", ID: "b1", Qty: 1}))
				repeat("B", "late", 1, stock.ErrSoldOut, 0)
				must(t)(r.Restock(ctx, "B", "more", 5))
				repeat("B", "late", 1, stock.ErrSoldOut, 0)
				require.Equal(t, int64(5), levels(t, r, "B").Available)

				// Recorded as insufficient while the item's sold-out filter was live, repeated
				// once the item is sold out again: the filter must send the id to Redis.
				require.NoError(t, r.Load(ctx, "C", 1))
				for i := range 3 {
					_, err := r.Deduct(ctx, stock.Request{SKU: "C", ID: fmt.Sprintf("c%d", i), Qty: 1})
					if i == 0 {
						require.NoError(t, err)
					} else {
						require.ErrorIs(t, err, stock.ErrSoldOut) // starts and fills the filter
					}
				}
				must(t)(r.Restock(ctx, "C", "more", 2))
				repeat("C", "big", 5, stock.ErrInsufficient, 2)
				for _, id := range []string{"d1", "d2"} {
					must(t)(r.Deduct(ctx, stock.Request{SKU: "C", ID: id, Qty: 1}))
				}
				for i := range 3 {
					mustFail(t, stock.ErrSoldOut)(r.Deduct(ctx, stock.Request{SKU: "C", ID: fmt.Sprintf("e%d", i), Qty: 1}))
				}
				repeat("C", "big", 5, stock.ErrInsufficient, 2)
			})
		}
	})
}
