package natspub_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/natspub"
	"github.com/stockres/stock/stockops"
)

// Broken promise under test (issue 13 case 2, with the package doc's consumer
// wiring on real JetStream): one unit sold and given back over and over; a
// consumer takes a batch, acks part of it and dies; a reconcile pass while it
// is dead adjusts nothing; its successor gets the rest redelivered after the
// AckWait, out of order: the store refuses nothing and ends equal to Redis.
func TestAttack13JetStreamConsumerDiesMidBatch(t *testing.T) {
	url := os.Getenv("STOCK_TEST_NATS")
	if url == "" {
		t.Skip("STOCK_TEST_NATS not set")
	}
	ctx := context.Background()
	nc, err := nats.Connect(url, nats.Timeout(3*time.Second))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	sfx := fmt.Sprint(time.Now().UnixNano())
	stream, prefix := "A13_"+sfx, "a13."+sfx
	if _, err := natspub.EnsureStream(ctx, js, stream, prefix); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	pub, err := natspub.New(js, natspub.WithStream(stream), natspub.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	_, c := redistest.Miniredis(t)
	r, err := stock.New(c, stock.WithCoalescing(0))
	if err != nil {
		t.Fatal(err)
	}
	st := memstore.New()
	const sku = "one.unit*sku"
	if err := r.Load(ctx, sku, 1); err != nil {
		t.Fatal(err)
	}
	if err := st.Load(ctx, sku, 1); err != nil {
		t.Fatal(err)
	}
	const n = 15
	for i := 0; i < n; i++ {
		id := fmt.Sprint("o", i)
		if _, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: 1}); err != nil {
			t.Fatal(err)
		}
		if i < n-1 {
			if _, err := r.Restore(ctx, sku, id); err != nil {
				t.Fatal(err)
			}
		}
	}
	rl, err := stockops.NewRelay(r, nil, pub, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rl.Once(ctx); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable: "store", AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: prefix + ".>",
		AckWait: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	handle := func(m jetstream.Msg) (refusedOrBad bool) {
		ev, err := natspub.Decode(m.Data())
		if err != nil {
			_ = m.Term()
			return true
		}
		switch err := stock.Consume(ctx, r, st, ev); {
		case err == nil:
			_ = m.Ack()
		case errors.Is(err, stock.ErrInvalid):
			_ = m.Term()
			t.Errorf("terminated %+v: %v", ev, err)
		default:
			_ = m.NakWithDelay(200 * time.Millisecond)
		}
		return false
	}
	// consumer 1: takes 10, handles (acks) the 2nd and 4th only, dies.
	batch, err := cons.Fetch(10, jetstream.FetchMaxWait(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	k := 0
	for m := range batch.Messages() {
		k++
		if k == 2 || k == 4 {
			handle(m)
		}
	}
	// consumer down: reconcile
	rc, _ := stockops.NewReconciler(r, st, nil)
	res, err := rc.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, rp := range res.Reports {
		if rp.Adjusted != 0 || rp.Drift != 0 || rp.Resynced != 0 {
			t.Errorf("pass with the consumer dead: %s", rp)
		}
	}
	// consumer 2
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		p, _, err := stockops.Pending(ctx, r, sku)
		if err != nil {
			t.Fatal(err)
		}
		res, _ := rc.Pass(ctx)
		done := p == 0 && len(res.Reports) == 1 && res.Reports[0].Published == 0
		if done {
			break
		}
		if _, err := rl.Once(ctx); err != nil {
			t.Fatal(err)
		}
		batch, err := cons.Fetch(5, jetstream.FetchMaxWait(500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			handle(m)
		}
	}
	rem, _ := st.Remaining(ctx, sku)
	lv, _ := r.Levels(ctx, sku)
	if rem != 0 || lv.Available != 0 {
		t.Errorf("store remaining %d, redis available %d, want 0 and 0", rem, lv.Available)
	}
	recs, err := st.List(ctx, sku, "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		if rec.Status == stock.StateRefused {
			t.Errorf("store refused a valid sale: %+v", rec)
		}
	}
	e, _ := r.Ledger(ctx, sku, fmt.Sprint("o", n-1))
	if e.State != stock.StateApplied {
		t.Errorf("the last sale is %s, want applied", e.State)
	}
	if st.MaxApplications() > 1 {
		t.Error("double application")
	}
}
