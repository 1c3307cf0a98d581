package bounded

import (
	"context"
	"errors"
	"testing"
	"time"
)

type ctxKey struct{}

// TestBoundEndsEveryCommandWithinTheTimeout: whatever the caller's context, the bounded one
// ends at the timeout at the latest (and not much sooner), keeps the caller's values and its
// cancellation, and never outlives an earlier deadline of the caller's.
func TestBoundEndsEveryCommandWithinTheTimeout(t *testing.T) {
	const d = 640 * time.Millisecond
	b := newDeadlines(d)
	withinTimeout := func(t *testing.T, ctx context.Context, start time.Time) {
		t.Helper()
		dl, ok := ctx.Deadline()
		if !ok {
			t.Fatal("no deadline")
		}
		if dl.After(time.Now().Add(d)) || dl.Before(start.Add(d-d/64)) {
			t.Fatalf("deadline %v after the start, want within (%v, %v]", dl.Sub(start), d-d/64, d)
		}
	}

	t.Run("never cancelled, shared", func(t *testing.T) {
		start := time.Now()
		c1, cancel1 := b.bound(context.Background())
		c2, cancel2 := b.bound(context.TODO())
		defer cancel1()
		defer cancel2()
		withinTimeout(t, c1, start)
		withinTimeout(t, c2, start)
		if c1.Done() == nil {
			t.Fatal("a bounded context that never ends")
		}
	})
	t.Run("values kept", func(t *testing.T) {
		start := time.Now()
		ctx, cancel := b.bound(context.WithValue(context.Background(), ctxKey{}, "v"))
		defer cancel()
		withinTimeout(t, ctx, start)
		if got := ctx.Value(ctxKey{}); got != "v" {
			t.Fatalf("value = %v, want v", got)
		}
		ctx, cancel = b.bound(context.WithoutCancel(context.WithValue(context.Background(), ctxKey{}, "w")))
		defer cancel()
		withinTimeout(t, ctx, start)
		if got := ctx.Value(ctxKey{}); got != "w" {
			t.Fatalf("value = %v, want w", got)
		}
	})
	t.Run("caller's cancel kept", func(t *testing.T) {
		start := time.Now()
		parent, stop := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "c"))
		ctx, cancel := b.bound(parent)
		defer cancel()
		withinTimeout(t, ctx, start)
		stop()
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
			t.Fatal("the caller's cancel did not reach the bounded context")
		}
		if !errors.Is(ctx.Err(), context.Canceled) || ctx.Value(ctxKey{}) != "c" {
			t.Fatalf("err %v, value %v", ctx.Err(), ctx.Value(ctxKey{}))
		}
	})
	t.Run("caller's earlier deadline kept", func(t *testing.T) {
		parent, stop := context.WithTimeout(context.Background(), d/2)
		defer stop()
		ctx, cancel := b.bound(parent)
		defer cancel()
		if ctx != parent {
			t.Fatal("a context of its own where the caller's deadline comes first")
		}
	})
	t.Run("a shared deadline ends", func(t *testing.T) {
		short := newDeadlines(5 * time.Millisecond)
		ctx, cancel := short.bound(context.Background())
		defer cancel()
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("the shared deadline never ended")
		}
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			t.Fatalf("err %v, want DeadlineExceeded", ctx.Err())
		}
	})
}
