package stocktest_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stockres/stock"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
	"github.com/stockres/stock/stocktest"
)

// TestAdvanceMovesHoldDeadlines: a hold expires after Advance past its ttl, not before.
func TestAdvanceMovesHoldDeadlines(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t)
	if err := e.Reserver.Load(ctx, "sku", 5); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Reserver.Hold(ctx, stock.Request{SKU: "sku", ID: "h1", Qty: 2}, time.Minute); err != nil {
		t.Fatal(err)
	}
	e.Advance(59 * time.Second)
	if _, err := e.Reserver.Hold(ctx, stock.Request{SKU: "sku", ID: "h1", Qty: 2}, time.Minute); err != nil {
		t.Fatalf("replay before the deadline: %v", err)
	}
	e.Advance(2 * time.Second)
	_, err := e.Reserver.Hold(ctx, stock.Request{SKU: "sku", ID: "h1", Qty: 2}, time.Minute)
	if !errors.Is(err, stock.ErrExpired) {
		t.Fatalf("replay after the deadline: %v, want ErrExpired", err)
	}
	if n, err := available(e.Reserver.Levels(ctx, "sku")); err != nil || n != 5 {
		t.Fatalf("Available = %d, %v; want 5", n, err)
	}
}

// TestAdvanceMovesTTLs: a key's TTL runs down with Advance, and the key expires.
func TestAdvanceMovesTTLs(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t)
	if err := e.Client.Do(ctx, e.Client.B().Set().Key("lease").Value("x").Px(10*time.Second).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	e.Advance(4 * time.Second)
	ttl, err := e.Client.Do(ctx, e.Client.B().Pttl().Key("lease").Build()).AsInt64()
	if err != nil || ttl != 6000 {
		t.Fatalf("PTTL after 4s = %d, %v; want 6000", ttl, err)
	}
	// TIME follows the same clock.
	tm, err := e.Client.Do(ctx, e.Client.B().Time().Build()).AsStrSlice()
	if err != nil || len(tm) != 2 {
		t.Fatalf("TIME: %v %v", tm, err)
	}
	if want := e.Now().Unix(); tm[0] != itoa(want) {
		t.Fatalf("TIME = %s, want %d", tm[0], want)
	}
	e.Advance(6 * time.Second)
	if n, err := e.Client.Do(ctx, e.Client.B().Exists().Key("lease").Build()).AsInt64(); err != nil || n != 0 {
		t.Fatalf("EXISTS after the TTL = %d, %v; want 0", n, err)
	}
}

// TestClockStandsStill: without Advance the Redis clock does not move.
func TestClockStandsStill(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t)
	if err := e.Client.Do(ctx, e.Client.B().Set().Key("k").Value("x").Px(time.Second).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	ttl, err := e.Client.Do(ctx, e.Client.B().Pttl().Key("k").Build()).AsInt64()
	if err != nil || ttl != 1000 {
		t.Fatalf("PTTL = %d, %v; want 1000", ttl, err)
	}
}

func itoa(n int64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

// TestAdvanceMovesRelayBackoff: an item whose event failed waits for its backoff, which only
// Advance makes pass.
func TestAdvanceMovesRelayBackoff(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t)
	st := memstore.New()
	if err := st.Load(ctx, "sku", 5); err != nil {
		t.Fatal(err)
	}
	if err := e.Reserver.Load(ctx, "sku", 5); err != nil {
		t.Fatal(err)
	}
	rl, err := stockops.NewRelay(e.Reserver, st, nil, &stock.RelayOptions{MinBackoff: 10 * time.Second, MaxBackoff: 10 * time.Second, Items: []string{"sku"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Reserver.Deduct(ctx, stock.Request{SKU: "sku", ID: "o1", Qty: 2}); err != nil {
		t.Fatal(err)
	}
	st.FailWith(func(stock.Event) error { return errors.New("database down") })
	if s, err := rl.Once(ctx); s.Retried != 1 { // Once also reports the store's error
		t.Fatalf("first pass: %+v (%v); want 1 retried", s, err)
	}
	st.FailWith(nil)
	time.Sleep(20 * time.Millisecond) // wall-clock time does not end the backoff
	if s, err := rl.Once(ctx); err != nil || s.Delivered != 0 {
		t.Fatalf("pass during the backoff: %+v, %v; want nothing delivered", s, err)
	}
	e.Advance(16 * time.Second) // the backoff, plus up to half of it as jitter
	if s, err := rl.Once(ctx); err != nil || s.Delivered != 1 {
		t.Fatalf("pass after the backoff: %+v, %v; want 1 delivered", s, err)
	}
	if n, err := st.Remaining(ctx, "sku"); err != nil || n != 3 {
		t.Fatalf("store remaining = %d, %v; want 3", n, err)
	}
}

// available returns the available units of a Levels call.
func available(l stock.Levels, err error) (int64, error) { return l.Available, err }

// TestEnvPassesTheMemoryPolicyCheckQuietly: the Env's miniredis answers the Reserver's memory
// policy check as a Redis set to noeviction, so a test's first write logs no warning that the
// policy could not be read.
func TestEnvPassesTheMemoryPolicyCheckQuietly(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	env := stocktest.New(t, stock.WithLogger(logger))
	if err := env.Reserver.Load(context.Background(), "quiet", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Reserver.Deduct(context.Background(), stock.Request{SKU: "quiet", ID: "o1", Qty: 1}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "maxmemory-policy") {
		t.Errorf("the first write logged about the memory policy:\n%s", buf.String())
	}
}
