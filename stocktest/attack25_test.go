package stocktest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockres/stock"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
	"github.com/stockres/stock/stocktest"
)

// --- helpers -------------------------------------------------------------------------------

// a25Wait polls cond until it holds or limit (real time) passes; generous bounds only.
func a25Wait(t *testing.T, limit time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	var last string
	for {
		ok, s := cond()
		if ok {
			return
		}
		last = s
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v; last state: %s", what, limit, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func a25Levels(t *testing.T, e *stocktest.Env, sku string) stock.Levels {
	t.Helper()
	lv, err := e.Reserver.Levels(context.Background(), sku)
	if err != nil {
		t.Fatalf("Levels(%q): %v", sku, err)
	}
	if lv.Loaded != lv.Available+lv.Held+lv.Sold {
		t.Fatalf("Levels(%q) = %+v: loaded != available + held + sold", sku, lv)
	}
	return lv
}

func a25Load(t *testing.T, e *stocktest.Env, sku string, qty int64) {
	t.Helper()
	if err := e.Reserver.Load(context.Background(), sku, qty); err != nil {
		t.Fatalf("Load(%q, %d): %v", sku, qty, err)
	}
}

// a25Run starts e.Reserver.Run and stops it when the test ends (bounded).
func a25Run(t *testing.T, e *stocktest.Env, opts stock.RunOptions) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Reserver.Run(ctx, opts) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Errorf("Run did not return within 30s of its context ending")
		}
	})
}

// fakeTB lets a test see whether stocktest.New fails its t. Fatal* end the goroutine (as the
// testing package does); Cleanup goes to the real test.
type fakeTB struct {
	testing.TB
	mu     sync.Mutex
	failed bool
	msg    string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) fail(s string) {
	f.mu.Lock()
	f.failed, f.msg = true, s
	f.mu.Unlock()
}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.fail(fmt.Sprintf(format, args...))
	runtime.Goexit()
}
func (f *fakeTB) Fatal(args ...any)                 { f.fail(fmt.Sprint(args...)); runtime.Goexit() }
func (f *fakeTB) Errorf(format string, args ...any) { f.fail(fmt.Sprintf(format, args...)) }
func (f *fakeTB) Error(args ...any)                 { f.fail(fmt.Sprint(args...)) }
func (f *fakeTB) FailNow()                          { f.fail("FailNow"); runtime.Goexit() }
func (f *fakeTB) Fail()                             { f.fail("Fail") }
func (f *fakeTB) Failed() bool                      { f.mu.Lock(); defer f.mu.Unlock(); return f.failed }

// a25NewFake calls stocktest.New on a fake TB and reports the env (nil when New failed it).
func a25NewFake(t *testing.T, opts ...stock.Option) (*stocktest.Env, *fakeTB) {
	f := &fakeTB{TB: t}
	var e *stocktest.Env
	done := make(chan struct{})
	go func() {
		defer close(done)
		e = stocktest.New(f, opts...)
	}()
	<-done
	return e, f
}

// a25HalfDoneCart leaves cart "cart-1" (a:2, b:1) half done: line a taken, the saga cut short
// by an error that is not a refusal on b (a key of the wrong type), then b repaired and loaded.
func a25HalfDoneCart(t *testing.T, e *stocktest.Env, prefix string) {
	t.Helper()
	ctx := context.Background()
	a25Load(t, e, "a", 5)
	bad := prefix + ":{b}"
	if err := e.Redis.Set(bad, "not a hash"); err != nil {
		t.Fatal(err)
	}
	_, err := e.Reserver.DeductMany(ctx, stock.Cart{ID: "cart-1", User: "u1", Lines: []stock.Line{{SKU: "a", Qty: 2}, {SKU: "b", Qty: 1}}})
	var ce *stock.CartError
	if err == nil || errors.As(err, &ce) {
		t.Fatalf("DeductMany with a broken key on b = %v, want an error that is not a refusal", err)
	}
	e.Redis.Del(bad)
	a25Load(t, e, "b", 5)
	if lv := a25Levels(t, e, "a"); lv.Available != 3 || lv.Sold != 2 {
		t.Fatalf("after the cut-short cart, a = %+v, want 3 available, 2 sold", lv)
	}
}

// --- Env: clock, options, isolation ---------------------------------------------------------

func TestAttack25EnvClock(t *testing.T) {
	e := stocktest.New(t)
	ctx := context.Background()
	start := e.Now()
	if d := time.Since(start); d < -time.Minute || d > time.Minute {
		t.Fatalf("Env.Now() = %v, want about the wall clock (%v)", start, time.Now())
	}
	if start.Nanosecond()%1000 != 0 {
		t.Fatalf("Env.Now() = %v, want truncated to the microsecond", start)
	}
	redisTime := func() time.Time {
		v, err := e.Client.Do(ctx, e.Client.B().Time().Build()).AsStrSlice()
		if err != nil || len(v) != 2 {
			t.Fatalf("TIME: %v %v", v, err)
		}
		s, _ := strconv.ParseInt(v[0], 10, 64)
		us, _ := strconv.ParseInt(v[1], 10, 64)
		return time.Unix(s, us*1000)
	}
	if rt := redisTime(); !rt.Equal(start) {
		t.Fatalf("Redis TIME = %v, Env.Now() = %v: want one clock", rt, start)
	}
	// The clock stands still without Advance.
	time.Sleep(30 * time.Millisecond)
	if !e.Now().Equal(start) || !redisTime().Equal(start) {
		t.Fatalf("the clock moved without Advance: Now %v, TIME %v, start %v", e.Now(), redisTime(), start)
	}
	e.Advance(0)
	if !e.Now().Equal(start) {
		t.Fatalf("Advance(0) moved the clock: %v -> %v", start, e.Now())
	}
	e.Advance(90 * time.Minute)
	if want := start.Add(90 * time.Minute); !e.Now().Equal(want) || !redisTime().Equal(want) {
		t.Fatalf("after Advance(90m): Now %v, TIME %v, want %v", e.Now(), redisTime(), want)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatalf("Advance(-1ns) did not panic; the doc says a negative d panics")
			}
		}()
		e.Advance(-time.Nanosecond)
	}()
	if want := start.Add(90 * time.Minute); !e.Now().Equal(want) {
		t.Fatalf("a refused negative Advance moved the clock to %v, want %v", e.Now(), want)
	}
	// TTLs run on the same clock: a key with a 10s TTL expires on Advance(10s), not before.
	if err := e.Client.Do(ctx, e.Client.B().Set().Key("k").Value("v").Px(10*time.Second).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	e.Advance(10*time.Second - time.Millisecond)
	if !e.Redis.Exists("k") {
		t.Fatalf("a 10s key expired after 9.999s of Advance")
	}
	e.Advance(time.Millisecond)
	if e.Redis.Exists("k") {
		t.Fatalf("a 10s key still exists after 10s of Advance")
	}
}

