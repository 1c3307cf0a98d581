package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock/internal/lane"
	"github.com/stockres/stock/internal/redistest"

	"github.com/stockres/stock/internal/protocol"
)

// TestCoalescedBatchEqualsOneByOne: a batch in one script call gives the same outcome per
// request, and the same ledger, as the same requests sent one by one.
func TestCoalescedBatchEqualsOneByOne(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := context.Background()
		r, err := New(b.Client(t), WithUserLimit(4), WithCoalescing(0))
		require.NoError(t, err)
		rng := rand.New(rand.NewPCG(1, 2))
		var reqs []Request
		for range lane.MaxBatch {
			id := rng.IntN(40) // repeats, some with other parameters
			reqs = append(reqs, Request{ID: fmt.Sprint("o", id), User: fmt.Sprint("u", id%7), Qty: int64(1 + rng.IntN(3))})
		}
		require.NoError(t, r.Load(ctx, "one", 60))
		require.NoError(t, r.Load(ctx, "batch", 60))
		_, err = r.Restore(ctx, "one", "o3") // a tombstone on both sides
		require.ErrorIs(t, err, ErrUnknownID)
		_, err = r.Restore(ctx, "batch", "o3")
		require.ErrorIs(t, err, ErrUnknownID)

		var one []outcome
		for _, q := range reqs {
			q.SKU = "one"
			var o [1]outcome
			require.NoError(t, r.execDeducts(ctx, r.item("one"), []Request{q}, o[:]))
			one = append(one, o[0])
		}
		batch := make([]outcome, len(reqs))
		for i := range reqs {
			reqs[i].SKU = "batch"
		}
		require.NoError(t, r.execDeducts(ctx, r.item("batch"), reqs, batch))
		assert.Equal(t, one, batch)
		codes := map[int64]int{}
		for _, o := range batch {
			codes[o.code]++
		}
		for _, c := range []int64{protocol.OK, protocol.Replay, protocol.Conflict, protocol.Restored} {
			assert.Positive(t, codes[c], "the sequence exercises code %d: %v", c, codes)
		}

		la, err := r.Levels(ctx, "one")
		require.NoError(t, err)
		lb, err := r.Levels(ctx, "batch")
		require.NoError(t, err)
		assert.Equal(t, la, lb)
		ledger := func(sku string) map[string]string {
			m := map[string]string{}
			for e, err := range r.entries(ctx, sku) {
				require.NoError(t, err)
				e.SKU, e.At = "", time.Time{} // one call's TIME against many
				m[e.ID] = fmt.Sprintf("%+v", e)
			}
			return m
		}
		assert.Equal(t, ledger("one"), ledger("batch"))
		// The outbox holds the same events in the same order.
		outbox := func(sku string) string {
			ms, err := r.client.Do(ctx, r.client.B().Zrange().Key(r.item(sku).Outbox).Min("0").Max("-1").Build()).AsStrSlice()
			require.NoError(t, err)
			return strings.Join(ms, ",")
		}
		assert.Equal(t, outbox("one"), outbox("batch"))
		// The buyers' units, which the batch reads and writes once per call.
		users := func(sku string) map[string]string {
			m, err := r.client.Do(ctx, r.client.B().Hgetall().Key(r.item(sku).Users).Build()).AsStrMap()
			require.NoError(t, err)
			return m
		}
		assert.NotEmpty(t, users("batch"))
		assert.Equal(t, users("one"), users("batch"))
		assert.Positive(t, codes[protocol.UserLimit], "the sequence exercises the per-user limit: %v", codes)
	})
}

// TestLanesDroppedWhenIdle: once an item has no deduct in flight its coalescing lane is gone,
// so a Reserver's memory does not grow with the number of items it ever sold; every deduct
// still gets its own answer.
func TestLanesDroppedWhenIdle(t *testing.T) {
	_, c := redistest.Miniredis(t)
	r, err := New(c, WithCoalescing(1))
	require.NoError(t, err)
	ctx := context.Background()
	const items, workers = 200, 32
	for i := range items {
		require.NoError(t, r.Load(ctx, fmt.Sprint("sku-", i), 3))
	}
	errs := make(chan error, items*4)
	done := make(chan struct{})
	for w := range workers {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range items * 4 / workers {
				n := w*(items*4/workers) + i
				_, err := r.Deduct(ctx, Request{SKU: fmt.Sprint("sku-", n%items), ID: fmt.Sprint("o", n), Qty: 1})
				if err != nil && !strings.Contains(err.Error(), "sold out") {
					errs <- err
				}
			}
		}()
	}
	for range workers {
		<-done
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	assert.Zero(t, r.deducts.Live(), "lanes left for idle items")
	for i := range items {
		l, err := r.Levels(ctx, fmt.Sprint("sku-", i))
		require.NoError(t, err)
		assert.Equal(t, Levels{Sold: 3, Loaded: 3}, l, "sku-%d: 4 deducts over 3 units", i)
	}
}
