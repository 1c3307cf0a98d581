package stock_test

// The documented promise of Request.Retry, checked case by case:
//
//	A retry's refusal for lack of stock (ErrSoldOut, ErrInsufficient) is then recorded for the
//	id, so that the earlier attempt, should it reach Redis after the retry, is refused too: the
//	answer the caller got stays the final one. Every later request of the id gets the same
//	error (ErrSoldOut or ErrInsufficient) and Remaining, whatever was restocked or given back
//	since.
//
// The tests use only the exported API and what the docs say.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// ---------- helpers ----------

func retryPending(t *testing.T, r *stock.Reserver, sku string) int64 {
	t.Helper()
	p, _, err := stockops.Pending(context.Background(), r, sku)
	if err != nil {
		t.Fatalf("Pending(%s): %v", sku, err)
	}
	return p
}

// refused checks that the call it is given answered the refusal want with Remaining rem.
func refused(t *testing.T, what string, want error, rem int64) func(stock.Receipt, error) {
	return func(rc stock.Receipt, err error) {
		t.Helper()
		retryCheckRefusal(t, what, rc, err, want, rem)
	}
}

// retryCheckRefusal checks that (rc, err) is the refusal want with Remaining rem.
func retryCheckRefusal(t *testing.T, what string, rc stock.Receipt, err error, want error, rem int64) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: err = %v, want %v", what, err, want)
		return
	}
	other := stock.ErrSoldOut
	if want == stock.ErrSoldOut {
		other = stock.ErrInsufficient
	}
	if errors.Is(err, other) {
		t.Errorf("%s: err %v is both kinds", what, err)
	}
	if rc.Remaining != rem {
		t.Errorf("%s: Remaining = %d, want %d (err %v)", what, rc.Remaining, rem, err)
	}
	if rc.Replayed {
		t.Errorf("%s: Replayed set on a refusal", what)
	}
}

func retryCheckCartRefusal(t *testing.T, what string, err error, want error, sku string) {
	t.Helper()
	var ce *stock.CartError
	if !errors.As(err, &ce) {
		t.Errorf("%s: err = %v, want a *CartError wrapping %v", what, err, want)
		return
	}
	if ce.SKU != sku || !errors.Is(err, want) {
		t.Errorf("%s: err = %v (sku %q), want %v on %q", what, err, ce.SKU, want, sku)
	}
}

type retryConfig struct {
	name string
	opts []stock.Option
}

var retryConfigs = []retryConfig{
	{"plain", nil},
	{"nocoalesce-nocache", []stock.Option{stock.WithCoalescing(0), stock.WithSoldOutCache(0)}},
	{"buckets4", []stock.Option{stock.WithBuckets(func(string) int { return 4 })}},
	{"userlimit", []stock.Option{stock.WithUserLimit(3)}},
}

// ---------- the matrix: Deduct/Hold retry refused, then give back and restock, then every repeat ----------

func TestRetryRefusalMatrix(t *testing.T) {
	type matrixCase struct {
		cfg  retryConfig
		op   string
		kind error
	}
	var cases []matrixCase
	var names []string
	for _, cfg := range retryConfigs {
		for _, op := range []string{"deduct", "hold"} {
			for _, kind := range []error{stock.ErrSoldOut, stock.ErrInsufficient} {
				cases = append(cases, matrixCase{cfg, op, kind})
				names = append(names, fmt.Sprintf("%s/%s/%s", cfg.name, op, stock.Outcome(kind)))
			}
		}
	}
	retryEach(t, false, names, func(t *testing.T, b redistest.Backend, i int) {
		cfg, op, kind := cases[i].cfg, cases[i].op, cases[i].kind
		r, r2 := retryPair(t, b, cfg.opts...)
		var err error
		sku := "it:em~X"
		other := "aa:other~" // sorts before sku: a cart takes it first
		id := "ord:1~retry"
		user := "us:er~1"
		require.NoError(t, r.Load(ctx, sku, 3))
		require.NoError(t, r.Load(ctx, other, 5))
		must(t)(r.Deduct(ctx, stock.Request{SKU: sku, ID: "pre:1", User: "p:1", Qty: 1}))
		must(t)(r.Hold(ctx, stock.Request{SKU: sku, ID: "pre:h~", User: "p:2", Qty: 1}, time.Hour))
		qty, rem := int64(2), int64(1)
		if kind == stock.ErrSoldOut {
			must(t)(r.Deduct(ctx, stock.Request{SKU: sku, ID: "fill~", User: "p:3", Qty: 1}))
			qty, rem = 1, 0
		}
		req := stock.Request{SKU: sku, ID: id, User: user, Qty: qty, Retry: true}
		var rc stock.Receipt
		if op == "deduct" {
			rc, err = r.Deduct(ctx, req)
		} else {
			rc, err = r.Hold(ctx, req, time.Hour)
		}
		retryCheckRefusal(t, "the retry", rc, err, kind, rem)
		recorded, err := r.Ledger(ctx, sku, id)
		if err != nil {
			t.Fatalf("Ledger of the refused retry: %v", err)
		}
		t.Logf("recorded: %+v", recorded)
		if recorded.Taken() {
			t.Errorf("the refused retry's entry is Taken: %+v", recorded)
		}
		checkLedger(t, r, sku, 3)

		// Stock comes back: a restore, a cancel, a restock.
		must(t)(r.Restore(ctx, sku, "pre:1"))
		must(t)(r.Cancel(ctx, sku, "pre:h~"))
		must(t)(r.Restock(ctx, sku, "rs:1~", 10))

		plain := req
		plain.Retry = false
		repeats := []struct {
			name string
			f    func() (stock.Receipt, error)
		}{
			{"late first attempt (Deduct, no Retry)", func() (stock.Receipt, error) {
				if op == "hold" {
					return r.Hold(ctx, plain, time.Hour)
				}
				return r.Deduct(ctx, plain)
			}},
			{"Deduct", func() (stock.Receipt, error) { return r.Deduct(ctx, plain) }},
			{"Deduct Retry", func() (stock.Receipt, error) { return r.Deduct(ctx, req) }},
			{"Hold", func() (stock.Receipt, error) { return r.Hold(ctx, plain, time.Hour) }},
			{"Hold Retry", func() (stock.Receipt, error) { return r.Hold(ctx, req, time.Hour) }},
			{"second Reserver Deduct", func() (stock.Receipt, error) { return r2.Deduct(ctx, plain) }},
			{"second Reserver Hold Retry", func() (stock.Receipt, error) { return r2.Hold(ctx, req, time.Minute) }},
		}
		for i := 0; i < 1; i++ {
			for _, rp := range repeats {
				before := levels(t, r, sku)
				pb := retryPending(t, r, sku)
				refused(t, rp.name, kind, rem)(rp.f())
				after := levels(t, r, sku)
				if before != after {
					t.Errorf("%s changed the levels: %+v -> %+v", rp.name, before, after)
				}
				if pa := retryPending(t, r, sku); pa != pb {
					t.Errorf("%s queued events: pending %d -> %d", rp.name, pb, pa)
				}
			}
		}
		// Carts with the same id: the line of sku must refuse, and the other item is
		// given back whole.
		ob := levels(t, r, other)
		sb := levels(t, r, sku)
		cart := stock.Cart{ID: id, User: user, Lines: []stock.Line{{SKU: other, Qty: 1}, {SKU: sku, Qty: qty}}}
		_, err = r.HoldMany(ctx, stock.Cart{ID: id + "h", User: user, Lines: []stock.Line{{SKU: sku, Qty: qty}}}, time.Hour)
		if err != nil {
			t.Errorf("HoldMany of another id: %v", err) // sanity: there is stock
		} else if _, err := r.CancelMany(ctx, id+"h", sku); err != nil {
			t.Fatal(err)
		}
		for i, rr := range []*stock.Reserver{r2, r} {
			if op == "deduct" {
				_, err = rr.DeductMany(ctx, cart)
			} else {
				_, err = rr.HoldMany(ctx, cart, time.Hour)
			}
			retryCheckCartRefusal(t, fmt.Sprintf("cart of the id, copy %d", i), err, kind, sku)
		}
		if oa := levels(t, r, other); oa != ob {
			t.Errorf("the refused cart kept stock of %s: %+v -> %+v", other, ob, oa)
		}
		if sa := levels(t, r, sku); sa != sb {
			t.Errorf("the refused carts changed %s: %+v -> %+v", sku, sb, sa)
		}
		// After the carts, still the same answer.
		refused(t, "Deduct after carts", kind, rem)(r.Deduct(ctx, plain))
		refused(t, "Hold Retry after carts", kind, rem)(r2.Hold(ctx, req, time.Hour))

		got := entry(t, r, sku, id)
		if got != recorded {
			t.Errorf("the recorded refusal changed: %+v -> %+v", recorded, got)
		}
		checkLedger(t, r, sku, 3)
		checkLedger(t, r, other, 5)
		// The stock is all there for others: the repeats took none.
		lv := levels(t, r, sku)
		if lv.Available != 13-int64(b2i(kind == stock.ErrSoldOut)) {
			t.Errorf("available %d after the repeats, levels %+v", lv.Available, lv)
		}
	})
}