func TestAttack25EnvsIsolatedParallel(t *testing.T) {
	for i := range 6 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := stocktest.New(t, stock.WithUserLimit(int64(i+1)))
			start := e.Now()
			a25Load(t, e, "same", int64(10+i))
			ok := 0
			for j := range 20 {
				_, err := e.Reserver.Deduct(ctx, stock.Request{SKU: "same", ID: fmt.Sprint("o", j), User: fmt.Sprint("u", j%3), Qty: 1})
				switch {
				case err == nil:
					ok++
				case errors.Is(err, stock.ErrUserLimit), errors.Is(err, stock.ErrSoldOut):
				default:
					t.Fatalf("Deduct: %v", err)
				}
			}
			// 3 users, each limited to i+1 units, on a stock of 10+i.
			want := min(3*(i+1), 10+i)
			if ok != want {
				t.Fatalf("env %d: %d deducts ok, want %d (per-user limit %d, stock %d)", i, ok, want, i+1, 10+i)
			}
			if lv := a25Levels(t, e, "same"); lv.Sold != int64(want) || lv.Loaded != int64(10+i) {
				t.Fatalf("env %d: levels %+v, want sold %d of %d (another env leaked in?)", i, lv, want, 10+i)
			}
			e.Advance(time.Duration(i+1) * time.Hour)
			if got := e.Now().Sub(start); got != time.Duration(i+1)*time.Hour {
				t.Fatalf("env %d: clock moved %v, want %v (another env's Advance leaked in?)", i, got, time.Duration(i+1)*time.Hour)
			}
			keys := e.Redis.Keys()
			for _, k := range keys {
				if !strings.HasPrefix(k, "stock:") {
					t.Fatalf("env %d: unexpected key %q", i, k)
				}
			}
		})
	}
}

func TestAttack25NewRefusesBadOptions(t *testing.T) {
	for name, opt := range map[string]stock.Option{
		"prefix with brace":   stock.WithPrefix("a{b"),
		"prefix with space":   stock.WithPrefix("a b"),
		"negative user limit": stock.WithUserLimit(-1),
		"user limit > MaxQty": stock.WithUserLimit(stock.MaxQty + 1),
		"timeout 0":           stock.WithTimeout(0),
		"negative coalescing": stock.WithCoalescing(-1),
	} {
		t.Run(name, func(t *testing.T) {
			e, f := a25NewFake(t, opt)
			if !f.Failed() || e != nil {
				t.Fatalf("stocktest.New with %s: failed=%v env=%v; the doc says it fails t if stock.New refuses opts", name, f.Failed(), e != nil)
			}
			if !strings.Contains(f.msg, "stock.New") {
				t.Fatalf("failure message %q does not say stock.New refused the options", f.msg)
			}
		})
	}
	// And a good set of options does not fail it.
	e, f := a25NewFake(t, stock.WithPrefix("shop"), stock.WithUserLimit(1), stock.WithCoalescing(0), stock.WithSoldOutCache(0))
	if f.Failed() || e == nil {
		t.Fatalf("stocktest.New with valid options failed: %s", f.msg)
	}
}

// A WithClock among the options: stocktest's doc promises that Advance moves the Reserver's
// own clock (cart age, retention). Either New refuses a conflicting WithClock (fails t), or
// Advance must still govern the cart-recovery cutoff.
func TestAttack25ConflictingWithClock(t *testing.T) {
	wall := func() time.Time { return time.Now() }
	e, f := a25NewFake(t, stock.WithClock(wall))
	if f.Failed() {
		t.Logf("stocktest.New refused a conflicting WithClock: %s", f.msg)
		return
	}
	a25HalfDoneCart(t, e, "stock")
	e.Advance(10 * time.Minute)
	n, err := stockops.RecoverCarts(context.Background(), e.Reserver, 5*time.Minute)
	if err != nil {
		t.Fatalf("RecoverCarts: %v", err)
	}
	if n != 1 {
		t.Fatalf("stocktest.New(t, stock.WithClock(time.Now)) was accepted, yet after Advance(10m) RecoverCarts(5m) undid %d carts, want 1: "+
			"the user's WithClock silently replaces the Env clock, so Advance no longer moves cart age / retention", n)
	}
}

