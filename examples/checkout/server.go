package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/stockres/stock"
)

// Payments takes the money for an order. Charge must be idempotent in Charge.Order, as payment
// providers are with an idempotency key: a checkout retried with the same key charges the same
// order again, and that must not take the money twice. Refund of an order that was not charged
// does nothing.
type Payments interface {
	Charge(ctx context.Context, c Charge) error
	Refund(ctx context.Context, order string) error
}

// Charge is one payment.
type Charge struct {
	Order string // the Idempotency-Key of the checkout
	User  string
	SKU   string
	Qty   int64
}

// ErrDeclined is returned by Payments.Charge when the payment is refused (card declined): the
// outcome is known and final. Any other error leaves the outcome unknown.
var ErrDeclined = errors.New("payment declined")

// flowTimeout bounds one checkout: hold, payment, confirm. The flow runs on a context that the
// client's disconnect does not cancel, so a charge is never left without its confirm or cancel
// because the client went away.
const flowTimeout = 30 * time.Second

// stepTimeout bounds each Redis call of a checkout, so that a Redis that does not answer gets
// a prompt 503 instead of a client waiting for the whole flowTimeout.
var stepTimeout = 3 * time.Second

// step returns the context of one Redis call of a checkout.
func step(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, stepTimeout)
}

// A response body: the confirmed order, or an error.
type (
	checkoutRequest struct {
		SKU  string `json:"sku"`
		Qty  int64  `json:"qty"`
		User string `json:"user"`
	}
	orderBody struct {
		Order     string `json:"order"`
		SKU       string `json:"sku"`
		User      string `json:"user"`
		Qty       int64  `json:"qty"`
		Status    string `json:"status"`    // "confirmed"
		Remaining int64  `json:"remaining"` // units left right after the hold
	}
	errorBody struct {
		Error   string `json:"error"`
		Message string `json:"message"`
	}
	levelsBody struct {
		SKU       string `json:"sku"`
		Available int64  `json:"available"`
		Held      int64  `json:"held"`
		Sold      int64  `json:"sold"`
		Loaded    int64  `json:"loaded"`
		Closed    bool   `json:"closed"`
	}
)

// apiError is an error response: an HTTP status and a body.
type apiError struct {
	status     int
	code, msg  string
	retryAfter bool // a 503: retry with the same Idempotency-Key
}

// Errors whose body must not change between a request and its replays.
var (
	errDeclined = apiError{http.StatusPaymentRequired, "payment_declined",
		"the payment was declined; the stock was released", false}
	errExpired = apiError{http.StatusGone, "hold_expired",
		"the hold expired before the payment completed; the stock was released and any payment refunded", false}
	errRefused = apiError{http.StatusConflict, "refused",
		"the order was voided: the database of record could not cover it; any payment will be refunded", false}
	errRestored = apiError{http.StatusConflict, "cancelled",
		"the order was cancelled and its stock given back", false}
)

// unknownOutcome is the answer when the outcome of a step is unknown: retry, same key.
func unknownOutcome(what string) apiError {
	return apiError{http.StatusServiceUnavailable, "unavailable",
		what + ": the outcome is unknown; retry with the same Idempotency-Key (it is safe: nothing is taken or charged twice)", true}
}

// stockError maps an error of the stock library to a response.
func stockError(err error, rc stock.Receipt) apiError {
	switch stock.Outcome(err) {
	case "sold_out":
		return apiError{http.StatusConflict, "sold_out", "the item is sold out", false}
	case "insufficient":
		return apiError{http.StatusConflict, "insufficient", fmt.Sprintf("only %d left", rc.Remaining), false}
	case "user_limit":
		return apiError{http.StatusForbidden, "user_limit", "over the limit of units per customer for this item", false}
	case "not_loaded":
		return apiError{http.StatusNotFound, "not_found", "no such item on sale", false}
	case "closed":
		return apiError{http.StatusConflict, "closed", "the item is not on sale now", false}
	case "conflict":
		return apiError{http.StatusUnprocessableEntity, "idempotency_key_reused",
			"this Idempotency-Key was used for a different request", false}
	case "expired":
		return errExpired
	case "restored":
		return errRestored
	case "invalid":
		return apiError{http.StatusBadRequest, "invalid", err.Error(), false}
	case "error", "timeout", "canceled":
		return unknownOutcome("the stock service did not answer")
	}
	// unknown_id, confirmed, refused, loaded: not outcomes of this flow.
	return apiError{http.StatusInternalServerError, "internal", "unexpected outcome " + stock.Outcome(err), false}
}

type handler struct {
	r    *stock.Reserver
	pay  Payments
	ttl  time.Duration
	keys *keyGuard
	log  *slog.Logger
}