// ---------- the sold-out fast path sees an ErrInsufficient refusal recorded after the filter started ----------

func TestRetryRefusalFastPath(t *testing.T) {
	splits := []int{1, 3}
	// The fast path needs client-side caching: miniredis runs none.
	retryEach(t, true, retrySplitNames(splits), func(t *testing.T, b redistest.Backend, i int) {
		split := splits[i]
		r, r2 := retryPair(t, b, stock.WithBuckets(func(string) int { return split }))
		var err error
		sku := "fa:st~1"
		require.NoError(t, r.Load(ctx, sku, 1))
		must(t)(r.Deduct(ctx, stock.Request{SKU: sku, ID: "a", User: "ua", Qty: 1}))
		// Sold out: refusals start and complete the filter.
		for i := 0; i < 10; i++ {
			_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("so:%d", i), User: fmt.Sprintf("so%d", i), Qty: 1})
			if !errors.Is(err, stock.ErrSoldOut) {
				t.Fatalf("sold-out refusal %d: %v", i, err)
			}
		}
		// Two ids refused for stock by a Retry while the item is short, the filter running:
		// one sold out (recorded Remaining 0), then restock 2 and one insufficient.
		idS, idI := "rt:so~1", "rt:in~1"
		refused(t, "retry sold out", stock.ErrSoldOut, 0)(r.Deduct(ctx, stock.Request{SKU: sku, ID: idS, User: "ux", Qty: 1, Retry: true}))
		must(t)(r.Restock(ctx, sku, "rs:1", 2))
		rc, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: idI, User: "uy", Qty: 5, Retry: true})
		remI := rc.Remaining
		if !errors.Is(err, stock.ErrInsufficient) || remI <= 0 {
			t.Fatalf("retry insufficient: %+v %v", rc, err)
		}
		// Sold out again.
		must(t)(r2.Deduct(ctx, stock.Request{SKU: sku, ID: "b", User: "ub", Qty: 2}))
		for i := 0; i < 10; i++ {
			_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("so2:%d", i), User: fmt.Sprintf("so%d", i), Qty: 1})
			if !errors.Is(err, stock.ErrSoldOut) {
				t.Fatalf("sold-out refusal %d: %v", i, err)
			}
		}
		before := stockops.SoldOutAnswers(r)
		for i := 0; i < 20; i++ {
			_, _ = r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("so3:%d", i), User: fmt.Sprintf("so%d", i), Qty: 1})
			_, _ = r2.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("so4:%d", i), User: fmt.Sprintf("so%d", i), Qty: 1})
		}
		t.Logf("fast-path answers: %d more", stockops.SoldOutAnswers(r)-before)
		if stockops.SoldOutAnswers(r) == before {
			t.Logf("note: the fast path did not answer on this backend")
		}
		for i := 0; i < 5; i++ {
			for j, rr := range []*stock.Reserver{r, r2} {
				refused(t, fmt.Sprintf("repeat insufficient via reserver %d", j), stock.ErrInsufficient, remI)(
					rr.Deduct(ctx, stock.Request{SKU: sku, ID: idI, User: "uy", Qty: 5}))
				refused(t, fmt.Sprintf("repeat insufficient as hold via reserver %d", j), stock.ErrInsufficient, remI)(
					rr.Hold(ctx, stock.Request{SKU: sku, ID: idI, User: "uy", Qty: 5}, time.Minute))
				refused(t, fmt.Sprintf("repeat sold out via reserver %d", j), stock.ErrSoldOut, 0)(
					rr.Deduct(ctx, stock.Request{SKU: sku, ID: idS, User: "ux", Qty: 1}))
				rc, err = rr.Deduct(ctx, stock.Request{SKU: sku, ID: "b", User: "ub", Qty: 2})
				if err != nil || !rc.Replayed {
					t.Errorf("replay of a sale under the fast path: %+v %v", rc, err)
				}
			}
		}
		// Stock back: the recorded ids stay refused, with the recorded Remaining.
		must(t)(r2.Restock(ctx, sku, "rs:2", 50))
		refused(t, "repeat insufficient after restock", stock.ErrInsufficient, remI)(
			r.Deduct(ctx, stock.Request{SKU: sku, ID: idI, User: "uy", Qty: 5}))
		refused(t, "repeat sold out after restock", stock.ErrSoldOut, 0)(
			r.Deduct(ctx, stock.Request{SKU: sku, ID: idS, User: "ux", Qty: 1}))
		checkLedger(t, r, sku, 1)
	})
}

// ---------- large numbers: the Remaining a refusal recorded must come back exactly ----------

func TestRetryRefusalLargeNumbers(t *testing.T) {
	avails := []int64{999_999_999_999_999, 1_000_000_000_000_003, 4_503_599_627_370_497, stock.MaxQty - 1}
	var names []string
	for _, avail := range avails {
		names = append(names, fmt.Sprintf("%d", avail))
	}
	retryEach(t, false, names, func(t *testing.T, b redistest.Backend, i int) {
		avail := avails[i]
		r := newReserver(t, b.Client(t))
		sku := "big:~1"
		require.NoError(t, r.Load(ctx, sku, avail))
		req := stock.Request{SKU: sku, ID: "big:id~", User: "u", Qty: stock.MaxQty, Retry: true}
		refused(t, "retry", stock.ErrInsufficient, avail)(r.Deduct(ctx, req))
		e, err := r.Ledger(ctx, sku, req.ID)
		if err != nil || e.Qty != stock.MaxQty || e.After != avail {
			t.Errorf("ledger: %+v %v", e, err)
		}
		req.Retry = false
		refused(t, "late first attempt", stock.ErrInsufficient, avail)(r.Deduct(ctx, req))
		refused(t, "hold", stock.ErrInsufficient, avail)(r.Hold(ctx, req, time.Minute))
		checkLedger(t, r, sku, avail)
	})
}

// ---------- holds that expire: the refusal stays, whatever the expiry gave back ----------

