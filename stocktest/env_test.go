package stocktest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// TestEnvPassesTheMemoryPolicyCheckQuietly: the Env's miniredis answers the Reserver's memory
// policy check as a Redis set to noeviction, so a test's first write logs no warning that the
// policy could not be read.
func TestEnvPassesTheMemoryPolicyCheckQuietly(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e := stocktest.New(t, stock.WithLogger(logger))
	load(t, e, "quiet", 1)
	deduct(t, e, "quiet", "o1", 1)
	if strings.Contains(buf.String(), "maxmemory-policy") {
		t.Errorf("the first write logged about the memory policy:\n%s", buf.String())
	}
}

// --- helpers -------------------------------------------------------------------------------

// must fails the test on err.
func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond until it holds or limit (real time) passes; generous bounds only.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() (bool, string)) {
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

func levels(t *testing.T, e *stocktest.Env, sku string) stock.Levels {
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

func load(t *testing.T, e *stocktest.Env, sku string, qty int64) {
	t.Helper()
	if err := e.Reserver.Load(context.Background(), sku, qty); err != nil {
		t.Fatalf("Load(%q, %d): %v", sku, qty, err)
	}
}

func deduct(t *testing.T, e *stocktest.Env, sku, id string, qty int64) {
	t.Helper()
	if _, err := e.Reserver.Deduct(context.Background(), stock.Request{SKU: sku, ID: id, Qty: qty}); err != nil {
		t.Fatalf("Deduct(%s/%s): %v", sku, id, err)
	}
}

func hold(t *testing.T, e *stocktest.Env, sku, id string, qty int64, ttl time.Duration) {
	t.Helper()
	if _, err := e.Reserver.Hold(context.Background(), stock.Request{SKU: sku, ID: id, Qty: qty}, ttl); err != nil {
		t.Fatalf("Hold(%s/%s): %v", sku, id, err)
	}
}

// runUntilEnd starts e.Reserver.Run and stops it when the test ends (bounded).
func runUntilEnd(t *testing.T, e *stocktest.Env, opts stock.RunOptions) {
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

// newOnFakeTB calls stocktest.New on a TB that records a failure instead of failing t, and
// reports the env (nil when New failed it), whether it failed, and why.
func newOnFakeTB(t *testing.T, opts ...stock.Option) (e *stocktest.Env, failed bool, msg string) {
	failed, _, msg = stocktest.RunOnFakeT(t, func(tb testing.TB) { e = stocktest.New(tb, opts...) })
	return e, failed, msg
}

// halfDoneCart leaves cart "cart-1" (a:2, b:1) half done: line a taken, the saga cut short
// by an error that is not a refusal on b (a key of the wrong type), then b repaired and loaded.
func halfDoneCart(t *testing.T, e *stocktest.Env, prefix string) {
	t.Helper()
	ctx := context.Background()
	load(t, e, "a", 5)
	bad := prefix + ":{b}"
	must(t, e.Redis.Set(bad, "not a hash"))
	_, err := e.Reserver.DeductMany(ctx, stock.Cart{ID: "cart-1", User: "u1", Lines: []stock.Line{{SKU: "a", Qty: 2}, {SKU: "b", Qty: 1}}})
	var ce *stock.CartError
	if err == nil || errors.As(err, &ce) {
		t.Fatalf("DeductMany with a broken key on b = %v, want an error that is not a refusal", err)
	}
	e.Redis.Del(bad)
	load(t, e, "b", 5)
	if lv := levels(t, e, "a"); lv.Available != 3 || lv.Sold != 2 {
		t.Fatalf("after the cut-short cart, a = %+v, want 3 available, 2 sold", lv)
	}
}

// --- Env: clock, options, isolation ---------------------------------------------------------

// TestEnvClock: Env.Now starts at about the wall clock, truncated to the microsecond, and is
// Redis's TIME too; the clock (and a key's TTL) stands still without Advance, Advance(0) and a
// refused negative Advance (which panics) leave it, and key TTLs run down on the same clock.
func TestEnvClock(t *testing.T) {
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
	pttl := func(k string) int64 {
		t.Helper()
		ms, err := e.Client.Do(ctx, e.Client.B().Pttl().Key(k).Build()).AsInt64()
		must(t, err)
		return ms
	}
	// The clock, and a key's TTL, stand still without Advance.
	must(t, e.Client.Do(ctx, e.Client.B().Set().Key("lease").Value("x").Px(time.Second).Build()).Error())
	time.Sleep(30 * time.Millisecond)
	if !e.Now().Equal(start) || !redisTime().Equal(start) || pttl("lease") != 1000 {
		t.Fatalf("the clock moved without Advance: Now %v, TIME %v, start %v, PTTL %d", e.Now(), redisTime(), start, pttl("lease"))
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
	must(t, e.Client.Do(ctx, e.Client.B().Set().Key("k").Value("v").Px(10*time.Second).Build()).Error())
	e.Advance(4 * time.Second)
	if ms := pttl("k"); ms != 6000 {
		t.Fatalf("PTTL after Advance(4s) = %d; want 6000", ms)
	}
	e.Advance(6*time.Second - time.Millisecond)
	if !e.Redis.Exists("k") {
		t.Fatalf("a 10s key expired after 9.999s of Advance")
	}
	e.Advance(time.Millisecond)
	if e.Redis.Exists("k") {
		t.Fatalf("a 10s key still exists after 10s of Advance")
	}
}

// TestEnvsIsolatedParallel: Envs of parallel tests share nothing: each has its own items,
// user limits, clock and keys.
func TestEnvsIsolatedParallel(t *testing.T) {
	for i := range 6 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := stocktest.New(t, stock.WithUserLimit(int64(i+1)))
			start := e.Now()
			load(t, e, "same", int64(10+i))
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
			if lv := levels(t, e, "same"); lv.Sold != int64(want) || lv.Loaded != int64(10+i) {
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

// TestNewRefusesBadOptions: stocktest.New fails t, saying so, when stock.New refuses the
// options, and accepts a valid set.
func TestNewRefusesBadOptions(t *testing.T) {
	for name, opt := range map[string]stock.Option{
		"prefix with brace":   stock.WithPrefix("a{b"),
		"prefix with space":   stock.WithPrefix("a b"),
		"negative user limit": stock.WithUserLimit(-1),
		"user limit > MaxQty": stock.WithUserLimit(stock.MaxQty + 1),
		"timeout 0":           stock.WithTimeout(0),
		"negative coalescing": stock.WithCoalescing(-1),
	} {
		t.Run(name, func(t *testing.T) {
			e, failed, msg := newOnFakeTB(t, opt)
			if !failed || e != nil {
				t.Fatalf("stocktest.New with %s: failed=%v env=%v; the doc says it fails t if stock.New refuses opts", name, failed, e != nil)
			}
			if !strings.Contains(msg, "stock.New") {
				t.Fatalf("failure message %q does not say stock.New refused the options", msg)
			}
		})
	}
	// And a good set of options does not fail it.
	if e, failed, msg := newOnFakeTB(t, stock.WithPrefix("shop"), stock.WithUserLimit(1), stock.WithCoalescing(0), stock.WithSoldOutCache(0)); failed || e == nil {
		t.Fatalf("stocktest.New with valid options failed: %s", msg)
	}
}

// A WithClock among the options: stocktest's doc promises that Advance moves the Reserver's
// own clock (cart age, retention). Either New refuses a conflicting WithClock (fails t), or
// Advance must still govern the cart-recovery cutoff.
func TestConflictingWithClock(t *testing.T) {
	wall := func() time.Time { return time.Now() }
	e, failed, msg := newOnFakeTB(t, stock.WithClock(wall))
	if failed {
		t.Logf("stocktest.New refused a conflicting WithClock: %s", msg)
		return
	}
	halfDoneCart(t, e, "stock")
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

// TestPrefixKeys: with WithPrefix every key carries the prefix, and holds, Sweep and Levels
// work under it.
func TestPrefixKeys(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t, stock.WithPrefix("shop"))
	load(t, e, "x:1~ü", 3)
	deduct(t, e, "x:1~ü", "o:1~é", 2)
	hold(t, e, "x:1~ü", "h", 1, time.Minute)
	for _, k := range e.Redis.Keys() {
		if !strings.HasPrefix(k, "shop:") {
			t.Fatalf("key %q does not carry the prefix shop:", k)
		}
	}
	e.Advance(time.Minute)
	if n, err := stockops.Sweep(ctx, e.Reserver); err != nil || n != 1 {
		t.Fatalf("Sweep after the deadline = %d, %v; want 1 unit released", n, err)
	}
	if lv := levels(t, e, "x:1~ü"); lv.Available != 1 || lv.Sold != 2 || lv.Held != 0 {
		t.Fatalf("levels %+v, want 1 available, 2 sold, 0 held", lv)
	}
}

// --- Holds and the clock -------------------------------------------------------------------

// TestHoldExactDeadline: on the Env clock a hold is live 1ms before its deadline (a replay of it
// answers as the first) and due at it: Confirm answers ErrExpired and releases the item's other due holds, Sweep agrees, Extend moves
// the deadline from its own call, and replays of expired and confirmed holds answer as the first.
func TestHoldExactDeadline(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t)
	load(t, e, "a", 10)
	load(t, e, "b", 10)
	// The clock stands still, so these holds share one deadline.
	hold(t, e, "b", "hb", 3, 10*time.Minute)
	for _, id := range []string{"h1", "h2", "h3", "h4"} {
		hold(t, e, "a", id, 2, 10*time.Minute)
	}
	dl, err := e.Reserver.Ledger(ctx, "a", "h1")
	must(t, err)
	if want := e.Now().Add(10 * time.Minute).Truncate(time.Millisecond); !dl.Deadline.Equal(want) {
		t.Fatalf("hold deadline = %v, want now+10m = %v", dl.Deadline, want)
	}
	e.Advance(10*time.Minute - time.Millisecond)
	hold(t, e, "a", "h3", 2, 10*time.Minute) // a replay of a live hold
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
	if lv := levels(t, e, "a"); lv.Sold != 2 || lv.Held != 2 || lv.Available != 6 {
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
func TestAdvanceConcurrentWithHolds(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t, stock.WithUserLimit(3))
	const loaded = 200
	load(t, e, "a", loaded)
	var confirmed, expired, refused atomic.Int64
	stop := make(chan struct{})
	var adv sync.WaitGroup
	adv.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				e.Advance(3 * time.Millisecond)
				time.Sleep(time.Millisecond)
			}
		}
	})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
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
		})
	}
	wg.Wait()
	close(stop)
	adv.Wait()
	e.Advance(time.Hour)
	_, err := stockops.Sweep(ctx, e.Reserver, "a")
	must(t, err)
	lv := levels(t, e, "a")
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