func TestAttack25PrefixKeys(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t, stock.WithPrefix("shop"))
	a25Load(t, e, "x:1~ü", 3)
	if _, err := e.Reserver.Deduct(ctx, stock.Request{SKU: "x:1~ü", ID: "o:1~é", Qty: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Reserver.Hold(ctx, stock.Request{SKU: "x:1~ü", ID: "h", Qty: 1}, time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, k := range e.Redis.Keys() {
		if !strings.HasPrefix(k, "shop:") {
			t.Fatalf("key %q does not carry the prefix shop:", k)
		}
	}
	e.Advance(time.Minute)
	if n, err := stockops.Sweep(ctx, e.Reserver); err != nil || n != 1 {
		t.Fatalf("Sweep after the deadline = %d, %v; want 1 unit released", n, err)
	}
	if lv := a25Levels(t, e, "x:1~ü"); lv.Available != 1 || lv.Sold != 2 || lv.Held != 0 {
		t.Fatalf("levels %+v, want 1 available, 2 sold, 0 held", lv)
	}
}

// --- Holds and the clock -------------------------------------------------------------------

func TestAttack25HoldExactDeadline(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t)
	a25Load(t, e, "a", 10)
	a25Load(t, e, "b", 10)
	// The clock stands still, so these holds share one deadline.
	if _, err := e.Reserver.Hold(ctx, stock.Request{SKU: "b", ID: "hb", Qty: 3}, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"h1", "h2", "h3", "h4"} {
		if _, err := e.Reserver.Hold(ctx, stock.Request{SKU: "a", ID: id, Qty: 2}, 10*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	dl, err := e.Reserver.Ledger(ctx, "a", "h1")
	if err != nil {
		t.Fatal(err)
	}
	if want := e.Now().Add(10 * time.Minute).Truncate(time.Millisecond); !dl.Deadline.Equal(want) {
		t.Fatalf("hold deadline = %v, want now+10m = %v", dl.Deadline, want)
	}
	e.Advance(10*time.Minute - time.Millisecond)
	if _, err := e.Reserver.Confirm(ctx, "a", "h1"); err != nil {
		t.Fatalf("Confirm 1ms before the deadline: %v", err)
	}
	if _, err := e.Reserver.Extend(ctx, "a", "h2", time.Minute); err != nil {
		t.Fatalf("Extend 1ms before the deadline: %v", err)
	}
	e.Advance(time.Millisecond) // exactly the deadline of h3, h4
	if _, err := e.Reserver.Confirm(ctx, "a", "h3"); !errors.Is(err, stock.ErrExpired) {
		t.Fatalf("Confirm at the deadline = %v, want ErrExpired (entries due at d <= now)", err)
	}
	// Confirm released the item's other due hold (h4) too.
	if en, _ := e.Reserver.Ledger(ctx, "a", "h4"); en.State != stock.StateExpired {
		t.Fatalf("h4 after the Confirm of h3 at the deadline: %+v, want expired", en)
	}
	// The sweeper agrees with Confirm at the exact deadline.
	if n, err := stockops.Sweep(ctx, e.Reserver, "a", "b"); err != nil || n != 3 {
		t.Fatalf("Sweep at the deadline released %d, %v; want 3 (hb)", n, err)
	}
	if en, _ := e.Reserver.Ledger(ctx, "b", "hb"); en.State != stock.StateExpired {
		t.Fatalf("hb after the sweep: %+v, want expired", en)
	}
	if en, _ := e.Reserver.Ledger(ctx, "a", "h2"); en.State != stock.StateHeld {
		t.Fatalf("extended h2: %+v, want held", en)
	}
	if lv := a25Levels(t, e, "a"); lv.Sold != 2 || lv.Held != 2 || lv.Available != 6 {
		t.Fatalf("levels %+v, want sold 2 (h1), held 2 (h2), available 6", lv)
	}
	// h2's new deadline is now+1m measured from its Extend, 1ms before.
	e.Advance(time.Minute - 2*time.Millisecond)
	if _, err := e.Reserver.Confirm(ctx, "a", "h2"); err != nil {
		t.Fatalf("Confirm of the extended hold before its new deadline: %v", err)
	}
	// A replayed Hold of an expired id answers ErrExpired; of a confirmed one, a replay.
	if _, err := e.Reserver.Hold(ctx, stock.Request{SKU: "a", ID: "h4", Qty: 2}, time.Minute); !errors.Is(err, stock.ErrExpired) {
		t.Fatalf("Hold replay of the expired h4 = %v, want ErrExpired", err)
	}
	if rc, err := e.Reserver.Hold(ctx, stock.Request{SKU: "a", ID: "h1", Qty: 2}, time.Minute); err != nil || !rc.Replayed {
		t.Fatalf("Hold replay of the confirmed h1 = %+v, %v; want a replay", rc, err)
	}
}

// Advance racing with holds and confirms: whatever interleaving, the counters must match the
// acknowledged answers once every hold is settled.
func TestAttack25AdvanceConcurrentWithHolds(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t, stock.WithUserLimit(3))
	const loaded = 200
	a25Load(t, e, "a", loaded)
	var confirmed, expired, refused atomic.Int64
	stop := make(chan struct{})
	var adv sync.WaitGroup
	adv.Add(1)
	go func() {
		defer adv.Done()
		for {
			select {
			case <-stop:
				return
			default:
				e.Advance(3 * time.Millisecond)
				time.Sleep(time.Millisecond)
			}
		}
	}()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				id := fmt.Sprintf("g%d-%d", g, i)
				req := stock.Request{SKU: "a", ID: id, User: fmt.Sprint("u", i%10), Qty: 1}
				if _, err := e.Reserver.Hold(ctx, req, 5*time.Millisecond); err != nil {
					if errors.Is(err, stock.ErrUserLimit) || errors.Is(err, stock.ErrSoldOut) {
						refused.Add(1)
						continue
					}
					if errors.Is(err, stock.ErrExpired) { // the clock passed the deadline already
						expired.Add(1)
						continue
					}
					t.Errorf("Hold %s: %v", id, err)
					return
				}
				_, err := e.Reserver.Confirm(ctx, "a", id)
				switch {
				case err == nil:
					confirmed.Add(1)
					if _, err := e.Reserver.Restore(ctx, "a", id); err != nil { // give the user's unit back
						t.Errorf("Restore %s: %v", id, err)
						return
					}
				case errors.Is(err, stock.ErrExpired):
					expired.Add(1)
				default:
					t.Errorf("Confirm %s: %v", id, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	adv.Wait()
	e.Advance(time.Hour)
	if _, err := stockops.Sweep(ctx, e.Reserver, "a"); err != nil {
		t.Fatal(err)
	}
	lv := a25Levels(t, e, "a")
	if lv.Held != 0 || lv.Sold != 0 || lv.Available != loaded {
		t.Fatalf("after every hold settled: %+v, want all %d available (confirmed %d and restored, expired %d, refused %d)",
			lv, loaded, confirmed.Load(), expired.Load(), refused.Load())
	}
	if confirmed.Load()+expired.Load()+refused.Load() != 8*40 {
		t.Fatalf("outcomes %d+%d+%d, want %d", confirmed.Load(), expired.Load(), refused.Load(), 8*40)
	}
	t.Logf("confirmed %d, expired %d, refused %d", confirmed.Load(), expired.Load(), refused.Load())
}

// --- Run under the controlled clock --------------------------------------------------------

func TestAttack25RunSweepsAndDeliversAfterAdvance(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t)
	store := memstore.New()
	_ = store.Load(ctx, "a", 10)
	a25Load(t, e, "a", 10)
	a25Run(t, e, stock.RunOptions{Store: store})
	if _, err := e.Reserver.Hold(ctx, stock.Request{SKU: "a", ID: "h1", Qty: 5}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Reserver.Hold(ctx, stock.Request{SKU: "a", ID: "h2", Qty: 1}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Reserver.Deduct(ctx, stock.Request{SKU: "a", ID: "d1", Qty: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Reserver.Confirm(ctx, "a", "h2"); err != nil {
		t.Fatal(err)
	}
	// The deduct and the confirm reach the store without Advance.
	a25Wait(t, 10*time.Second, "events delivered", func() (bool, string) {
		n, _ := store.Remaining(ctx, "a")
		return n == 7, fmt.Sprint("store remaining ", n)
	})
	// The live hold stays held while the clock stands still, however long Run runs.
	time.Sleep(1500 * time.Millisecond)
	if lv := a25Levels(t, e, "a"); lv.Held != 5 {
		t.Fatalf("hold released without Advance: %+v", lv)
	}
	e.Advance(time.Minute) // exactly the deadline
	a25Wait(t, 10*time.Second, "hold released by Run's sweeper after Advance", func() (bool, string) {
		lv := a25Levels(t, e, "a")
		return lv.Held == 0 && lv.Available == 7, fmt.Sprintf("%+v", lv)
	})
	if en, err := e.Reserver.Ledger(ctx, "a", "h1"); err != nil || en.State != stock.StateExpired {
		t.Fatalf("h1 = %+v, %v; want expired", en, err)
	}
	if store.MaxApplications() != 1 {
		t.Fatalf("store applied an event %d times", store.MaxApplications())
	}
	for _, id := range []string{"d1", "h2"} {
		a25Wait(t, 10*time.Second, "ledger entry "+id+" applied", func() (bool, string) {
			en, _ := e.Reserver.Ledger(ctx, "a", id)
			return en.State == stock.StateApplied, string(en.State)
		})
	}
	if recs, _ := store.Records(ctx, "a", []string{"h1"}); len(recs) != 0 {
		t.Fatalf("the expired hold reached the store: %+v", recs)
	}
}

// The relay's retry backoff is a key TTL: it moves with Advance and stands still otherwise.
func TestAttack25RelayBackoffFollowsAdvance(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t)
	store := memstore.New()
	_ = store.Load(ctx, "a", 10)
	var calls atomic.Int64
	store.FailWith(func(stock.Event) error { calls.Add(1); return memstore.ErrDown })
	a25Load(t, e, "a", 10)
	a25Run(t, e, stock.RunOptions{Store: store, Reconcile: &stock.ReconcileOptions{Interval: -1},
		Relay: &stock.RelayOptions{MinBackoff: time.Minute, MaxBackoff: time.Minute}})
	if _, err := e.Reserver.Deduct(ctx, stock.Request{SKU: "a", ID: "d1", Qty: 3}); err != nil {
		t.Fatal(err)
	}
	a25Wait(t, 10*time.Second, "a first, failed, delivery", func() (bool, string) { return calls.Load() > 0, "" })
	store.FailWith(nil)
	before := calls.Load()
	time.Sleep(2 * time.Second)
	if n, _ := store.Remaining(ctx, "a"); n != 10 {
		t.Fatalf("event applied during a 1m backoff with the clock standing still (store remaining %d, failed calls %d -> %d)", n, before, calls.Load())
	}
	e.Advance(2 * time.Minute)
	a25Wait(t, 10*time.Second, "delivery after Advance past the backoff", func() (bool, string) {
		n, _ := store.Remaining(ctx, "a")
		return n == 7, fmt.Sprint("store remaining ", n)
	})
	if store.Applications("a", "d1", stock.EventDeducted) != 1 {
		t.Fatalf("d1 applied %d times", store.Applications("a", "d1", stock.EventDeducted))
	}
}

// --- Carts ---------------------------------------------------------------------------------

func TestAttack25CartRecoveryUnderRun(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t)
	a25HalfDoneCart(t, e, "stock")
	a25Run(t, e, stock.RunOptions{RecoverCartsAfter: 2 * time.Second})
	// Recovery looks every second of real time, but the cart is young on the Env clock.
	time.Sleep(2500 * time.Millisecond)
	if lv := a25Levels(t, e, "a"); lv.Available != 3 {
		t.Fatalf("cart undone while the Env clock stood still: a = %+v", lv)
	}
	e.Advance(3 * time.Second)
	a25Wait(t, 10*time.Second, "cart undone after Advance", func() (bool, string) {
		lv := a25Levels(t, e, "a")
		return lv.Available == 5 && lv.Sold == 0, fmt.Sprintf("%+v", lv)
	})
	// A late retry of the cart answers ErrRestored and takes nothing.
	_, err := e.Reserver.DeductMany(ctx, stock.Cart{ID: "cart-1", User: "u1", Lines: []stock.Line{{SKU: "a", Qty: 2}, {SKU: "b", Qty: 1}}})
	if !errors.Is(err, stock.ErrRestored) {
		t.Fatalf("retry of the recovered cart = %v, want ErrRestored", err)
	}
	if a, b := a25Levels(t, e, "a"), a25Levels(t, e, "b"); a.Available != 5 || b.Available != 5 {
		t.Fatalf("after the retry: a %+v, b %+v; want both untouched (5)", a, b)
	}
}

// With Run's default RecoverCartsAfter (5m), a test that Advances past it expects the cart
// undone "without real waiting": stocktest promises the cart-recovery cutoff moves with Advance.
func TestAttack25CartRecoveryDefaultRunAfterAdvance(t *testing.T) {
	e := stocktest.New(t)
	a25HalfDoneCart(t, e, "stock")
	a25Run(t, e, stock.RunOptions{})
	time.Sleep(500 * time.Millisecond) // Run's first look at carts, while the cart is young
	e.Advance(6 * time.Minute)
	a25Wait(t, 15*time.Second, "cart undone by Run (default RecoverCartsAfter 5m) after Advance(6m)", func() (bool, string) {
		lv := a25Levels(t, e, "a")
		return lv.Available == 5, fmt.Sprintf("a = %+v", lv)
	})
}

func TestAttack25HoldManyExpiresAfterAdvance(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t, stock.WithUserLimit(2))
	a25Load(t, e, "a", 3)
	a25Load(t, e, "b", 3)
	cart := stock.Cart{ID: "c1", User: "u", Lines: []stock.Line{{SKU: "b", Qty: 1}, {SKU: "a", Qty: 1}, {SKU: "a", Qty: 1}}}
	rc, err := e.Reserver.HoldMany(ctx, cart, time.Minute)
	if err != nil || len(rc.Items) != 2 || rc.Items[0].SKU != "a" || rc.Items[0].Qty != 2 {
		t.Fatalf("HoldMany = %+v, %v; want 2 receipts in SKU order, a with 2 units", rc, err)
	}
	// The user is at its limit on a.
	if _, err := e.Reserver.Deduct(ctx, stock.Request{SKU: "a", ID: "x", User: "u", Qty: 1}); !errors.Is(err, stock.ErrUserLimit) {
		t.Fatalf("Deduct past the limit = %v, want ErrUserLimit", err)
	}
	e.Advance(time.Minute)
	_, err = e.Reserver.ConfirmMany(ctx, "c1", "a", "b")
	var ce *stock.CartError
	if !errors.As(err, &ce) || !errors.Is(err, stock.ErrExpired) {
		t.Fatalf("ConfirmMany after the deadline = %v, want a *CartError wrapping ErrExpired", err)
	}
	for _, sku := range []string{"a", "b"} {
		if lv := a25Levels(t, e, sku); lv.Available != 3 || lv.Held != 0 || lv.Sold != 0 {
			t.Fatalf("%s after the expired cart: %+v, want all 3 available", sku, lv)
		}
	}
	if _, err := e.Reserver.HoldMany(ctx, cart, time.Minute); !errors.Is(err, stock.ErrExpired) {
		t.Fatalf("HoldMany retry of the expired cart = %v, want ErrExpired", err)
	}
	// Units went back to the user: a new cart of 2 fits the limit.
	if _, err := e.Reserver.DeductMany(ctx, stock.Cart{ID: "c2", User: "u", Lines: []stock.Line{{SKU: "a", Qty: 2}}}); err != nil {
		t.Fatalf("DeductMany after the expiry gave the user's units back: %v", err)
	}
}

func TestAttack25GroupsCartAtomic(t *testing.T) {
	ctx := context.Background()
	group := func(sku string) string {
		if i := strings.IndexByte(sku, '-'); i > 0 {
			return sku[:i]
		}
		return ""
	}
	e := stocktest.New(t, stock.WithGroups(group))
	a25Load(t, e, "shoe-41", 1)
	a25Load(t, e, "shoe-42", 5)
	for _, k := range e.Redis.Keys() {
		if strings.Contains(k, "shoe-4") && !strings.Contains(k, "{shoe}") {
			t.Fatalf("grouped key %q lacks the group tag", k)
		}
	}
	bad := stock.Cart{ID: "c1", Lines: []stock.Line{{SKU: "shoe-42", Qty: 1}, {SKU: "shoe-41", Qty: 2}}}
	if _, err := e.Reserver.DeductMany(ctx, bad); !errors.Is(err, stock.ErrInsufficient) {
		t.Fatalf("one-slot cart short on shoe-41 = %v, want ErrInsufficient", err)
	}
	if lv := a25Levels(t, e, "shoe-42"); lv.Available != 5 {
		t.Fatalf("refused one-slot cart changed shoe-42: %+v", lv)
	}
	good := stock.Cart{ID: "c2", Lines: []stock.Line{{SKU: "shoe-42", Qty: 2}, {SKU: "shoe-41", Qty: 1}}}
	var okN, replayN atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rc, err := e.Reserver.DeductMany(ctx, good)
			if err != nil {
				t.Errorf("copy of c2: %v", err)
				return
			}
			if rc.Replayed {
				replayN.Add(1)
			} else {
				okN.Add(1)
			}
		}()
	}
	wg.Wait()
	if okN.Load() != 1 || replayN.Load() != 7 {
		t.Fatalf("8 copies of one cart: %d not replayed, %d replayed; want 1 and 7", okN.Load(), replayN.Load())
	}
	if a, b := a25Levels(t, e, "shoe-41"), a25Levels(t, e, "shoe-42"); a.Available != 0 || b.Available != 3 {
		t.Fatalf("after c2: shoe-41 %+v, shoe-42 %+v", a, b)
	}
}

func TestAttack25CoalescingCounts(t *testing.T) {
	for _, c := range []int{0, 1, 4} {
		t.Run(fmt.Sprint("coalesce", c), func(t *testing.T) {
			ctx := context.Background()
			e := stocktest.New(t, stock.WithCoalescing(c), stock.WithSoldOutCache(time.Second))
			a25Load(t, e, "hot", 25)
			var ok, soldOut atomic.Int64
			run := func(wantReplay bool) {
				var wg sync.WaitGroup
				for i := range 60 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						rc, err := e.Reserver.Deduct(ctx, stock.Request{SKU: "hot", ID: fmt.Sprint("o", i), User: fmt.Sprint("u", i), Qty: 1})
						switch {
						case err == nil:
							if rc.Replayed != wantReplay {
								t.Errorf("o%d: Replayed %v, want %v", i, rc.Replayed, wantReplay)
							}
							ok.Add(1)
						case errors.Is(err, stock.ErrSoldOut):
							soldOut.Add(1)
						default:
							t.Errorf("o%d: %v", i, err)
						}
					}()
				}
				wg.Wait()
			}
			run(false)
			if ok.Load() != 25 || soldOut.Load() != 35 {
				t.Fatalf("60 deducts of 1 on 25: %d ok, %d sold out", ok.Load(), soldOut.Load())
			}
			ok.Store(0)
			soldOut.Store(0)
			run(true) // every id again: the 25 are replays, the 35 still sold out
			if ok.Load() != 25 || soldOut.Load() != 35 {
				t.Fatalf("repeat: %d replays, %d sold out; want 25 and 35", ok.Load(), soldOut.Load())
			}
			// Stock coming back is seen at once (the sold-out cache is off on miniredis).
			if _, err := e.Reserver.Restore(ctx, "hot", "o0"); err != nil && !errors.Is(err, stock.ErrUnknownID) {
				t.Fatal(err)
			}
			lv := a25Levels(t, e, "hot")
			if lv.Available != 1 && lv.Available != 0 {
				t.Fatalf("levels after a restore: %+v", lv)
			}
			if lv.Available == 1 {
				if _, err := e.Reserver.Deduct(ctx, stock.Request{SKU: "hot", ID: "late", Qty: 1}); err != nil {
					t.Fatalf("deduct after a restore: %v", err)
				}
			}
		})
	}
}