func TestRetryRefusalHoldExpiry(t *testing.T) {
	retryEachEnv(t, func(t *testing.T, cfg retryConfig, env *retryEnv) {
		r := env.Reserver
		r2 := newReserver(t, env.Client, cfg.opts...)
		sku := "ex:p~1"
		require.NoError(t, r.Load(ctx, sku, 3))
		must(t)(r.Hold(ctx, stock.Request{SKU: sku, ID: "h:1", User: "h1", Qty: 2}, time.Minute))
		// Insufficient: 1 left, asks 2.
		refused(t, "retry hold insufficient", stock.ErrInsufficient, 1)(
			r.Hold(ctx, stock.Request{SKU: sku, ID: "x:in~", User: "x", Qty: 2, Retry: true}, time.Minute))
		must(t)(r.Hold(ctx, stock.Request{SKU: sku, ID: "h:2", User: "h2", Qty: 1}, time.Minute))
		// Sold out.
		refused(t, "retry deduct sold out", stock.ErrSoldOut, 0)(
			r.Deduct(ctx, stock.Request{SKU: sku, ID: "x:so~", User: "y", Qty: 1, Retry: true}))
		env.Advance(2 * time.Minute) // both holds are due
		refused(t, "late hold after expiry", stock.ErrInsufficient, 1)(
			r2.Hold(ctx, stock.Request{SKU: sku, ID: "x:in~", User: "x", Qty: 2}, time.Minute))
		refused(t, "late deduct after expiry", stock.ErrSoldOut, 0)(r2.Deduct(ctx, stock.Request{SKU: sku, ID: "x:so~", User: "y", Qty: 1}))
		_, err := stockops.Sweep(ctx, r, sku)
		require.NoError(t, err)
		refused(t, "deduct retry after sweep", stock.ErrInsufficient, 1)(
			r.Deduct(ctx, stock.Request{SKU: sku, ID: "x:in~", User: "x", Qty: 2, Retry: true}))
		refused(t, "hold retry after sweep", stock.ErrSoldOut, 0)(
			r.Hold(ctx, stock.Request{SKU: sku, ID: "x:so~", User: "y", Qty: 1, Retry: true}, time.Minute))
		lv := levels(t, r, sku)
		if lv.Available != 3 || lv.Held != 0 || lv.Sold != 0 {
			t.Errorf("levels after expiry and repeats: %+v", lv)
		}
		checkLedger(t, r, sku, 3)
	})
}

// A retry refused while a hold is due: the due hold goes back first (documented), so the
// recorded refusal must carry the stock after that release, and so must its repeats.
func TestRetryRefusalDueHoldFirst(t *testing.T) {
	retryEachEnv(t, func(t *testing.T, cfg retryConfig, env *retryEnv) {
		r := env.Reserver
		sku := "du:e~1"
		require.NoError(t, r.Load(ctx, sku, 2))
		must(t)(r.Hold(ctx, stock.Request{SKU: sku, ID: "h:1", User: "h1", Qty: 2}, time.Minute))
		env.Advance(2 * time.Minute)
		refused(t, "retry with a due hold", stock.ErrInsufficient, 2)(
			r.Deduct(ctx, stock.Request{SKU: sku, ID: "x~1", User: "x", Qty: 3, Retry: true}))
		refused(t, "repeat", stock.ErrInsufficient, 2)(r.Deduct(ctx, stock.Request{SKU: sku, ID: "x~1", User: "x", Qty: 3}))
		checkLedger(t, r, sku, 2)
	})
}

// The filter is built from the ledger in HSCAN steps after the first sell-out. Retry refusals
// recorded while that build is under way (stock came back in between) must still be seen by
// the fast path once the item is sold out again and the build is complete.
func TestRetryRefusalFastPathMidBuild(t *testing.T) {
	retryEach(t, true, []string{"all"}, func(t *testing.T, b redistest.Backend, _ int) {
		r, r2 := retryPair(t, b)
		sku := "mid:bu~ild"
		const n = 700
		require.NoError(t, r.Load(ctx, sku, n))
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				for i := g; i < n; i += 8 {
					if _, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("s:%d~", i), User: fmt.Sprintf("u%d", i), Qty: 1}); err != nil {
						t.Error(err)
						return
					}
				}
			}(g)
		}
		wg.Wait()
		// The first sold-out refusal starts the filter; its build has a long way to go.
		if _, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: "so:0", User: "z", Qty: 1}); !errors.Is(err, stock.ErrSoldOut) {
			t.Fatalf("first sold out: %v", err)
		}
		must(t)(r.Restock(ctx, sku, "rs:1", 3))
		var ids []string
		for i := 0; i < 60; i++ {
			id := fmt.Sprintf("rt:%d~x", i)
			refused(t, "retry", stock.ErrInsufficient, 3)(r2.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: "w", Qty: 5, Retry: true}))
			ids = append(ids, id)
		}
		must(t)(r.Deduct(ctx, stock.Request{SKU: sku, ID: "last", User: "l", Qty: 3}))
		for i := 0; i < 40; i++ { // complete the build
			_, _ = r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("so2:%d", i), User: "z", Qty: 1})
		}
		before := stockops.SoldOutAnswers(r)
		for i := 0; i < 20; i++ {
			_, _ = r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("so3:%d", i), User: "z", Qty: 1})
		}
		t.Logf("fast path answered %d of 20 new ids", stockops.SoldOutAnswers(r)-before)
		bad := 0
		for _, id := range ids {
			for _, rr := range []*stock.Reserver{r, r2} {
				rc, err := rr.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: "w", Qty: 5})
				if !errors.Is(err, stock.ErrInsufficient) || rc.Remaining != 3 {
					bad++
					if bad < 5 {
						t.Errorf("repeat of %s: %+v %v, want ErrInsufficient Remaining 3", id, rc, err)
					}
				}
			}
		}
		if bad > 0 {
			t.Errorf("%d repeats of recorded refusals answered wrongly", bad)
		}
		checkLedger(t, r, sku, n)
	})
}

// ---------- the per-user limit ----------

func TestRetryRefusalUserLimit(t *testing.T) {
	splits := []int{1, 4}
	retryEach(t, false, retrySplitNames(splits), func(t *testing.T, b redistest.Backend, i int) {
		split := splits[i]
		r := newReserver(t, b.Client(t), stock.WithUserLimit(2), stock.WithBuckets(func(string) int { return split }))
		sku := "li:mit~"
		u := "al:ice~"
		require.NoError(t, r.Load(ctx, sku, 1))
		refused(t, "retry", stock.ErrInsufficient, 1)(r.Deduct(ctx, stock.Request{SKU: sku, ID: "x:1", User: u, Qty: 2, Retry: true}))
		must(t)(r.Deduct(ctx, stock.Request{SKU: sku, ID: "y:1", User: u, Qty: 1}))
		// Sold out and u has 1: a retry refused as sold out.
		refused(t, "retry 2", stock.ErrSoldOut, 0)(
			r.Hold(ctx, stock.Request{SKU: sku, ID: "x:2", User: u, Qty: 1, Retry: true}, time.Minute))
		must(t)(r.Restock(ctx, sku, "rs", 10))
		must(t)(r.Deduct(ctx, stock.Request{SKU: sku, ID: "z:1", User: u, Qty: 1}))
		// u is at the limit: the repeats must still answer the recorded refusals.
		refused(t, "repeat x:1 at the limit", stock.ErrInsufficient, 1)(r.Deduct(ctx, stock.Request{SKU: sku, ID: "x:1", User: u, Qty: 2}))
		refused(t, "repeat x:2 at the limit", stock.ErrSoldOut, 0)(
			r.Hold(ctx, stock.Request{SKU: sku, ID: "x:2", User: u, Qty: 1}, time.Minute))
		for _, id := range []string{"y:1", "z:1"} {
			must(t)(r.Restore(ctx, sku, id))
		}
		refused(t, "repeat x:1 after restores", stock.ErrInsufficient, 1)(
			r.Deduct(ctx, stock.Request{SKU: sku, ID: "x:1", User: u, Qty: 2, Retry: true}))
		rc, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: "x:2", User: u, Qty: 1, Retry: true})
		retryCheckRefusal(t, "repeat x:2 after restores", rc, err, stock.ErrSoldOut, 0)
		// The repeats counted nothing against u: u may still take 2.
		if rc, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: "w:1", User: u, Qty: 2}); err != nil {
			t.Errorf("u cannot take 2 after the repeats: %+v %v", rc, err)
		}
		// A retry refused for the limit records nothing (only stock refusals are recorded).
		rc, err = r.Deduct(ctx, stock.Request{SKU: sku, ID: "v:1", User: u, Qty: 1, Retry: true})
		if !errors.Is(err, stock.ErrUserLimit) {
			t.Errorf("retry over the limit: %+v %v", rc, err)
		}
		if e, err := r.Ledger(ctx, sku, "v:1"); !errors.Is(err, stock.ErrUnknownID) {
			t.Logf("note: a retry refused for the limit left an entry: %+v %v", e, err)
		}
		checkLedger(t, r, sku, 1)
	})
}

