package stock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/memstore"
)

// batchRecorder is a BatchPublisher that records every call and every event it accepted, in
// order, and fails the events for which fail says so.
type batchRecorder struct {
	mu      sync.Mutex
	batches [][]stock.Event // the events of each PublishBatch call
	singles []stock.Event   // the events of each Publish call
	got     []stock.Event   // every event accepted, in order
	fail    func(ev stock.Event) bool
}

func (p *batchRecorder) one(ev stock.Event) error {
	if p.fail != nil && p.fail(ev) {
		return errors.New("broker refused " + ev.ID)
	}
	p.got = append(p.got, ev)
	return nil
}

func (p *batchRecorder) Publish(_ context.Context, ev stock.Event) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.singles = append(p.singles, ev)
	return p.one(ev)
}

// PublishBatch stops at the first failure, as the BatchPublisher doc asks.
func (p *batchRecorder) PublishBatch(_ context.Context, evs []stock.Event) []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.batches = append(p.batches, append([]stock.Event(nil), evs...))
	errs := make([]error, len(evs))
	for i, ev := range evs {
		if errs[i] = p.one(ev); errs[i] != nil {
			for j := i + 1; j < len(evs); j++ {
				errs[j] = errors.New("not sent after an earlier failure")
			}
			break
		}
	}
	return errs
}

var _ stock.BatchPublisher = (*batchRecorder)(nil)

// deductEach deducts one unit of sku for each of the ids o0 … o<n-1>, in order.
func deductEach(t *testing.T, r *stock.Reserver, sku string, n int) {
	t.Helper()
	for i := range n {
		must(t)(r.Deduct(context.Background(), stock.Request{SKU: sku, ID: fmt.Sprint("o", i), Qty: 1}))
	}
}

// TestRelayUsesBatchPublisher: the relay hands an item's claimed events to PublishBatch in one
// call, in sequence, and Publish is not called.
func TestRelayUsesBatchPublisher(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		require.NoError(t, r.Load(ctx, "A", 100))
		pub := &batchRecorder{}
		rl := newRelay(t, r, nil, pub, &stock.RelayOptions{Batch: 16})
		deductEach(t, r, "A", 40)
		st := drain(t, rl)
		assert.Equal(t, 40, st.Delivered)
		assert.Empty(t, pub.singles, "Publish is not used for batches of several events")
		require.Len(t, pub.batches, 3, "40 events in batches of 16")
		assert.Len(t, pub.batches[0], 16)
		require.Len(t, pub.got, 40)
		for i, ev := range pub.got {
			assert.Equal(t, fmt.Sprint("o", i), ev.ID)
			if i > 0 {
				assert.Greater(t, ev.Seq, pub.got[i-1].Seq)
			}
		}
		// A single event goes through Publish.
		must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "last", Qty: 1}))
		drain(t, rl)
		require.Len(t, pub.singles, 1)
		assert.Equal(t, "last", pub.singles[0].ID)
	})
}

// TestRelayBatchFailureRetriesFromIt: an event of a batch fails once; the events before it
// are published once and not again, it is retried after the backoff, and the item's events
// reach the publisher in order. With a store, the store applied each event once.
func TestRelayBatchFailureRetriesFromIt(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		store := memstore.New()
		require.NoError(t, r.Load(ctx, "A", 100))
		require.NoError(t, store.Load(ctx, "A", 100))
		failed := false
		pub := &batchRecorder{fail: func(ev stock.Event) bool {
			if ev.ID == "o3" && !failed {
				failed = true
				return true
			}
			return false
		}}
		rl := newRelay(t, r, store, pub, &stock.RelayOptions{MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond})
		deductEach(t, r, "A", 6)
		st, err := rl.Once(ctx)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "broker refused o3")
		assert.Equal(t, 3, st.Delivered)
		assert.Equal(t, 3, st.Retried)
		assert.Equal(t, int64(3), outboxLen(t, c, "A"), "o3, o4, o5 wait")
		redistest.Sleep(c, 10*time.Millisecond)
		drain(t, rl)
		require.Len(t, pub.batches, 2)
		ids := func(evs []stock.Event) []string {
			var out []string
			for _, ev := range evs {
				out = append(out, ev.ID)
			}
			return out
		}
		assert.Equal(t, []string{"o0", "o1", "o2", "o3", "o4", "o5"}, ids(pub.batches[0]))
		assert.Equal(t, []string{"o3", "o4", "o5"}, ids(pub.batches[1]), "the retry starts at the failed event")
		assert.Equal(t, []string{"o0", "o1", "o2", "o3", "o4", "o5"}, ids(pub.got), "each event accepted once, in order")
		assert.Equal(t, 1, store.MaxApplications())
		rem, _ := store.Remaining(ctx, "A")
		assert.Equal(t, int64(94), rem)
		assert.Zero(t, outboxLen(t, c, "A"))
	})
}

// TestRelayBatchPublisherWrongLength: a result of the wrong length fails the whole batch,
// which is delivered again.
func TestRelayBatchPublisherWrongLength(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		require.NoError(t, r.Load(ctx, "A", 10))
		short := true
		bad := &shortBatch{batchRecorder: &batchRecorder{}, short: &short}
		rl := newRelay(t, r, nil, bad, &stock.RelayOptions{MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond})
		deductEach(t, r, "A", 3)
		_, err := rl.Once(ctx)
		require.ErrorContains(t, err, "2 results for 3 events")
		assert.Equal(t, int64(3), outboxLen(t, c, "A"))
		short = false
		redistest.Sleep(c, 10*time.Millisecond)
		st := drain(t, rl)
		assert.Equal(t, 3, st.Delivered)
	})
}

type shortBatch struct {
	*batchRecorder
	short *bool
}

func (s *shortBatch) PublishBatch(ctx context.Context, evs []stock.Event) []error {
	errs := s.batchRecorder.PublishBatch(ctx, evs)
	if *s.short {
		return errs[:len(errs)-1]
	}
	return errs
}