func TestAttack25OutboxOff(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t, stock.WithOutbox(false))
	a25Load(t, e, "a", 5)
	if _, err := e.Reserver.Deduct(ctx, stock.Request{SKU: "a", ID: "d", Qty: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Reserver.Hold(ctx, stock.Request{SKU: "a", ID: "h", Qty: 1}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Reserver.Restore(ctx, "a", "d"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Reserver.Restock(ctx, "a", "r", 4); err != nil {
		t.Fatal(err)
	}
	e.Advance(time.Minute)
	if _, err := stockops.Sweep(ctx, e.Reserver); err != nil {
		t.Fatal(err)
	}
	pending, dead, err := stockops.Pending(ctx, e.Reserver, "a")
	if err != nil || pending != 0 || dead != 0 {
		t.Fatalf("Pending with the outbox off = %d, %d, %v; want 0, 0", pending, dead, err)
	}
	if lv := a25Levels(t, e, "a"); lv.Available != 9 || lv.Loaded != 9 {
		t.Fatalf("levels %+v, want 9 available of 9", lv)
	}
}

// --- TestStore against broken stores, in a child process -----------------------------------

// a25Store is a small Store whose mode breaks one rule of the contract on purpose.
type a25Store struct {
	mode string
	mu   sync.Mutex
	rem  map[string]int64
	recs map[string]map[string]stock.Record
}

func newA25Store(mode string) *a25Store {
	return &a25Store{mode: mode, rem: map[string]int64{}, recs: map[string]map[string]stock.Record{}}
}

func (s *a25Store) Load(_ context.Context, sku string, qty int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.rem[sku]; ok {
		return stock.ErrLoaded
	}
	s.rem[sku] = qty
	return nil
}

func (s *a25Store) Remaining(_ context.Context, sku string) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.rem[sku]
	if !ok {
		if s.mode == "remaining-unknown-zero" {
			return 0, nil
		}
		return 0, stock.ErrNotLoaded
	}
	return n, nil
}

func (s *a25Store) Records(_ context.Context, sku string, ids []string) (map[string]stock.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]stock.Record{}
	for _, id := range ids {
		if r, ok := s.recs[sku][id]; ok {
			out[id] = r
		}
	}
	return out, nil
}

func (s *a25Store) Apply(_ context.Context, ev stock.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	recs := s.recs[ev.SKU]
	if recs == nil {
		recs = map[string]stock.Record{}
		s.recs[ev.SKU] = recs
	}
	rec, seen := recs[ev.ID]
	rem, loaded := s.rem[ev.SKU]
	newRec := func(st stock.State) stock.Record {
		return stock.Record{SKU: ev.SKU, ID: ev.ID, User: ev.User, Type: ev.Type, Qty: ev.Qty, Status: st, At: time.Now()}
	}
	covers := func() bool {
		if s.mode == "negative" {
			return loaded && rem > 0 // checks only that some stock is left
		}
		return loaded && rem >= ev.Qty
	}
	switch ev.Type {
	case stock.EventDeducted, stock.EventConfirmed:
		if s.mode == "repeat-refused-when-low" && !covers() {
			// A conditional decrement first, the id looked up only when it succeeds: a repeat
			// of an applied deduct is "refused" once the stock has dropped below its qty.
			if !seen {
				recs[ev.ID] = newRec(stock.StateRefused)
			}
			return stock.ErrRefused
		}
		if !seen && !loaded {
			return stock.ErrNotLoaded // a setup error, not a refusal: nothing recorded
		}
		if seen && s.mode != "non-idempotent" {
			if rec.Status == stock.StateRefused {
				if s.mode == "refusal-not-sticky" && covers() {
					s.rem[ev.SKU] = rem - ev.Qty
					recs[ev.ID] = newRec(stock.StateApplied)
					return nil
				}
				return stock.ErrRefused
			}
			if rec.Status == stock.StateRestored && s.mode == "tombstone-ignored" && covers() {
				s.rem[ev.SKU] = rem - ev.Qty
				recs[ev.ID] = newRec(stock.StateApplied)
			}
			return nil
		}
		if !covers() {
			recs[ev.ID] = newRec(stock.StateRefused)
			return stock.ErrRefused
		}
		s.rem[ev.SKU] = rem - ev.Qty
		recs[ev.ID] = newRec(stock.StateApplied)
	case stock.EventRestored, stock.EventRefused:
		if !seen {
			if s.mode != "tombstone-ignored" {
				recs[ev.ID] = newRec(stock.StateRestored)
			}
			return nil
		}
		if rec.Status == stock.StateApplied && rec.Type != stock.EventRestocked {
			if s.mode == "racy-restore" {
				// Check, then give back outside the lock (a read-then-write without a row lock).
				s.mu.Unlock()
				time.Sleep(2 * time.Millisecond)
				s.mu.Lock()
				s.rem[ev.SKU] += rec.Qty
				rec.Status = stock.StateRestored
				s.recs[ev.SKU][ev.ID] = rec
				return nil
			}
			s.rem[ev.SKU] = rem + rec.Qty
			rec.Status = stock.StateRestored
			recs[ev.ID] = rec
		}
	case stock.EventRestocked:
		if seen {
			return nil
		}
		if !loaded {
			return stock.ErrNotLoaded
		}
		s.rem[ev.SKU] = rem + ev.Qty
		recs[ev.ID] = newRec(stock.StateApplied)
	}
	return nil
}

// TestAttack25StoreSuiteChild runs stocktest.TestStore on the store ATTACK25_STORE names; it is
// run by TestAttack25TestStore* in a child process, and skips otherwise.
func TestAttack25StoreSuiteChild(t *testing.T) {
	mode := os.Getenv("ATTACK25_STORE")
	if mode == "" {
		t.Skip("run by TestAttack25TestStore in a child process")
	}
	stocktest.TestStore(t, func(t *testing.T) stock.Store {
		if mode == "memstore" {
			return memstore.New()
		}
		return newA25Store(mode)
	})
}

// a25Child runs TestStore on the store mode in a child test process.
func a25Child(t *testing.T, env, mode string) (failed bool, out string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestAttack25StoreSuiteChild$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), env+"="+mode)
	b, err := cmd.CombinedOutput()
	out = string(b)
	if ctx.Err() != nil {
		t.Fatalf("child for %s timed out:\n%s", mode, out)
	}
	if strings.Contains(out, "panic:") || strings.Contains(out, "no tests to run") {
		t.Fatalf("child for %s did not run the suite cleanly:\n%s", mode, out)
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return false, out
	case errors.As(err, &ee):
		return true, out
	default:
		t.Fatalf("child for %s: %v", mode, err)
	}
	return
}