// ---------- other operations on the refused id ----------

func TestRetryRefusalOtherOps(t *testing.T) {
	retryEach(t, false, retryConfigNames(retryConfigs), func(t *testing.T, b redistest.Backend, i int) {
		cfg := retryConfigs[i]
		r := newReserver(t, b.Client(t), cfg.opts...)
		sku := "op:s~"
		id := "x:~1"
		require.NoError(t, r.Load(ctx, sku, 1))
		refused(t, "retry", stock.ErrInsufficient, 1)(r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: "u", Qty: 2, Retry: true}))
		recorded := entry(t, r, sku, id)
		lv0 := levels(t, r, sku)
		steps := []struct {
			name string
			f    func() (stock.Receipt, error)
		}{
			{"Restock with the id", func() (stock.Receipt, error) { return r.Restock(ctx, sku, id, 5) }},
			{"Restore", func() (stock.Receipt, error) { return r.Restore(ctx, sku, id) }},
			{"Cancel", func() (stock.Receipt, error) { return r.Cancel(ctx, sku, id) }},
			{"Confirm", func() (stock.Receipt, error) { return r.Confirm(ctx, sku, id) }},
			{"Extend", func() (stock.Receipt, error) { return r.Extend(ctx, sku, id, time.Minute) }},
			{"stockops.Refuse", func() (stock.Receipt, error) { return stockops.Refuse(ctx, r, sku, id) }},
		}
		for _, st := range steps {
			rc, err := st.f()
			t.Logf("%s: %+v %v", st.name, rc, err)
			if err == nil {
				t.Errorf("%s of a refused id succeeded: %+v", st.name, rc)
			}
			if lv := levels(t, r, sku); lv != lv0 {
				t.Errorf("%s changed the levels: %+v -> %+v", st.name, lv0, lv)
			}
			rc, err = r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: "u", Qty: 2})
			retryCheckRefusal(t, "repeat after "+st.name, rc, err, stock.ErrInsufficient, 1)
		}
		if got, err := r.Ledger(ctx, sku, id); err != nil || got != recorded {
			t.Errorf("the recorded refusal changed: %+v -> %+v %v", recorded, got, err)
		}
		// A closed item: what does the repeat answer?
		require.NoError(t, r.CloseItem(ctx, sku))
		rc, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: "u", Qty: 2})
		t.Logf("repeat on a closed item: %+v %v", rc, err)
		require.NoError(t, r.ReopenItem(ctx, sku))
		refused(t, "repeat after reopen", stock.ErrInsufficient, 1)(r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: "u", Qty: 2}))
		checkLedger(t, r, sku, 1)
	})
}

// ---------- a one-script cart (WithGroups) with the refused id ----------

func TestRetryRefusalGroupCart(t *testing.T) {
	kinds := []error{stock.ErrSoldOut, stock.ErrInsufficient}
	retryEach(t, false, []string{stock.Outcome(kinds[0]), stock.Outcome(kinds[1])}, func(t *testing.T, b redistest.Backend, i int) {
		kind := kinds[i]
		r := newReserver(t, b.Client(t), stock.WithGroups(func(string) string { return "gr:p~" }))
		var err error
		a, x := "a:item~", "x:item~"
		require.NoError(t, r.Load(ctx, a, 5))
		load := int64(1)
		if kind == stock.ErrSoldOut {
			load = 0
		}
		require.NoError(t, r.Load(ctx, x, load))
		id := "ca:rt~1"
		refused(t, "retry", kind, load)(r.Deduct(ctx, stock.Request{SKU: x, ID: id, User: "u", Qty: 2, Retry: true}))
		must(t)(r.Restock(ctx, x, "rs", 10))
		la := levels(t, r, a)
		for _, hold := range []bool{false, true} {
			cart := stock.Cart{ID: id, User: "u", Lines: []stock.Line{{SKU: a, Qty: 1}, {SKU: x, Qty: 2}}}
			var cr stock.CartReceipt
			if hold {
				cr, err = r.HoldMany(ctx, cart, time.Minute)
			} else {
				cr, err = r.DeductMany(ctx, cart)
			}
			if err == nil {
				t.Errorf("group cart (hold %v) with the refused id was taken: %+v", hold, cr)
			} else {
				retryCheckCartRefusal(t, fmt.Sprintf("group cart (hold %v)", hold), err, kind, x)
			}
		}
		if lv := levels(t, r, a); lv != la {
			t.Errorf("the group cart changed %s: %+v -> %+v", a, la, lv)
		}
		refused(t, "repeat after the carts", kind, load)(r.Deduct(ctx, stock.Request{SKU: x, ID: id, User: "u", Qty: 2}))
		checkLedger(t, r, x, load)
		checkLedger(t, r, a, 5)
	})
}

// ---------- split items: a refusal must only come when the buckets together cannot serve ----------

func TestRetryRefusalBucketsNoPhantomRefusal(t *testing.T) {
	tcs := []struct {
		buckets   int
		load, qty int64
	}{{64, 64, 64}, {64, 640, 600}, {16, 33, 33}, {7, 100, 99}}
	var names []string
	for _, tc := range tcs {
		names = append(names, fmt.Sprintf("%d-%d-%d", tc.buckets, tc.load, tc.qty))
	}
	retryEach(t, false, names, func(t *testing.T, b redistest.Backend, i int) {
		tc := tcs[i]
		r := newReserver(t, b.Client(t), stock.WithBuckets(func(string) int { return tc.buckets }))
		sku := "sp:lit~"
		require.NoError(t, r.Load(ctx, sku, tc.load))
		rc, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: "x:1~", User: "u:1", Qty: tc.qty, Retry: true})
		if err != nil {
			t.Errorf("retry of %d of %d over %d buckets refused: %+v %v", tc.qty, tc.load, tc.buckets, rc, err)
			rc2, err2 := r.Deduct(ctx, stock.Request{SKU: sku, ID: "x:1~", User: "u:1", Qty: tc.qty})
			t.Logf("and it is final: %+v %v; levels %+v", rc2, err2, levels(t, r, sku))
		} else if rc.Remaining != tc.load-tc.qty {
			t.Logf("remaining in the bucket %d (item %d)", rc.Remaining, tc.load-tc.qty)
		}
		// Over: one more than the whole.
		rc, err = r.Hold(ctx, stock.Request{SKU: sku, ID: "x:2~", User: "u:2", Qty: tc.load - tc.qty + 1, Retry: true}, time.Minute)
		if !errors.Is(err, stock.ErrInsufficient) && !errors.Is(err, stock.ErrSoldOut) {
			t.Errorf("over-ask: %+v %v", rc, err)
		}
		if errors.Is(err, stock.ErrSoldOut) && rc.Remaining != 0 || errors.Is(err, stock.ErrInsufficient) && rc.Remaining == 0 {
			t.Errorf("refusal kind does not match its Remaining: %+v %v", rc, err)
		}
		kind := err
		rc2, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: "x:2~", User: "u:2", Qty: tc.load - tc.qty + 1})
		if stock.Outcome(err) != stock.Outcome(kind) || rc2.Remaining != rc.Remaining {
			t.Errorf("repeat answered %+v %v, the retry %+v %v", rc2, err, rc, kind)
		}
		levels(t, r, sku)
	})
}

