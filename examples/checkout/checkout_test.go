package main

// Tests of the checkout service's happy path, its answers to closed items and a closed
// Reserver, and its shutdown, on server_test.go's harness (httpEnv).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/stockres/stock"
	"github.com/stockres/stock/memstore"
)

const shoe = `{"sku":"shoe","qty":1,"user":"alice"}`

// A checkout holds, charges and confirms: the answer is the order (its id derived from the
// user, the key, the item and the quantity), one unit is sold, the payment charged once, and
// the ledger holds a confirmed hold waiting for the relay. GET /stock answers the levels.
func TestCheckout(t *testing.T) {
	e := newHTTPEnv(t, false, envConfig{limit: 2, items: map[string]int64{"shoe": 5}})
	rp := e.do(t, httpReq{key: "order-1", body: shoe})
	var ob orderBody
	if err := json.Unmarshal([]byte(rp.raw), &ob); err != nil || rp.status != http.StatusOK {
		t.Fatalf("%s: %v", rp, err)
	}
	order := orderID("alice", "order-1", "shoe", 1)
	if want := (orderBody{Order: order, SKU: "shoe", User: "alice", Qty: 1, Status: "confirmed", Remaining: 4}); ob != want {
		t.Fatalf("body %+v, want %+v", ob, want)
	}
	if ct := rp.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	if lv := e.levels("shoe"); lv.Available != 4 || lv.Sold != 1 || !e.pay.Charged(order) || e.pay.Calls() != 1 {
		t.Fatalf("levels %+v, charged %v, %d calls", lv, e.pay.Charged(order), e.pay.Calls())
	}
	if en, err := e.r.Ledger(context.Background(), "shoe", order); err != nil || en.Kind != stock.KindHold || en.State != stock.StateReserved {
		t.Fatalf("ledger %+v %v: want a confirmed hold waiting for the relay", en, err)
	}
	g := e.do(t, httpReq{method: "GET", path: "/stock/shoe"})
	var lb levelsBody
	if err := json.Unmarshal([]byte(g.raw), &lb); err != nil || g.status != http.StatusOK {
		t.Fatalf("%s: %v", g, err)
	}
	if want := (levelsBody{SKU: "shoe", Available: 4, Sold: 1, Loaded: 5}); lb != want {
		t.Fatalf("%+v, want %+v", lb, want)
	}
}

// A user at the limit is refused (403); a closed item is refused (409 closed) and takes nothing.
func TestUserLimitAndClosedItem(t *testing.T) {
	e := newHTTPEnv(t, false, envConfig{limit: 2, items: map[string]int64{"shoe": 5}})
	wantOK(t, "two units", e.buy(t, "order-1", "shoe", "alice", 2), "shoe", "alice", 2)
	wantError(t, "past the limit", e.buy(t, "order-2", "shoe", "alice", 1), http.StatusForbidden, "user_limit")
	if err := e.r.CloseItem(context.Background(), "shoe"); err != nil {
		t.Fatal(err)
	}
	wantError(t, "closed item", e.buy(t, "order-4", "shoe", "bob", 1), http.StatusConflict, "closed")
	if lv := e.levels("shoe"); lv.Available != 3 || lv.Sold != 2 || lv.Held != 0 {
		t.Fatalf("levels %+v", lv)
	}
}

// The errors that say the stock service cannot take the order now (a failover fence, a write
// its replicas have not acknowledged, a closed Reserver, a Redis that may evict keys) are a 503
// with Retry-After, as an unknown outcome is: the client retries the same key.
func TestServiceNotTakingOrdersIs503(t *testing.T) {
	for _, err := range []error{stock.ErrFailover, stock.ErrNotReplicated, stock.ErrReserverClosed, stock.ErrEvictionPolicy} {
		if ae := stockError(fmt.Errorf("wrapped: %w", err), stock.Receipt{}); ae.status != http.StatusServiceUnavailable || ae.code != "unavailable" || !ae.retryAfter {
			t.Errorf("%v: %d %s (Retry-After %v), want 503 unavailable with Retry-After", err, ae.status, ae.code, ae.retryAfter)
		}
	}

	// Over HTTP: a checkout on a closed Reserver (a service shutting down) takes nothing.
	e := newHTTPEnv(t, false, envConfig{limit: 2, items: map[string]int64{"shoe": 5}})
	if err := e.r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	rp := e.do(t, httpReq{key: "order-1", body: shoe})
	wantError(t, "closed Reserver", rp, http.StatusServiceUnavailable, "unavailable")
	if rp.header.Get("Retry-After") == "" {
		t.Error("no Retry-After")
	}
	if e.pay.Calls() != 0 {
		t.Errorf("%d payments charged", e.pay.Calls())
	}
}

// The service as main runs it: it takes traffic once started, and its shutdown (ctx ended, as
// by SIGINT) delivers the sales to the database of record and closes the Reserver, which then
// writes nothing (ErrReserverClosed) before serve returns.
func TestServeShutdownClosesTheReserver(t *testing.T) {
	type started struct {
		addr string
		r    *stock.Reserver
		db   *memstore.Store
	}
	up := make(chan started, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := config{addr: "127.0.0.1:0", prefix: "checkout", holdTTL: time.Minute, keyTTL: time.Hour,
		userLimit: 2, load: "shoe=5", shutdownTimeout: 5 * time.Second,
		started: func(addr string, r *stock.Reserver, db *memstore.Store) { up <- started{addr, r, db} }}
	served := make(chan error, 1)
	go func() { served <- serve(ctx, cfg, slog.New(slog.DiscardHandler)) }()
	var s started
	select {
	case s = <-up:
	case err := <-served:
		t.Fatalf("serve returned before it took traffic: %v", err)
	}
	if rp := doOn(t, "http://"+s.addr, httpReq{key: "order-1", body: shoe}); rp.status != http.StatusOK {
		t.Fatalf("checkout: %s", rp)
	}

	cancel()
	if err := <-served; err != nil {
		t.Fatalf("serve: %v", err)
	}
	if _, err := s.r.Deduct(context.Background(), stock.Request{SKU: "shoe", ID: "after", User: "bob", Qty: 1}); !errors.Is(err, stock.ErrReserverClosed) {
		t.Errorf("a deduct after the shutdown: %v, want ErrReserverClosed (the Reserver was not closed)", err)
	}
	if left, err := s.db.Remaining(context.Background(), "shoe"); err != nil || left != 4 {
		t.Errorf("the database of record has %d left (%v), want 4: the sale was not delivered before the end", left, err)
	}
}
