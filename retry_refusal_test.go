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
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// ---------- helpers ----------

func retryPending(t *testing.T, r *stock.Reserver, sku string) int64 {
	t.Helper()
	p, _, err := stockops.Pending(ctx, r, sku)
	require.NoError(t, err, "Pending(%s)", sku)
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
	if !assert.ErrorIs(t, err, want, what) {
		return
	}
	other := stock.ErrSoldOut
	if want == stock.ErrSoldOut {
		other = stock.ErrInsufficient
	}
	assert.NotErrorIs(t, err, other, "%s: both kinds", what)
	assert.Equal(t, rem, rc.Remaining, "%s: Remaining (err %v)", what, err)
	assert.False(t, rc.Replayed, "%s: Replayed set on a refusal", what)
}

func retryCheckCartRefusal(t *testing.T, what string, err error, want error, sku string) {
	t.Helper()
	var ce *stock.CartError
	if assert.ErrorAs(t, err, &ce, "%s: want a *CartError wrapping %v", what, want) {
		assert.Equal(t, sku, ce.SKU, what)
		assert.ErrorIs(t, err, want, what)
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
	for _, cfg := range retryConfigs {
		for _, op := range []string{"deduct", "hold"} {
			for _, kind := range retryKinds {
				cases = append(cases, matrixCase{cfg, op, kind})
			}
		}
	}
	name := func(c matrixCase) string { return fmt.Sprintf("%s/%s/%s", c.cfg.name, c.op, stock.Outcome(c.kind)) }
	retryEach(t, false, cases, name, func(t *testing.T, b redistest.Backend, c matrixCase) {
		cfg, op, kind := c.cfg, c.op, c.kind
		r, r2 := retryPair(t, b, cfg.opts...)
		var err error
		sku := "it:em~X"
		other := "aa:other~" // sorts before sku: a cart takes it first
		id := "ord:1~retry"
		user := "us:er~1"
		require.NoError(t, r.Load(ctx, sku, 3))
		require.NoError(t, r.Load(ctx, other, 5))
		must(t)(r.Deduct(ctx, request(sku, "pre:1", "p:1", 1)))
		must(t)(r.Hold(ctx, request(sku, "pre:h~", "p:2", 1), time.Hour))
		qty, rem := int64(2), int64(1)
		if kind == stock.ErrSoldOut {
			must(t)(r.Deduct(ctx, request(sku, "fill~", "p:3", 1)))
			qty, rem = 1, 0
		}
		req := retryRequest(sku, id, user, qty)
		var rc stock.Receipt
		if op == "deduct" {
			rc, err = r.Deduct(ctx, req)
		} else {
			rc, err = r.Hold(ctx, req, time.Hour)
		}
		retryCheckRefusal(t, "the retry", rc, err, kind, rem)
		recorded := entry(t, r, sku, id)
		t.Logf("recorded: %+v", recorded)
		assert.False(t, recorded.Taken(), "the refused retry's entry is Taken: %+v", recorded)
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
		for _, rp := range repeats {
			before, pb := levels(t, r, sku), retryPending(t, r, sku)
			refused(t, rp.name, kind, rem)(rp.f())
			assert.Equal(t, before, levels(t, r, sku), "%s changed the levels", rp.name)
			assert.Equal(t, pb, retryPending(t, r, sku), "%s queued events", rp.name)
		}
		// Carts with the same id: the line of sku must refuse, and the other item is
		// given back whole.
		ob := levels(t, r, other)
		sb := levels(t, r, sku)
		cart := stock.Cart{ID: id, User: user, Lines: []stock.Line{{SKU: other, Qty: 1}, {SKU: sku, Qty: qty}}}
		mustCart(t, "HoldMany of another id: there is stock")(
			r.HoldMany(ctx, stock.Cart{ID: id + "h", User: user, Lines: []stock.Line{{SKU: sku, Qty: qty}}}, time.Hour))
		require.NoError(t, testkit.Err(r.CancelMany(ctx, id+"h", sku)))
		for i, rr := range []*stock.Reserver{r2, r} {
			if op == "deduct" {
				_, err = rr.DeductMany(ctx, cart)
			} else {
				_, err = rr.HoldMany(ctx, cart, time.Hour)
			}
			retryCheckCartRefusal(t, fmt.Sprintf("cart of the id, copy %d", i), err, kind, sku)
		}
		assert.Equal(t, ob, levels(t, r, other), "the refused cart kept stock of %s", other)
		assert.Equal(t, sb, levels(t, r, sku), "the refused carts changed %s", sku)
		// After the carts, still the same answer.
		refused(t, "Deduct after carts", kind, rem)(r.Deduct(ctx, plain))
		refused(t, "Hold Retry after carts", kind, rem)(r2.Hold(ctx, req, time.Hour))

		assert.Equal(t, recorded, entry(t, r, sku, id), "the recorded refusal changed")
		checkLedger(t, r, sku, 3)
		checkLedger(t, r, other, 5)
		// The stock is all there for others: the repeats took none.
		assert.Equal(t, 13-int64(b2i(kind == stock.ErrSoldOut)), levels(t, r, sku).Available, "available after the repeats")
	})
}

// ---------- the sold-out fast path sees an ErrInsufficient refusal recorded after the filter started ----------

func TestRetryRefusalFastPath(t *testing.T) {
	splits := []int{1, 3}
	// The fast path needs client-side caching: miniredis runs none.
	retryEach(t, true, splits, splitName, func(t *testing.T, b redistest.Backend, split int) {
		r, r2 := retryPair(t, b, stock.WithBuckets(func(string) int { return split }))
		sku := "fa:st~1"
		require.NoError(t, r.Load(ctx, sku, 1))
		must(t)(r.Deduct(ctx, request(sku, "a", "ua", 1)))
		// Sold out: refusals start and complete the filter.
		for i := 0; i < 10; i++ {
			mustFail(t, stock.ErrSoldOut, "sold-out refusal %d", i)(
				r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("so:%d", i), User: fmt.Sprintf("so%d", i), Qty: 1}))
		}
		// Two ids refused for stock by a Retry while the item is short, the filter running:
		// one sold out (recorded Remaining 0), then restock 2 and one insufficient.
		idS, idI := "rt:so~1", "rt:in~1"
		refused(t, "retry sold out", stock.ErrSoldOut, 0)(r.Deduct(ctx, retryRequest(sku, idS, "ux", 1)))
		must(t)(r.Restock(ctx, sku, "rs:1", 2))
		remI := mustFail(t, stock.ErrInsufficient, "retry insufficient")(r.Deduct(ctx, retryRequest(sku, idI, "uy", 5))).Remaining
		require.Positive(t, remI, "retry insufficient")
		// Sold out again.
		must(t)(r2.Deduct(ctx, request(sku, "b", "ub", 2)))
		for i := 0; i < 10; i++ {
			mustFail(t, stock.ErrSoldOut, "sold-out refusal %d", i)(
				r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("so2:%d", i), User: fmt.Sprintf("so%d", i), Qty: 1}))
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
					rr.Deduct(ctx, request(sku, idI, "uy", 5)))
				refused(t, fmt.Sprintf("repeat insufficient as hold via reserver %d", j), stock.ErrInsufficient, remI)(
					rr.Hold(ctx, request(sku, idI, "uy", 5), time.Minute))
				refused(t, fmt.Sprintf("repeat sold out via reserver %d", j), stock.ErrSoldOut, 0)(
					rr.Deduct(ctx, request(sku, idS, "ux", 1)))
				rc := must(t, "replay of a sale under the fast path")(rr.Deduct(ctx, request(sku, "b", "ub", 2)))
				assert.True(t, rc.Replayed, "replay of a sale under the fast path")
			}
		}
		// Stock back: the recorded ids stay refused, with the recorded Remaining.
		must(t)(r2.Restock(ctx, sku, "rs:2", 50))
		refused(t, "repeat insufficient after restock", stock.ErrInsufficient, remI)(r.Deduct(ctx, request(sku, idI, "uy", 5)))
		refused(t, "repeat sold out after restock", stock.ErrSoldOut, 0)(r.Deduct(ctx, request(sku, idS, "ux", 1)))
		checkLedger(t, r, sku, 1)
	})
}

