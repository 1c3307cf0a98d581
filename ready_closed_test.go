package stock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"

	"github.com/stockres/stock"
)

// After Close, every method returns an error wrapping ErrReserverClosed (Reserver.Close's
// doc). Ready retried the refused commands as if Redis were unreachable, until its context
// ended, and then answered the context's error: with a context without a deadline it never
// returned, and its error never said that the Reserver was closed.
func TestReadyOfAClosedReserverAnswersReserverClosedAtOnce(t *testing.T) {
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
	if err := r.Ready(ctx); err != nil {
		t.Fatalf("Ready of an open Reserver: %v", err)
	}
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
	wait, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	err = r.Ready(wait)
	if took := time.Since(start); !errors.Is(err, stock.ErrReserverClosed) || took > time.Second {
		t.Fatalf("Ready of a closed Reserver = %v after %v, want ErrReserverClosed at once", err, took.Round(time.Millisecond))
	}
}
