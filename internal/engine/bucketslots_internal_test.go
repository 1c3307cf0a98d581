package engine

import (
	"context"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock/internal/protocol"
	"github.com/stockres/stock/internal/redistest"
)

// TestBucketKeysSpreadOverSlots: bucket i of an item of n buckets keeps every key in the i-th of
// n equal slot ranges, as Redis itself computes the slot (CLUSTER KEYSLOT), so that on a cluster
// of n masters owning equal ranges each bucket has a master of its own; the keys a Load and a
// deduct write are those keys; the bucket's name is unchanged.
func TestBucketKeysSpreadOverSlots(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		if b.Name != "cluster" {
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := b.Client(t)
			for _, n := range []int{2, 3, 5} {
				r := bucketedReserver(t, c, n, WithPrefix("spread"+strconv.Itoa(n)))
				sku := "hot-" + strconv.Itoa(n)
				require.NoError(t, r.Load(ctx, sku, 100))
				for i := range 20 {
					_, err := r.Deduct(ctx, Request{SKU: sku, ID: "o" + strconv.Itoa(i), User: "u" + strconv.Itoa(i), Qty: 1})
					require.NoError(t, err)
				}
				masters := map[int]bool{}
				for i := range n {
					k := r.item(bucketName(sku, i))
					lo, hi := protocol.BucketSlots(i, n)
					for _, key := range k.All() {
						slot, err := c.Do(ctx, c.B().ClusterKeyslot().Key(key).Build()).AsInt64()
						require.NoError(t, err)
						assert.Equal(t, protocol.Slot(key), int(slot), "%s: Redis agrees", key)
						assert.True(t, int(slot) >= lo && int(slot) < hi, "bucket %d of %d: %s in slot %d, not in [%d, %d)", i, n, key, slot, lo, hi)
					}
					on, err := c.Do(ctx, c.B().Exists().Key(k.Item).Build()).AsInt64()
					require.NoError(t, err)
					assert.EqualValues(t, 1, on, "bucket %d's hash is under its spread keys", i)
					if n == 3 {
						masters[protocol.Slot(k.Item)*3/protocol.Slots] = true
					}
				}
				if n == 3 {
					assert.Len(t, masters, 3, "3 buckets on the 3 masters")
				}
				l := bucketLevels(t, r, sku)
				assert.EqualValues(t, 80, l.Available)
				assert.EqualValues(t, 20, l.Sold)
			}
		})
	}
}