// ---------- large numbers: the Remaining a refusal recorded must come back exactly ----------

func TestRetryRefusalLargeNumbers(t *testing.T) {
	avails := []int64{999_999_999_999_999, 1_000_000_000_000_003, 4_503_599_627_370_497, stock.MaxQty - 1}
	retryEach(t, false, avails, func(a int64) string { return fmt.Sprint(a) }, func(t *testing.T, b redistest.Backend, avail int64) {
		r := newReserver(t, b.Client(t))
		sku := "big:~1"
		require.NoError(t, r.Load(ctx, sku, avail))
		req := retryRequest(sku, "big:id~", "u", stock.MaxQty)
		refused(t, "retry", stock.ErrInsufficient, avail)(r.Deduct(ctx, req))
		e := entry(t, r, sku, req.ID)
		assert.Equal(t, []int64{stock.MaxQty, avail}, []int64{e.Qty, e.After}, "ledger: %+v", e)
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
		must(t)(r.Hold(ctx, request(sku, "h:1", "h1", 2), time.Minute))
		// Insufficient: 1 left, asks 2.
		refused(t, "retry hold insufficient", stock.ErrInsufficient, 1)(r.Hold(ctx, retryRequest(sku, "x:in~", "x", 2), time.Minute))
		must(t)(r.Hold(ctx, request(sku, "h:2", "h2", 1), time.Minute))
		// Sold out.
		refused(t, "retry deduct sold out", stock.ErrSoldOut, 0)(r.Deduct(ctx, retryRequest(sku, "x:so~", "y", 1)))
		env.Advance(2 * time.Minute) // both holds are due
		refused(t, "late hold after expiry", stock.ErrInsufficient, 1)(r2.Hold(ctx, request(sku, "x:in~", "x", 2), time.Minute))
		refused(t, "late deduct after expiry", stock.ErrSoldOut, 0)(r2.Deduct(ctx, request(sku, "x:so~", "y", 1)))
		require.NoError(t, testkit.Err(stockops.Sweep(ctx, r, sku)))
		refused(t, "deduct retry after sweep", stock.ErrInsufficient, 1)(r.Deduct(ctx, retryRequest(sku, "x:in~", "x", 2)))
		refused(t, "hold retry after sweep", stock.ErrSoldOut, 0)(r.Hold(ctx, retryRequest(sku, "x:so~", "y", 1), time.Minute))
		assert.Equal(t, stock.Levels{Available: 3, Loaded: 3}, levels(t, r, sku), "levels after expiry and repeats")
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
		must(t)(r.Hold(ctx, request(sku, "h:1", "h1", 2), time.Minute))
		env.Advance(2 * time.Minute)
		refused(t, "retry with a due hold", stock.ErrInsufficient, 2)(r.Deduct(ctx, retryRequest(sku, "x~1", "x", 3)))
		refused(t, "repeat", stock.ErrInsufficient, 2)(r.Deduct(ctx, request(sku, "x~1", "x", 3)))
		checkLedger(t, r, sku, 2)
	})
}