// TestRunSweepsAndDeliversAfterAdvance: under Reserver.Run, deducts and confirms reach the
// store without Advance, a live hold stays held while the clock stands still and is released
// by Run's sweeper after Advance past its deadline, and the expired hold never reaches the store.
func TestRunSweepsAndDeliversAfterAdvance(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t)
	store := memstore.New()
	_ = store.Load(ctx, "a", 10)
	load(t, e, "a", 10)
	runUntilEnd(t, e, stock.RunOptions{Store: store})
	hold(t, e, "a", "h1", 5, time.Minute)
	hold(t, e, "a", "h2", 1, time.Minute)
	deduct(t, e, "a", "d1", 2)
	_, err := e.Reserver.Confirm(ctx, "a", "h2")
	must(t, err)
	// The deduct and the confirm reach the store without Advance.
	waitFor(t, 10*time.Second, "events delivered", func() (bool, string) {
		n, _ := store.Remaining(ctx, "a")
		return n == 7, fmt.Sprint("store remaining ", n)
	})
	// The live hold stays held while the clock stands still, however long Run runs.
	time.Sleep(1500 * time.Millisecond)
	if lv := levels(t, e, "a"); lv.Held != 5 {
		t.Fatalf("hold released without Advance: %+v", lv)
	}
	e.Advance(time.Minute) // exactly the deadline
	waitFor(t, 10*time.Second, "hold released by Run's sweeper after Advance", func() (bool, string) {
		lv := levels(t, e, "a")
		return lv.Held == 0 && lv.Available == 7, fmt.Sprintf("%+v", lv)
	})
	if en, err := e.Reserver.Ledger(ctx, "a", "h1"); err != nil || en.State != stock.StateExpired {
		t.Fatalf("h1 = %+v, %v; want expired", en, err)
	}
	if store.MaxApplications() != 1 {
		t.Fatalf("store applied an event %d times", store.MaxApplications())
	}
	for _, id := range []string{"d1", "h2"} {
		waitFor(t, 10*time.Second, "ledger entry "+id+" applied", func() (bool, string) {
			en, _ := e.Reserver.Ledger(ctx, "a", id)
			return en.State == stock.StateApplied, string(en.State)
		})
	}
	if recs, _ := store.Records(ctx, "a", []string{"h1"}); len(recs) != 0 {
		t.Fatalf("the expired hold reached the store: %+v", recs)
	}
}