// NewHandler returns the checkout API:
//
//	POST /checkout      {"sku", "qty", "user"} with an Idempotency-Key header: hold, pay, confirm
//	GET  /stock/{sku}   the item's levels
//
// A hold lasts holdTTL; a payment that outlasts it is refunded and answered 410.
func NewHandler(r *stock.Reserver, p Payments, holdTTL time.Duration) http.Handler {
	h := &handler{r: r, pay: p, ttl: holdTTL, keys: newKeyGuard(100000), log: slog.Default()}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /checkout", h.checkout)
	mux.HandleFunc("GET /stock/{sku}", h.levels)
	return mux
}

func (h *handler) checkout(w http.ResponseWriter, req *http.Request) {
	key := req.Header.Get("Idempotency-Key")
	if key == "" {
		writeError(w, apiError{http.StatusBadRequest, "missing_idempotency_key",
			"an Idempotency-Key header is required: a unique key per order, reused when retrying it", false})
		return
	}
	var in checkoutRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, req.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		writeError(w, apiError{http.StatusBadRequest, "invalid", "body: " + err.Error(), false})
		return
	}
	if in.User == "" {
		writeError(w, apiError{http.StatusBadRequest, "invalid", "user is required", false})
		return
	}
	// The stock ledger refuses a key reused with another quantity or user (ErrConflict), but
	// ledgers are per item: a key reused for another item is caught here, in this process only.
	if !h.keys.fits(key, in) {
		writeError(w, stockError(stock.ErrConflict, stock.Receipt{}))
		return
	}

	ctx, cancel := context.WithTimeout(context.WithoutCancel(req.Context()), flowTimeout)
	defer cancel()
	o := stock.Request{SKU: in.SKU, ID: key, User: in.User, Qty: in.Qty}
	sctx, done := step(ctx)
	rc, err := h.r.Hold(sctx, o, h.ttl)
	done()
	if err == nil && !h.keys.bind(key, in) {
		// A request with the same key and another item got there first, in between.
		if _, err := h.cancel(ctx, o); err != nil {
			h.log.Warn("checkout: cancel of a hold whose key was taken", "order", key, "err", err)
		}
		writeError(w, stockError(stock.ErrConflict, stock.Receipt{}))
		return
	}
	if err == nil && rc.Replayed {
		// A retry: the ledger entry says how far the first attempt went.
		e, lerr := h.ledger(ctx, o)
		switch {
		case lerr != nil:
			writeError(w, stockError(lerr, rc))
			return
		case e.State != stock.StateHeld:
			writeJSON(w, http.StatusOK, confirmed(o, rc)) // confirmed already
			return
		}
		// Still held: the first attempt is paying, or died while paying. Go on: the charge is
		// idempotent in the key, the confirm too.
	}
	if errors.Is(err, stock.ErrRestored) {
		// Given back: by a declined payment (cancelled), a refusal of the database of record,
		// or a Restore.
		if e, lerr := h.ledger(ctx, o); lerr == nil {
			switch e.State {
			case stock.StateCancelled:
				writeError(w, errDeclined)
				return
			case stock.StateRefused:
				writeError(w, errRefused)
				return
			}
		}
	}
	if errors.Is(err, stock.ErrExpired) {
		h.refund(ctx, key)
	}
	if err != nil {
		writeError(w, stockError(err, rc))
		return
	}

	err = h.pay.Charge(ctx, Charge{Order: key, User: o.User, SKU: o.SKU, Qty: o.Qty})
	if errors.Is(err, ErrDeclined) {
		if _, cerr := h.cancel(ctx, o); cerr != nil {
			// The hold expires by itself; a retry of the key cancels it again.
			h.log.Warn("checkout: cancel after a declined payment", "order", key, "err", cerr)
		}
		writeError(w, errDeclined)
		return
	}
	if err != nil {
		writeError(w, unknownOutcome("the payment service did not answer"))
		return
	}

	sctx, done = step(ctx)
	_, err = h.r.Confirm(sctx, o.SKU, o.ID)
	done()
	if err != nil {
		ae := stockError(err, rc)
		if errors.Is(err, stock.ErrExpired) || errors.Is(err, stock.ErrRestored) {
			h.refund(ctx, key) // paid, but the stock went back
		}
		writeError(w, ae)
		return
	}
	writeJSON(w, http.StatusOK, confirmed(o, rc))
}

func (h *handler) ledger(ctx context.Context, o stock.Request) (stock.Entry, error) {
	ctx, done := step(ctx)
	defer done()
	return h.r.Ledger(ctx, o.SKU, o.ID)
}