// The filter is built from the ledger in HSCAN steps after the first sell-out. Retry refusals
// recorded while that build is under way (stock came back in between) must still be seen by
// the fast path once the item is sold out again and the build is complete.
func TestRetryRefusalFastPathMidBuild(t *testing.T) {
	retryEach(t, true, []string{"all"}, itself, func(t *testing.T, b redistest.Backend, _ string) {
		r, r2 := retryPair(t, b)
		sku := "mid:bu~ild"
		const n = 700
		require.NoError(t, r.Load(ctx, sku, n))
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Go(func() {
				for i := g; i < n; i += 8 {
					if _, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("s:%d~", i), User: fmt.Sprintf("u%d", i), Qty: 1}); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		// The first sold-out refusal starts the filter; its build has a long way to go.
		mustFail(t, stock.ErrSoldOut, "first sold out")(r.Deduct(ctx, request(sku, "so:0", "z", 1)))
		must(t)(r.Restock(ctx, sku, "rs:1", 3))
		var ids []string
		for i := 0; i < 60; i++ {
			id := fmt.Sprintf("rt:%d~x", i)
			refused(t, "retry", stock.ErrInsufficient, 3)(r2.Deduct(ctx, retryRequest(sku, id, "w", 5)))
			ids = append(ids, id)
		}
		must(t)(r.Deduct(ctx, request(sku, "last", "l", 3)))
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
				rc, err := rr.Deduct(ctx, request(sku, id, "w", 5))
				if !errors.Is(err, stock.ErrInsufficient) || rc.Remaining != 3 {
					bad++
					if bad < 5 {
						t.Errorf("repeat of %s: %+v %v, want ErrInsufficient Remaining 3", id, rc, err)
					}
				}
			}
		}
		assert.Zero(t, bad, "repeats of recorded refusals answered wrongly")
		checkLedger(t, r, sku, n)
	})
}

// ---------- the per-user limit ----------

func TestRetryRefusalUserLimit(t *testing.T) {
	splits := []int{1, 4}
	retryEach(t, false, splits, splitName, func(t *testing.T, b redistest.Backend, split int) {
		r := newReserver(t, b.Client(t), stock.WithUserLimit(2), stock.WithBuckets(func(string) int { return split }))
		sku := "li:mit~"
		u := "al:ice~"
		require.NoError(t, r.Load(ctx, sku, 1))
		refused(t, "retry", stock.ErrInsufficient, 1)(r.Deduct(ctx, retryRequest(sku, "x:1", u, 2)))
		must(t)(r.Deduct(ctx, request(sku, "y:1", u, 1)))
		// Sold out and u has 1: a retry refused as sold out.
		refused(t, "retry 2", stock.ErrSoldOut, 0)(r.Hold(ctx, retryRequest(sku, "x:2", u, 1), time.Minute))
		must(t)(r.Restock(ctx, sku, "rs", 10))
		must(t)(r.Deduct(ctx, request(sku, "z:1", u, 1)))
		// u is at the limit: the repeats must still answer the recorded refusals.
		refused(t, "repeat x:1 at the limit", stock.ErrInsufficient, 1)(r.Deduct(ctx, request(sku, "x:1", u, 2)))
		refused(t, "repeat x:2 at the limit", stock.ErrSoldOut, 0)(r.Hold(ctx, request(sku, "x:2", u, 1), time.Minute))
		for _, id := range []string{"y:1", "z:1"} {
			must(t)(r.Restore(ctx, sku, id))
		}
		refused(t, "repeat x:1 after restores", stock.ErrInsufficient, 1)(r.Deduct(ctx, retryRequest(sku, "x:1", u, 2)))
		rc, err := r.Deduct(ctx, retryRequest(sku, "x:2", u, 1))
		retryCheckRefusal(t, "repeat x:2 after restores", rc, err, stock.ErrSoldOut, 0)
		// The repeats counted nothing against u: u may still take 2.
		must(t, "u cannot take 2 after the repeats")(r.Deduct(ctx, request(sku, "w:1", u, 2)))
		// A retry refused for the limit records nothing (only stock refusals are recorded).
		mustFail(t, stock.ErrUserLimit, "retry over the limit")(r.Deduct(ctx, retryRequest(sku, "v:1", u, 1)))
		if e, err := r.Ledger(ctx, sku, "v:1"); !errors.Is(err, stock.ErrUnknownID) {
			t.Logf("note: a retry refused for the limit left an entry: %+v %v", e, err)
		}
		checkLedger(t, r, sku, 1)
	})
}