// ---------- concurrency ----------

var retryConcConfigs = []retryConfig{
	{"plain", nil},
	{"coalesce1", []stock.Option{stock.WithCoalescing(1)}},
	{"buckets4", []stock.Option{stock.WithBuckets(func(string) int { return 4 })}},
}

// Many goroutines repeat one refused id (Deduct, Hold, with and without Retry, from two
// Reservers) while another restocks and another sells and gives back other ids.
func TestRetryRefusalRepeatConcurrentRestock(t *testing.T) {
	type concCase struct {
		cfg  retryConfig
		kind error
	}
	var cases []concCase
	var names []string
	for _, cfg := range retryConcConfigs {
		for _, kind := range []error{stock.ErrSoldOut, stock.ErrInsufficient} {
			cases = append(cases, concCase{cfg, kind})
			names = append(names, cfg.name+"/"+stock.Outcome(kind))
		}
	}
	retryEach(t, false, names, func(t *testing.T, b redistest.Backend, i int) {
		cfg, kind := cases[i].cfg, cases[i].kind
		r, r2 := retryPair(t, b, cfg.opts...)
		sku := "co:nc~1"
		load := int64(2)
		if kind == stock.ErrSoldOut {
			load = 0
		}
		require.NoError(t, r.Load(ctx, sku, load))
		id, user := "x:~id", "x:~u"
		rc, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: user, Qty: 3, Retry: true})
		retryCheckRefusal(t, "retry", rc, err, kind, load)
		recorded := entry(t, r, sku, id)
		const restocks = 15
		var wg sync.WaitGroup
		var mu sync.Mutex
		var bad []string
		stop := make(chan struct{})
		wg.Add(1)
		go func() { // restocker
			defer wg.Done()
			for i := 0; i < restocks; i++ {
				if _, err := r2.Restock(ctx, sku, fmt.Sprintf("rs:%d~", i), 1); err != nil {
					t.Error(err)
				}
			}
		}()
		var churned int64
		wg.Add(1)
		go func() { // churn: others sell and give back
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				oid := fmt.Sprintf("o:%d~", i)
				if _, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: oid, User: fmt.Sprintf("o%d", i%5), Qty: 1}); err == nil {
					if _, err := r2.Restore(ctx, sku, oid); err != nil {
						t.Error(err)
					}
					churned++
				}
			}
		}()
		goroutines, per := 10, 12
		if cfg.name == "buckets4" {
			goroutines, per = 6, 10 // split items are slow under contention
		}
		var rep sync.WaitGroup
		for g := 0; g < goroutines; g++ {
			rep.Add(1)
			go func(g int) {
				defer rep.Done()
				rr := r
				if g%2 == 1 {
					rr = r2
				}
				for i := 0; i < per; i++ {
					req := stock.Request{SKU: sku, ID: id, User: user, Qty: 3, Retry: i%3 == 0}
					var rc stock.Receipt
					var err error
					if (g+i)%2 == 0 {
						rc, err = rr.Deduct(ctx, req)
					} else {
						rc, err = rr.Hold(ctx, req, time.Minute)
					}
					if !errors.Is(err, kind) || rc.Remaining != load || rc.Replayed {
						mu.Lock()
						bad = append(bad, fmt.Sprintf("g%d i%d: %+v %v", g, i, rc, err))
						mu.Unlock()
					}
				}
			}(g)
		}
		rep.Wait()
		close(stop)
		wg.Wait()
		t.Logf("churned %d other sales", churned)
		if len(bad) > 0 {
			t.Errorf("%d repeats answered otherwise than %v Remaining %d, e.g. %v", len(bad), kind, load, bad[:min(len(bad), 5)])
		}
		if got, err := r.Ledger(ctx, sku, id); err != nil || got != recorded {
			t.Errorf("the recorded refusal changed: %+v -> %+v %v", recorded, got, err)
		}
		lv := levels(t, r, sku)
		if lv.Available != load+restocks || lv.Held != 0 || lv.Sold != 0 {
			t.Errorf("levels %+v, want available %d and nothing held or sold", lv, load+restocks)
		}
		checkLedger(t, r, sku, load)
	})
}

// The first attempt and its retry race each other while stock comes back: the retry's refusal,
// if there is one, must be final: no copy of the id takes stock.
func TestRetryRefusalRaceFirstAttempt(t *testing.T) {
	type raceCase struct {
		cfg  retryConfig
		hold bool
	}
	var cases []raceCase
	var names []string
	for _, cfg := range retryConcConfigs {
		for _, hold := range []bool{false, true} {
			cases = append(cases, raceCase{cfg, hold})
			names = append(names, fmt.Sprintf("%s/hold=%v", cfg.name, hold))
		}
	}
	retryEach(t, false, names, func(t *testing.T, b redistest.Backend, i int) {
		cfg, hold := cases[i].cfg, cases[i].hold
		r, r2 := retryPair(t, b, cfg.opts...)
		sku := "ra:ce~"
		require.NoError(t, r.Load(ctx, sku, 0))
		var refusedRounds, takenRounds int
		for round := 0; round < 25; round++ {
			id := fmt.Sprintf("x:%d~", round)
			user := fmt.Sprintf("u:%d", round)
			type ans struct {
				retry bool
				rc    stock.Receipt
				err   error
			}
			var mu sync.Mutex
			var answers []ans
			var wg sync.WaitGroup
			start := make(chan struct{})
			for g := 0; g < 8; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					<-start
					rr := r
					if g%2 == 1 {
						rr = r2
					}
					req := stock.Request{SKU: sku, ID: id, User: user, Qty: 2, Retry: g >= 4}
					var rc stock.Receipt
					var err error
					if hold {
						rc, err = rr.Hold(ctx, req, time.Hour)
					} else {
						rc, err = rr.Deduct(ctx, req)
					}
					mu.Lock()
					answers = append(answers, ans{req.Retry, rc, err})
					mu.Unlock()
				}(g)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if _, err := r2.Restock(ctx, sku, "rs:"+id, int64(1+round%2)); err != nil {
					t.Error(err)
				}
			}()
			close(start)
			wg.Wait()
			var retryRefused []ans
			var taken, fresh int
			for _, a := range answers {
				switch {
				case a.err == nil:
					taken++
					if !a.rc.Replayed {
						fresh++
					}
				case errors.Is(a.err, stock.ErrSoldOut) || errors.Is(a.err, stock.ErrInsufficient):
					if a.retry {
						retryRefused = append(retryRefused, a)
					}
				default:
					t.Errorf("round %d: unexpected answer %+v %v", round, a.rc, a.err)
				}
			}
			if fresh > 1 {
				t.Errorf("round %d: %d fresh takes of one id", round, fresh)
			}
			if len(retryRefused) > 0 && taken > 0 {
				t.Errorf("round %d: a retry was refused (%v, Remaining %d) yet the id took stock: %+v", round, retryRefused[0].err, retryRefused[0].rc.Remaining, answers)
			}
			// Every refused retry told the same thing, and so does a late copy now.
			if len(retryRefused) > 0 {
				refusedRounds++
				// The retries refused before the record answer the record, so all alike.
				first := retryRefused[0]
				late, lerr := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: user, Qty: 2})
				if hold {
					late, lerr = r.Hold(ctx, stock.Request{SKU: sku, ID: id, User: user, Qty: 2}, time.Hour)
				}
				matched := false
				for _, a := range retryRefused {
					if stock.Outcome(a.err) == stock.Outcome(lerr) && a.rc.Remaining == late.Remaining {
						matched = true
					}
				}
				if !matched {
					t.Errorf("round %d: a late copy answered %+v %v; the refused retries got e.g. %+v %v", round, late, lerr, first.rc, first.err)
				}
			}
			if taken > 0 {
				takenRounds++
			}
			// Empty the item again for the next round, with a sale of its own.
			lv := levels(t, r, sku)
			if lv.Available > 0 {
				if _, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: "drain:" + id, Qty: lv.Available}); err != nil {
					t.Fatalf("drain: %v", err)
				}
			}
		}
		t.Logf("rounds with a refused retry: %d, with a take: %d", refusedRounds, takenRounds)
		checkLedger(t, r, sku, 0)
	})
}

