package engine

import (
	"context"
	"strconv"
	"testing"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// idHomeIn returns an id of the form prefix+N whose home bucket (of n) is b.
func idHomeIn(prefix string, b, n int) string {
	for i := 0; ; i++ {
		id := prefix + strconv.Itoa(i)
		if homeBucket(id, n) == b {
			return id
		}
	}
}

// TestBucketedRestockKeepsItemUnderMaxQty: an item split over buckets holds at most MaxQty units
// in all, as a plain item does. Load splits up to MaxQty over the buckets; a restock that would
// take the sum of the buckets' loaded counts (what Levels reports) past MaxQty is refused with
// ErrInvalid, whichever bucket its id goes to, and writes nothing: no ledger entry, no event,
// no counter changed. A restock that brings the item to MaxQty exactly is accepted, and its
// repeat is a replay even once the item is full.
func TestBucketedRestockKeepsItemUnderMaxQty(t *testing.T) {
	eachBucketClient(t, func(t *testing.T, c rueidis.Client) {
		const n = 3
		ctx := context.Background()
		r := bucketedReserver(t, c, n)

		// Load near and at MaxQty: the buckets' shares sum to what was loaded.
		require.NoError(t, r.Load(ctx, "full", MaxQty))
		assert.Equal(t, Levels{Available: MaxQty, Loaded: MaxQty}, bucketLevels(t, r, "full"))
		assert.ErrorIs(t, r.Load(ctx, "over", MaxQty+1), ErrInvalid)
		require.NoError(t, r.Load(ctx, "near", MaxQty-10))
		near := Levels{Available: MaxQty - 10, Loaded: MaxQty - 10}
		assert.Equal(t, near, bucketLevels(t, r, "near"))
		pending, _, err := r.pendingCounts(ctx, "near")
		require.NoError(t, err)

		// Each bucket has room for 11 more of its own; the item has room for 10.
		for b := range n {
			id := idHomeIn("po-", b, n)
			_, err := r.Restock(ctx, "near", id, 11)
			require.ErrorIs(t, err, ErrInvalid, "a restock of 11 in bucket %d passes MaxQty in all", b)
			assert.ErrorContains(t, err, "MaxQty")
			_, err = r.Ledger(ctx, "near", id)
			assert.ErrorIs(t, err, ErrUnknownID, "the refused restock %s left no entry", id)
			_, err = r.Restock(ctx, "full", id, 1)
			assert.ErrorIs(t, err, ErrInvalid, "a full item takes no unit more, in bucket %d", b)
		}
		assert.Equal(t, near, bucketLevels(t, r, "near"), "the refusals changed no counter")
		p, _, err := r.pendingCounts(ctx, "near")
		require.NoError(t, err)
		assert.Equal(t, pending, p, "the refusals queued no event")
		assert.Equal(t, Levels{Available: MaxQty, Loaded: MaxQty}, bucketLevels(t, r, "full"))

		// Up to MaxQty exactly, in two buckets; then nothing more, and a repeat is a replay.
		first, second := idHomeIn("ok-", 0, n), idHomeIn("ok-", 2, n)
		_, err = r.Restock(ctx, "near", first, 4)
		require.NoError(t, err)
		_, err = r.Restock(ctx, "near", second, 6)
		require.NoError(t, err)
		assert.Equal(t, Levels{Available: MaxQty, Loaded: MaxQty}, bucketLevels(t, r, "near"))
		for b := range n {
			_, err = r.Restock(ctx, "near", idHomeIn("more-", b, n), 1)
			assert.ErrorIs(t, err, ErrInvalid, "bucket %d", b)
		}
		rc, err := r.Restock(ctx, "near", first, 4)
		require.NoError(t, err)
		assert.True(t, rc.Replayed, "a repeat of an accepted restock is a replay at MaxQty too")
		assert.Equal(t, Levels{Available: MaxQty, Loaded: MaxQty}, bucketLevels(t, r, "near"))
	})
}