// The relay's retry backoff is a key TTL: an item whose event failed waits for its backoff,
// which stands still with the clock (whatever real time passes) and passes with Advance; the
// event is then applied once. Through a stockops Relay's passes, and under Reserver.Run.
func TestRelayBackoffFollowsAdvance(t *testing.T) {
	setup := func(t *testing.T) (*stocktest.Env, *memstore.Store, *atomic.Int64) {
		e := stocktest.New(t)
		store := memstore.New()
		_ = store.Load(context.Background(), "a", 10)
		load(t, e, "a", 10)
		var calls atomic.Int64
		store.FailWith(func(stock.Event) error { calls.Add(1); return memstore.ErrDown })
		return e, store, &calls
	}
	ctx := context.Background()
	t.Run("Relay.Once", func(t *testing.T) {
		e, store, _ := setup(t)
		rl, err := stockops.NewRelay(e.Reserver, store, nil, &stock.RelayOptions{MinBackoff: 10 * time.Second, MaxBackoff: 10 * time.Second, Items: []string{"a"}})
		must(t, err)
		deduct(t, e, "a", "d1", 3)
		if s, err := rl.Once(ctx); s.Retried != 1 { // Once also reports the store's error
			t.Fatalf("first pass: %+v (%v); want 1 retried", s, err)
		}
		store.FailWith(nil)
		time.Sleep(20 * time.Millisecond) // wall-clock time does not end the backoff
		if s, err := rl.Once(ctx); err != nil || s.Delivered != 0 {
			t.Fatalf("pass during the backoff: %+v, %v; want nothing delivered", s, err)
		}
		e.Advance(16 * time.Second) // the backoff, plus up to half of it as jitter
		if s, err := rl.Once(ctx); err != nil || s.Delivered != 1 {
			t.Fatalf("pass after the backoff: %+v, %v; want 1 delivered", s, err)
		}
		if n, err := store.Remaining(ctx, "a"); err != nil || n != 7 {
			t.Fatalf("store remaining = %d, %v; want 7", n, err)
		}
	})
	t.Run("Run", func(t *testing.T) {
		e, store, calls := setup(t)
		runUntilEnd(t, e, stock.RunOptions{Store: store, Reconcile: &stock.ReconcileOptions{Interval: -1},
			Relay: &stock.RelayOptions{MinBackoff: time.Minute, MaxBackoff: time.Minute}})
		deduct(t, e, "a", "d1", 3)
		waitFor(t, 10*time.Second, "a first, failed, delivery", func() (bool, string) { return calls.Load() > 0, "" })
		store.FailWith(nil)
		before := calls.Load()
		time.Sleep(2 * time.Second)
		if n, _ := store.Remaining(ctx, "a"); n != 10 {
			t.Fatalf("event applied during a 1m backoff with the clock standing still (store remaining %d, failed calls %d -> %d)", n, before, calls.Load())
		}
		e.Advance(2 * time.Minute)
		waitFor(t, 10*time.Second, "delivery after Advance past the backoff", func() (bool, string) {
			n, _ := store.Remaining(ctx, "a")
			return n == 7, fmt.Sprint("store remaining ", n)
		})
		if store.Applications("a", "d1", stock.EventDeducted) != 1 {
			t.Fatalf("d1 applied %d times", store.Applications("a", "d1", stock.EventDeducted))
		}
	})
}