// Retries refused on a split item while transfers move stock between buckets: every repeat
// answers what its retry got.
func TestRetryRefusalBucketsConcurrentRefusals(t *testing.T) {
	splits := []int{3}
	retryEach(t, false, retrySplitNames(splits), func(t *testing.T, b redistest.Backend, i int) {
		n := splits[i]
		r, r2 := retryPair(t, b, stock.WithBuckets(func(string) int { return n }))
		sku := "bu:ck~"
		require.NoError(t, r.Load(ctx, sku, 30))
		type refusal struct {
			req stock.Request
			rc  stock.Receipt
			err error
		}
		var mu sync.Mutex
		var refusals []refusal
		var wg sync.WaitGroup
		for g := 0; g < 6; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				rr := r
				if g%2 == 1 {
					rr = r2
				}
				for i := 0; i < 8; i++ {
					req := stock.Request{SKU: sku, ID: fmt.Sprintf("g%d:%d~", g, i), User: fmt.Sprintf("u:%d~%d", g, i%3), Qty: int64(1 + (g*7+i)%6), Retry: true}
					rc, err := rr.Deduct(ctx, req)
					switch {
					case err == nil:
						if i%4 == 0 {
							if _, err := rr.Restore(ctx, sku, req.ID); err != nil {
								t.Error(err)
							}
						}
					case errors.Is(err, stock.ErrSoldOut) || errors.Is(err, stock.ErrInsufficient):
						mu.Lock()
						refusals = append(refusals, refusal{req, rc, err})
						mu.Unlock()
					default:
						t.Errorf("%+v: %v", req, err)
					}
				}
			}(g)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				if _, err := r2.Restock(ctx, sku, fmt.Sprintf("rs%d", i), 2); err != nil {
					t.Error(err)
				}
				time.Sleep(time.Millisecond)
			}
		}()
		wg.Wait()
		_, err := r.Restock(ctx, sku, "rs:big", 1000)
		require.NoError(t, err)
		t.Logf("%d refusals", len(refusals))
		for _, f := range refusals {
			if errors.Is(f.err, stock.ErrSoldOut) != (f.rc.Remaining == 0) {
				t.Logf("note: refusal %v with Remaining %d", f.err, f.rc.Remaining)
			}
			req := f.req
			req.Retry = false
			for _, rr := range []*stock.Reserver{r, r2} {
				rc, err := rr.Deduct(ctx, req)
				if stock.Outcome(err) != stock.Outcome(f.err) || rc.Remaining != f.rc.Remaining {
					t.Errorf("%s: the retry got %v Remaining %d, a repeat %v Remaining %d", req.ID, f.err, f.rc.Remaining, err, rc.Remaining)
				}
			}
		}
		levels(t, r, sku)
		checkLedger(t, r, sku, 30)
	})
}

// Repeats of a refusal recorded on a split item, asking more than the whole item, run while
// other buyers of other buckets buy with Retry: the repeats pull the item's stock into their
// bucket (transfers), and no buyer may be refused while the item has plenty (a refused Retry
// would be final).
func TestRetryRefusalBucketsRepeatsNoPhantomForOthers(t *testing.T) {
	retryEach(t, false, []string{"all"}, func(t *testing.T, b redistest.Backend, _ int) {
		r, r2 := retryPair(t, b, stock.WithBuckets(func(string) int { return 4 }))
		sku := "ph:an~tom"
		require.NoError(t, r.Load(ctx, sku, 1000))
		big := stock.Request{SKU: sku, ID: "x:~", User: "u:~1", Qty: 1 << 40, Retry: true}
		refused(t, "retry", stock.ErrInsufficient, 1000)(r.Deduct(ctx, big))
		big.Retry = false
		var wg sync.WaitGroup
		stop := make(chan struct{})
		var mu sync.Mutex
		var wrong []string
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				rr := []*stock.Reserver{r, r2}[g%2]
				for {
					select {
					case <-stop:
						return
					default:
					}
					rc, err := rr.Deduct(ctx, big)
					if !errors.Is(err, stock.ErrInsufficient) || rc.Remaining != 1000 {
						mu.Lock()
						wrong = append(wrong, fmt.Sprintf("%+v %v", rc, err))
						mu.Unlock()
					}
				}
			}(g)
		}
		var lw sync.WaitGroup
		for g := 0; g < 6; g++ {
			lw.Add(1)
			go func(g int) {
				defer lw.Done()
				rr := []*stock.Reserver{r, r2}[g%2]
				for i := 0; i < 10; i++ {
					req := stock.Request{SKU: sku, ID: fmt.Sprintf("l%d:%d", g, i), User: fmt.Sprintf("v%d~%d", g, i), Qty: 2, Retry: true}
					if rc, err := rr.Deduct(ctx, req); err != nil {
						t.Errorf("%s refused while the item has %d+: %+v %v", req.ID, 1000-120, rc, err)
					}
				}
			}(g)
		}
		lw.Wait()
		close(stop)
		wg.Wait()
		if len(wrong) > 0 {
			t.Errorf("%d repeats answered otherwise, e.g. %v", len(wrong), wrong[0])
		}
		lv := levels(t, r, sku)
		if lv.Sold != 120 {
			t.Errorf("levels %+v, want 120 sold", lv)
		}
		checkLedger(t, r, sku, 1000)
	})
}

// ---------- the relay, the reconciler and the retention ----------