func (h *handler) cancel(ctx context.Context, o stock.Request) (stock.Receipt, error) {
	ctx, done := step(ctx)
	defer done()
	return h.r.Cancel(ctx, o.SKU, o.ID)
}

// refund gives a payment back; a failure is logged for an operator (the fake never fails).
func (h *handler) refund(ctx context.Context, order string) {
	if err := h.pay.Refund(ctx, order); err != nil {
		h.log.Error("checkout: refund failed; refund by hand", "order", order, "err", err)
	}
}

func confirmed(o stock.Request, rc stock.Receipt) orderBody {
	return orderBody{Order: o.ID, SKU: o.SKU, User: o.User, Qty: o.Qty, Status: "confirmed", Remaining: rc.Remaining}
}

func (h *handler) levels(w http.ResponseWriter, req *http.Request) {
	sku := req.PathValue("sku")
	ctx, done := step(req.Context())
	defer done()
	lv, err := h.r.Levels(ctx, sku)
	if err != nil {
		writeError(w, stockError(err, stock.Receipt{}))
		return
	}
	writeJSON(w, http.StatusOK, levelsBody{SKU: sku, Available: lv.Available, Held: lv.Held, Sold: lv.Sold, Loaded: lv.Loaded, Closed: lv.Closed})
}

func writeError(w http.ResponseWriter, e apiError) {
	if e.retryAfter {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, e.status, errorBody{Error: e.code, Message: e.msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"internal","message":"encoding the response"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// keyGuard remembers which request each recent Idempotency-Key was first used with, in this
// process, up to a number of keys (the oldest are forgotten first).
type keyGuard struct {
	mu    sync.Mutex
	max   int
	seen  map[string]checkoutRequest
	order []string
}

func newKeyGuard(max int) *keyGuard {
	return &keyGuard{max: max, seen: map[string]checkoutRequest{}}
}

// fits reports whether key is not bound to another request.
func (g *keyGuard) fits(key string, req checkoutRequest) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	prev, ok := g.seen[key]
	return !ok || prev == req
}

// bind binds key to req, once it took stock, and reports whether it was not bound to another
// request.
func (g *keyGuard) bind(key string, req checkoutRequest) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if prev, ok := g.seen[key]; ok {
		return prev == req
	}
	g.seen[key] = req
	g.order = append(g.order, key)
	if len(g.order) > g.max {
		delete(g.seen, g.order[0])
		g.order = g.order[1:]
	}
	return true
}

// FakePayments is a Payments for the demo and the tests: it charges everyone, except users told
// to be declined, and can be told to fail (an unknown outcome) or to be slow. It is idempotent
// in the order, like a real provider with idempotency keys, and safe for concurrent use.
type FakePayments struct {
	// Delay is how long each Charge takes; Sleep waits it (time.Sleep when nil; tests move a
	// fake clock instead).
	Delay time.Duration
	Sleep func(time.Duration)

	mu       sync.Mutex
	decline  map[string]bool
	failures int
	charges  map[string]int // order -> Charge calls that took money (at most 1)
	calls    int
	refunded map[string]bool
}

// ErrPaymentsDown is what a FakePayments told to fail returns: the outcome is unknown.
var ErrPaymentsDown = errors.New("payments: service unavailable")

// NewFakePayments returns a FakePayments that accepts every payment.
func NewFakePayments() *FakePayments {
	return &FakePayments{decline: map[string]bool{}, charges: map[string]int{}, refunded: map[string]bool{}}
}

// Decline makes every payment of user declined.
func (f *FakePayments) Decline(user string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.decline[user] = true
}

// FailNext makes the next n Charge calls fail with ErrPaymentsDown, taking nothing.
func (f *FakePayments) FailNext(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures = n
}

// Charge implements Payments.
func (f *FakePayments) Charge(ctx context.Context, c Charge) error {
	if f.Delay > 0 {
		if f.Sleep != nil {
			f.Sleep(f.Delay)
		} else {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(f.Delay):
			}
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.failures > 0 {
		f.failures--
		return ErrPaymentsDown
	}
	if f.decline[c.User] {
		return ErrDeclined
	}
	f.charges[c.Order] = 1 // idempotent: a second charge of the order takes nothing more
	return nil
}

// Refund implements Payments.
func (f *FakePayments) Refund(_ context.Context, order string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.charges[order] > 0 {
		f.refunded[order] = true
	}
	return nil
}

// Charged reports whether the order's money was taken (and not refunded).
func (f *FakePayments) Charged(order string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.charges[order] > 0 && !f.refunded[order]
}

// Refunded reports whether the order was charged and refunded.
func (f *FakePayments) Refunded(order string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.refunded[order]
}

// Calls returns the number of Charge calls.
func (f *FakePayments) Calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}
