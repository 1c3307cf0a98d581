package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
)

type env struct {
	t      *testing.T
	client rueidis.Client
	r      *stock.Reserver
	pay    *FakePayments
	h      http.Handler
}

// newEnv loads items on a fresh miniredis (clock standing still: redistest.Sleep moves it)
// and returns the checkout handler on it.
func newEnv(t *testing.T, holdTTL time.Duration, items map[string]int64) *env {
	t.Helper()
	_, c := redistest.Miniredis(t)
	r, err := stock.New(c, stock.WithUserLimit(2))
	if err != nil {
		t.Fatal(err)
	}
	for sku, n := range items {
		if err := r.Load(context.Background(), sku, n); err != nil {
			t.Fatal(err)
		}
	}
	pay := NewFakePayments()
	return &env{t: t, client: c, r: r, pay: pay, h: NewHandler(r, pay, holdTTL)}
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
	if want := (orderBody{Order: "order-1", SKU: "shoe", User: "alice", Qty: 1, Status: "confirmed", Remaining: 4}); ob != want {
		t.Fatalf("body %+v, want %+v", ob, want)
	}
	e.wantLevels("shoe", 4, 0, 1)
	if !e.pay.Charged("order-1") || e.pay.Calls() != 1 {
		t.Fatalf("charged %v, %d calls", e.pay.Charged("order-1"), e.pay.Calls())
	}
	if en, err := e.r.Ledger(context.Background(), "shoe", "order-1"); err != nil || en.Kind != stock.KindHold || en.State != stock.StateReserved {
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
		`{"sku":"shoe","qty":1,"user":"bob"}`,   // other user: the ledger says conflict
		`{"sku":"hat","qty":1,"user":"alice"}`,  // other item: the handler's key guard
	} {
		e.want(e.post("order-1", body), http.StatusUnprocessableEntity, "idempotency_key_reused")
	}
	e.wantLevels("shoe", 4, 0, 1)
	e.wantLevels("hat", 5, 0, 0)
}

func TestSoldOut(t *testing.T) {
	e := newEnv(t, time.Minute, map[string]int64{"shoe": 1})
	e.want(e.post("order-1", shoe), http.StatusOK, "")
	e.want(e.post("order-2", `{"sku":"shoe","qty":1,"user":"bob"}`), http.StatusConflict, "sold_out")
	e.wantLevels("shoe", 0, 0, 1)
	if e.pay.Charged("order-2") {
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
	e.pay.Sleep = func(d time.Duration) { redistest.Sleep(e.client, d) } // Redis's clock moves on
	first := e.post("order-1", shoe)
	e.want(first, http.StatusGone, "hold_expired")
	e.wantLevels("shoe", 5, 0, 0)
	if !e.pay.Refunded("order-1") || e.pay.Charged("order-1") {
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
	e.want(e.post("order-{1}", shoe), http.StatusBadRequest, "invalid")              // braces
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
	if err := e.r.Close(context.Background(), "shoe"); err != nil {
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
	if !e.pay.Charged("order-1") {
		t.Fatal("not charged")
	}
}

// Redis does not answer: 503 with Retry-After.
func TestRedisDown(t *testing.T) {
	m := miniredis.RunT(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{m.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, err := stock.New(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Load(context.Background(), "shoe", 5); err != nil {
		t.Fatal(err)
	}
	m.Close()
	defer func(d time.Duration) { stepTimeout = d }(stepTimeout)
	stepTimeout = 200 * time.Millisecond
	e := &env{t: t, h: NewHandler(r, NewFakePayments(), time.Minute)}
	rp := e.post("order-1", shoe)
	e.want(rp, http.StatusServiceUnavailable, "unavailable")
	if rp.header.Get("Retry-After") == "" {
		t.Fatal("no Retry-After")
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