func TestRetryRefusalReconcile(t *testing.T) {
	retryEachEnv(t, func(t *testing.T, cfg retryConfig, env *retryEnv) {
		r := env.Reserver
		store := memstore.New()
		sku := "re:con~"
		require.NoError(t, store.Load(ctx, sku, 2))
		require.NoError(t, r.Load(ctx, sku, 2))
		must(t)(r.Deduct(ctx, stock.Request{SKU: sku, ID: "a:1", User: "a", Qty: 1}))
		id := "x:~1"
		rc, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: "u", Qty: 3, Retry: true})
		retryCheckRefusal(t, "retry", rc, err, stock.ErrInsufficient, 1)
		must(t)(r.Restock(ctx, sku, "rs:1", 5))
		must(t)(r.Restore(ctx, sku, "a:1"))
		relay := newRelay(t, r, store, nil, nil)
		rec := newReconciler(t, r, store, nil)
		pass := func(label string) {
			t.Helper()
			if _, err := relay.Once(ctx); err != nil {
				t.Fatalf("%s: relay: %v", label, err)
			}
			rep, err := rec.Item(ctx, sku)
			if err != nil {
				t.Fatalf("%s: reconcile: %v", label, err)
			}
			if rep.Drift != 0 || rep.Adjusted != 0 || rep.Rebuilt || rep.Requeued != 0 || rep.Rerecorded != 0 || rep.Resynced != 0 || rep.NeedsHuman != "" {
				t.Errorf("%s: the pass found or repaired something: %s", label, rep)
			}
			if _, ok := func() (stock.Record, bool) {
				m, err := store.Records(ctx, sku, []string{id})
				require.NoError(t, err)
				rec, ok := m[id]
				return rec, ok
			}(); ok {
				t.Errorf("%s: the store has a record of the refused id", label)
			}
			if rem, err := store.Remaining(ctx, sku); err != nil || rem != 7 {
				t.Errorf("%s: store remaining %d %v, want 7", label, rem, err)
			}
		}
		pass("first pass")
		refused(t, "repeat after a pass", stock.ErrInsufficient, 1)(r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: "u", Qty: 3}))
		env.Advance(23 * time.Hour)
		pass("pass within the retention")
		refused(t, "repeat within the retention", stock.ErrInsufficient, 1)(
			r.Hold(ctx, stock.Request{SKU: sku, ID: id, User: "u", Qty: 3}, time.Minute))
		checkLedger(t, r, sku, 2)
		// Past the retention the entry may be trimmed: the documented end of idempotency.
		env.Advance(2 * time.Hour)
		rep, err := rec.Item(ctx, sku)
		t.Logf("pass past the retention: %s %v", rep, err)
		rc, err = r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: "u", Qty: 3, Retry: true})
		t.Logf("a copy past the retention (documented: idempotency ends with the entry): %+v %v", rc, err)
	})
}

// ---------- WithReplicaAck: a refusal is never ErrNotReplicated ----------

// With WithReplicaAck(5, …) and fewer replicas (none, or the Sentinel backend's), a sale answers
// ErrNotReplicated: the units were taken, a failover could lose it. A refusal never does, even
// one that left a record the replicas lack (a Retry's, a Restore's tombstone): a caller that
// treats ErrNotReplicated as "taken" must not ship a refused order (WithReplicaAck's doc says
// what a failover can lose of such a record).
func TestRetryRefusalReplicaAck(t *testing.T) {
	// miniredis has no WAIT semantics worth testing: it runs none.
	retryEach(t, true, []string{"all"}, func(t *testing.T, b redistest.Backend, _ int) {
		r := newReserver(t, b.Client(t), stock.WithReplicaAck(5, 20*time.Millisecond))
		sku := "ack:~1"
		require.NoError(t, r.Load(ctx, sku, 1))
		t0 := time.Now()
		rc, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: "x:~", User: "u", Qty: 2, Retry: true})
		el := time.Since(t0)
		if !errors.Is(err, stock.ErrInsufficient) || rc.Remaining != 1 {
			t.Fatalf("retry: %+v %v", rc, err)
		}
		t.Logf("retry refusal: %v in %v", err, el)
		if _, err := r.Ledger(ctx, sku, "x:~"); err != nil {
			t.Fatalf("the refusal was not recorded: %v", err)
		}
		_, serr := r.Deduct(ctx, stock.Request{SKU: sku, ID: "y:~", User: "v", Qty: 1})
		t.Logf("a sale: %v", serr)
		if !errors.Is(serr, stock.ErrNotReplicated) {
			t.Fatalf("a sale without a replica: %v, want ErrNotReplicated", serr)
		}
		if errors.Is(err, stock.ErrNotReplicated) {
			t.Errorf("a Retry refused for stock says ErrNotReplicated (the units were taken): %v", err)
		}
		_, err = r.Restore(ctx, sku, "z:~")
		if !errors.Is(err, stock.ErrUnknownID) || errors.Is(err, stock.ErrNotReplicated) {
			t.Errorf("restore of an unknown id without a replica: %v, want a bare ErrUnknownID", err)
		}
		_, err = r.Deduct(ctx, stock.Request{SKU: sku, ID: "w:~", User: "w", Qty: 5})
		if !errors.Is(err, stock.ErrSoldOut) || errors.Is(err, stock.ErrNotReplicated) {
			t.Errorf("a first refusal without Retry (the sale took the last unit): %v, want a bare ErrSoldOut", err)
		}
	})
}

// ---------- a repeat with another quantity or user ----------

// The guarantees say a repeat with another quantity or user is ErrConflict; the Retry doc says
// every later request of the id gets the recorded refusal. Either way it must take nothing.
func TestRetryRefusalRepeatOtherParams(t *testing.T) {
	retryEach(t, false, retryConfigNames(retryConfigs), func(t *testing.T, b redistest.Backend, i int) {
		cfg := retryConfigs[i]
		r := newReserver(t, b.Client(t), cfg.opts...)
		sku := "pa:ram~"
		require.NoError(t, r.Load(ctx, sku, 2))
		id := "x:~"
		refused(t, "retry", stock.ErrInsufficient, 2)(r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: "u", Qty: 3, Retry: true}))
		lv := levels(t, r, sku)
		for _, req := range []stock.Request{
			{SKU: sku, ID: id, User: "u", Qty: 1},
			{SKU: sku, ID: id, User: "u", Qty: 2, Retry: true},
			{SKU: sku, ID: id, User: "other", Qty: 3},
			{SKU: sku, ID: id, Qty: 3},
		} {
			rc, err := r.Deduct(ctx, req)
			t.Logf("%+v -> %+v %v", req, rc, err)
			if err == nil {
				t.Errorf("a copy of the refused id with other parameters took stock: %+v", rc)
			} else if !errors.Is(err, stock.ErrConflict) && !(errors.Is(err, stock.ErrInsufficient) && rc.Remaining == 2) {
				t.Errorf("%+v answered %v Remaining %d", req, err, rc.Remaining)
			}
			if errors.Is(err, stock.ErrInsufficient) && rc.Remaining >= req.Qty {
				t.Logf("note: ErrInsufficient for %d units with Remaining %d (the recorded answer, not a conflict)", req.Qty, rc.Remaining)
			}
		}
		if lv2 := levels(t, r, sku); lv2 != lv {
			t.Errorf("levels changed %+v -> %+v", lv, lv2)
		}
	})
}

// ---------- long names full of ':' and '~', on split items ----------

func TestRetryRefusalLongNames(t *testing.T) {
	splits := []int{1, 64}
	retryEach(t, false, retrySplitNames(splits), func(t *testing.T, b redistest.Backend, i int) {
		split := splits[i]
		r := newReserver(t, b.Client(t), stock.WithBuckets(func(string) int { return split }), stock.WithPrefix("p:~x"))
		sku := strings.Repeat("s:~", 42) + "zz" // 128 bytes
		id := strings.Repeat("~:", 64)
		user := strings.Repeat("u~", 64)
		require.NoError(t, r.Load(ctx, sku, 5))
		refused(t, "retry", stock.ErrInsufficient, 5)(r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: user, Qty: 6, Retry: true}))
		must(t)(r.Restock(ctx, sku, id[:127]+"x", 3))
		rc, err := r.Hold(ctx, stock.Request{SKU: sku, ID: id, User: user, Qty: 6}, time.Minute)
		retryCheckRefusal(t, "repeat", rc, err, stock.ErrInsufficient, 5)
		if e, err := r.Ledger(ctx, sku, id); err != nil || e.ID != id || e.User != user || e.SKU != sku || e.Qty != 6 || e.After != 5 {
			t.Errorf("ledger: %+v %v", e, err)
		}
		checkLedger(t, r, sku, 5)
	})
}