func TestAttack25TestStoreMemstorePasses(t *testing.T) {
	failed, out := a25Child(t, "ATTACK25_STORE", "memstore")
	if failed {
		t.Fatalf("TestStore fails memstore:\n%s", out)
	}
	for _, sub := range []string{"DeductIdempotent", "RefusalIsFinal", "ConcurrentNoOversell", "Batch", "BatchStopsAtFailure", "BatchAnswersUnapplied"} {
		if !strings.Contains(out, "--- PASS: TestAttack25StoreSuiteChild/"+sub+" ") {
			t.Fatalf("subtest %s did not pass on memstore:\n%s", sub, out)
		}
	}
	// The correct reference store of this file passes too (a control for the broken modes).
	if failed, out := a25Child(t, "ATTACK25_STORE", "correct"); failed {
		t.Fatalf("TestStore fails the correct a25Store:\n%s", out)
	}
}

func TestAttack25TestStoreCatchesBrokenStores(t *testing.T) {
	for mode, wantFail := range map[string]string{
		"non-idempotent":         "DeductIdempotent",
		"negative":               "RefusalIsFinal",
		"tombstone-ignored":      "RestoreBeforeDeductTombstone",
		"refusal-not-sticky":     "RefusalIsFinal",
		"remaining-unknown-zero": "RemainingUnknownItem",
	} {
		t.Run(mode, func(t *testing.T) {
			failed, out := a25Child(t, "ATTACK25_STORE", mode)
			if !failed {
				t.Fatalf("TestStore passed a store broken on purpose (%s):\n%s", mode, out)
			}
			if !strings.Contains(out, "--- FAIL: TestAttack25StoreSuiteChild/"+wantFail+" ") {
				t.Fatalf("broken store %s: subtest %s did not fail:\n%s", mode, wantFail, out)
			}
		})
	}
}

