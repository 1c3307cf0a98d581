package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/stockres/stock"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stocktest"
)

type env struct {
	t    *testing.T
	kit  *stocktest.Env
	r    *stock.Reserver
	keys *Keys
	pay  *FakePayments
	h    http.Handler
}

// testKeys returns the key records of a test on c.
func testKeys(t *testing.T, c rueidis.Client) *Keys {
	t.Helper()
	k, err := NewKeys(c, "checkout-test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// newEnv loads items on a fresh miniredis (clock standing still: kit.Advance moves it)
// and returns the checkout handler on it.
func newEnv(t *testing.T, holdTTL time.Duration, items map[string]int64) *env {
	t.Helper()
	kit := stocktest.New(t, stock.WithUserLimit(2))
	r := kit.Reserver
	for sku, n := range items {
		if err := r.Load(context.Background(), sku, n); err != nil {
			t.Fatal(err)
		}
	}
	pay := NewFakePayments()
	keys := testKeys(t, kit.Client)
	return &env{t: t, kit: kit, r: r, keys: keys, pay: pay, h: NewHandler(r, keys, pay, holdTTL, slog.New(slog.DiscardHandler))}
}

type reply struct {
	status int
	header http.Header
	body   string
}

func (e *env) post(key, body string) reply {
	e.t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/checkout", strings.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return e.do(req)
}

func (e *env) do(req *http.Request) reply {
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, req)
	return reply{w.Code, w.Header(), w.Body.String()}
}

func (e *env) levels(sku string) stock.Levels {
	e.t.Helper()
	lv, err := e.r.Levels(context.Background(), sku)
	if err != nil {
		e.t.Fatal(err)
	}
	return lv
}

func (e *env) want(rp reply, status int, code string) {
	e.t.Helper()
	if rp.status != status {
		e.t.Fatalf("status %d, want %d: %s", rp.status, status, rp.body)
	}
	if ct := rp.header.Get("Content-Type"); ct != "application/json" {
		e.t.Errorf("Content-Type %q", ct)
	}
	if code == "" {
		return
	}
	var eb errorBody
	if err := json.Unmarshal([]byte(rp.body), &eb); err != nil || eb.Error != code || eb.Message == "" {
		e.t.Fatalf("body %s: want error %q with a message (%v)", rp.body, code, err)
	}
}

func (e *env) wantLevels(sku string, available, held, sold int64) {
	e.t.Helper()
	if lv := e.levels(sku); lv.Available != available || lv.Held != held || lv.Sold != sold {
		e.t.Fatalf("%s: %+v, want available %d held %d sold %d", sku, lv, available, held, sold)
	}
}

const shoe = `{"sku":"shoe","qty":1,"user":"alice"}`

func TestCheckout(t *testing.T) {
	e := newEnv(t, time.Minute, map[string]int64{"shoe": 5})
	rp := e.post("order-1", shoe)
	e.want(rp, http.StatusOK, "")
	var ob orderBody
	if err := json.Unmarshal([]byte(rp.body), &ob); err != nil {
		t.Fatal(err)
	}
	if want := (orderBody{Order: orderID("alice", "order-1", "shoe", 1), SKU: "shoe", User: "alice", Qty: 1, Status: "confirmed", Remaining: 4}); ob != want {
		t.Fatalf("body %+v, want %+v", ob, want)
	}
	e.wantLevels("shoe", 4, 0, 1)
	if !e.pay.Charged(orderID("alice", "order-1", "shoe", 1)) || e.pay.Calls() != 1 {
		t.Fatalf("charged %v, %d calls", e.pay.Charged(orderID("alice", "order-1", "shoe", 1)), e.pay.Calls())
	}
	if en, err := e.r.Ledger(context.Background(), "shoe", orderID("alice", "order-1", "shoe", 1)); err != nil || en.Kind != stock.KindHold || en.State != stock.StateReserved {
		t.Fatalf("ledger %+v %v: want a confirmed hold waiting for the relay", en, err)
	}
}

func TestRetrySameKey(t *testing.T) {
	e := newEnv(t, time.Minute, map[string]int64{"shoe": 5})
	first := e.post("order-1", shoe)
	e.want(first, http.StatusOK, "")
	e.post("order-2", `{"sku":"shoe","qty":1,"user":"bob"}`) // stock moves in between
	for range 3 {
		again := e.post("order-1", shoe)
		if again.status != first.status || again.body != first.body {
			t.Fatalf("retry: %d %s, want %d %s", again.status, again.body, first.status, first.body)
		}
	}
	e.wantLevels("shoe", 3, 0, 2) // order-1 took one unit, once
	if e.pay.Calls() != 2 {
		t.Fatalf("%d charges, want 2 (one per order)", e.pay.Calls())
	}
}

func TestSameKeyDifferentBody(t *testing.T) {
	e := newEnv(t, time.Minute, map[string]int64{"shoe": 5, "hat": 5})
	e.want(e.post("order-1", shoe), http.StatusOK, "")
	for _, body := range []string{
		`{"sku":"shoe","qty":2,"user":"alice"}`, // other quantity: the ledger says conflict
		`{"sku":"hat","qty":1,"user":"alice"}`,  // other item: the handler's key guard
	} {
		e.want(e.post("order-1", body), http.StatusUnprocessableEntity, "idempotency_key_reused")
	}
	e.wantLevels("shoe", 4, 0, 1)
	e.wantLevels("hat", 5, 0, 0)
}

// The Idempotency-Key is scoped to the user: the same key sent by another user is another
// order, never an answer (or a charge, or a cancel) of the first user's order.
func TestIdempotencyKeyPerUser(t *testing.T) {
	e := newEnv(t, time.Minute, map[string]int64{"shoe": 5, "hat": 5})
	alice := e.post("order-1", shoe)
	e.want(alice, http.StatusOK, "")
	bobBody := `{"sku":"shoe","qty":1,"user":"bob"}`
	bob := e.post("order-1", bobBody)
	e.want(bob, http.StatusOK, "")
	var a, b orderBody
	if err := json.Unmarshal([]byte(alice.body), &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(bob.body), &b); err != nil {
		t.Fatal(err)
	}
	if a.Order == b.Order || b.User != "bob" || b.Remaining != 3 {
		t.Fatalf("alice %+v, bob %+v: want two orders", a, b)
	}
	e.wantLevels("shoe", 3, 0, 2) // one unit each
	if !e.pay.Charged(orderID("alice", "order-1", "shoe", 1)) || !e.pay.Charged(orderID("bob", "order-1", "shoe", 1)) || e.pay.Calls() != 2 {
		t.Fatalf("%d charges: want one per user", e.pay.Calls())
	}
	// Another user's key on another item is not a reuse either.
	e.want(e.post("order-1", `{"sku":"hat","qty":1,"user":"carol"}`), http.StatusOK, "")
	e.wantLevels("hat", 4, 0, 1)
	// A declined user's key does not cancel an order of the same key.
	e.pay.Decline("mallory")
	e.want(e.post("order-1", `{"sku":"shoe","qty":1,"user":"mallory"}`), http.StatusPaymentRequired, "payment_declined")
	e.wantLevels("shoe", 3, 0, 2)
	// Retries still answer each user their own order.
	if again := e.post("order-1", bobBody); again.body != bob.body {
		t.Fatalf("bob's retry: %s, want %s", again.body, bob.body)
	}
	if again := e.post("order-1", shoe); again.body != alice.body {
		t.Fatalf("alice's retry: %s, want %s", again.body, alice.body)
	}
	// Users whose name and key run together differently are different orders.
	if orderID("ab", "c", "shoe", 1) == orderID("a", "bc", "shoe", 1) ||
		orderID("a", "b", "c1", 1) == orderID("a", "b", "c", 11) ||
		orderID("a", "bc", "shoe", 1) == orderID("a", "b", "cshoe", 1) {
		t.Fatal("orderID is ambiguous")
	}
}

func TestSoldOut(t *testing.T) {
	e := newEnv(t, time.Minute, map[string]int64{"shoe": 1})
	e.want(e.post("order-1", shoe), http.StatusOK, "")
	e.want(e.post("order-2", `{"sku":"shoe","qty":1,"user":"bob"}`), http.StatusConflict, "sold_out")
	e.wantLevels("shoe", 0, 0, 1)
	if e.pay.Charged(orderID("bob", "order-2", "shoe", 1)) {
		t.Fatal("a sold-out order was charged")
	}
}

func TestPaymentDeclined(t *testing.T) {
	e := newEnv(t, time.Minute, map[string]int64{"shoe": 5})
	e.pay.Decline("mallory")
	body := `{"sku":"shoe","qty":2,"user":"mallory"}`
	first := e.post("order-1", body)
	e.want(first, http.StatusPaymentRequired, "payment_declined")
	e.wantLevels("shoe", 5, 0, 0) // the hold was cancelled: stock back
	again := e.post("order-1", body)
	if again.status != first.status || again.body != first.body {
		t.Fatalf("retry: %d %s, want %d %s", again.status, again.body, first.status, first.body)
	}
	e.wantLevels("shoe", 5, 0, 0)
}

func TestHoldExpiresDuringPayment(t *testing.T) {
	const ttl = 50 * time.Millisecond
	e := newEnv(t, ttl, map[string]int64{"shoe": 5})
	e.pay.Delay = 4 * ttl
	e.pay.Sleep = func(d time.Duration) { e.kit.Advance(d) } // Redis's clock moves on
	first := e.post("order-1", shoe)
	e.want(first, http.StatusGone, "hold_expired")
	e.wantLevels("shoe", 5, 0, 0)
	if !e.pay.Refunded(orderID("alice", "order-1", "shoe", 1)) || e.pay.Charged(orderID("alice", "order-1", "shoe", 1)) {
		t.Fatal("the payment of an expired hold was not refunded")
	}
	again := e.post("order-1", shoe)
	if again.status != first.status || again.body != first.body {
		t.Fatalf("retry: %d %s, want %d %s", again.status, again.body, first.status, first.body)
	}
	e.wantLevels("shoe", 5, 0, 0)
}

func TestBadRequests(t *testing.T) {
	e := newEnv(t, time.Minute, map[string]int64{"shoe": 5})
	e.want(e.post("", shoe), http.StatusBadRequest, "missing_idempotency_key")
	e.want(e.post("order 1", shoe), http.StatusBadRequest, "invalid")                // whitespace: stock.ErrInvalid
	e.want(e.post("order-é", shoe), http.StatusBadRequest, "invalid")                // not ASCII
	e.want(e.post(strings.Repeat("k", 129), shoe), http.StatusBadRequest, "invalid") // too long
	e.want(e.post("order-1", `{"sku":"shoe","qty":0,"user":"alice"}`), http.StatusBadRequest, "invalid")
	e.want(e.post("order-1", `{"sku":"shoe","qty":1}`), http.StatusBadRequest, "invalid")
	e.want(e.post("order-1", `{"sku":"shoe","qty":1,"user":"alice"`), http.StatusBadRequest, "invalid")
	e.want(e.post("order-1", `{"sku":"shoe","qty":1,"user":"alice","coupon":1}`), http.StatusBadRequest, "invalid")
	e.wantLevels("shoe", 5, 0, 0)
	// A key refused as invalid is not bound: the corrected request goes through.
	e.want(e.post("order-1", shoe), http.StatusOK, "")
}

func TestUserLimitAndUnknownItem(t *testing.T) {
	e := newEnv(t, time.Minute, map[string]int64{"shoe": 5})
	e.want(e.post("order-1", `{"sku":"shoe","qty":2,"user":"alice"}`), http.StatusOK, "")
	e.want(e.post("order-2", shoe), http.StatusForbidden, "user_limit")
	e.want(e.post("order-3", `{"sku":"boot","qty":1,"user":"bob"}`), http.StatusNotFound, "not_found")
	if err := e.r.CloseItem(context.Background(), "shoe"); err != nil {
		t.Fatal(err)
	}
	e.want(e.post("order-4", `{"sku":"shoe","qty":1,"user":"bob"}`), http.StatusConflict, "closed")
	e.wantLevels("shoe", 3, 0, 2)
}

// The payment service does not answer: 503, the hold is kept, and the retry with the same key
// finishes the order, charging it once.
func TestPaymentsDownThenRetry(t *testing.T) {
	e := newEnv(t, time.Minute, map[string]int64{"shoe": 5})
	e.pay.FailNext(1)
	rp := e.post("order-1", shoe)
	e.want(rp, http.StatusServiceUnavailable, "unavailable")
	if rp.header.Get("Retry-After") == "" || !strings.Contains(rp.body, "same Idempotency-Key") {
		t.Fatalf("503 without Retry-After or advice: %v %s", rp.header, rp.body)
	}
	e.wantLevels("shoe", 4, 1, 0) // still held
	e.want(e.post("order-1", shoe), http.StatusOK, "")
	e.wantLevels("shoe", 4, 0, 1)
	if !e.pay.Charged(orderID("alice", "order-1", "shoe", 1)) {
		t.Fatal("not charged")
	}
}

// Redis does not answer: 503 with Retry-After.
func TestRedisDown(t *testing.T) {
	kit := stocktest.New(t)
	r := kit.Reserver
	if err := r.Load(context.Background(), "shoe", 5); err != nil {
		t.Fatal(err)
	}
	kit.Redis.Close()
	defer func(d time.Duration) { stepTimeout = d }(stepTimeout)
	stepTimeout = 200 * time.Millisecond
	e := &env{t: t, h: NewHandler(r, testKeys(t, kit.Client), NewFakePayments(), time.Minute, slog.New(slog.DiscardHandler))}
	rp := e.post("order-1", shoe)
	e.want(rp, http.StatusServiceUnavailable, "unavailable")
	if rp.header.Get("Retry-After") == "" {
		t.Fatal("no Retry-After")
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
	e := newEnv(t, time.Minute, map[string]int64{"shoe": 5})
	if err := e.r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	rp := e.post("order-1", shoe)
	e.want(rp, http.StatusServiceUnavailable, "unavailable")
	if rp.header.Get("Retry-After") == "" {
		t.Error("no Retry-After")
	}
	if e.pay.Calls() != 0 {
		t.Errorf("%d payments charged", e.pay.Calls())
	}
}

func TestStockLevels(t *testing.T) {
	e := newEnv(t, time.Minute, map[string]int64{"shoe": 5})
	e.want(e.post("order-1", shoe), http.StatusOK, "")
	rp := e.do(httptest.NewRequest(http.MethodGet, "/stock/shoe", nil))
	e.want(rp, http.StatusOK, "")
	var lb levelsBody
	if err := json.Unmarshal([]byte(rp.body), &lb); err != nil {
		t.Fatal(err)
	}
	if want := (levelsBody{SKU: "shoe", Available: 4, Sold: 1, Loaded: 5}); lb != want {
		t.Fatalf("%+v, want %+v", lb, want)
	}
	e.want(e.do(httptest.NewRequest(http.MethodGet, "/stock/boot", nil)), http.StatusNotFound, "not_found")
	if rp := e.do(httptest.NewRequest(http.MethodGet, "/checkout", nil)); rp.status != http.StatusMethodNotAllowed {
		t.Fatalf("GET /checkout: %d", rp.status)
	}
}

func (e *env) send(method, target, contentType, key, body string) reply {
	e.t.Helper()
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return e.do(req)
}

// wantMessage checks the error and that its message says what it should and no Go internals.
func (e *env) wantMessage(rp reply, status int, code, says string) {
	e.t.Helper()
	e.want(rp, status, code)
	var eb errorBody
	if err := json.Unmarshal([]byte(rp.body), &eb); err != nil {
		e.t.Fatal(err)
	}
	if !strings.Contains(eb.Message, says) {
		e.t.Errorf("%d %s: message %q does not say %q", status, code, eb.Message, says)
	}
	for _, internal := range []string{"Go ", "struct", "int64", "json:", "stock:", "checkoutRequest", " id "} {
		if strings.Contains(eb.Message, internal) {
			e.t.Errorf("message %q shows %q", eb.Message, internal)
		}
	}
}

// Every malformed request is refused with a JSON error that says what is wrong in the API's
// words, and takes nothing.
func TestRequestErrors(t *testing.T) {
	e := newEnv(t, time.Minute, map[string]int64{"shoe": 5})
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
		{"GET /checkout", "GET", "/checkout", "", "", "", 405, "method_not_allowed", "use POST"},
		{"DELETE /stock", "DELETE", "/stock/shoe", "", "", "", 405, "method_not_allowed", "use GET"},
		{"unknown path", "GET", "/nothing", "", "", "", 404, "not_found", "no such endpoint"},
		{"bad sku in path", "GET", "/stock/a%7Bb", "", "", "", 400, "invalid", "sku may not contain"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.t = t
			rp := e.send(c.method, c.target, c.ctype, c.key, c.body)
			e.wantMessage(rp, c.status, c.code, c.says)
			if c.status == 405 && rp.header.Get("Allow") == "" {
				t.Error("405 without Allow")
			}
		})
	}
	e.t = t
	e.wantLevels("shoe", 5, 0, 0)
	if e.pay.Calls() != 0 {
		t.Fatalf("%d charges", e.pay.Calls())
	}
	// A JSON Content-Type with parameters, a +json type or none at all is accepted.
	e.want(e.send("POST", "/checkout", "application/json; charset=utf-8", "k2", shoe), http.StatusOK, "")
	e.want(e.send("POST", "/checkout", "application/vnd.api+json", "k3", `{"sku":"shoe","qty":1,"user":"bob"}`), http.StatusOK, "")
	e.want(e.send("POST", "/checkout", "", "k2", shoe), http.StatusOK, "") // replay of k2
	e.wantLevels("shoe", 3, 0, 2)
}