// ---------- other operations on the refused id ----------

func TestRetryRefusalOtherOps(t *testing.T) {
	retryEach(t, false, retryConfigs, cfgName, func(t *testing.T, b redistest.Backend, cfg retryConfig) {
		r := newReserver(t, b.Client(t), cfg.opts...)
		sku := "op:s~"
		id := "x:~1"
		require.NoError(t, r.Load(ctx, sku, 1))
		refused(t, "retry", stock.ErrInsufficient, 1)(r.Deduct(ctx, retryRequest(sku, id, "u", 2)))
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
			assert.Error(t, err, "%s of a refused id succeeded: %+v", st.name, rc)
			assert.Equal(t, lv0, levels(t, r, sku), "%s changed the levels", st.name)
			rc, err = r.Deduct(ctx, request(sku, id, "u", 2))
			retryCheckRefusal(t, "repeat after "+st.name, rc, err, stock.ErrInsufficient, 1)
		}
		assert.Equal(t, recorded, entry(t, r, sku, id), "the recorded refusal changed")
		// A closed item: what does the repeat answer?
		require.NoError(t, r.CloseItem(ctx, sku))
		rc, err := r.Deduct(ctx, request(sku, id, "u", 2))
		t.Logf("repeat on a closed item: %+v %v", rc, err)
		require.NoError(t, r.ReopenItem(ctx, sku))
		refused(t, "repeat after reopen", stock.ErrInsufficient, 1)(r.Deduct(ctx, request(sku, id, "u", 2)))
		checkLedger(t, r, sku, 1)
	})
}

// ---------- a one-script cart (WithGroups) with the refused id ----------

func TestRetryRefusalGroupCart(t *testing.T) {
	retryEach(t, false, retryKinds, stock.Outcome, func(t *testing.T, b redistest.Backend, kind error) {
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
		refused(t, "retry", kind, load)(r.Deduct(ctx, retryRequest(x, id, "u", 2)))
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
		assert.Equal(t, la, levels(t, r, a), "the group cart changed %s", a)
		refused(t, "repeat after the carts", kind, load)(r.Deduct(ctx, request(x, id, "u", 2)))
		checkLedger(t, r, x, load)
		checkLedger(t, r, a, 5)
	})
}

// ---------- split items: a refusal must only come when the buckets together cannot serve ----------