// Stores that break the contract in ways TestStore's doc says it checks, but that its checks
// do not reach: each must fail the suite.
func TestAttack25TestStoreCatchesSubtleStores(t *testing.T) {
	for _, mode := range []string{
		// "Apply is idempotent per (SKU, ID), and a repeat answers as the first application
		// did": a repeat of an applied deduct answered ErrRefused once stock dropped below its
		// qty. The relay/Consume would then give the units back in Redis for a sale the store
		// keeps (Redis oversells by that much).
		"repeat-refused-when-low",
		// "concurrent applies of one id apply it once": concurrent duplicate restores of one
		// id give back twice.
		"racy-restore",
	} {
		t.Run(mode, func(t *testing.T) {
			failed, out := a25Child(t, "ATTACK25_STORE", mode)
			if !failed {
				t.Fatalf("stocktest.TestStore PASSED a store broken on purpose (%s); a store with this bug is certified:\n%s", mode, a25Tail(out, 40))
			}
		})
	}
}

// Show directly that the two subtle stores break the contract (so the finding above is real).
func TestAttack25SubtleStoresReallyBroken(t *testing.T) {
	ctx := context.Background()
	t.Run("repeat-refused-when-low", func(t *testing.T) {
		s := newA25Store("repeat-refused-when-low")
		_ = s.Load(ctx, "a", 3)
		e := stock.Event{Type: stock.EventDeducted, SKU: "a", ID: "o1", Qty: 3}
		if err := s.Apply(ctx, e); err != nil {
			t.Fatal(err)
		}
		if err := s.Apply(ctx, e); !errors.Is(err, stock.ErrRefused) {
			t.Fatalf("the broken store answered the repeat %v (expected it to be broken)", err)
		}
		if r, _ := s.Records(ctx, "a", []string{"o1"}); r["o1"].Status != stock.StateApplied {
			t.Fatalf("record %+v", r)
		}
		t.Logf("repeat of an applied deduct answered ErrRefused while its record says applied: contract broken")
	})
	t.Run("racy-restore", func(t *testing.T) {
		s := newA25Store("racy-restore")
		_ = s.Load(ctx, "a", 10)
		_ = s.Apply(ctx, stock.Event{Type: stock.EventDeducted, SKU: "a", ID: "o1", Qty: 3})
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = s.Apply(ctx, stock.Event{Type: stock.EventRestored, SKU: "a", ID: "o1", Qty: 3})
			}()
		}
		wg.Wait()
		if n, _ := s.Remaining(ctx, "a"); n == 10 {
			t.Fatalf("the racy store gave back once (remaining 10); expected it to be broken")
		} else {
			t.Logf("8 concurrent restores of one id: remaining %d, want 10: contract broken", n)
		}
	})
}

