package queuetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// Ev returns a deduct of one unit of sku with id and seq, at a fixed time.
func Ev(sku, id string, seq int64) stock.Event {
	return stock.Event{Type: stock.EventDeducted, SKU: sku, ID: id, Qty: 1, At: time.UnixMilli(1_700_000_000_000).UTC(), Seq: seq}
}

// Pipeline is a Reserver, a memstore and the operations Redis acknowledged on a few items of
// 100,000 units each: the queue path of the adapters' crash tests, whose consumers the adapter runs.
type Pipeline struct {
	R     *stock.Reserver
	Store *memstore.Store

	mu       sync.Mutex
	deducted map[string]map[string]int64
	restored map[string]map[string]bool
	initial  map[string]int64
	skus     []string // sorted
	n        int
	events   int // events the operations queued (deducts and restores)
}

// NewMiniredisPipeline is NewPipeline on a miniredis of the test's own.
func NewMiniredisPipeline(t *testing.T, skus []string) *Pipeline {
	t.Helper()
	m := miniredis.RunT(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{m.Addr()}, DisableCache: true})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return NewPipeline(t, c, skus)
}

// NewPipeline loads skus with 100,000 units each in Redis (through c) and in a memstore.
func NewPipeline(t *testing.T, c rueidis.Client, skus []string) *Pipeline {
	t.Helper()
	r, err := stock.New(c)
	require.NoError(t, err)
	ctx := context.Background()
	p := &Pipeline{R: r, Store: memstore.New(), deducted: map[string]map[string]int64{}, restored: map[string]map[string]bool{}, initial: map[string]int64{}}
	for _, sku := range skus {
		require.NoError(t, r.Load(ctx, sku, 100000))
		require.NoError(t, p.Store.Load(ctx, sku, 100000))
		p.initial[sku] = 100000
		p.deducted[sku] = map[string]int64{}
		p.restored[sku] = map[string]bool{}
	}
	p.skus = append([]string(nil), skus...)
	sort.Strings(p.skus)
	return p
}

// Events returns how many events the operations queued (deducts and restores).
func (p *Pipeline) Events() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.events
}

// Deduct deducts qty of sku under a new id that starts with prefix, and records the answer.
func (p *Pipeline) Deduct(t *testing.T, sku, prefix string, qty int64) string {
	t.Helper()
	p.mu.Lock()
	p.n++
	id := fmt.Sprintf("%s%d", prefix, p.n)
	p.mu.Unlock()
	if _, err := p.R.Deduct(context.Background(), stock.Request{SKU: sku, ID: id, Qty: qty}); err != nil {
		t.Fatalf("Deduct: %v", err)
	}
	p.mu.Lock()
	p.deducted[sku][id] = qty
	p.events++
	p.mu.Unlock()
	return id
}

// Traffic runs n deducts of 1 to 3 units (and a restore of every fourth) spread over the items.
func (p *Pipeline) Traffic(t *testing.T, n int, rng *rand.Rand) {
	t.Helper()
	for i := 0; i < n; i++ {
		sku := p.skus[rng.IntN(len(p.skus))]
		id := p.Deduct(t, sku, "o", int64(1+rng.IntN(3)))
		if i%4 == 3 {
			if _, err := p.R.Restore(context.Background(), sku, id); err != nil {
				t.Fatalf("Restore: %v", err)
			}
			p.mu.Lock()
			p.restored[sku][id] = true
			p.events++
			p.mu.Unlock()
		}
	}
}

// Drain runs rl until Redis has nothing pending for the items.
func (p *Pipeline) Drain(t *testing.T, rl *stockops.Relay) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < 100; i++ {
		if _, err := rl.Once(ctx); err != nil {
			t.Fatalf("relay: %v", err)
		}
		var left int64
		for _, sku := range p.skus {
			n, _, err := stockops.Pending(ctx, p.R, sku)
			require.NoError(t, err)
			left += n
		}
		if left == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the relay did not drain")
}

// RunRelay runs a relay of the pipeline's Reserver into pub (batches of 16, polled every
// 5 ms) until the returned stop is called; stop returns once the relay has ended.
func (p *Pipeline) RunRelay(t *testing.T, pub stock.Publisher) (stop func()) {
	t.Helper()
	rl, err := stockops.NewRelay(p.R, nil, pub, &stock.RelayOptions{Batch: 16, Poll: 5 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = rl.Run(ctx) }()
	return func() { cancel(); <-done }
}

// Settle applies a delivered message through stock.Consume and says whether to acknowledge it
// (true) or leave it to the broker to deliver again (false). what names the message in the
// errors: a message that does not decode (decodeErr) or an event Consume calls invalid fails
// the test, and is acknowledged.
func (p *Pipeline) Settle(t *testing.T, what string, ev stock.Event, decodeErr error) bool {
	if decodeErr != nil {
		t.Errorf("%s does not decode: %v", what, decodeErr)
		return true
	}
	switch err := stock.Consume(context.Background(), p.R, p.Store, ev); {
	case err == nil:
		return true
	case errors.Is(err, stock.ErrInvalid):
		t.Errorf("Consume %s/%s: %v", ev.SKU, ev.ID, err)
		return true
	default:
		return false
	}
}

// WaitApplied waits up to d until no item has an event pending or published and not applied,
// calling between (if not nil) after each look that found one.
func (p *Pipeline) WaitApplied(t *testing.T, d time.Duration, between func()) {
	t.Helper()
	ctx := context.Background()
	rec, err := stockops.NewReconciler(p.R, p.Store, &stock.ReconcileOptions{DryRun: true})
	require.NoError(t, err)
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
		busy := false
		for _, sku := range p.skus {
			rp, err := rec.Item(ctx, sku)
			require.NoError(t, err)
			if rp.Pending+rp.Published > 0 {
				busy = true
			}
		}
		if !busy {
			return
		}
		time.Sleep(50 * time.Millisecond)
		if between != nil {
			between()
		}
	}
}

// VerifyCrashed fails the test if the consumers that crashed held no message (held: how many
// they held), then verifies the pipeline.
func (p *Pipeline) VerifyCrashed(t *testing.T, held int64) {
	t.Helper()
	if held == 0 {
		t.Error("no consumer crashed holding messages: the scenario did not happen")
	}
	t.Logf("crashed consumers held %d messages", held)
	p.Verify(t)
}

// Verify compares the store with Redis and with the acknowledged answers, checks that the
// reconciler finds nothing pending, in flight, dead or drifting, and that no event changed the
// store twice.
func (p *Pipeline) Verify(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	rec, err := stockops.NewReconciler(p.R, p.Store, &stock.ReconcileOptions{DryRun: true})
	require.NoError(t, err)
	for _, sku := range p.skus {
		want := p.initial[sku]
		for id, q := range p.deducted[sku] {
			if !p.restored[sku][id] {
				want -= q
			}
		}
		lv, err := p.R.Levels(ctx, sku)
		require.NoError(t, err)
		rem, err := p.Store.Remaining(ctx, sku)
		require.NoError(t, err)
		if rem != want || lv.Available != want {
			t.Errorf("item %q: store %d, Redis %d, acknowledged answers %d", sku, rem, lv.Available, want)
		}
		rp, err := rec.Item(ctx, sku)
		require.NoError(t, err)
		if rp.Pending != 0 || rp.Published != 0 || rp.InFlight != 0 || rp.Drift != 0 || rp.DeadLetters != 0 {
			t.Errorf("item %q after the drain: %s", sku, rp)
		}
	}
	if m := p.Store.MaxApplications(); m > 1 {
		t.Errorf("an event changed the store %d times", m)
	}
}
