package stock_test

import (
	"context"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"

	"github.com/stockres/stock"
)

// Close is idempotent: once a Close returned nil, there is nothing left to wait for, and a later
// Close answers nil even with a context that already ended. It answered ctx's error at random
// (the wait picked between the closed Reserver and the ended context), so a shutdown path that
// closes twice with an expired context, or a test's clean-up, reported a failure that was not.
func TestCloseOfAClosedReserverAnswersNilWhateverItsContext(t *testing.T) {
	mr := miniredis.RunT(t)
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{mr.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	r, err := stock.New(client)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := r.Load(ctx, "sku-1", 3); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(ctx); err != nil {
		t.Fatalf("first Close: %v", err)
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	for i := range 200 {
		if err := r.Close(ended); err != nil {
			t.Fatalf("Close %d of a closed Reserver with an ended context: %v, want nil", i+2, err)
		}
	}
}