func a25Tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// --- TestPublisher against an in-memory queue, correct and broken --------------------------

type a25Msg struct {
	ev      stock.Event
	owner   *a25Consumer
	acked   bool
	visible time.Time
}

// a25Queue is an in-memory queue with one consumer group. mode breaks it on purpose:
// "drop" accepts every third event without keeping it; "lose-on-crash" drops the messages a
// crashed member held; "ack-ignored" delivers acknowledged messages again.
type a25Queue struct {
	mode string
	mu   sync.Mutex
	msgs []*a25Msg
	n    int
}

func (q *a25Queue) Publish(_ context.Context, ev stock.Event) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.n++
	if q.mode == "drop" && q.n%3 == 0 {
		return nil
	}
	q.msgs = append(q.msgs, &a25Msg{ev: ev})
	return nil
}

type a25Consumer struct {
	q    *a25Queue
	dead atomic.Bool
}

type a25Delivery struct {
	c *a25Consumer
	m *a25Msg
}

func (d a25Delivery) Event() (stock.Event, error) { return d.m.ev, nil }
func (d a25Delivery) Ack(context.Context) error {
	d.c.q.mu.Lock()
	defer d.c.q.mu.Unlock()
	if d.m.owner != d.c {
		return errors.New("not the owner")
	}
	if d.c.q.mode == "ack-ignored" {
		d.m.owner, d.m.visible = nil, time.Now().Add(100*time.Millisecond)
		return nil
	}
	d.m.acked, d.m.owner = true, nil
	return nil
}
func (d a25Delivery) Retry(context.Context) error {
	d.c.q.mu.Lock()
	defer d.c.q.mu.Unlock()
	if d.m.owner == d.c {
		d.m.owner, d.m.visible = nil, time.Now().Add(100*time.Millisecond)
	}
	return nil
}