// Every request is logged: method, path, status, duration, and the Idempotency-Key.
func TestRequestLog(t *testing.T) {
	e := newEnv(t, time.Minute, map[string]int64{"shoe": 5})
	var buf bytes.Buffer
	e.h = NewHandler(e.r, e.keys, e.pay, time.Minute, slog.New(slog.NewJSONHandler(&buf, nil)))
	e.want(e.post("order-1", shoe), http.StatusOK, "")
	e.want(e.do(httptest.NewRequest(http.MethodGet, "/nothing", nil)), http.StatusNotFound, "not_found")
	var lines []map[string]any
	for l := range strings.SplitSeq(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		if m["msg"] == "request" {
			lines = append(lines, m)
		}
	}
	if len(lines) != 2 {
		t.Fatalf("%d request lines: %s", len(lines), buf.String())
	}
	first, second := lines[0], lines[1]
	if first["method"] != "POST" || first["path"] != "/checkout" || first["status"] != float64(200) ||
		first["idempotency_key"] != "order-1" || first["duration"] == nil {
		t.Errorf("first line %v", first)
	}
	if second["method"] != "GET" || second["path"] != "/nothing" || second["status"] != float64(404) {
		t.Errorf("second line %v", second)
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

	req, err := http.NewRequest(http.MethodPost, "http://"+s.addr+"/checkout", strings.NewReader(shoe))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", "order-1")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("checkout: status %d", res.StatusCode)
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
