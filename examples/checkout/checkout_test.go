package main

// Tests of the checkout service's happy path, its answers to closed items and a closed
// Reserver, its error messages and its shutdown, on server_test.go's harness (httpEnv).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
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

// Every malformed request is refused with a JSON error whose message says what is wrong in the
// API's words (no Go internals), and takes nothing; a JSON Content-Type with parameters, a
// +json type or none at all is accepted.
func TestRequestErrors(t *testing.T) {
	e := newHTTPEnv(t, false, envConfig{limit: 2, items: map[string]int64{"shoe": 5}})
	const js = "application/json"
	cases := []struct {
		name, method, target, ctype, key, body string
		status                                 int
		code, says                             string
	}{
		{"trailing data", "POST", "/checkout", js, "k1", shoe + " trailing", 400, "invalid", "after the JSON object"},
		{"trailing data, big", "POST", "/checkout", js, "k1", shoe + strings.Repeat(" ", 70<<10) + "x", 413, "too_large", "larger than"},
		{"second object", "POST", "/checkout", js, "k1", shoe + shoe, 400, "invalid", "after the JSON object"},
		{"too large", "POST", "/checkout", js, "k1", `{"sku":"shoe","qty":1,"user":"` + strings.Repeat("a", 70<<10) + `"}`, 413, "too_large", "larger than 65536 bytes"},
		{"form body", "POST", "/checkout", "application/x-www-form-urlencoded", "k1", shoe, 415, "unsupported_media_type", "application/json"},
		{"text body", "POST", "/checkout", "text/plain", "k1", shoe, 415, "unsupported_media_type", "application/json"},
		{"bad media type", "POST", "/checkout", "json;;", "k1", shoe, 415, "unsupported_media_type", "application/json"},
		{"huge qty", "POST", "/checkout", js, "k1", `{"sku":"shoe","qty":1e20,"user":"alice"}`, 400, "invalid", "qty must be a whole number"},
		{"fractional qty", "POST", "/checkout", js, "k1", `{"sku":"shoe","qty":1.5,"user":"alice"}`, 400, "invalid", "qty must be a whole number"},
		{"qty as text", "POST", "/checkout", js, "k1", `{"sku":"shoe","qty":"1","user":"alice"}`, 400, "invalid", "qty must be a whole number"},
		{"missing qty", "POST", "/checkout", js, "k1", `{"sku":"shoe","user":"alice"}`, 400, "invalid", "qty is required"},
		{"zero qty", "POST", "/checkout", js, "k1", `{"sku":"shoe","qty":0,"user":"alice"}`, 400, "invalid", "qty must be a whole number from 1"},
		{"missing sku", "POST", "/checkout", js, "k1", `{"qty":1,"user":"alice"}`, 400, "invalid", "sku is required"},
		{"sku as number", "POST", "/checkout", js, "k1", `{"sku":7,"qty":1,"user":"alice"}`, 400, "invalid", "sku must be a string"},
		{"sku with a space", "POST", "/checkout", js, "k1", `{"sku":"sh oe","qty":1,"user":"alice"}`, 400, "invalid", "sku may not contain"},
		{"missing user", "POST", "/checkout", js, "k1", `{"sku":"shoe","qty":1}`, 400, "invalid", "user is required"},
		{"unknown field", "POST", "/checkout", js, "k1", `{"sku":"shoe","qty":1,"user":"alice","coupon":1}`, 400, "invalid", `unknown field "coupon"`},
		{"array", "POST", "/checkout", js, "k1", `[1]`, 400, "invalid", "JSON object"},
		{"not JSON", "POST", "/checkout", js, "k1", `sku=shoe`, 400, "invalid", "not valid JSON"},
		{"empty body", "POST", "/checkout", js, "k1", ``, 400, "invalid", "the body is empty"},
		{"cut short", "POST", "/checkout", js, "k1", `{"sku":"shoe"`, 400, "invalid", "ends before"},
		{"no key", "POST", "/checkout", js, "", shoe, 400, "missing_idempotency_key", "Idempotency-Key header is required"},
		{"key too long", "POST", "/checkout", js, strings.Repeat("k", 129), shoe, 400, "invalid", "Idempotency-Key is longer"},
		{"key with a space", "POST", "/checkout", js, "order 1", shoe, 400, "invalid", "Idempotency-Key may hold only"},
		{"key not ASCII", "POST", "/checkout", js, "order-é", shoe, 400, "invalid", "Idempotency-Key may hold only"},
		{"GET /checkout", "GET", "/checkout", "", "", "", 405, "method_not_allowed", "use POST"},
		{"DELETE /stock", "DELETE", "/stock/shoe", "", "", "", 405, "method_not_allowed", "use GET"},
		{"unknown path", "GET", "/nothing", "", "", "", 404, "not_found", "no such endpoint"},
		{"bad sku in path", "GET", "/stock/a%7Bb", "", "", "", 400, "invalid", "sku may not contain"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rp := e.do(t, httpReq{method: c.method, path: c.target, ctype: c.ctype, key: c.key, body: c.body})
			wantError(t, c.name, rp, c.status, c.code)
			if msg := rp.str("message"); !strings.Contains(msg, c.says) {
				t.Errorf("message %q does not say %q", msg, c.says)
			}
			for _, internal := range []string{"Go ", "struct", "int64", "json:", "stock:", "checkoutRequest", " id "} {
				if strings.Contains(rp.str("message"), internal) {
					t.Errorf("message %q shows %q", rp.str("message"), internal)
				}
			}
			if c.status == 405 && rp.header.Get("Allow") == "" {
				t.Error("405 without Allow")
			}
		})
	}
	if lv := e.levels("shoe"); lv.Available != 5 || e.pay.Calls() != 0 {
		t.Fatalf("refused requests took stock or charged: %+v, %d charges", lv, e.pay.Calls())
	}
	for _, c := range []struct{ ctype, key, user string }{
		{"application/json; charset=utf-8", "k2", "alice"}, {"application/vnd.api+json", "k3", "bob"}, {"", "k2", "alice"}, // a replay of k2
	} {
		body := `{"sku":"shoe","qty":1,"user":"` + c.user + `"}`
		wantOK(t, "Content-Type "+c.ctype, e.do(t, httpReq{ctype: c.ctype, key: c.key, body: body}), "shoe", c.user, 1)
	}
	if lv := e.levels("shoe"); lv.Available != 3 || lv.Sold != 2 {
		t.Fatalf("levels %+v, want 2 sold", lv)
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