func (c *a25Consumer) Receive(ctx context.Context, max int, wait time.Duration) ([]Delivery, error) {
	deadline := time.Now().Add(wait)
	for {
		if c.dead.Load() {
			return nil, errors.New("crashed")
		}
		c.q.mu.Lock()
		var out []Delivery
		now := time.Now()
		for _, m := range c.q.msgs {
			if len(out) == max {
				break
			}
			if !m.acked && m.owner == nil && !m.visible.After(now) {
				m.owner = c
				out = append(out, a25Delivery{c, m})
			}
		}
		c.q.mu.Unlock()
		if len(out) > 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return out, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (c *a25Consumer) Crash() {
	c.dead.Store(true)
	c.q.mu.Lock()
	defer c.q.mu.Unlock()
	for _, m := range c.q.msgs {
		if m.owner == c {
			m.owner = nil
			if c.q.mode == "lose-on-crash" {
				m.acked = true // gone
			}
		}
	}
}

// Delivery is stocktest.Delivery, named here for the fake consumer.
type Delivery = stocktest.Delivery

func TestAttack25PublisherSuiteChild(t *testing.T) {
	mode := os.Getenv("ATTACK25_QUEUE")
	if mode == "" {
		t.Skip("run by TestAttack25TestPublisher in a child process")
	}
	stocktest.TestPublisher(t, func(t *testing.T) stocktest.PublisherPair {
		q := &a25Queue{mode: mode}
		return stocktest.PublisherPair{
			Publisher:   q,
			NewConsumer: func(testing.TB) stocktest.Consumer { return &a25Consumer{q: q} },
			Redelivery:  300 * time.Millisecond,
		}
	})
}

func a25PubChild(t *testing.T, mode string) (failed bool, out string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestAttack25PublisherSuiteChild$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "ATTACK25_QUEUE="+mode)
	b, err := cmd.CombinedOutput()
	out = string(b)
	if ctx.Err() != nil {
		t.Fatalf("child for %s timed out:\n%s", mode, a25Tail(out, 40))
	}
	if strings.Contains(out, "panic:") || strings.Contains(out, "no tests to run") {
		t.Fatalf("child for %s did not run the suite cleanly:\n%s", mode, a25Tail(out, 60))
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("child for %s: %v", mode, err)
	}
	return err != nil, out
}

func TestAttack25TestPublisher(t *testing.T) {
	t.Run("correct", func(t *testing.T) {
		t.Parallel()
		if failed, out := a25PubChild(t, "correct"); failed {
			t.Fatalf("TestPublisher fails a correct in-memory queue:\n%s", a25Tail(out, 60))
		}
	})
	for mode, wantFail := range map[string]string{
		"drop":          "AtLeastOnce",
		"lose-on-crash": "OrderAfterCrash",
		"ack-ignored":   "ExactlyOnceInEffect",
	} {
		t.Run(mode, func(t *testing.T) {
			if testing.Short() {
				t.Skip("-short: a broken queue's child run waits out TestPublisher's timeouts (up to half a minute); TestPublisherChecksCanFail makes the same checks fail in-process, and the full tier runs this")
			}
			t.Parallel()
			failed, out := a25PubChild(t, mode)
			if !failed {
				t.Fatalf("TestPublisher passed a queue broken on purpose (%s):\n%s", mode, a25Tail(out, 40))
			}
			if !strings.Contains(out, "--- FAIL: TestAttack25PublisherSuiteChild/"+wantFail+" ") {
				t.Fatalf("queue %s: subtest %s did not fail:\n%s", mode, wantFail, a25Tail(out, 60))
			}
		})
	}
}

// memstore's Applications through the whole path: two distinct events, each applied once by
// the relay, on names the library accepts ('/' is allowed).
func TestAttack25MemstoreCountsThroughRelay(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t)
	store := memstore.New()
	for _, sku := range []string{"a/b", "a"} {
		_ = store.Load(ctx, sku, 10)
		a25Load(t, e, sku, 10)
	}
	if _, err := e.Reserver.Deduct(ctx, stock.Request{SKU: "a/b", ID: "c", Qty: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Reserver.Deduct(ctx, stock.Request{SKU: "a", ID: "b/c", Qty: 1}); err != nil {
		t.Fatal(err)
	}
	a25Run(t, e, stock.RunOptions{Store: store, Reconcile: &stock.ReconcileOptions{Interval: -1}})
	a25Wait(t, 10*time.Second, "both deducts delivered", func() (bool, string) {
		x, _ := store.Remaining(ctx, "a/b")
		y, _ := store.Remaining(ctx, "a")
		return x == 9 && y == 9, fmt.Sprint(x, y)
	})
	if m := store.MaxApplications(); m != 1 {
		t.Fatalf("memstore.MaxApplications() = %d after the relay applied two distinct events once each (a/b:c and a:b/c), want 1", m)
	}
}
