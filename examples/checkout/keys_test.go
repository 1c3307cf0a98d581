package main

// Tests of the Idempotency-Key records (Keys) and of Request.Retry, on server_test.go's envs:
// miniredis, and a private redis-server when STOCK_REDIS_SERVER is set.

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/stockres/stock"
)

// instance starts another process of the service on c: its own Reserver (per-user limit
// limit) and key records (key lifetime keyTTL), sharing the env's Redis and payment provider.
func (e *httpEnv) instance(t *testing.T, c rueidis.Client, limit int64, keyTTL time.Duration) *httptest.Server {
	t.Helper()
	r, err := stock.New(c, stock.WithPrefix("shop"), stock.WithUserLimit(limit))
	if err != nil {
		t.Fatal(err)
	}
	keys, err := NewKeys(c, "shop", keyTTL)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(NewHandler(r, keys, e.pay, e.ttl, slog.New(slog.NewTextHandler(e.logs, nil))))
	t.Cleanup(ts.Close)
	return ts
}

// The record of a key: where it is, what it holds, how long it lives; a key whose attempts
// were all refused is free again; once its lifetime is over, the key may name another purchase,
// which is a new order, charged anew: the first order's payment is never reused.
func TestKeysRecord(t *testing.T) {
	onBackends(t, envConfig{limit: 10, items: map[string]int64{"sku-a": 5, "sku-b": 5}}, func(t *testing.T, e *httpEnv) {
		ctx := context.Background()
		k := e.keys()
		if a, b := k.record("a:", "b"), k.record("a", ":b"); a == b {
			t.Errorf("record keys of (a:, b) and (a, :b) are both %q", a)
		}
		wantOK(t, "first", e.buy(t, "k1", "sku-a", "alice", 1), "sku-a", "alice", 1)
		rec := "shop|key:5:alice:k1"
		h, err := e.c.Do(ctx, e.c.B().Hgetall().Key(rec).Build()).AsStrMap()
		if err != nil || h["p"] != "1|sku-a" || h["n"] != "1" {
			t.Errorf("record %q = %v (%v), want p=1|sku-a n=1", rec, h, err)
		}
		ttl, err := e.c.Do(ctx, e.c.B().Pttl().Key(rec).Build()).AsInt64()
		if err != nil || ttl <= 0 || ttl > (24*time.Hour).Milliseconds() {
			t.Errorf("PTTL %q = %d (%v), want the key's lifetime, 24h", rec, ttl, err)
		}
		// A retry counts one more use (it may be in flight with the first).
		wantOK(t, "retry", e.buy(t, "k1", "sku-a", "alice", 1), "sku-a", "alice", 1)
		if n, _ := e.c.Do(ctx, e.c.B().Hget().Key(rec).Field("n").Build()).ToString(); n != "2" {
			t.Errorf("uses after a retry: %q, want 2", n)
		}

		// Refused for stock: the key is free again, for any purchase.
		wantError(t, "too many", e.buy(t, "k2", "sku-a", "bob", 9), 409, "insufficient")
		if n, err := e.c.Do(ctx, e.c.B().Exists().Key("shop|key:3:bob:k2").Build()).AsInt64(); err != nil || n != 0 {
			t.Errorf("the record of a refused key is still there (%d, %v)", n, err)
		}
		wantOK(t, "the refused key, another item", e.buy(t, "k2", "sku-b", "bob", 1), "sku-b", "bob", 1)

		// A key of lifetime 1s, used for sku-a; after its lifetime, for sku-b.
		short := e.instance(t, e.client(t, false), 2, time.Second).URL
		first := buyOn(t, short, "k3", "sku-a", "carol", 1)
		wantOK(t, "short-lived key, sku-a", first, "sku-a", "carol", 1)
		wantError(t, "short-lived key, sku-b at once", buyOn(t, short, "k3", "sku-b", "carol", 1), 422, "idempotency_key_reused")
		calls := e.pay.Calls()
		e.advance(1500 * time.Millisecond)
		second := buyOn(t, short, "k3", "sku-b", "carol", 1)
		wantOK(t, "short-lived key, sku-b after its lifetime", second, "sku-b", "carol", 1)
		if second.str("order") == first.str("order") || e.pay.Calls() != calls+1 || !e.pay.Charged(second.str("order")) {
			t.Errorf("orders %s and %s, %d charge calls after %d: the second item must be a new order, charged",
				first.str("order"), second.str("order"), e.pay.Calls(), calls)
		}
		if lv := e.levels("sku-b"); lv.Sold != 2 {
			t.Errorf("sku-b %+v, want 2 sold", lv)
		}
	})
}