// ---------- time moved by hand: WithClock on a miniredis whose clock stands still ----------

func TestRetryRefusalWithClock(t *testing.T) {
	_, c := redistest.Miniredis(t)
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) {
		mu.Lock()
		now = now.Add(d)
		mu.Unlock()
		redistest.Sleep(c, d)
	}
	r := newReserver(t, c, stock.WithClock(clock))
	sku := "cl:ock~"
	require.NoError(t, r.Load(ctx, sku, 1))
	must(t)(r.Hold(ctx, stock.Request{SKU: sku, ID: "h:~", User: "h", Qty: 1}, time.Second))
	refused(t, "retry", stock.ErrSoldOut, 0)(r.Hold(ctx, stock.Request{SKU: sku, ID: "x:~", User: "x", Qty: 1, Retry: true}, time.Minute))
	advance(2 * time.Second)
	rc, err := r.Hold(ctx, stock.Request{SKU: sku, ID: "x:~", User: "x", Qty: 1}, time.Minute)
	retryCheckRefusal(t, "late first attempt after the hold expired", rc, err, stock.ErrSoldOut, 0)
	if rc, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: "y:~", User: "y", Qty: 1}); err != nil {
		t.Errorf("the expired unit is not for sale: %+v %v", rc, err)
	}
	if _, err := r.Confirm(ctx, sku, "h:~"); !errors.Is(err, stock.ErrExpired) {
		t.Errorf("confirm of the expired hold: %v", err)
	}
	checkLedger(t, r, sku, 1)
}

// retryEnv is a miniredis whose clock moves only with Advance, and a Reserver on the same clock
// (as package stocktest's Env, which the root module cannot import).
type retryEnv struct {
	Client   rueidis.Client
	Reserver *stock.Reserver
	m        *miniredis.Miniredis
	mu       sync.Mutex
	now      time.Time
}

func retryNewEnv(t *testing.T, opts ...stock.Option) *retryEnv {
	t.Helper()
	m, c := redistest.Miniredis(t)
	e := &retryEnv{Client: c, m: m, now: time.Now().Truncate(time.Microsecond)}
	m.SetTime(e.now)
	m.ClockTTL(true)
	e.Reserver = newReserver(t, c, append([]stock.Option{stock.WithClock(e.Now)}, opts...)...)
	return e
}

func (e *retryEnv) Now() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.now
}

func (e *retryEnv) Advance(d time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.now = e.now.Add(d)
	e.m.SetTime(e.now)
}

// retryEachEnv runs f for every case of retryConfigs on a retryEnv of its options.
func retryEachEnv(t *testing.T, f func(t *testing.T, cfg retryConfig, env *retryEnv)) {
	t.Helper()
	for _, cfg := range retryConfigs {
		t.Run(cfg.name, func(t *testing.T) { f(t, cfg, retryNewEnv(t, cfg.opts...)) })
	}
}

// retryEach runs f for every case (named by names) on every backend, the backends in
// parallel; with realOnly, a miniredis backend runs none of them (its leaf passes empty).
func retryEach(t *testing.T, realOnly bool, names []string, f func(t *testing.T, b redistest.Backend, i int)) {
	t.Helper()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			if realOnly && !b.Real() {
				return
			}
			for i, name := range names {
				t.Run(name, func(t *testing.T) { f(t, b, i) })
			}
		})
	}
}

// retryPair is two Reservers with opts on two clients of one backend.
func retryPair(t *testing.T, b redistest.Backend, opts ...stock.Option) (*stock.Reserver, *stock.Reserver) {
	t.Helper()
	c1, c2 := b.Pair(t)
	return newReserver(t, c1, opts...), newReserver(t, c2, opts...)
}

// retryConfigNames names the cases of a config table.
func retryConfigNames(cfgs []retryConfig) []string {
	names := make([]string, len(cfgs))
	for i, c := range cfgs {
		names[i] = c.name
	}
	return names
}

// retrySplitNames names the cases of a bucket count table.
func retrySplitNames(splits []int) []string {
	names := make([]string, len(splits))
	for i, n := range splits {
		names[i] = fmt.Sprintf("buckets%d", n)
	}
	return names
}

// A retry's refusal is the final answer for its id, of the kind the retry was told: a repeat
// after a restock answers ErrInsufficient (or ErrSoldOut) again, with the Remaining of then,
// never the other kind and never a take. On a plain item, a split one, and with the sold-out
// fast path answering for the item.
func TestRetryRefusalKeepsItsKind(t *testing.T) {
	configs := []struct {
		name string
		opts []stock.Option
	}{
		{"plain", nil},
		{"split", []stock.Option{stock.WithBuckets(func(string) int { return 3 })}},
		{"fastpath", []stock.Option{stock.WithSoldOutCache(time.Minute)}},
	}
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		for _, cf := range configs {
			t.Run(cf.name, func(t *testing.T) {
				r := newReserver(t, c, append([]stock.Option{stock.WithPrefix("rr-" + cf.name)}, cf.opts...)...)
				repeat := func(sku, id string, qty int64, want error, remaining int64) {
					t.Helper()
					for _, retry := range []bool{true, false, true} {
						rc := mustFail(t, want, "%s/%s retry=%v", sku, id, retry)(
							r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: qty, Retry: retry}))
						require.Equal(t, remaining, rc.Remaining, "%s/%s: the stock of the recorded refusal", sku, id)
					}
				}

				// Insufficient, then a restock that would serve it.
				require.NoError(t, r.Load(ctx, "A", 3))
				repeat("A", "big", 5, stock.ErrInsufficient, 3)
				must(t)(r.Restock(ctx, "A", "more", 10))
				repeat("A", "big", 5, stock.ErrInsufficient, 3)
				require.Equal(t, int64(13), levels(t, r, "A").Available, "the repeats took nothing")

				// Sold out, then a restock.
				require.NoError(t, r.Load(ctx, "B", 1))
				must(t)(r.Deduct(ctx, stock.Request{SKU: "B", ID: "b1", Qty: 1}))
				repeat("B", "late", 1, stock.ErrSoldOut, 0)
				must(t)(r.Restock(ctx, "B", "more", 5))
				repeat("B", "late", 1, stock.ErrSoldOut, 0)
				require.Equal(t, int64(5), levels(t, r, "B").Available)

				// Recorded as insufficient while the item's sold-out filter was live, repeated
				// once the item is sold out again: the filter must send the id to Redis.
				require.NoError(t, r.Load(ctx, "C", 1))
				for i := range 3 {
					_, err := r.Deduct(ctx, stock.Request{SKU: "C", ID: fmt.Sprintf("c%d", i), Qty: 1})
					if i == 0 {
						require.NoError(t, err)
					} else {
						require.ErrorIs(t, err, stock.ErrSoldOut) // starts and fills the filter
					}
				}
				must(t)(r.Restock(ctx, "C", "more", 2))
				repeat("C", "big", 5, stock.ErrInsufficient, 2)
				for _, id := range []string{"d1", "d2"} {
					must(t)(r.Deduct(ctx, stock.Request{SKU: "C", ID: id, Qty: 1}))
				}
				for i := range 3 {
					mustFail(t, stock.ErrSoldOut)(r.Deduct(ctx, stock.Request{SKU: "C", ID: fmt.Sprintf("e%d", i), Qty: 1}))
				}
				repeat("C", "big", 5, stock.ErrInsufficient, 2)
			})
		}
	})
}
