package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

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
	Order string // the order id: derived from the user, the Idempotency-Key, the sku and the qty
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
		// The handler checks every field first; this is a refusal it did not foresee.
		return apiError{http.StatusBadRequest, "invalid", "the request was refused as invalid", false}
	case "error", "timeout", "canceled":
		return unknownOutcome("the stock service did not answer")
	}
	// unknown_id, confirmed, refused, loaded: not outcomes of this flow.
	return apiError{http.StatusInternalServerError, "internal", "unexpected outcome " + stock.Outcome(err), false}
}

type handler struct {
	r    *stock.Reserver
	keys *Keys
	pay  Payments
	ttl  time.Duration
	log  *slog.Logger
}

// maxBody is the largest request body accepted; a larger one is answered 413.
const maxBody = 64 << 10

// NewHandler returns the checkout API:
//
//	POST /checkout      {"sku", "qty", "user"} with an Idempotency-Key header: hold, pay, confirm
//	GET  /stock/{sku}   the item's levels
//
// Each (user, Idempotency-Key) is bound to its first purchase (sku and qty) in keys, shared by
// every instance of the service. A hold lasts holdTTL; a payment that outlasts it is refunded
// and answered 410. Every request is logged on log (slog.Default() when nil): method, path,
// status, duration.
func NewHandler(r *stock.Reserver, keys *Keys, p Payments, holdTTL time.Duration, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.Default()
	}
	h := &handler{r: r, keys: keys, pay: p, ttl: holdTTL, log: log}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /checkout", h.checkout)
	mux.HandleFunc("GET /stock/{sku}", h.levels)
	// Everything else answers in JSON too: a known path with another method is 405, any other
	// path 404.
	mux.HandleFunc("/checkout", methodNotAllowed("POST"))
	mux.HandleFunc("/stock/{sku}", methodNotAllowed("GET, HEAD"))
	mux.HandleFunc("/", func(w http.ResponseWriter, req *http.Request) {
		writeError(w, apiError{http.StatusNotFound, "not_found", "no such endpoint: POST /checkout or GET /stock/{sku}", false})
	})
	return h.logRequests(mux)
}

func methodNotAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Allow", allow)
		writeError(w, apiError{http.StatusMethodNotAllowed, "method_not_allowed",
			req.Method + " is not allowed here; use " + allow, false})
	}
}

// statusWriter records the status a handler answered, for the request log.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// logRequests logs one line per request: method, path, status, duration, and the
// Idempotency-Key when there is one.
func (h *handler) logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, req)
		attrs := []any{"method", req.Method, "path", req.URL.Path, "status", sw.status, "duration", time.Since(start)}
		if k := req.Header.Get("Idempotency-Key"); k != "" {
			attrs = append(attrs, "idempotency_key", k)
		}
		h.log.Info("request", attrs...)
	})
}

// orderID is the order id of a checkout: the stock library's request id, the payment's
// idempotency key. It is derived from everything that makes the purchase: the user, the
// Idempotency-Key, the sku and the quantity. So the same key sent by two users names two
// different orders (one user's key can never reach another user's order), and a payment taken
// for one purchase can never be reused for another, even where the key records (Keys) would
// let the key through: once a record expired, or with a Keys on another Redis. Each part but
// the last is length-prefixed before hashing, so no two purchases give the same input.
func orderID(user, key, sku string, qty int64) string {
	var b []byte
	for _, s := range []string{user, key, sku} {
		b = strconv.AppendInt(b, int64(len(s)), 10)
		b = append(b, ':')
		b = append(b, s...)
	}
	b = strconv.AppendInt(b, qty, 10)
	sum := sha256.Sum256(b)
	return "order-" + hex.EncodeToString(sum[:16])
}