// --- Carts ---------------------------------------------------------------------------------

// TestCartRecoveryUnderRun: Run's cart recovery, with RecoverCartsAfter of 2s and with its
// default (5m), leaves a half-done cart while the Env clock stands still and undoes it after
// Advance past the cutoff, without real waiting; a late retry of the cart answers ErrRestored.
func TestCartRecoveryUnderRun(t *testing.T) {
	for _, c := range []struct {
		name          string
		opts          stock.RunOptions
		wait, advance time.Duration // real time while the cart is young; then Advance
	}{
		{"after 2s", stock.RunOptions{RecoverCartsAfter: 2 * time.Second}, 2500 * time.Millisecond, 3 * time.Second},
		{"default 5m", stock.RunOptions{}, 500 * time.Millisecond, 6 * time.Minute},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			e := stocktest.New(t)
			halfDoneCart(t, e, "stock")
			runUntilEnd(t, e, c.opts)
			// Recovery looks every second of real time, but the cart is young on the Env clock.
			time.Sleep(c.wait)
			if lv := levels(t, e, "a"); lv.Available != 3 {
				t.Fatalf("cart undone while the Env clock stood still: a = %+v", lv)
			}
			e.Advance(c.advance)
			waitFor(t, 15*time.Second, "cart undone after Advance", func() (bool, string) {
				lv := levels(t, e, "a")
				return lv.Available == 5 && lv.Sold == 0, fmt.Sprintf("%+v", lv)
			})
			// A late retry of the cart answers ErrRestored and takes nothing.
			_, err := e.Reserver.DeductMany(ctx, stock.Cart{ID: "cart-1", User: "u1", Lines: []stock.Line{{SKU: "a", Qty: 2}, {SKU: "b", Qty: 1}}})
			if !errors.Is(err, stock.ErrRestored) {
				t.Fatalf("retry of the recovered cart = %v, want ErrRestored", err)
			}
			if a, b := levels(t, e, "a"), levels(t, e, "b"); a.Available != 5 || b.Available != 5 {
				t.Fatalf("after the retry: a %+v, b %+v; want both untouched (5)", a, b)
			}
		})
	}
}

