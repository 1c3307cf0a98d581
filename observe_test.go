package stock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/memstore"
)

func TestObserver(t *testing.T) {
	_, c := redistest.Miniredis(t)
	ctx := context.Background()
	var mu sync.Mutex
	seen := map[string]int{}
	var relayed int64
	obs := stock.ObserverFunc(func(_ context.Context, o stock.Observation) {
		mu.Lock()
		defer mu.Unlock()
		seen[o.Op+"/"+o.Outcome]++
		if o.Replayed {
			seen[o.Op+"/replayed"]++
		}
		if o.Op == "relay" {
			relayed += o.Units
		}
		assert.Positive(t, o.Duration+o.Lag+1)
	})
	r := newReserver(t, c, stock.WithObserver(obs))
	require.NoError(t, r.Load(ctx, "A", 2))
	for i := range 3 {
		_, _ = r.Deduct(ctx, stock.Request{SKU: "A", ID: fmt.Sprint("o", i), Qty: 1})
	}
	_, _ = r.Deduct(ctx, stock.Request{SKU: "A", ID: "o0", Qty: 1})
	_, _ = r.Deduct(ctx, stock.Request{SKU: "A", ID: "", Qty: 1})
	_, _ = r.Restore(ctx, "A", "o1")
	store := memstore.New()
	require.NoError(t, store.Load(ctx, "A", 2))
	rl, err := r.NewRelay(store, nil)
	require.NoError(t, err)
	drain(t, rl)
	rec, err := r.NewReconciler(store)
	require.NoError(t, err)
	_, err = rec.Once(ctx)
	require.NoError(t, err)
	assert.Equal(t, map[string]int{
		"deduct/ok": 3, "deduct/replayed": 1, "deduct/sold_out": 1, "deduct/invalid": 1,
		"restore/ok": 1, "relay/ok": 1, "reconcile/ok": 1,
	}, seen)
	assert.Equal(t, int64(3), relayed)
	assert.Equal(t, "error", stock.Outcome(errors.New("boom")))
	assert.Equal(t, "sold_out", stock.Outcome(fmt.Errorf("x: %w", stock.ErrSoldOut)))
}