func TestRetryRefusalBucketsNoPhantomRefusal(t *testing.T) {
	type split struct {
		buckets   int
		load, qty int64
	}
	tcs := []split{{64, 64, 64}, {64, 640, 600}, {16, 33, 33}, {7, 100, 99}}
	name := func(tc split) string { return fmt.Sprintf("%d-%d-%d", tc.buckets, tc.load, tc.qty) }
	retryEach(t, false, tcs, name, func(t *testing.T, b redistest.Backend, tc split) {
		r := newReserver(t, b.Client(t), stock.WithBuckets(func(string) int { return tc.buckets }))
		sku := "sp:lit~"
		require.NoError(t, r.Load(ctx, sku, tc.load))
		rc, err := r.Deduct(ctx, retryRequest(sku, "x:1~", "u:1", tc.qty))
		if err != nil {
			t.Errorf("retry of %d of %d over %d buckets refused: %+v %v", tc.qty, tc.load, tc.buckets, rc, err)
			rc2, err2 := r.Deduct(ctx, request(sku, "x:1~", "u:1", tc.qty))
			t.Logf("and it is final: %+v %v; levels %+v", rc2, err2, levels(t, r, sku))
		} else if rc.Remaining != tc.load-tc.qty {
			t.Logf("remaining in the bucket %d (item %d)", rc.Remaining, tc.load-tc.qty)
		}
		// Over: one more than the whole.
		rc, err = r.Hold(ctx, retryRequest(sku, "x:2~", "u:2", tc.load-tc.qty+1), time.Minute)
		assert.True(t, errors.Is(err, stock.ErrInsufficient) || errors.Is(err, stock.ErrSoldOut), "over-ask: %+v %v", rc, err)
		assert.Equal(t, errors.Is(err, stock.ErrSoldOut), rc.Remaining == 0, "refusal kind does not match its Remaining: %+v %v", rc, err)
		kind := err
		rc2, err := r.Deduct(ctx, request(sku, "x:2~", "u:2", tc.load-tc.qty+1))
		assert.True(t, stock.Outcome(err) == stock.Outcome(kind) && rc2.Remaining == rc.Remaining,
			"repeat answered %+v %v, the retry %+v %v", rc2, err, rc, kind)
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
	for _, cfg := range retryConcConfigs {
		for _, kind := range retryKinds {
			cases = append(cases, concCase{cfg, kind})
		}
	}
	name := func(c concCase) string { return c.cfg.name + "/" + stock.Outcome(c.kind) }
	retryEach(t, false, cases, name, func(t *testing.T, b redistest.Backend, c concCase) {
		cfg, kind := c.cfg, c.kind
		r, r2 := retryPair(t, b, cfg.opts...)
		sku := "co:nc~1"
		load := int64(2)
		if kind == stock.ErrSoldOut {
			load = 0
		}
		require.NoError(t, r.Load(ctx, sku, load))
		id, user := "x:~id", "x:~u"
		rc, err := r.Deduct(ctx, retryRequest(sku, id, user, 3))
		retryCheckRefusal(t, "retry", rc, err, kind, load)
		recorded := entry(t, r, sku, id)
		const restocks = 15
		var wg sync.WaitGroup
		var mu sync.Mutex
		var bad []string
		stop := make(chan struct{})
		wg.Go(func() { // restocker
			for i := 0; i < restocks; i++ {
				assert.NoError(t, testkit.Err(r2.Restock(ctx, sku, fmt.Sprintf("rs:%d~", i), 1)))
			}
		})
		var churned int64
		wg.Go(func() { // churn: others sell and give back
			for i := 0; !stopped(stop); i++ {
				oid := fmt.Sprintf("o:%d~", i)
				if _, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: oid, User: fmt.Sprintf("o%d", i%5), Qty: 1}); err == nil {
					assert.NoError(t, testkit.Err(r2.Restore(ctx, sku, oid)))
					churned++
				}
			}
		})
		goroutines, per := 10, 12
		if cfg.name == "buckets4" {
			goroutines, per = 6, 10 // split items are slow under contention
		}
		var rep sync.WaitGroup
		for g := 0; g < goroutines; g++ {
			rep.Go(func() {
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
			})
		}
		rep.Wait()
		close(stop)
		wg.Wait()
		t.Logf("churned %d other sales", churned)
		assert.Empty(t, bad, "repeats answered otherwise than %v Remaining %d", kind, load)
		assert.Equal(t, recorded, entry(t, r, sku, id), "the recorded refusal changed")
		assert.Equal(t, stock.Levels{Available: load + restocks, Loaded: load + restocks}, levels(t, r, sku), "nothing held or sold")
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
	for _, cfg := range retryConcConfigs {
		for _, hold := range []bool{false, true} {
			cases = append(cases, raceCase{cfg, hold})
		}
	}
	name := func(c raceCase) string { return fmt.Sprintf("%s/hold=%v", c.cfg.name, c.hold) }
	retryEach(t, false, cases, name, func(t *testing.T, b redistest.Backend, c raceCase) {
		cfg, hold := c.cfg, c.hold
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
				wg.Go(func() {
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
				})
			}
			wg.Go(func() {
				<-start
				assert.NoError(t, testkit.Err(r2.Restock(ctx, sku, "rs:"+id, int64(1+round%2))))
			})
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
			assert.LessOrEqual(t, fresh, 1, "round %d: fresh takes of one id", round)
			if len(retryRefused) > 0 && taken > 0 {
				t.Errorf("round %d: a retry was refused (%v, Remaining %d) yet the id took stock: %+v", round, retryRefused[0].err, retryRefused[0].rc.Remaining, answers)
			}
			// Every refused retry told the same thing, and so does a late copy now.
			if len(retryRefused) > 0 {
				refusedRounds++
				// The retries refused before the record answer the record, so all alike.
				first := retryRefused[0]
				late, lerr := r.Deduct(ctx, request(sku, id, user, 2))
				if hold {
					late, lerr = r.Hold(ctx, request(sku, id, user, 2), time.Hour)
				}
				matched := false
				for _, a := range retryRefused {
					if stock.Outcome(a.err) == stock.Outcome(lerr) && a.rc.Remaining == late.Remaining {
						matched = true
					}
				}
				assert.True(t, matched, "round %d: a late copy answered %+v %v; the refused retries got e.g. %+v %v", round, late, lerr, first.rc, first.err)
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
	retryEach(t, false, splits, splitName, func(t *testing.T, b redistest.Backend, n int) {
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
			wg.Go(func() {
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
							assert.NoError(t, testkit.Err(rr.Restore(ctx, sku, req.ID)))
						}
					case errors.Is(err, stock.ErrSoldOut) || errors.Is(err, stock.ErrInsufficient):
						mu.Lock()
						refusals = append(refusals, refusal{req, rc, err})
						mu.Unlock()
					default:
						t.Errorf("%+v: %v", req, err)
					}
				}
			})
		}
		wg.Go(func() {
			for i := 0; i < 10; i++ {
				assert.NoError(t, testkit.Err(r2.Restock(ctx, sku, fmt.Sprintf("rs%d", i), 2)))
				time.Sleep(time.Millisecond)
			}
		})
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
	retryEach(t, false, []string{"all"}, itself, func(t *testing.T, b redistest.Backend, _ string) {
		r, r2 := retryPair(t, b, stock.WithBuckets(func(string) int { return 4 }))
		sku := "ph:an~tom"
		require.NoError(t, r.Load(ctx, sku, 1000))
		big := retryRequest(sku, "x:~", "u:~1", 1<<40)
		refused(t, "retry", stock.ErrInsufficient, 1000)(r.Deduct(ctx, big))
		big.Retry = false
		var wg sync.WaitGroup
		stop := make(chan struct{})
		var mu sync.Mutex
		var wrong []string
		for g := 0; g < 4; g++ {
			wg.Go(func() {
				rr := []*stock.Reserver{r, r2}[g%2]
				for !stopped(stop) {
					rc, err := rr.Deduct(ctx, big)
					if !errors.Is(err, stock.ErrInsufficient) || rc.Remaining != 1000 {
						mu.Lock()
						wrong = append(wrong, fmt.Sprintf("%+v %v", rc, err))
						mu.Unlock()
					}
				}
			})
		}
		var lw sync.WaitGroup
		for g := 0; g < 6; g++ {
			lw.Go(func() {
				rr := []*stock.Reserver{r, r2}[g%2]
				for i := 0; i < 10; i++ {
					req := stock.Request{SKU: sku, ID: fmt.Sprintf("l%d:%d", g, i), User: fmt.Sprintf("v%d~%d", g, i), Qty: 2, Retry: true}
					rc, err := rr.Deduct(ctx, req)
					assert.NoError(t, err, "%s refused while the item has %d+: %+v", req.ID, 1000-120, rc)
				}
			})
		}
		lw.Wait()
		close(stop)
		wg.Wait()
		assert.Empty(t, wrong, "repeats answered otherwise")
		assert.Equal(t, int64(120), levels(t, r, sku).Sold)
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
		must(t)(r.Deduct(ctx, request(sku, "a:1", "a", 1)))
		id := "x:~1"
		rc, err := r.Deduct(ctx, retryRequest(sku, id, "u", 3))
		retryCheckRefusal(t, "retry", rc, err, stock.ErrInsufficient, 1)
		must(t)(r.Restock(ctx, sku, "rs:1", 5))
		must(t)(r.Restore(ctx, sku, "a:1"))
		relay := newRelay(t, r, store, nil, nil)
		rec := newReconciler(t, r, store, nil)
		pass := func(label string) {
			t.Helper()
			require.NoError(t, testkit.Err(relay.Once(ctx)), "%s: relay", label)
			rep, err := rec.Item(ctx, sku)
			require.NoError(t, err, "%s: reconcile", label)
			if rep.Drift != 0 || rep.Adjusted != 0 || rep.Rebuilt || rep.Requeued != 0 || rep.Rerecorded != 0 || rep.Resynced != 0 || rep.NeedsHuman != "" {
				t.Errorf("%s: the pass found or repaired something: %s", label, rep)
			}
			recs, err := store.Records(ctx, sku, []string{id})
			require.NoError(t, err)
			assert.NotContains(t, recs, id, "%s: the store has a record of the refused id", label)
			assert.Equal(t, int64(7), remaining(t, store, sku), "%s: store remaining", label)
		}
		pass("first pass")
		refused(t, "repeat after a pass", stock.ErrInsufficient, 1)(r.Deduct(ctx, request(sku, id, "u", 3)))
		env.Advance(23 * time.Hour)
		pass("pass within the retention")
		refused(t, "repeat within the retention", stock.ErrInsufficient, 1)(r.Hold(ctx, request(sku, id, "u", 3), time.Minute))
		checkLedger(t, r, sku, 2)
		// Past the retention the entry may be trimmed: the documented end of idempotency.
		env.Advance(2 * time.Hour)
		rep, err := rec.Item(ctx, sku)
		t.Logf("pass past the retention: %s %v", rep, err)
		rc, err = r.Deduct(ctx, retryRequest(sku, id, "u", 3))
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
	retryEach(t, true, []string{"all"}, itself, func(t *testing.T, b redistest.Backend, _ string) {
		r := newReserver(t, b.Client(t), stock.WithReplicaAck(5, 20*time.Millisecond))
		sku := "ack:~1"
		require.NoError(t, r.Load(ctx, sku, 1))
		t0 := time.Now()
		rc, err := r.Deduct(ctx, retryRequest(sku, "x:~", "u", 2))
		el := time.Since(t0)
		require.ErrorIs(t, err, stock.ErrInsufficient, "retry")
		require.Equal(t, int64(1), rc.Remaining, "retry")
		t.Logf("retry refusal: %v in %v", err, el)
		entry(t, r, sku, "x:~") // the refusal was recorded
		_, serr := r.Deduct(ctx, request(sku, "y:~", "v", 1))
		t.Logf("a sale: %v", serr)
		require.ErrorIs(t, serr, stock.ErrNotReplicated, "a sale without a replica")
		assert.NotErrorIs(t, err, stock.ErrNotReplicated, "a Retry refused for stock says ErrNotReplicated (the units were taken)")
		// A restore of an unknown id, and a first refusal without Retry (the sale took the last
		// unit): bare errors.
		_, err = r.Restore(ctx, sku, "z:~")
		assert.ErrorIs(t, err, stock.ErrUnknownID)
		assert.NotErrorIs(t, err, stock.ErrNotReplicated)
		_, err = r.Deduct(ctx, request(sku, "w:~", "w", 5))
		assert.ErrorIs(t, err, stock.ErrSoldOut)
		assert.NotErrorIs(t, err, stock.ErrNotReplicated)
	})
}

// ---------- a repeat with another quantity or user ----------

// The guarantees say a repeat with another quantity or user is ErrConflict; the Retry doc says
// every later request of the id gets the recorded refusal. Either way it must take nothing.
func TestRetryRefusalRepeatOtherParams(t *testing.T) {
	retryEach(t, false, retryConfigs, cfgName, func(t *testing.T, b redistest.Backend, cfg retryConfig) {
		r := newReserver(t, b.Client(t), cfg.opts...)
		sku := "pa:ram~"
		require.NoError(t, r.Load(ctx, sku, 2))
		id := "x:~"
		refused(t, "retry", stock.ErrInsufficient, 2)(r.Deduct(ctx, retryRequest(sku, id, "u", 3)))
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
		assert.Equal(t, lv, levels(t, r, sku), "levels changed")
	})
}

// ---------- long names full of ':' and '~', on split items ----------

func TestRetryRefusalLongNames(t *testing.T) {
	splits := []int{1, 64}
	retryEach(t, false, splits, splitName, func(t *testing.T, b redistest.Backend, split int) {
		r := newReserver(t, b.Client(t), stock.WithBuckets(func(string) int { return split }), stock.WithPrefix("p:~x"))
		sku := strings.Repeat("s:~", 42) + "zz" // 128 bytes
		id := strings.Repeat("~:", 64)
		user := strings.Repeat("u~", 64)
		require.NoError(t, r.Load(ctx, sku, 5))
		refused(t, "retry", stock.ErrInsufficient, 5)(r.Deduct(ctx, retryRequest(sku, id, user, 6)))
		must(t)(r.Restock(ctx, sku, id[:127]+"x", 3))
		rc, err := r.Hold(ctx, request(sku, id, user, 6), time.Minute)
		retryCheckRefusal(t, "repeat", rc, err, stock.ErrInsufficient, 5)
		e := entry(t, r, sku, id)
		assert.Equal(t, []any{id, user, sku, int64(6), int64(5)}, []any{e.ID, e.User, e.SKU, e.Qty, e.After}, "ledger: %+v", e)
		checkLedger(t, r, sku, 5)
	})
}

// ---------- time moved by hand: WithClock on a miniredis whose clock stands still ----------

func TestRetryRefusalWithClock(t *testing.T) {
	_, c := redistest.Miniredis(t)
	clock := newTestClock()
	advance := func(d time.Duration) {
		clock.advance(d)
		redistest.Sleep(c, d)
	}
	r := newReserver(t, c, stock.WithClock(clock.now))
	sku := "cl:ock~"
	require.NoError(t, r.Load(ctx, sku, 1))
	must(t)(r.Hold(ctx, request(sku, "h:~", "h", 1), time.Second))
	refused(t, "retry", stock.ErrSoldOut, 0)(r.Hold(ctx, retryRequest(sku, "x:~", "x", 1), time.Minute))
	advance(2 * time.Second)
	rc, err := r.Hold(ctx, request(sku, "x:~", "x", 1), time.Minute)
	retryCheckRefusal(t, "late first attempt after the hold expired", rc, err, stock.ErrSoldOut, 0)
	must(t, "the expired unit is not for sale")(r.Deduct(ctx, request(sku, "y:~", "y", 1)))
	mustFail(t, stock.ErrExpired, "confirm of the expired hold")(r.Confirm(ctx, sku, "h:~"))
	checkLedger(t, r, sku, 1)
}

// retryEnv is a miniredis whose clock moves only with Advance, and a Reserver on the same clock
// (as package stocktest's Env, which the root module cannot import).
type retryEnv struct {
	*testClock
	Client   rueidis.Client
	Reserver *stock.Reserver
	m        *miniredis.Miniredis
}

func retryNewEnv(t *testing.T, opts ...stock.Option) *retryEnv {
	t.Helper()
	m, c := redistest.Miniredis(t)
	e := &retryEnv{testClock: &testClock{at: time.Now().Truncate(time.Microsecond)}, Client: c, m: m}
	m.SetTime(e.now())
	m.ClockTTL(true)
	e.Reserver = newReserver(t, c, append([]stock.Option{stock.WithClock(e.now)}, opts...)...)
	return e
}

// Advance moves the Reserver's clock and miniredis's by d.
func (e *retryEnv) Advance(d time.Duration) {
	e.advance(d)
	e.m.SetTime(e.now())
}

// retryEachEnv runs f for every case of retryConfigs on a retryEnv of its options.
func retryEachEnv(t *testing.T, f func(t *testing.T, cfg retryConfig, env *retryEnv)) {
	t.Helper()
	for _, cfg := range retryConfigs {
		t.Run(cfg.name, func(t *testing.T) { f(t, cfg, retryNewEnv(t, cfg.opts...)) })
	}
}

// retryEach runs f for every case (named by name) on every backend, the backends in parallel;
// with realOnly, a miniredis backend runs none of them (its leaf passes empty).
func retryEach[C any](t *testing.T, realOnly bool, cases []C, name func(C) string, f func(t *testing.T, b redistest.Backend, c C)) {
	t.Helper()
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		if realOnly && !b.Real() {
			return
		}
		for _, c := range cases {
			t.Run(name(c), func(t *testing.T) { f(t, b, c) })
		}
	})
}

// retryPair is two Reservers with opts on two clients of one backend.
func retryPair(t *testing.T, b redistest.Backend, opts ...stock.Option) (*stock.Reserver, *stock.Reserver) {
	t.Helper()
	c1, c2 := b.Pair(t)
	return newReserver(t, c1, opts...), newReserver(t, c2, opts...)
}

// cfgName names a case of a config table, splitName one of a bucket count table, itself a
// case that is its name.
func cfgName(c retryConfig) string { return c.name }
func splitName(n int) string       { return fmt.Sprintf("buckets%d", n) }
func itself(name string) string    { return name }

// retryKinds are the two refusals for stock that a retry records.
var retryKinds = []error{stock.ErrSoldOut, stock.ErrInsufficient}

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

// TestRetryRefusalIsFinal: a retry's refusal for lack of stock is recorded, so the earlier
// attempt of the id, arriving later, is refused too; a first attempt's refusal writes nothing.
func TestRetryRefusalIsFinal(t *testing.T) {
	eachReserver(t, nil, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		require.NoError(t, r.Load(ctx, "A", 0))
		mustFail(t, stock.ErrSoldOut)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "first", Qty: 1}))
		require.ErrorIs(t, testkit.Err(r.Ledger(ctx, "A", "first")), stock.ErrUnknownID, "the sold-out path writes nothing")

		mustFail(t, stock.ErrSoldOut)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1, Retry: true}))
		e := entry(t, r, "A", "o1")
		assert.Equal(t, stock.KindTombstone, e.Kind)
		assert.Equal(t, stock.StateRefused, e.State)
		must(t)(r.Restock(ctx, "A", "r1", 5))
		mustFail(t, stock.ErrSoldOut)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1})) // the late first attempt
		mustFail(t, stock.ErrInsufficient)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", Qty: 9, Retry: true}))
		rc := mustFail(t, stock.ErrInsufficient, "the id is closed, with the refusal it was told")(
			r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", Qty: 9}))
		assert.Equal(t, int64(5), rc.Remaining, "the stock of the recorded refusal")
		must(t, "a retry that is admitted is an ordinary deduct")(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o3", Qty: 1, Retry: true}))
		assert.Equal(t, stock.Levels{Available: 4, Sold: 1, Loaded: 5}, levels(t, r, "A"))
	})
}

// request is a request of qty units of sku for id by user; retryRequest is the same request as a retry.
func request(sku, id, user string, qty int64) stock.Request {
	return stock.Request{SKU: sku, ID: id, User: user, Qty: qty}
}

func retryRequest(sku, id, user string, qty int64) stock.Request {
	return stock.Request{SKU: sku, ID: id, User: user, Qty: qty, Retry: true}
}