// checkKey checks an Idempotency-Key: 1 to stock.MaxNameLen visible ASCII characters.
func checkKey(key string) *apiError {
	if key == "" {
		return &apiError{http.StatusBadRequest, "missing_idempotency_key",
			"an Idempotency-Key header is required: a unique key per order, reused when retrying it", false}
	}
	if len(key) > stock.MaxNameLen {
		return &apiError{http.StatusBadRequest, "invalid",
			fmt.Sprintf("the Idempotency-Key is longer than %d characters", stock.MaxNameLen), false}
	}
	for i := 0; i < len(key); i++ {
		if key[i] <= ' ' || key[i] > '~' {
			return &apiError{http.StatusBadRequest, "invalid",
				"the Idempotency-Key may hold only visible ASCII characters (no spaces)", false}
		}
	}
	return nil
}

// checkName checks the sku or the user of a request, by the rules of the stock library, with a
// message that names the field.
func checkName(field, s string) *apiError {
	bad := func(msg string) *apiError {
		return &apiError{http.StatusBadRequest, "invalid", msg, false}
	}
	switch {
	case s == "":
		return bad(field + " is required")
	case len(s) > stock.MaxNameLen:
		return bad(fmt.Sprintf("%s is longer than %d bytes", field, stock.MaxNameLen))
	case !utf8.ValidString(s):
		return bad(field + " is not valid UTF-8")
	}
	for _, c := range s {
		if c == '{' || c == '}' || c == '|' || unicode.IsSpace(c) || unicode.IsControl(c) || unicode.Is(unicode.Cf, c) {
			return bad(field + " may not contain braces, '|', spaces, control characters or invisible format characters")
		}
	}
	return nil
}