// A retry after an unknown outcome is marked Request.Retry: its refusal is final. Alice's
// first attempt is cut off from Redis (its hold waits in a partition) and answered 503; on
// another instance, bob takes the last unit and alice's retry is refused (409 sold_out); then a
// unit comes back, and the partition heals, and alice's first hold reaches Redis at last. It
// must be refused: alice was told "sold out", nobody will pay for that hold, and it must not
// take the unit from the next buyer.
func TestRetryAfterUnknownOutcomeIsFinal(t *testing.T) {
	onBackends(t, envConfig{limit: 2, items: map[string]int64{"sku-a": 1}}, func(t *testing.T, e *httpEnv) {
		defer func(d time.Duration) { stepTimeout = d }(stepTimeout)
		stepTimeout = 500 * time.Millisecond
		ctx := context.Background()
		direct := e.client(t, true)
		// Instance 1 holds through the proxy (e.r), with its key records straight on Redis, so
		// that the partition cuts the hold and not the binding of the key before it.
		keys, err := NewKeys(direct, "shop", 24*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		one := httptest.NewServer(NewHandler(e.r, keys, e.pay, e.ttl, slog.New(slog.NewTextHandler(e.logs, nil))))
		defer one.Close()
		two := e.instance(t, direct, 2, 24*time.Hour).URL
		r, err := stock.New(direct, stock.WithPrefix("shop"))
		if err != nil {
			t.Fatal(err)
		}
		levels := func() stock.Levels {
			t.Helper()
			lv, err := r.Levels(ctx, "sku-a")
			if err != nil {
				t.Fatal(err)
			}
			return lv
		}

		e.proxy.Blackhole(time.Minute)
		wantError(t, "alice, partitioned", buyOn(t, one.URL, "k1", "sku-a", "alice", 1), 503, "unavailable")
		if lv := levels(); lv.Available != 1 || lv.Held != 0 {
			t.Fatalf("levels %+v: alice's hold reached Redis; the test did not partition it", lv)
		}
		wantOK(t, "bob", buyOn(t, two, "b1", "sku-a", "bob", 1), "sku-a", "bob", 1)
		wantError(t, "alice's retry", buyOn(t, two, "k1", "sku-a", "alice", 1), 409, "sold_out")
		if _, err := r.Restock(ctx, "sku-a", "restock-1", 1); err != nil {
			t.Fatal(err)
		}

		sent := e.proxy.Stats().Commands // alice's hold among them, held back
		e.proxy.Heal()                   // it reaches Redis now
		deadline := time.Now().Add(10 * time.Second)
		for s := e.proxy.Stats(); s.Replies < sent; s = e.proxy.Stats() {
			if time.Now().After(deadline) {
				t.Fatalf("proxy stats %+v: the %d commands held back did not all run", s, sent)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if lv := levels(); lv.Held != 0 || lv.Available != 1 || lv.Sold != 1 {
			t.Errorf("levels %+v: alice's late first hold took the unit after she was told sold out", lv)
		}
		order := orderID("alice", "k1", "sku-a", 1)
		if en, err := r.Ledger(ctx, "sku-a", order); err != nil || en.Taken() {
			t.Errorf("ledger of alice's order: %+v %v, want a refusal", en, err)
		}
		// The answer stays: alice's key is sold out; the unit is the next buyer's.
		wantError(t, "alice again", buyOn(t, two, "k1", "sku-a", "alice", 1), 409, "sold_out")
		wantOK(t, "carol", buyOn(t, two, "c1", "sku-a", "carol", 1), "sku-a", "carol", 1)
		if e.pay.Charged(order) {
			t.Errorf("alice was charged")
		}
	})
}
