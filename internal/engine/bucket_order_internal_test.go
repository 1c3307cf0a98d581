package engine

import (
	"context"
	"strconv"
	"sync"
	"testing"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock/internal/protocol"
)

// shortStore is a Store of one item that refuses a sale it is short for (memstore cannot be
// imported here).
type shortStore struct {
	mu      sync.Mutex
	rem     int64
	refused int
}

func (s *shortStore) Apply(_ context.Context, ev Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch ev.Type {
	case EventDeducted, EventConfirmed:
		if s.rem < ev.Qty {
			s.refused++
			return ErrRefused
		}
		s.rem -= ev.Qty
	case EventRestocked, EventRestored, EventRefused:
		s.rem += ev.Qty
	}
	return nil
}

func (s *shortStore) Remaining(context.Context, string) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rem, nil
}

func (s *shortStore) Records(context.Context, string, []string) (map[string]Record, error) {
	return map[string]Record{}, nil
}

// sellInBucket0 sells n units of sku of 3 buckets, one a deduct, to a buyer of bucket 0.
func sellInBucket0(t *testing.T, r *Reserver, sku string, n int) {
	t.Helper()
	buyer := idHomeIn("u", 0, 3)
	for i := range n {
		_, err := r.Deduct(context.Background(), Request{SKU: sku, ID: "o" + strconv.Itoa(i), User: buyer, Qty: 1})
		require.NoError(t, err, "sale %d", i)
	}
}

// relayUntilIdle runs rl's passes until one claims nothing (at most 10).
func relayUntilIdle(t *testing.T, rl *Relay) {
	t.Helper()
	for range 10 {
		st, err := rl.Once(context.Background())
		require.NoError(t, err)
		if st.Claimed == 0 {
			return
		}
	}
}

// TestBucketOrderCutTransferRecovered: a transfer cut after xout.lua (its process died) and
// completed by recoverTransfers sets the same barrier in the target as a whole one: the
// target's sales of the donor's restocked units reach the store after the restock.
func TestBucketOrderCutTransferRecovered(t *testing.T) {
	eachClient(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := bucketedReserver(t, c, 3)
		require.NoError(t, r.Load(ctx, "oc", 3)) // one unit in each bucket
		rs := idHomeIn("rs", 1, 3)
		_, err := r.Restock(ctx, "oc", rs, 5)
		require.NoError(t, err)
		o, err := decodeXOut(protocol.XOut.Exec(ctx, r.client, r.item(bucketName("oc", 1)).ForXOut(), []string{"tc", "0", "6", "1"}))
		require.NoError(t, err)
		require.Equal(t, protocol.OK, o.code)
		require.Equal(t, int64(6), o.remaining)
		require.Positive(t, o.seq, "the donor's restock is recorded with the transfer")

		n, err := r.recoverTransfers(ctx, "oc", 1, 3, 0)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		bars, err := r.client.Do(ctx, r.client.B().Zrange().Key(r.item(bucketName("oc", 0)).Barriers).Min("0").Max("-1").Build()).AsStrSlice()
		require.NoError(t, err)
		assert.Equal(t, []string{"1|" + strconv.FormatInt(o.seq, 10) + "|tc"}, bars)

		sellInBucket0(t, r, "oc", 7)
		store := &shortStore{rem: 3}
		rl, err := r.newRelay(store, nil, nil)
		require.NoError(t, err)
		relayUntilIdle(t, rl)
		assert.Zero(t, store.refused, "no acknowledged sale refused")
		rem, _ := store.Remaining(ctx, "oc")
		assert.Equal(t, int64(1), rem)
		l := bucketLevels(t, r, "oc")
		assert.Equal(t, Levels{Available: 1, Sold: 7, Loaded: 8}, l)
	})
}

// TestBucketOrderChain: units restocked in bucket 2 move to bucket 1, which writes no event of
// its own, and on to bucket 0, where they are sold: bucket 0's sales wait for bucket 2's
// restock through bucket 1's barrier.
func TestBucketOrderChain(t *testing.T) {
	eachClient(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := bucketedReserver(t, c, 3)
		require.NoError(t, r.Load(ctx, "ch", 3))
		rs := idHomeIn("rs", 2, 3)
		_, err := r.Restock(ctx, "ch", rs, 5)
		require.NoError(t, err)
		k, err := r.transfer(ctx, "ch", "t21", 2, 1, 6, 6)
		require.NoError(t, err)
		require.Equal(t, int64(6), k)
		k, err = r.transfer(ctx, "ch", "t10", 1, 0, 7, 7)
		require.NoError(t, err)
		require.Equal(t, int64(7), k)
		sellInBucket0(t, r, "ch", 8)
		store := &shortStore{rem: 3}
		rl, err := r.newRelay(store, nil, &RelayOptions{Items: []string{"ch"}})
		require.NoError(t, err)
		st, err := rl.Once(ctx) // bucket 0 first: its sales wait
		require.NoError(t, err)
		assert.Zero(t, store.refused)
		assert.Equal(t, 1, st.Claimed, "only bucket 2's restock goes in the first pass")
		relayUntilIdle(t, rl)
		assert.Zero(t, store.refused, "no acknowledged sale refused")
		rem, _ := store.Remaining(ctx, "ch")
		assert.Zero(t, rem)
		assert.Equal(t, Levels{Sold: 8, Loaded: 8}, bucketLevels(t, r, "ch"))
		for i := range 3 {
			n, err := r.client.Do(ctx, r.client.B().Zcard().Key(r.item(bucketName("ch", i)).Barriers).Build()).AsInt64()
			require.NoError(t, err)
			assert.Zero(t, n, "bucket %d: every barrier met is removed", i)
		}
	})
}
