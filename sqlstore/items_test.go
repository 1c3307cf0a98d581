package sqlstore_test

import (
	"context"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestListItems: ListItems pages through the items in byte order (as Go compares strings),
// which the reconciler relies on to find the items Redis lost from its registry.
func TestListItems(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		skus := []string{"b", "B", "a", "é", "a-1", "Z", "aa"}
		for _, sku := range skus {
			require.NoError(t, e.s.Load(ctx, sku, 1))
		}
		want := slices.Clone(skus)
		slices.Sort(want)
		var got []string
		after := ""
		for range 10 {
			page, err := e.s.ListItems(ctx, after, 3)
			require.NoError(t, err)
			got = append(got, page...)
			if len(page) < 3 {
				break
			}
			after = page[len(page)-1]
		}
		assert.Equal(t, want, got)
		_, err := e.s.ListItems(ctx, "", 0)
		assert.Error(t, err)
	})
}