// TestHoldManyExpiresAfterAdvance: a cart held by HoldMany expires after Advance past its
// deadline: ConfirmMany answers a *CartError wrapping ErrExpired, the stock and the user's units
// come back, and a retry of the cart answers ErrExpired.
func TestHoldManyExpiresAfterAdvance(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t, stock.WithUserLimit(2))
	load(t, e, "a", 3)
	load(t, e, "b", 3)
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
		if lv := levels(t, e, sku); lv.Available != 3 || lv.Held != 0 || lv.Sold != 0 {
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

// TestGroupsCartAtomic: with item groups, a cart on one slot is all or nothing, and 8
// concurrent copies of one cart are taken once and replayed 7 times.
func TestGroupsCartAtomic(t *testing.T) {
	ctx := context.Background()
	group := func(sku string) string {
		if i := strings.IndexByte(sku, '-'); i > 0 {
			return sku[:i]
		}
		return ""
	}
	e := stocktest.New(t, stock.WithGroups(group))
	load(t, e, "shoe-41", 1)
	load(t, e, "shoe-42", 5)
	for _, k := range e.Redis.Keys() {
		if strings.Contains(k, "shoe-4") && !strings.Contains(k, "{shoe}") {
			t.Fatalf("grouped key %q lacks the group tag", k)
		}
	}
	bad := stock.Cart{ID: "c1", Lines: []stock.Line{{SKU: "shoe-42", Qty: 1}, {SKU: "shoe-41", Qty: 2}}}
	if _, err := e.Reserver.DeductMany(ctx, bad); !errors.Is(err, stock.ErrInsufficient) {
		t.Fatalf("one-slot cart short on shoe-41 = %v, want ErrInsufficient", err)
	}
	if lv := levels(t, e, "shoe-42"); lv.Available != 5 {
		t.Fatalf("refused one-slot cart changed shoe-42: %+v", lv)
	}
	good := stock.Cart{ID: "c2", Lines: []stock.Line{{SKU: "shoe-42", Qty: 2}, {SKU: "shoe-41", Qty: 1}}}
	var okN, replayN atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
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
		})
	}
	wg.Wait()
	if okN.Load() != 1 || replayN.Load() != 7 {
		t.Fatalf("8 copies of one cart: %d not replayed, %d replayed; want 1 and 7", okN.Load(), replayN.Load())
	}
	if a, b := levels(t, e, "shoe-41"), levels(t, e, "shoe-42"); a.Available != 0 || b.Available != 3 {
		t.Fatalf("after c2: shoe-41 %+v, shoe-42 %+v", a, b)
	}
}

