package stock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/memstore"
)

func TestObserver(t *testing.T) {
	_, c := redistest.Miniredis(t)
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
	rl := newRelay(t, r, store, nil, nil)
	drain(t, rl)
	rec := newReconciler(t, r, store, nil)
	require.NoError(t, errOf(rec.Once(ctx)))
	assert.Equal(t, map[string]int{
		"deduct/ok": 3, "deduct/replayed": 1, "deduct/sold_out": 1, "deduct/invalid": 1,
		"restore/ok": 1, "relay/ok": 1, "reconcile/ok": 1,
	}, seen)
	assert.Equal(t, int64(3), relayed)
	assert.Equal(t, "error", stock.Outcome(errors.New("boom")))
	assert.Equal(t, "sold_out", stock.Outcome(fmt.Errorf("x: %w", stock.ErrSoldOut)))
}

// startRecorder is a StartObserver that checks the contract: every Start is followed by one
// Observe of the same op, on the context Start returned.
type startRecorder struct {
	mu       sync.Mutex
	started  map[int]string // token -> op, until observed
	next     int
	observed []string
	bad      []string
}

type tokenKey struct{}

func (s *startRecorder) Start(ctx context.Context, op, sku string) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	s.started[s.next] = op
	return context.WithValue(ctx, tokenKey{}, s.next)
}

func (s *startRecorder) Observe(ctx context.Context, o stock.Observation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tok, _ := ctx.Value(tokenKey{}).(int)
	if op, ok := s.started[tok]; !ok || op != o.Op {
		s.bad = append(s.bad, fmt.Sprintf("%s/%s observed on a context Start did not return for it (token %d, %q)", o.Op, o.Outcome, tok, op))
	}
	delete(s.started, tok)
	s.observed = append(s.observed, o.Op+"/"+o.Outcome)
}

// TestStartObserver: a StartObserver is told when each operation starts, the operation runs on
// the context it returns, and Observe gets that context once, on success, refusal, invalid
// input and failure alike.
func TestStartObserver(t *testing.T) {
	_, c := redistest.Miniredis(t)
	rec := &startRecorder{started: map[int]string{}}
	r := newReserver(t, c, stock.WithObserver(rec), stock.WithOutbox(true))
	require.NoError(t, r.Load(ctx, "A", 2))
	require.NoError(t, r.Load(ctx, "B", 2))
	_, _ = r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1})
	_, _ = r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1})   // replay
	_, _ = r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", Qty: 5})   // insufficient
	_, _ = r.Deduct(ctx, stock.Request{SKU: "A b", ID: "o3", Qty: 1}) // invalid
	_, _ = r.Hold(ctx, stock.Request{SKU: "B", ID: "h1", Qty: 1}, 0)  // invalid ttl
	_, _ = r.Hold(ctx, stock.Request{SKU: "B", ID: "h1", Qty: 1}, time.Minute)
	_, _ = r.Extend(ctx, "B", "h1", time.Minute)
	_, _ = r.Confirm(ctx, "B", "h1")
	_, _ = r.Cancel(ctx, "B", "nobody")
	_, _ = r.Restore(ctx, "A", "o1")
	_, _ = r.Restock(ctx, "A", "r1", 1)
	_, _ = r.DeductMany(ctx, stock.Cart{ID: "c1", Lines: []stock.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 1}}})
	_, _ = r.DeductMany(ctx, stock.Cart{ID: "c2", Lines: []stock.Line{{SKU: "A", Qty: 9}}}) // refused
	_, _ = r.HoldMany(ctx, stock.Cart{ID: "c3", Lines: []stock.Line{{SKU: "B", Qty: 1}}}, -time.Second)
	store := memstore.New()
	require.NoError(t, store.Load(ctx, "A", 2))
	require.NoError(t, store.Load(ctx, "B", 2))
	relay := newRelay(t, r, store, nil, nil)
	require.NoError(t, errOf(relay.Once(ctx)))
	rc := newReconciler(t, r, store, &stock.ReconcileOptions{DryRun: true})
	require.NoError(t, errOf(rc.Once(ctx)))
	dead, cancel := context.WithCancel(ctx)
	cancel() // every call now fails before its outcome is known
	_, _ = r.Deduct(dead, stock.Request{SKU: "A", ID: "o9", Qty: 1})
	_, _ = r.Confirm(dead, "B", "h9")

	rec.mu.Lock()
	defer rec.mu.Unlock()
	assert.Empty(t, rec.bad)
	assert.Empty(t, rec.started, "every Start was observed")
	for _, want := range []string{"deduct/ok", "deduct/insufficient", "deduct/invalid", "hold/invalid", "hold/ok",
		"extend/ok", "confirm/ok", "cancel/unknown_id", "restore/ok", "restock/ok", "deduct_many/ok",
		"deduct_many/insufficient", "hold_many/invalid", "relay/ok", "reconcile/ok", "deduct/canceled", "confirm/canceled"} {
		assert.Contains(t, rec.observed, want)
	}
}