// decodeRequest reads the body of a checkout: one JSON object and nothing after it, at most
// maxBody bytes, with a JSON Content-Type (or none). The messages name the field at fault and
// never quote Go types.
func decodeRequest(w http.ResponseWriter, req *http.Request) (checkoutRequest, *apiError) {
	bad := func(msg string) (checkoutRequest, *apiError) {
		return checkoutRequest{}, &apiError{http.StatusBadRequest, "invalid", msg, false}
	}
	if ct := req.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return checkoutRequest{}, &apiError{http.StatusUnsupportedMediaType, "unsupported_media_type",
				"the body must be JSON: Content-Type: application/json", false}
		}
	}
	var in struct {
		SKU  *string `json:"sku"`
		Qty  *int64  `json:"qty"`
		User *string `json:"user"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, req.Body, maxBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(&in)
	var (
		tooBig *http.MaxBytesError
		syntax *json.SyntaxError
		typ    *json.UnmarshalTypeError
	)
	if err == nil {
		// One JSON object and nothing after it (white space aside).
		if _, terr := dec.Token(); terr != io.EOF {
			if errors.As(terr, &tooBig) {
				err = terr
			} else {
				return bad("unexpected data after the JSON object")
			}
		}
	}
	switch {
	case err == nil:
	case errors.As(err, &tooBig):
		return checkoutRequest{}, &apiError{http.StatusRequestEntityTooLarge, "too_large",
			fmt.Sprintf("the body is larger than %d bytes", maxBody), false}
	case errors.Is(err, io.EOF):
		return bad(`the body is empty: want {"sku": ..., "qty": ..., "user": ...}`)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return bad("the body ends before its JSON object does")
	case errors.As(err, &syntax):
		return bad(fmt.Sprintf("the body is not valid JSON (at byte %d)", syntax.Offset))
	case errors.As(err, &typ):
		switch typ.Field {
		case "qty":
			return bad(fmt.Sprintf("qty must be a whole number from 1 to %d", stock.MaxQty))
		case "sku", "user":
			return bad(typ.Field + " must be a string")
		}
		return bad(`the body must be a JSON object: {"sku": ..., "qty": ..., "user": ...}`)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return bad("unknown field " + strings.TrimPrefix(err.Error(), "json: unknown field ") + ": the fields are sku, qty and user")
	default:
		return bad("the body is not a valid JSON object")
	}
	var out checkoutRequest
	if in.SKU != nil {
		out.SKU = *in.SKU
	}
	if in.User != nil {
		out.User = *in.User
	}
	if e := checkName("sku", out.SKU); e != nil {
		return out, e
	}
	if e := checkName("user", out.User); e != nil {
		return out, e
	}
	if in.Qty == nil {
		return bad("qty is required")
	}
	if out.Qty = *in.Qty; out.Qty < 1 || out.Qty > stock.MaxQty {
		return bad(fmt.Sprintf("qty must be a whole number from 1 to %d", stock.MaxQty))
	}
	return out, nil
}

func (h *handler) checkout(w http.ResponseWriter, req *http.Request) {
	key := req.Header.Get("Idempotency-Key")
	if e := checkKey(key); e != nil {
		writeError(w, *e)
		return
	}
	in, e := decodeRequest(w, req)
	if e != nil {
		writeError(w, *e)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(req.Context()), flowTimeout)
	defer cancel()

	// Bind the key to this purchase, in Redis, before anything is taken: a key used for another
	// sku or qty is refused here, whichever instance saw it first and however long ago (within
	// the record's lifetime). The check and the binding are one atomic step, so of two requests
	// racing with the same key for two purchases, on any instances, one gets 422.
	sctx, done := step(ctx)
	again, err := h.keys.Use(sctx, in.User, key, in.SKU, in.Qty)
	done()
	switch {
	case errors.Is(err, errKeyReused):
		writeError(w, stockError(stock.ErrConflict, stock.Receipt{}))
		return
	case err != nil:
		writeError(w, unknownOutcome("the stock service did not answer"))
		return
	}

	// The order id is scoped to the user and to the purchase: the same key from another user is
	// another order.
	id := orderID(in.User, key, in.SKU, in.Qty)
	// Retry: an earlier attempt of this purchase came this far, and its hold may have run, or may
	// still reach Redis (after a 503, an unknown outcome). A refusal of this hold for stock is
	// then recorded, so that the earlier hold, should it arrive late, is refused too and the
	// answer given here stays the final one. (A replay is answered as without it.)
	o := stock.Request{SKU: in.SKU, ID: id, User: in.User, Qty: in.Qty, Retry: again}
	sctx, done = step(ctx)
	rc, err := h.r.Hold(sctx, o, h.ttl)
	done()
	if tookNothing(err) {
		// Refused, and nothing taken: give the key's use back, so that the key is free again
		// once no attempt of it holds anything (see Keys).
		sctx, done := step(ctx)
		if kerr := h.keys.Refused(sctx, in.User, key, in.SKU, in.Qty); kerr != nil {
			h.log.Warn("checkout: the key record keeps a refused attempt (it expires by itself)", "order", id, "err", kerr)
		}
		done()
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
		// idempotent in the order id, the confirm too.
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
		h.refund(ctx, id)
	}
	if err != nil {
		writeError(w, stockError(err, rc))
		return
	}

	err = h.pay.Charge(ctx, Charge{Order: id, User: o.User, SKU: o.SKU, Qty: o.Qty})
	if errors.Is(err, ErrDeclined) {
		if _, cerr := h.cancel(ctx, o); cerr != nil {
			// The hold expires by itself; a retry of the key cancels it again.
			h.log.Warn("checkout: cancel after a declined payment", "order", id, "err", cerr)
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
			h.refund(ctx, id) // paid, but the stock went back
		}
		writeError(w, ae)
		return
	}
	writeJSON(w, http.StatusOK, confirmed(o, rc))
}

// tookNothing reports whether a hold was refused without taking stock, for good: the script ran
// and refused it (not an unknown outcome, not a replay of an order that existed).
func tookNothing(err error) bool {
	for _, e := range []error{stock.ErrSoldOut, stock.ErrInsufficient, stock.ErrUserLimit,
		stock.ErrNotLoaded, stock.ErrClosed, stock.ErrInvalid} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
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
	if e := checkName("sku", sku); e != nil {
		writeError(w, *e)
		return
	}
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