// TestCoalescingCounts: with and without coalescing, 60 deducts of 1 on a stock of 25 sell 25,
// their repeats replay those 25, and stock given back is seen at once.
func TestCoalescingCounts(t *testing.T) {
	for _, c := range []int{0, 1, 4} {
		t.Run(fmt.Sprint("coalesce", c), func(t *testing.T) {
			ctx := context.Background()
			e := stocktest.New(t, stock.WithCoalescing(c), stock.WithSoldOutCache(time.Second))
			load(t, e, "hot", 25)
			var ok, soldOut atomic.Int64
			run := func(wantReplay bool) {
				var wg sync.WaitGroup
				for i := range 60 {
					wg.Go(func() {
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
					})
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
			lv := levels(t, e, "hot")
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

// TestOutboxOff: with the outbox off nothing is queued for delivery (Pending answers 0, 0)
// and the levels still count.
func TestOutboxOff(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t, stock.WithOutbox(false))
	load(t, e, "a", 5)
	deduct(t, e, "a", "d", 2)
	hold(t, e, "a", "h", 1, time.Minute)
	_, err := e.Reserver.Restore(ctx, "a", "d")
	must(t, err)
	_, err = e.Reserver.Restock(ctx, "a", "r", 4)
	must(t, err)
	e.Advance(time.Minute)
	_, err = stockops.Sweep(ctx, e.Reserver)
	must(t, err)
	pending, dead, err := stockops.Pending(ctx, e.Reserver, "a")
	if err != nil || pending != 0 || dead != 0 {
		t.Fatalf("Pending with the outbox off = %d, %d, %v; want 0, 0", pending, dead, err)
	}
	if lv := levels(t, e, "a"); lv.Available != 9 || lv.Loaded != 9 {
		t.Fatalf("levels %+v, want 9 available of 9", lv)
	}
}
