package idle_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
	"github.com/stockres/stock/stocktest"
)

// TestMain starts and stops the real servers the tests ask for (redistest.Run).
func TestMain(m *testing.M) { os.Exit(redistest.Run(m)) }

// aiEnv is a Reserver on stocktest's miniredis whose clock is moved forward by a goroutine in
// step with the wall clock (so leases and backoff run out as they would on a real server),
// unless frozen, with a memstore holding the same items.
type aiEnv struct {
	t     *testing.T
	env   *stocktest.Env
	r     *stock.Reserver
	c     rueidis.Client
	store *memstore.Store

	mu     sync.Mutex // serializes Advance
	ticker chan struct{}
	wg     sync.WaitGroup
}

func aiNew(t *testing.T, flow bool, opts ...stock.Option) *aiEnv {
	t.Helper()
	e := &aiEnv{t: t, env: stocktest.New(t, opts...), store: memstore.New()}
	e.r, e.c = e.env.Reserver, e.env.Client
	if flow {
		e.ticker = make(chan struct{})
		e.wg.Go(func() {
			tk := time.NewTicker(20 * time.Millisecond)
			defer tk.Stop()
			last := time.Now()
			for {
				select {
				case <-e.ticker:
					return
				case <-tk.C:
					// A tick's value is its scheduled time, which can be
					// before last when this goroutine started late: read
					// the clock instead.
					now := time.Now()
					if d := now.Sub(last); d > 0 {
						e.advance(d)
					}
					last = now
				}
			}
		})
		t.Cleanup(e.stopFlow)
	}
	return e
}

func (e *aiEnv) stopFlow() {
	if e.ticker != nil {
		close(e.ticker)
		e.wg.Wait()
		e.ticker = nil
	}
}

func (e *aiEnv) advance(d time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.env.Advance(d)
}

// aiSKUs names n items; a few carry ':', '~' and non-ASCII letters.
func aiSKUs(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		switch i % 7 {
		case 3:
			out[i] = fmt.Sprintf("%s:a:%05d", prefix, i)
		case 5:
			out[i] = fmt.Sprintf("%s~%05d~ü", prefix, i)
		default:
			out[i] = fmt.Sprintf("%s-%05d", prefix, i)
		}
	}
	return out
}

// aiLoad loads every item with qty units in Redis (through r) and in store.
func aiLoad(t *testing.T, r *stock.Reserver, store *memstore.Store, skus []string, qty int64) {
	t.Helper()
	ctx := context.Background()
	for _, s := range skus {
		require.NoError(t, r.Load(ctx, s, qty), "Load %q", s)
		if store != nil {
			require.NoError(t, store.Load(ctx, s, qty), "store Load %q", s)
		}
	}
}

// loadItems names n items after prefix (aiSKUs) and loads each with qty units in Redis and in
// the env's store.
func (e *aiEnv) loadItems(prefix string, n int, qty int64) []string {
	e.t.Helper()
	skus := aiSKUs(prefix, n)
	aiLoad(e.t, e.r, e.store, skus, qty)
	return skus
}

// aiRun starts r.Run with store and returns a stop function that cancels it and waits.
func aiRun(t *testing.T, r *stock.Reserver, opts stock.RunOptions) (stop func() error) {
	t.Helper()
	if opts.Reconcile == nil {
		// A reconciler that repairs nothing and passes rarely: it must not mask the relay.
		opts.Reconcile = &stock.ReconcileOptions{DryRun: true, Interval: time.Hour}
	}
	if opts.GuardInterval == 0 {
		// The guard's fence is lifted by repairing reconcile passes, which the dry run is not.
		opts.GuardInterval = -1
	}
	if opts.RecoverCartsAfter == 0 {
		opts.RecoverCartsAfter = time.Hour
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, opts) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(20 * time.Second):
				err = errors.New("Run did not return within 20s of its ctx ending")
			}
			if errors.Is(err, context.Canceled) {
				err = nil
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// aiSettled says whether sku has no pending event and the store agrees with Redis
// (store remaining == available + held).
func aiSettled(ctx context.Context, r *stock.Reserver, store *memstore.Store, sku string) (bool, string) {
	p, d, err := stockops.Pending(ctx, r, sku)
	if err != nil {
		return false, fmt.Sprintf("%s: Pending: %v", sku, err)
	}
	if p != 0 || d != 0 {
		return false, fmt.Sprintf("%s: pending %d, dead %d", sku, p, d)
	}
	l, err := r.Levels(ctx, sku)
	if err != nil {
		return false, fmt.Sprintf("%s: Levels: %v", sku, err)
	}
	rem, err := store.Remaining(ctx, sku)
	if err != nil {
		return false, fmt.Sprintf("%s: Remaining: %v", sku, err)
	}
	if rem != l.Available+l.Held {
		return false, fmt.Sprintf("%s: store %d, redis available %d + held %d", sku, rem, l.Available, l.Held)
	}
	return true, ""
}

// aiWaitAll polls until every sku is settled or timeout passes; it returns the time it took
// and, on timeout, what was still unsettled.
func aiWaitAll(r *stock.Reserver, store *memstore.Store, skus []string, timeout time.Duration) (time.Duration, []string) {
	ctx := context.Background()
	start := time.Now()
	left := append([]string(nil), skus...)
	var why []string
	for {
		why = why[:0]
		var still []string
		for _, s := range left {
			if ok, w := aiSettled(ctx, r, store, s); !ok {
				still = append(still, s)
				why = append(why, w)
			}
		}
		left = still
		if len(left) == 0 || time.Since(start) > timeout {
			return time.Since(start), why
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// aiSettles waits up to timeout for every sku to settle (aiWaitAll), logs how long it took, and
// fails the test when some did not settle, or all took longer than bound; it returns the time
// taken.
func aiSettles(t *testing.T, r *stock.Reserver, store *memstore.Store, skus []string, timeout, bound time.Duration, what string) time.Duration {
	t.Helper()
	took, why := aiWaitAll(r, store, skus, timeout)
	t.Logf("%s: settled in %v", what, took.Round(time.Millisecond))
	if len(why) > 0 || took > bound {
		t.Errorf("%s: after %v (want < %v): %v", what, took, bound, why)
	}
	return took
}

// aiReleases is aiSettles for holds: it waits until nothing is held on any of skus.
func aiReleases(t *testing.T, r *stock.Reserver, skus []string, timeout, bound time.Duration, what string) time.Duration {
	t.Helper()
	took, diff := aiWaitHeld(t, r, aiNoneHeld(skus), timeout)
	t.Logf("%s: released in %v", what, took.Round(time.Millisecond))
	if len(diff) > 0 || took > bound {
		t.Errorf("%s: released after %v (want < %v): %v", what, took, bound, diff)
	}
	return took
}

// aiStart starts Run (aiRun) and gives it 300ms to start polling: the walk is somewhere.
func aiStart(t *testing.T, r *stock.Reserver, opts stock.RunOptions) (stop func() error) {
	t.Helper()
	stop = aiRun(t, r, opts)
	time.Sleep(300 * time.Millisecond)
	return stop
}

// aiPick picks k items spread over skus (deep in the registry, whatever its order).
func aiPick(skus []string, k int) []string {
	out := make([]string, 0, k)
	step := len(skus) / k
	for i := 0; i < k; i++ {
		out = append(out, skus[(i*step+step/2)%len(skus)])
	}
	return out
}

type aiAck struct {
	sku, id string
	typ     stock.EventType
}

// aiCheckOnce checks that every acknowledged event reached the store exactly once.
func aiCheckOnce(t *testing.T, store *memstore.Store, acks []aiAck) {
	t.Helper()
	for _, a := range acks {
		n := store.Applications(a.sku, a.id, a.typ)
		assert.EqualValues(t, 1, n, "%s %s %s applied %d times, want 1", a.sku, a.id, a.typ, n)
	}
	if m := store.MaxApplications(); m > 1 {
		t.Errorf("some event applied %d times", m)
	}
}

const aiPrompt = 3 * time.Second

// aiWalkBound is how long a walk-bound test allows for a walk documented to take bound: the walk
// visits 256 items a second on an idle machine, and on a loaded CI machine (two cores, five test
// processes) a 10 s walk took 17 s. Past 2.5 times the walk bound the walk is broken or much
// slower than documented, not merely starved of a core.
func aiWalkBound(bound time.Duration) time.Duration { return bound * 5 / 2 }

// TestHintedOpsPrompt: with 3,000 items, every kind of operation that queues an event
// (deduct, restore, restock, confirm, carts by saga and by group) on items deep in the registry
// reaches the Store promptly, long before the walk (3000/256 ≈ 12s) would find it.
func TestHintedOpsPrompt(t *testing.T) {
	ctx := context.Background()
	group := func(sku string) string {
		if strings.HasPrefix(sku, "g") {
			return "grp" + sku[len(sku)-1:]
		}
		return ""
	}
	e := aiNew(t, true, stock.WithGroups(group))
	skus := aiSKUs("item", 2990)
	grouped := []string{"gx-a1", "gx-b1", "gy-a2", "gy-b2", "gz-a3", "gz-b3", "gw-a4", "gw-b4", "gv-a5", "gv-b5"}
	aiLoad(t, e.r, e.store, append(skus, grouped...), 100)
	stop := aiStart(t, e.r, stock.RunOptions{Store: e.store})

	type kind struct {
		name string
		skus []string
		do   func(sku string) []aiAck
	}
	picked := aiPick(skus, 36)
	n := 0
	kinds := []kind{
		{"deduct", picked[0:4], func(s string) []aiAck {
			n++
			id := fmt.Sprintf("d%d", n)
			if _, err := e.r.Deduct(ctx, stock.Request{SKU: s, ID: id, Qty: 2}); err != nil {
				t.Fatal(err)
			}
			return []aiAck{{s, id, stock.EventDeducted}}
		}},
		{"restock", picked[4:8], func(s string) []aiAck {
			n++
			id := fmt.Sprintf("rs%d", n)
			require.NoError(t, testkit.Err(e.r.Restock(ctx, s, id, 5)))
			return []aiAck{{s, id, stock.EventRestocked}}
		}},
		{"hold+confirm", picked[8:12], func(s string) []aiAck {
			n++
			id := fmt.Sprintf("h%d", n)
			if _, err := e.r.Hold(ctx, stock.Request{SKU: s, ID: id, Qty: 1}, time.Hour); err != nil {
				t.Fatal(err)
			}
			require.NoError(t, testkit.Err(e.r.Confirm(ctx, s, id)))
			return []aiAck{{s, id, stock.EventConfirmed}}
		}},
		{"deductmany (saga)", picked[12:16], func(s string) []aiAck {
			n++
			id := fmt.Sprintf("c%d", n)
			if _, err := e.r.DeductMany(ctx, stock.Cart{ID: id, Lines: []stock.Line{{SKU: s, Qty: 1}}}); err != nil {
				t.Fatal(err)
			}
			return []aiAck{{s, id, stock.EventDeducted}}
		}},
		{"holdmany+confirmmany (saga)", picked[16:20], func(s string) []aiAck {
			n++
			id := fmt.Sprintf("hc%d", n)
			if _, err := e.r.HoldMany(ctx, stock.Cart{ID: id, Lines: []stock.Line{{SKU: s, Qty: 1}}}, time.Hour); err != nil {
				t.Fatal(err)
			}
			require.NoError(t, testkit.Err(e.r.ConfirmMany(ctx, id, s)))
			return []aiAck{{s, id, stock.EventConfirmed}}
		}},
		{"deductmany (group)", []string{"gx-a1", "gy-a2"}, func(s string) []aiAck {
			n++
			id := fmt.Sprintf("gc%d", n)
			other := strings.Replace(s, "-a", "-b", 1)
			if _, err := e.r.DeductMany(ctx, stock.Cart{ID: id, Lines: []stock.Line{{SKU: s, Qty: 1}, {SKU: other, Qty: 2}}}); err != nil {
				t.Fatal(err)
			}
			return []aiAck{{s, id, stock.EventDeducted}, {other, id, stock.EventDeducted}}
		}},
		{"holdmany+confirmmany (group)", []string{"gz-a3", "gw-a4"}, func(s string) []aiAck {
			n++
			id := fmt.Sprintf("gh%d", n)
			other := strings.Replace(s, "-a", "-b", 1)
			if _, err := e.r.HoldMany(ctx, stock.Cart{ID: id, Lines: []stock.Line{{SKU: s, Qty: 1}, {SKU: other, Qty: 1}}}, time.Hour); err != nil {
				t.Fatal(err)
			}
			require.NoError(t, testkit.Err(e.r.ConfirmMany(ctx, id, s, other)))
			return []aiAck{{s, id, stock.EventConfirmed}, {other, id, stock.EventConfirmed}}
		}},
	}
	// Restores need a delivered deduct first, so that the restore is the only new work.
	restoreSKUs := picked[20:24]
	var restoreIDs []string
	for _, s := range restoreSKUs {
		n++
		id := fmt.Sprintf("r%d", n)
		if _, err := e.r.Deduct(ctx, stock.Request{SKU: s, ID: id, Qty: 3}); err != nil {
			t.Fatal(err)
		}
		restoreIDs = append(restoreIDs, id)
	}
	if took, why := aiWaitAll(e.r, e.store, restoreSKUs, 30*time.Second); len(why) > 0 {
		t.Fatalf("deducts before the restores not delivered in %v: %v", took, why)
	}
	kinds = append(kinds, kind{"restore", restoreSKUs, func(s string) []aiAck {
		for i, rs := range restoreSKUs {
			if rs == s {
				require.NoError(t, testkit.Err(e.r.Restore(ctx, s, restoreIDs[i])))
				return []aiAck{{s, restoreIDs[i], stock.EventDeducted}, {s, restoreIDs[i], stock.EventRestored}}
			}
		}
		return nil
	}})

	var all []aiAck
	for _, k := range kinds {
		var acks []aiAck
		for _, s := range k.skus {
			acks = append(acks, k.do(s)...)
		}
		all = append(all, acks...)
		var touched []string
		for _, a := range acks {
			touched = append(touched, a.sku)
		}
		// An event with a hint reaches the store long before the walk's pace.
		aiSettles(t, e.r, e.store, touched, 20*time.Second, aiPrompt, k.name)
	}
	if err := stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	aiCheckOnce(t, e.store, all)
}

// TestLostHintsWalkBound: events queued while no Run runs, whose hint keys are then
// deleted, are still delivered by the walk within catalogue/256 s (+ slack).
func TestLostHintsWalkBound(t *testing.T) {
	ctx := context.Background()
	e := aiNew(t, true)
	skus := e.loadItems("lost", 2560, 50) // walk bound 10s
	picked := aiPick(skus, 40)
	var acks []aiAck
	for i, s := range picked {
		id := fmt.Sprintf("o%d", i)
		if _, err := e.r.Deduct(ctx, stock.Request{SKU: s, ID: id, Qty: 1}); err != nil {
			t.Fatal(err)
		}
		acks = append(acks, aiAck{s, id, stock.EventDeducted})
	}
	time.Sleep(200 * time.Millisecond) // the hints are written
	aiDropHints(t, e.c, "stock")
	stop := aiRun(t, e.r, stock.RunOptions{Store: e.store})
	aiSettles(t, e.r, e.store, picked, aiWalkBound(10*time.Second)+5*time.Second, aiWalkBound(10*time.Second),
		"after Run started (walk bound 2560/256 = 10s)")
	if err := stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	aiCheckOnce(t, e.store, acks)
}

// aiDropHints deletes every due-work hint key of prefix and reports how many there were.
func aiDropHints(t *testing.T, c rueidis.Client, prefix string) int {
	t.Helper()
	ctx := context.Background()
	var keys []string
	for n := 0; n < 16; n++ {
		keys = append(keys, fmt.Sprintf("%s:due{~%d}", prefix, n), fmt.Sprintf("%s:holdsdue{~%d}", prefix, n))
	}
	found := 0
	for _, k := range keys {
		v, err := c.Do(ctx, c.B().Del().Key(k).Build()).AsInt64()
		require.NoError(t, err, "DEL %s", k)
		found += int(v)
	}
	return found
}

// aiHintCount is the number of members in the prefix's hint keys of kind ("due", "holdsdue").
func aiHintCount(t *testing.T, c rueidis.Client, prefix, kind string) int64 {
	t.Helper()
	var total int64
	for n := 0; n < 16; n++ {
		v, err := c.Do(context.Background(), c.B().Zcard().Key(fmt.Sprintf("%s:%s{~%d}", prefix, kind, n)).Build()).AsInt64()
		require.NoError(t, err)
		total += v
	}
	return total
}

// TestHintKeysExist: the hint keys the README names are where the Reserver writes.
func TestHintKeysExist(t *testing.T) {
	ctx := context.Background()
	e := aiNew(t, false, stock.WithPrefix("shop"))
	aiLoad(t, e.r, nil, []string{"a", "b"}, 10)
	if _, err := e.r.Deduct(ctx, stock.Request{SKU: "a", ID: "1", Qty: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.r.Hold(ctx, stock.Request{SKU: "b", ID: "2", Qty: 1}, time.Minute); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) && (aiHintCount(t, e.c, "shop", "due") == 0 || aiHintCount(t, e.c, "shop", "holdsdue") == 0) {
		time.Sleep(10 * time.Millisecond)
	}
	if d, h := aiHintCount(t, e.c, "shop", "due"), aiHintCount(t, e.c, "shop", "holdsdue"); d == 0 || h == 0 {
		t.Fatalf("hints after a deduct and a hold: due %d, holdsdue %d; want both > 0", d, h)
	}
	d := aiHintCount(t, e.c, "stock", "due")
	assert.EqualValues(t, 0, d, "a Reserver with prefix shop wrote %d hints under stock:", d)
}

// aiHeld returns the units held on each sku.
func aiHeld(t *testing.T, r *stock.Reserver, skus []string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, s := range skus {
		l, err := r.Levels(context.Background(), s)
		require.NoError(t, err)
		out[s] = l.Held
	}
	return out
}

// aiHoldEach holds qty of each sku for ttl under the id "h".
func aiHoldEach(t *testing.T, r *stock.Reserver, skus []string, qty int64, ttl time.Duration) {
	t.Helper()
	for _, s := range skus {
		if _, err := r.Hold(context.Background(), stock.Request{SKU: s, ID: "h", Qty: qty}, ttl); err != nil {
			t.Fatal(err)
		}
	}
}

// aiNoneHeld is the aiWaitHeld target of nothing held on any of skus.
func aiNoneHeld(skus []string) map[string]int64 {
	want := make(map[string]int64, len(skus))
	for _, s := range skus {
		want[s] = 0
	}
	return want
}

// aiWaitHeld waits until every sku's held units equal want[sku], and returns how long it took
// and what differs on timeout.
func aiWaitHeld(t *testing.T, r *stock.Reserver, want map[string]int64, timeout time.Duration) (time.Duration, []string) {
	t.Helper()
	start := time.Now()
	var skus []string
	for s := range want {
		skus = append(skus, s)
	}
	sort.Strings(skus)
	for {
		got := aiHeld(t, r, skus)
		var diff []string
		for _, s := range skus {
			if got[s] != want[s] {
				diff = append(diff, fmt.Sprintf("%s held %d want %d", s, got[s], want[s]))
			}
		}
		if len(diff) == 0 || time.Since(start) > timeout {
			return time.Since(start), diff
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestHoldsSweptPrompt: with 3,000 items and a frozen clock, holds on deep items,
// extended to later and to earlier deadlines, several holds per item, 600 due holds on one item,
// and carts of holds (saga and group), are each released by Run's sweeper promptly once due,
// and not before.
func TestHoldsSweptPrompt(t *testing.T) {
	ctx := context.Background()
	group := func(sku string) string {
		if strings.HasPrefix(sku, "g") {
			return "grp"
		}
		return ""
	}
	e := aiNew(t, false, stock.WithGroups(group))
	skus := aiSKUs("hold", 2996)
	grouped := []string{"g-1", "g-2", "g-3", "g-4"}
	aiLoad(t, e.r, e.store, append(skus, grouped...), 1000)
	p := aiPick(skus, 12)
	hold := func(sku, id string, ttl time.Duration) {
		t.Helper()
		if _, err := e.r.Hold(ctx, stock.Request{SKU: sku, ID: id, Qty: 1}, ttl); err != nil {
			t.Fatalf("Hold %s %s: %v", sku, id, err)
		}
	}
	extend := func(sku, id string, ttl time.Duration) {
		t.Helper()
		require.NoError(t, testkit.Err(e.r.Extend(ctx, sku, id, ttl)), "Extend %s %s", sku, id)
	}
	// p[0]: one hold of 2m. p[1]: 2m extended to 10m (later). p[2]: 10m extended to 1m (earlier).
	// p[3]: holds of 2m, 4m and 6m. p[4]: 600 holds of 2m. p[5], p[6]: a saga cart of 2m.
	// g-1, g-2: a grouped cart of 2m. p[7]: 2m, extended to 4m twice over time.
	hold(p[0], "x", 2*time.Minute)
	hold(p[1], "x", 2*time.Minute)
	extend(p[1], "x", 10*time.Minute)
	hold(p[2], "x", 10*time.Minute)
	extend(p[2], "x", time.Minute)
	hold(p[3], "a", 2*time.Minute)
	hold(p[3], "b", 4*time.Minute)
	hold(p[3], "c", 6*time.Minute)
	for i := 0; i < 600; i++ {
		hold(p[4], fmt.Sprintf("m%d", i), 2*time.Minute)
	}
	if _, err := e.r.HoldMany(ctx, stock.Cart{ID: "cart", Lines: []stock.Line{{SKU: p[5], Qty: 2}, {SKU: p[6], Qty: 3}}}, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := e.r.HoldMany(ctx, stock.Cart{ID: "gcart", Lines: []stock.Line{{SKU: "g-1", Qty: 2}, {SKU: "g-2", Qty: 1}}}, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	hold(p[7], "x", 2*time.Minute)
	// p[8]: a hold of 10m, then one of 1m (the later hold must not hide the earlier deadline).
	hold(p[8], "late", 10*time.Minute)
	hold(p[8], "early", time.Minute)

	all := append(p[:9:9], "g-1", "g-2")
	want := aiHeld(t, e.r, all)
	_ = aiRun(t, e.r, stock.RunOptions{Store: e.store, SweepInterval: 200 * time.Millisecond})
	time.Sleep(500 * time.Millisecond)

	step := func(name string, d time.Duration, change map[string]int64) {
		t.Helper()
		e.advance(d)
		for s, v := range change {
			want[s] = v
		}
		took, diff := aiWaitHeld(t, e.r, want, 20*time.Second)
		t.Logf("%-22s settled in %v", name, took.Round(time.Millisecond))
		if len(diff) > 0 {
			t.Errorf("%s: after %v: %v", name, took, diff)
			want = aiHeld(t, e.r, all) // go on from what is
		} else if took > aiPrompt {
			t.Errorf("%s: due holds released only after %v (hinted; want < %v)", name, took, aiPrompt)
		}
	}
	// t = 1m30s: p[2] (extended to 1m) is due.
	step("earlier deadline", 90*time.Second, map[string]int64{p[2]: 0, p[8]: 1})
	// p[7] extended to 4m from now (t=1m30s → 5m30s).
	extend(p[7], "x", 4*time.Minute)
	// t = 2m30s: 2m holds are due; p[1] was extended, p[3] keeps b and c; p[7] extended.
	step("2m holds", time.Minute, map[string]int64{p[0]: 0, p[3]: 2, p[4]: 0, p[5]: 0, p[6]: 0, "g-1": 0, "g-2": 0})
	// t = 4m30s: p[3]'s b.
	step("second hold of item", 2*time.Minute, map[string]int64{p[3]: 1})
	// t = 6m: p[7] (5m30s) and p[3]'s c.
	step("extended later + third", 90*time.Second, map[string]int64{p[3]: 0, p[7]: 0})
	// t = 10m30s: p[1].
	step("extended to 10m", 270*time.Second, map[string]int64{p[1]: 0, p[8]: 0})

	// The expiries queue events (EventExpired) for the relay: they leave the outbox promptly.
	aiSettles(t, e.r, e.store, all, 20*time.Second, aiPrompt, "the events of the sweeper's expiries")
}

// aiDeductEach deducts qty from each sku under a fresh id and returns the acknowledgements.
func aiDeductEach(t *testing.T, r *stock.Reserver, skus []string, tag string, qty int64) []aiAck {
	t.Helper()
	var acks []aiAck
	for i, s := range skus {
		id := fmt.Sprintf("%s-%d", tag, i)
		if _, err := r.Deduct(context.Background(), stock.Request{SKU: s, ID: id, Qty: qty}); err != nil {
			t.Fatalf("Deduct %s %s: %v", s, id, err)
		}
		acks = append(acks, aiAck{s, id, stock.EventDeducted})
	}
	return acks
}

// TestStoreRecovers: the Store fails every event of some deep items (the relay backs
// off), then recovers: the items are retried after their backoff, promptly, not at the walk's
// pace.
func TestStoreRecovers(t *testing.T) {
	e := aiNew(t, true)
	skus := e.loadItems("rec", 3000, 100)
	picked := aiPick(skus, 20)
	failing := map[string]bool{}
	for _, s := range picked[:10] {
		failing[s] = true
	}
	var mu sync.Mutex
	calls := map[string]int{}
	e.store.FailWith(func(ev stock.Event) error {
		mu.Lock()
		defer mu.Unlock()
		if failing[ev.SKU] {
			calls[ev.SKU]++
			return memstore.ErrDown
		}
		return nil
	})
	_ = aiRun(t, e.r, stock.RunOptions{Store: e.store, Relay: &stock.RelayOptions{MinBackoff: 100 * time.Millisecond, MaxBackoff: 400 * time.Millisecond}})
	time.Sleep(200 * time.Millisecond)
	acks := aiDeductEach(t, e.r, picked, "f", 1)
	// The healthy half goes through at once.
	aiSettles(t, e.r, e.store, picked[10:], 20*time.Second, aiPrompt, "healthy items")
	time.Sleep(2 * time.Second) // several failures each, backoff at its maximum
	mu.Lock()
	for _, s := range picked[:10] {
		if calls[s] < 2 {
			t.Errorf("%s: tried %d times in 2s of a failing store with backoff ≤ 400ms", s, calls[s])
		}
		failing[s] = false
	}
	mu.Unlock()
	aiSettles(t, e.r, e.store, picked[:10], 25*time.Second, 400*time.Millisecond+aiPrompt, "after the store recovered (backoff ≤ 400ms)")
	aiCheckOnce(t, e.store, acks)
}

// TestTwoRunsOneRedis: two Reservers (two processes) on one Redis, both running Run
// into one Store: every event is applied once, promptly, and every due hold released.
func TestTwoRunsOneRedis(t *testing.T) {
	ctx := context.Background()
	e := aiNew(t, true)
	r2 := testkit.NewReserver(t, e.c)
	skus := e.loadItems("two", 2500, 100)
	_ = aiRun(t, e.r, stock.RunOptions{Store: e.store, SweepInterval: 200 * time.Millisecond})
	_ = aiStart(t, r2, stock.RunOptions{Store: e.store, SweepInterval: 200 * time.Millisecond})
	picked := aiPick(skus, 40)
	var acks []aiAck
	acks = append(acks, aiDeductEach(t, e.r, picked[:20], "a", 1)...)
	acks = append(acks, aiDeductEach(t, r2, picked[:20], "b", 2)...)
	for i, s := range picked[20:] {
		rr := e.r
		if i%2 == 1 {
			rr = r2
		}
		if _, err := rr.Hold(ctx, stock.Request{SKU: s, ID: "h", Qty: 3}, 2*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	aiSettles(t, e.r, e.store, picked[:20], 20*time.Second, aiPrompt, "deducts through two Runs")
	aiReleases(t, e.r, picked[20:], 20*time.Second, 2*time.Second+aiPrompt, "holds of 2s through two Runs")
	aiCheckOnce(t, e.store, acks)
}

// TestRunRestarted: Run is cancelled right after a burst of deducts (with a drain too
// short to deliver them: its hints may be taken and not processed, its claims left leased),
// then started again: every event is delivered within the lease (3s) + the walk bound (10s).
// (With the default lease of 30s, an event the cancelled Run had claimed waits the whole 30s:
// the cancelled Run does not give its claims back. That is the documented lease, not the hints.)
func TestRunRestarted(t *testing.T) {
	e := aiNew(t, true)
	skus := e.loadItems("rst", 2560, 100) // walk bound 10s
	var acks []aiAck
	var touched []string
	for round := 0; round < 3; round++ {
		stop := aiRun(t, e.r, stock.RunOptions{Store: e.store, Drain: time.Millisecond, Relay: aiRestartRelay})
		time.Sleep(150 * time.Millisecond)
		picked := aiPick(skus[round:], 60)
		acks = append(acks, aiDeductEach(t, e.r, picked, fmt.Sprintf("r%d", round), 1)...)
		touched = append(touched, picked...)
		time.Sleep(time.Duration(5+round*10) * time.Millisecond)
		if err := stop(); err != nil {
			t.Logf("Run %d: %v", round, err)
		}
	}
	_ = aiRun(t, e.r, stock.RunOptions{Store: e.store})
	aiSettles(t, e.r, e.store, touched, 3*time.Second+aiWalkBound(10*time.Second)+5*time.Second, 3*time.Second+aiWalkBound(10*time.Second),
		"after the last restart (lease 3s + walk bound 10s)")
	aiCheckOnce(t, e.store, acks)
}

// TestNoOutboxSweeps: WithOutbox(false) and a Run with neither Store nor Publisher
// (it only sweeps holds): due holds on deep items of 3,000 are released promptly.
func TestNoOutboxSweeps(t *testing.T) {
	ctx := context.Background()
	e := aiNew(t, false, stock.WithOutbox(false))
	skus := aiSKUs("nob", 3000)
	aiLoad(t, e.r, nil, skus, 10)
	picked := aiPick(skus, 20)
	aiHoldEach(t, e.r, picked, 4, time.Minute)
	_ = aiStart(t, e.r, stock.RunOptions{SweepInterval: 200 * time.Millisecond})
	e.advance(2 * time.Minute)
	aiReleases(t, e.r, picked, 20*time.Second, aiPrompt, "due holds")
	for _, s := range picked {
		if l, err := e.r.Levels(ctx, s); err != nil || l.Available != 10 {
			t.Errorf("%s: %+v %v, want 10 available", s, l, err)
		}
	}
}

// aiBlockStore blocks every Apply of one item until released: a relay that hangs holding the
// item's lease.
type aiBlockStore struct {
	*memstore.Store
	sku     string
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (s *aiBlockStore) Apply(ctx context.Context, ev stock.Event) error {
	if ev.SKU == s.sku {
		s.once.Do(func() { close(s.entered) })
		<-s.release
		return errors.New("aiBlockStore: released")
	}
	return s.Store.Apply(ctx, ev)
}

// TestLeaseHeldElsewhere: a relay claims a deep item's event and hangs (its lease of
// 2s runs out); Run's relay delivers the event soon after the lease, within the walk bound.
func TestLeaseHeldElsewhere(t *testing.T) {
	e := aiNew(t, true)
	skus := e.loadItems("lse", 3000, 100) // walk bound ≈ 11.7s
	target := skus[1777]
	bs := &aiBlockStore{Store: e.store, sku: target, entered: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(func() { close(bs.release) })
	hung, err := stockops.NewRelay(e.r, bs, nil, &stock.RelayOptions{Items: []string{target}, Lease: 2 * time.Second})
	require.NoError(t, err)
	hctx, hcancel := context.WithCancel(context.Background())
	defer hcancel()
	go func() { _ = hung.Run(hctx) }()
	acks := aiDeductEach(t, e.r, []string{target}, "l", 1)
	select {
	case <-bs.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the hung relay never claimed the event")
	}
	claimed := time.Now()
	hcancel()
	_ = aiRun(t, e.r, stock.RunOptions{Store: e.store})
	_, why := aiWaitAll(e.r, e.store, []string{target}, 2*time.Second+aiWalkBound(12*time.Second)+5*time.Second)
	took := time.Since(claimed)
	t.Logf("delivered %v after the other relay claimed it (lease 2s)", took.Round(time.Millisecond))
	if len(why) > 0 || took > 2*time.Second+aiWalkBound(12*time.Second) {
		t.Errorf("delivered %v after a 2s lease (walk bound ≈ 12s): %v", took, why)
	}
	aiCheckOnce(t, e.store, acks)
}

// TestRestrictedRelayBeside: a Relay limited to one item (RelayOptions.Items) runs
// beside Run on the same prefix: the other items' events still reach the store promptly (the
// limited relay must not take hints it will not serve).
func TestRestrictedRelayBeside(t *testing.T) {
	e := aiNew(t, true)
	skus := e.loadItems("rr", 3000, 100)
	other := memstore.New()
	require.NoError(t, other.Load(context.Background(), skus[0], 100))
	lim, err := stockops.NewRelay(e.r, other, nil, &stock.RelayOptions{Items: []string{skus[0]}, Poll: 10 * time.Millisecond})
	require.NoError(t, err)
	lctx, lcancel := context.WithCancel(context.Background())
	defer lcancel()
	go func() { _ = lim.Run(lctx) }()
	_ = aiStart(t, e.r, stock.RunOptions{Store: e.store})
	var acks []aiAck
	for round := 0; round < 3; round++ {
		picked := aiPick(skus[1+round:], 10)
		acks = append(acks, aiDeductEach(t, e.r, picked, fmt.Sprintf("x%d", round), 1)...)
		aiSettles(t, e.r, e.store, picked, 20*time.Second, aiPrompt, fmt.Sprintf("round %d, with a limited relay beside Run", round))
	}
	aiCheckOnce(t, e.store, acks)
}

// TestManyEventsOneItem: 1,000 events (batches of 128) on one deep item of 3,000 are
// all delivered promptly, not one batch per walk.
func TestManyEventsOneItem(t *testing.T) {
	e := aiNew(t, true)
	skus := e.loadItems("many", 3000, 5000)
	target := skus[2345]
	_ = aiStart(t, e.r, stock.RunOptions{Store: e.store})
	var acks []aiAck
	for i := 0; i < 1000; i++ {
		acks = append(acks, aiDeductEach(t, e.r, []string{target}, fmt.Sprintf("m%d", i), 1)...)
	}
	aiSettles(t, e.r, e.store, []string{target}, 25*time.Second, 2*aiPrompt, "1000 events of one item, after the last deduct")
	aiCheckOnce(t, e.store, acks)
}

// TestHintsDeletedLive: the hint keys are deleted over and over while Run runs and
// events are queued: every event still arrives within the walk bound.
func TestHintsDeletedLive(t *testing.T) {
	e := aiNew(t, true)
	skus := e.loadItems("del", 2560, 100)
	_ = aiRun(t, e.r, stock.RunOptions{Store: e.store})
	stopDel := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		ctx := context.Background()
		for {
			select {
			case <-stopDel:
				return
			default:
			}
			for n := 0; n < 16; n++ {
				e.c.Do(ctx, e.c.B().Del().Key(fmt.Sprintf("stock:due{~%d}", n), fmt.Sprintf("stock:holdsdue{~%d}", n)).Build())
			}
			time.Sleep(time.Millisecond)
		}
	})
	picked := aiPick(skus, 30)
	acks := aiDeductEach(t, e.r, picked, "z", 1)
	took, why := aiWaitAll(e.r, e.store, picked, aiWalkBound(10*time.Second)+5*time.Second)
	close(stopDel)
	wg.Wait()
	t.Logf("settled in %v with the hints deleted every ms (bound 10s)", took.Round(time.Millisecond))
	if len(why) > 0 || took > aiWalkBound(10*time.Second) {
		t.Errorf("delivered after %v (walk bound 2560/256 = 10s): %v", took, why)
	}
	aiCheckOnce(t, e.store, acks)
}

var aiRestartRelay = &stock.RelayOptions{Lease: 3 * time.Second}

// TestCancelRefusePrompt: events for publishers only (held, cancelled, expired by a
// Cancel/CancelMany) and refusals (Refuse) of deep items leave the outbox promptly; the Store
// ends equal to Redis.
func TestCancelRefusePrompt(t *testing.T) {
	ctx := context.Background()
	e := aiNew(t, true)
	skus := e.loadItems("cr", 3000, 100)
	_ = aiStart(t, e.r, stock.RunOptions{Store: e.store})
	p := aiPick(skus, 12)
	// Deducts delivered first, then refused by hand: the refusal is the only new work.
	acks := aiDeductEach(t, e.r, p[8:], "d", 2)
	if took, why := aiWaitAll(e.r, e.store, p[8:], 20*time.Second); len(why) > 0 {
		t.Fatalf("deducts: %v %v", took, why)
	}
	for i, s := range p[:4] {
		id := fmt.Sprintf("h%d", i)
		if _, err := e.r.Hold(ctx, stock.Request{SKU: s, ID: id, Qty: 1}, time.Hour); err != nil {
			t.Fatal(err)
		}
		require.NoError(t, testkit.Err(e.r.Cancel(ctx, s, id)))
	}
	if _, err := e.r.HoldMany(ctx, stock.Cart{ID: "cart", Lines: []stock.Line{{SKU: p[4], Qty: 1}, {SKU: p[5], Qty: 1}, {SKU: p[6], Qty: 1}, {SKU: p[7], Qty: 1}}}, time.Hour); err != nil {
		t.Fatal(err)
	}
	require.NoError(t, testkit.Err(e.r.CancelMany(ctx, "cart", p[4], p[5], p[6], p[7])))
	for i, s := range p[8:] {
		require.NoError(t, testkit.Err(stockops.Refuse(ctx, e.r, s, fmt.Sprintf("d-%d", i))))
	}
	aiSettles(t, e.r, e.store, p, 20*time.Second, aiPrompt, "cancel and refuse events")
	aiCheckOnce(t, e.store, acks)
	// memstore's Applications does not count a refusal's give-back: the remaining stock shows it.
	for _, s := range p[8:] {
		rem, _ := e.store.Remaining(ctx, s)
		assert.EqualValues(t, 100, rem, "%s: store %d after deduct + refusal, want 100", s, rem)
	}
}

// TestPublisherOnly: Run with a Publisher and no Store (the queue path) publishes the
// events of deep items of 3,000 promptly, each once.
func TestPublisherOnly(t *testing.T) {
	e := aiNew(t, true)
	skus := aiSKUs("pub", 3000)
	aiLoad(t, e.r, nil, skus, 100)
	var mu sync.Mutex
	got := map[string]int{}
	pub := stock.PublisherFunc(func(_ context.Context, ev stock.Event) error {
		mu.Lock()
		defer mu.Unlock()
		got[ev.SKU+"/"+ev.ID+"/"+string(ev.Type)]++
		return nil
	})
	_ = aiStart(t, e.r, stock.RunOptions{Publisher: pub})
	picked := aiPick(skus, 30)
	acks := aiDeductEach(t, e.r, picked, "q", 1)
	start := time.Now()
	for {
		mu.Lock()
		n := 0
		for _, a := range acks {
			if got[a.sku+"/"+a.id+"/"+string(a.typ)] > 0 {
				n++
			}
		}
		mu.Unlock()
		if n == len(acks) || time.Since(start) > 20*time.Second {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(start)
	t.Logf("published in %v", took.Round(time.Millisecond))
	mu.Lock()
	defer mu.Unlock()
	for _, a := range acks {
		c := got[a.sku+"/"+a.id+"/"+string(a.typ)]
		assert.EqualValues(t, 1, c, "%s %s published %d times", a.sku, a.id, c)
	}
	if took > aiPrompt {
		t.Errorf("published only after %v (want < %v)", took, aiPrompt)
	}
	for _, s := range picked {
		if p, _, err := stockops.Pending(context.Background(), e.r, s); err != nil || p != 0 {
			t.Errorf("%s: %d still in the outbox (%v)", s, p, err)
		}
	}
}

// TestOnceAndSweepVisitAll: with every hint gone, Relay.Once and Sweep(ctx) still
// deliver and release everything in one call.
func TestOnceAndSweepVisitAll(t *testing.T) {
	ctx := context.Background()
	e := aiNew(t, false)
	skus := e.loadItems("all", 2000, 100)
	p := aiPick(skus, 40)
	acks := aiDeductEach(t, e.r, p[:20], "o", 1)
	aiHoldEach(t, e.r, p[20:], 2, time.Minute)
	time.Sleep(100 * time.Millisecond)
	if n := aiDropHints(t, e.c, "stock"); n == 0 {
		t.Errorf("no hint keys to drop after deducts and holds")
	}
	e.advance(2 * time.Minute)
	released, err := stockops.Sweep(ctx, e.r)
	require.NoError(t, err)
	assert.EqualValues(t, 40, released, "Sweep released %d units, want 40", released)
	rl, err := stockops.NewRelay(e.r, e.store, nil, nil)
	require.NoError(t, err)
	st, err := rl.Once(ctx)
	require.NoError(t, err)
	// 20 deducts, 20 held and 20 expired events.
	assert.EqualValues(t, 60, st.Delivered, "Once delivered %d, want 60 (%+v)", st.Delivered, st)
	for _, s := range p {
		if ok, why := aiSettled(ctx, e.r, e.store, s); !ok {
			t.Errorf("after Sweep and Once: %s", why)
		}
	}
	aiCheckOnce(t, e.store, acks)
}

// TestTwoPrefixes: two Reservers with their own prefixes and the same item names on one
// Redis, each with its Run and its Store: each Store gets its own prefix's events only, promptly.
func TestTwoPrefixes(t *testing.T) {
	ctx := context.Background()
	e := aiNew(t, true, stock.WithPrefix("pa"))
	rb := testkit.NewReserver(t, e.c, stock.WithPrefix("pb"))
	storeB := memstore.New()
	skus := e.loadItems("same", 1500, 100)
	aiLoad(t, rb, storeB, skus, 100)
	_ = aiRun(t, e.r, stock.RunOptions{Store: e.store})
	_ = aiStart(t, rb, stock.RunOptions{Store: storeB})
	p := aiPick(skus, 20)
	acksA := aiDeductEach(t, e.r, p[:10], "a", 1)
	acksB := aiDeductEach(t, rb, p[10:], "b", 3)
	aiSettles(t, e.r, e.store, p, 20*time.Second, aiPrompt, "prefix pa")
	aiSettles(t, rb, storeB, p, 20*time.Second, aiPrompt, "prefix pb")
	aiCheckOnce(t, e.store, acksA)
	aiCheckOnce(t, storeB, acksB)
	for _, a := range acksA {
		assert.EqualValues(t, 0, storeB.Applications(a.sku, a.id, a.typ), "pa's %s %s reached pb's store", a.sku, a.id)
	}
	rem, _ := storeB.Remaining(ctx, p[0])
	assert.EqualValues(t, 100, rem, "pb's store has %d of %s, want 100", rem, p[0])
}

// TestRestockBeforeStoreRow: a restock of an item the Store has no row for is retried
// with backoff (ErrNotLoaded); once the row is there, it arrives after the backoff, not at the
// walk's pace.
func TestRestockBeforeStoreRow(t *testing.T) {
	ctx := context.Background()
	e := aiNew(t, true)
	skus := aiSKUs("rsk", 3000)
	aiLoad(t, e.r, e.store, skus[:2999], 10)
	late := skus[2999]
	require.NoError(t, e.r.Load(ctx, late, 10))
	_ = aiStart(t, e.r, stock.RunOptions{Store: e.store, Relay: &stock.RelayOptions{MinBackoff: 100 * time.Millisecond, MaxBackoff: 300 * time.Millisecond}})
	require.NoError(t, testkit.Err(e.r.Restock(ctx, late, "rs", 5)))
	time.Sleep(1500 * time.Millisecond)
	p, _, _ := stockops.Pending(ctx, e.r, late)
	require.EqualValues(t, 1, p, "restock of an item the store lacks: pending %d, want 1", p)
	require.NoError(t, e.store.Load(ctx, late, 10))
	aiSettles(t, e.r, e.store, []string{late}, 25*time.Second, 300*time.Millisecond+aiPrompt, "after the store row appeared (backoff ≤ 300ms)")
	n := e.store.Applications(late, "rs", stock.EventRestocked)
	assert.EqualValues(t, 1, n, "restock applied %d times", n)
}

// TestRealBackends (STOCK_REDIS_SERVER): on redis-server standalone and Cluster, with
// real time: events of deep items are delivered promptly, due holds are released promptly, and
// events whose hints were deleted arrive within the walk bound.
func TestRealBackends(t *testing.T) {
	ran := false
	for _, b := range redistest.Backends(t) {
		if !b.Real() {
			continue // miniredis: the tests above, on stocktest's clock
		}
		ran = true
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			c := b.Client(t)
			r := testkit.NewReserver(t, c)
			store := memstore.New()
			skus := aiSKUs("real", 2048) // walk bound 8s
			aiLoad(t, r, store, skus, 100)
			stop := aiStart(t, r, stock.RunOptions{Store: store, SweepInterval: 200 * time.Millisecond})
			p := aiPick(skus, 40)
			acks := aiDeductEach(t, r, p[:20], "d", 1)
			aiSettles(t, r, store, p[:20], 20*time.Second, aiPrompt, "deducts")
			aiHoldEach(t, r, p[20:30], 2, time.Second)
			aiReleases(t, r, p[20:30], 20*time.Second, time.Second+aiPrompt, "holds of 1s")
			if err := stop(); err != nil {
				t.Errorf("Run: %v", err)
			}
			acks = append(acks, aiDeductEach(t, r, p[30:], "l", 1)...)
			time.Sleep(200 * time.Millisecond)
			if n := aiDropHints(t, c, "stock"); n == 0 {
				t.Errorf("no hint keys found after deducts with no Run")
			}
			_ = aiRun(t, r, stock.RunOptions{Store: store})
			aiSettles(t, r, store, p[30:], 25*time.Second, 12*time.Second, "lost hints (walk bound 8s)")
			aiCheckOnce(t, store, acks)
		})
	}
	if !ran {
		t.Skip("no real Redis: set STOCK_REDIS_SERVER=path")
	}
}

// aiCommands is the server's total_commands_processed.
func aiCommands(t *testing.T, c rueidis.Client) int64 {
	t.Helper()
	s, err := c.Do(context.Background(), c.B().Info().Section("stats").Build()).ToString()
	require.NoError(t, err)
	for _, line := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
			var n int64
			fmt.Sscan(v, &n)
			return n
		}
	}
	t.Fatal("no total_commands_processed in INFO")
	return 0
}

// TestCostFlat (STOCK_REDIS_SERVER): with no traffic, Run's commands per second on a
// catalogue of 4,000 items are about those on 1,000 (the walk's pace does not grow).
func TestCostFlat(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skip("no real Redis: set STOCK_REDIS_SERVER=path")
	}
	rate := func(n int) float64 {
		srv := redistest.StartServer(t)
		c := srv.Client(t)
		r := testkit.NewReserver(t, c)
		store := memstore.New()
		aiLoad(t, r, store, aiSKUs("idle", n), 10)
		// A relay (on the queue path) and a sweeper: the reconciler, which a Store would add,
		// compares every item once per Interval by design, and its first pass runs at once
		// (on a loaded machine, well past any fixed wait).
		stop := aiRun(t, r, stock.RunOptions{Publisher: stock.PublisherFunc(func(context.Context, stock.Event) error { return nil })})
		time.Sleep(1500 * time.Millisecond) // past the first steps of the walks
		before := aiCommands(t, c)
		time.Sleep(3 * time.Second)
		after := aiCommands(t, c)
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
		per := float64(after-before-1) / 3
		t.Logf("%d items: %.0f commands/s idle", n, per)
		return per
	}
	small, large := rate(1000), rate(4000)
	if large > 2*small+50 {
		t.Errorf("idle commands/s: %.0f with 4,000 items, %.0f with 1,000: the cost grows with the catalogue", large, small)
	}
}

// aiTimedStore records when each (sku, id, type) was first applied.
type aiTimedStore struct {
	*memstore.Store
	mu sync.Mutex
	at map[string]time.Time
}

func (s *aiTimedStore) Apply(ctx context.Context, ev stock.Event) error {
	err := s.Store.Apply(ctx, ev)
	if err == nil {
		k := ev.SKU + "/" + ev.ID + "/" + string(ev.Type)
		s.mu.Lock()
		if _, ok := s.at[k]; !ok {
			s.at[k] = time.Now()
		}
		s.mu.Unlock()
	}
	return err
}

// TestStreamLatency: a steady stream of deducts on a few deep items (new events
// arriving while the relay delivers the item's earlier ones, so new hints race the relay's
// handling of old ones): every event's delivery follows its acknowledgement promptly.
func TestStreamLatency(t *testing.T) {
	e := aiNew(t, true)
	skus := e.loadItems("strm", 3000, 100000)
	ts := &aiTimedStore{Store: e.store, at: map[string]time.Time{}}
	_ = aiStart(t, e.r, stock.RunOptions{Store: ts, Relay: &stock.RelayOptions{Poll: 20 * time.Millisecond}})
	hot := aiPick(skus, 5)
	type sent struct {
		key string
		at  time.Time
	}
	var log []sent
	var acks []aiAck
	end := time.Now().Add(6 * time.Second)
	for i := 0; time.Now().Before(end); i++ {
		s := hot[i%len(hot)]
		id := fmt.Sprintf("s%d", i)
		if _, err := e.r.Deduct(context.Background(), stock.Request{SKU: s, ID: id, Qty: 1}); err != nil {
			t.Fatal(err)
		}
		log = append(log, sent{s + "/" + id + "/" + string(stock.EventDeducted), time.Now()})
		acks = append(acks, aiAck{s, id, stock.EventDeducted})
		time.Sleep(time.Duration(i%7) * time.Millisecond)
	}
	if took, why := aiWaitAll(e.r, e.store, hot, 25*time.Second); len(why) > 0 {
		t.Fatalf("stream not delivered %v after its end: %v", took, why)
	}
	ts.mu.Lock()
	var worst time.Duration
	var worstKey string
	late := 0
	for _, s := range log {
		d := ts.at[s.key].Sub(s.at)
		if d > worst {
			worst, worstKey = d, s.key
		}
		if d > aiPrompt {
			late++
		}
	}
	ts.mu.Unlock()
	t.Logf("%d events, worst latency %v (%s), %d over %v", len(log), worst.Round(time.Millisecond), worstKey, late, aiPrompt)
	if late > 0 {
		t.Errorf("%d of %d events of a steady stream waited more than %v (worst %v: %s)", late, len(log), aiPrompt, worst, worstKey)
	}
	aiCheckOnce(t, e.store, acks)
}

// TestHoldStreamLatency: a steady stream of holds of mixed lengths (later holds often
// due before earlier ones) on a few deep items of 3,000, some extended, with real time flowing:
// each hold's expiry is published within a few sweeps of its deadline.
func TestHoldStreamLatency(t *testing.T) {
	ctx := context.Background()
	e := aiNew(t, true)
	skus := e.loadItems("hstr", 3000, 100000)
	var mu sync.Mutex
	expiredAt := map[string]time.Time{}
	pub := stock.PublisherFunc(func(_ context.Context, ev stock.Event) error {
		if ev.Type == stock.EventExpired {
			mu.Lock()
			if _, ok := expiredAt[ev.SKU+"/"+ev.ID]; !ok {
				expiredAt[ev.SKU+"/"+ev.ID] = time.Now()
			}
			mu.Unlock()
		}
		return nil
	})
	_ = aiStart(t, e.r, stock.RunOptions{Store: e.store, Publisher: pub, SweepInterval: 100 * time.Millisecond})
	hot := aiPick(skus, 4)
	due := map[string]time.Time{}
	ttls := []time.Duration{1500 * time.Millisecond, 300 * time.Millisecond, 900 * time.Millisecond, 200 * time.Millisecond, 2 * time.Second, 600 * time.Millisecond}
	end := time.Now().Add(5 * time.Second)
	var ext []string
	for i := 0; time.Now().Before(end); i++ {
		s := hot[i%len(hot)]
		id := fmt.Sprintf("h%d", i)
		ttl := ttls[i%len(ttls)]
		before := time.Now()
		if _, err := e.r.Hold(ctx, stock.Request{SKU: s, ID: id, Qty: 1}, ttl); err != nil {
			t.Fatal(err)
		}
		due[s+"/"+id] = before.Add(ttl)
		if i%9 == 4 && ttl >= 900*time.Millisecond {
			// shorten it: it is due before the holds made since
			require.NoError(t, testkit.Err(e.r.Extend(ctx, s, id, 100*time.Millisecond)))
			due[s+"/"+id] = time.Now().Add(100 * time.Millisecond)
			ext = append(ext, s+"/"+id)
		}
		time.Sleep(time.Duration(5+i%11) * time.Millisecond)
	}
	time.Sleep(2*time.Second + aiPrompt)
	mu.Lock()
	defer mu.Unlock()
	var worst time.Duration
	var worstKey string
	var late, missing []string
	for k, d := range due {
		at, ok := expiredAt[k]
		if !ok {
			missing = append(missing, k)
			continue
		}
		lat := at.Sub(d)
		if lat > worst {
			worst, worstKey = lat, k
		}
		if lat > time.Second {
			late = append(late, fmt.Sprintf("%s %v", k, lat.Round(time.Millisecond)))
		}
	}
	t.Logf("%d holds (%d shortened), worst expiry latency %v (%s)", len(due), len(ext), worst.Round(time.Millisecond), worstKey)
	if len(missing) > 0 {
		sort.Strings(missing)
		t.Errorf("%d holds never expired (%v after their deadline): %v", len(missing), aiPrompt, missing[:min(10, len(missing))])
	}
	if len(late) > 0 {
		sort.Strings(late)
		t.Errorf("%d holds expired more than 1s after their deadline (sweep every 100ms): %v", len(late), late[:min(10, len(late))])
	}
	for _, s := range hot {
		if l, err := e.r.Levels(ctx, s); err != nil || l.Held != 0 {
			t.Errorf("%s: %+v %v, want nothing held", s, l, err)
		}
	}
}

// TestACLWithoutHintKeys (STOCK_REDIS_SERVER): a user whose ACL lacks the hint keys
// (the README's ACL without ~shop:due{~* ~shop:holdsdue{~*, as granted before the hints): the
// README says a hint lost that way "only delays the work until the walk reaches the item".
// Deducts and holds succeed, Run delivers the events and releases the due holds within the
// walk bound.
func TestACLWithoutHintKeys(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skip("no real Redis: set STOCK_REDIS_SERVER=path")
	}
	ctx := context.Background()
	srv := redistest.StartServer(t)
	admin := srv.Client(t)
	acl := strings.Fields(`SETUSER shop-svc reset on >pw resetchannels ~shop:{* ~shop:items ~shop:epoch
  ~shop:carts{~} ~shop:carts{~}:p ~shop:probe -@all +ping
  +client|tracking +client|caching +multi +exec +pttl +cluster|slots +cluster|shards +role
  +evalsha +eval +get +getrange +set +del +exists +pexpire +setbit +time +hget +hmget +hset
  +hsetnx +hdel +hexists +hincrby +hscan +zadd +zrem +zcard +zcount +zrange +zrangebyscore
  +zscore +sadd +srem +scard +sscan +sismember +wait +info`)
	require.NoError(t, admin.Do(ctx, admin.B().Arbitrary("ACL").Args(acl...).Build()).Error(), "ACL SETUSER")
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, Username: "shop-svc", Password: "pw", DisableCache: true})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	r := testkit.NewReserver(t, c, stock.WithPrefix("shop"))
	store := memstore.New()
	skus := aiSKUs("acl", 1024) // walk bound 4s
	aiLoad(t, r, store, skus, 100)
	_ = aiStart(t, r, stock.RunOptions{Store: store, SweepInterval: 200 * time.Millisecond})
	p := aiPick(skus, 20)
	acks := aiDeductEach(t, r, p[:10], "d", 1)
	aiHoldEach(t, r, p[10:], 2, time.Second)
	aiSettles(t, r, store, p[:10], 20*time.Second, 8*time.Second, "without the hint keys in the ACL, events (walk bound 4s)")
	aiReleases(t, r, p[10:], 20*time.Second, 9*time.Second, "without the hint keys in the ACL, holds of 1s (walk bound 4s)")
	aiCheckOnce(t, store, acks)
}

// TestRunRelayItems: Run's relay limited by RelayOptions.Items delivers those items'
// events promptly and never the others', whatever the hints say.
func TestRunRelayItems(t *testing.T) {
	e := aiNew(t, true)
	skus := e.loadItems("lim", 2000, 100)
	p := aiPick(skus, 10)
	_ = aiStart(t, e.r, stock.RunOptions{Store: e.store, Relay: &stock.RelayOptions{Items: p[:5]}})
	acks := aiDeductEach(t, e.r, p, "i", 1)
	aiSettles(t, e.r, e.store, p[:5], 20*time.Second, aiPrompt, "listed items")
	time.Sleep(2 * time.Second)
	for _, a := range acks[5:] {
		n := e.store.Applications(a.sku, a.id, a.typ)
		assert.EqualValues(t, 0, n, "%s is not in RelayOptions.Items, yet its event was applied %d times", a.sku, n)
		pend, _, _ := stockops.Pending(context.Background(), e.r, a.sku)
		assert.EqualValues(t, 1, pend, "%s: pending %d, want 1 (not relayed)", a.sku, pend)
	}
	aiCheckOnce(t, e.store, acks[:5])
}

// TestEveryItemDue: every one of 2,560 items has a due hold at once, and an event:
// Run releases and delivers them all. (How fast is throughput, which the race detector and a
// shared machine change several times over: logged, not asserted.)
func TestEveryItemDue(t *testing.T) {
	e := aiNew(t, false)
	skus := e.loadItems("every", 2560, 100)
	acks := aiDeductEach(t, e.r, skus, "d", 1)
	aiHoldEach(t, e.r, skus, 2, time.Minute)
	e.advance(2 * time.Minute)
	start := time.Now()
	_ = aiRun(t, e.r, stock.RunOptions{Store: e.store})
	took, diff := aiWaitHeld(t, e.r, aiNoneHeld(skus), 60*time.Second)
	t.Logf("2560 due holds released in %v", took.Round(time.Millisecond))
	if len(diff) > 0 {
		t.Errorf("due holds on every item: after %v, %d left: %v", took, len(diff), diff[:min(5, len(diff))])
	}
	took2, why := aiWaitAll(e.r, e.store, skus, 60*time.Second)
	t.Logf("and every event delivered %v after Run started", time.Since(start).Round(time.Millisecond))
	if len(why) > 0 {
		t.Errorf("events on every item: after %v, %d left: %v", took2, len(why), why[:min(5, len(why))])
	}
	aiCheckOnce(t, e.store, acks)
}

// TestBurstHints: a burst of concurrent deducts on 1,000 distinct items of 5,000 (walk
// bound ≈ 20s): the hints of a burst are all recorded, so every event arrives at the relay's
// pace, well before the walk would find it.
func TestBurstHints(t *testing.T) {
	e := aiNew(t, true)
	skus := e.loadItems("burst", 5000, 100)
	ts := &aiTimedStore{Store: e.store, at: map[string]time.Time{}}
	_ = aiStart(t, e.r, stock.RunOptions{Store: ts})
	picked := aiPick(skus, 1000)
	var wg sync.WaitGroup
	acks := make([][]aiAck, 16)
	start := time.Now()
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := g; i < len(picked); i += 16 {
				id := fmt.Sprintf("b%d", i)
				if _, err := e.r.Deduct(context.Background(), stock.Request{SKU: picked[i], ID: id, Qty: 1}); err != nil {
					t.Error(err)
					return
				}
				acks[g] = append(acks[g], aiAck{picked[i], id, stock.EventDeducted})
			}
		}(g)
	}
	wg.Wait()
	burst := time.Since(start)
	took, why := aiWaitAll(e.r, e.store, picked, 28*time.Second)
	t.Logf("burst of 1000 in %v, all delivered %v after it", burst.Round(time.Millisecond), took.Round(time.Millisecond))
	if len(why) > 0 {
		t.Fatalf("%d not delivered after %v: %v", len(why), took, why[:min(5, len(why))])
	}
	// The walk alone visits about 256 items a second: it needs about 20s to reach 1,000 items
	// picked at random among 5,000 (and 15s reaches fewer than 80% of them). Every one arriving
	// before that shows the hints were recorded, however slow this machine is at the moment.
	if took > 15*time.Second {
		t.Errorf("a burst's events took %v after the burst to arrive (walk bound ≈ 20s): hints lost?", took)
	}
	var all []aiAck
	for _, a := range acks {
		all = append(all, a...)
	}
	aiCheckOnce(t, e.store, all)
}

// TestFrozenClock: on stocktest's clock, which stands still while the wall clock runs
// (Testing your code), Run still delivers a deep item's event promptly, and an event that failed
// once is retried promptly after Advance moves past its backoff.
func TestFrozenClock(t *testing.T) {
	ctx := context.Background()
	e := aiNew(t, false)
	skus := e.loadItems("frz", 3000, 100)
	p := aiPick(skus, 4)
	var mu sync.Mutex
	fail := map[string]bool{p[2]: true, p[3]: true}
	e.store.FailWith(func(ev stock.Event) error {
		mu.Lock()
		defer mu.Unlock()
		if fail[ev.SKU] {
			return memstore.ErrDown
		}
		return nil
	})
	_ = aiRun(t, e.r, stock.RunOptions{Store: e.store, Relay: &stock.RelayOptions{MinBackoff: time.Second, MaxBackoff: time.Second}})
	time.Sleep(2 * time.Second) // the wall clock runs ahead of Redis's
	acks := aiDeductEach(t, e.r, p, "f", 1)
	aiSettles(t, e.r, e.store, p[:2], 20*time.Second, aiPrompt, "frozen clock")
	time.Sleep(time.Second) // p[2], p[3] failed and backed off (by the Redis clock: 1-1.5s)
	mu.Lock()
	fail = map[string]bool{}
	mu.Unlock()
	for _, s := range p[2:] {
		pend, _, _ := stockops.Pending(ctx, e.r, s)
		require.EqualValues(t, 1, pend, "%s: pending %d before the backoff ran out, want 1", s, pend)
	}
	e.advance(2 * time.Second)
	aiSettles(t, e.r, e.store, p[2:], 25*time.Second, aiPrompt, "retried after Advance passed the backoff")
	aiCheckOnce(t, e.store, acks)
}

// TestNewEventsDuringBackoff: while the Store fails a deep item (backoff), new events
// of that item keep coming (new hints arriving for an item that is backing off); once the
// Store recovers, the item's events arrive after its backoff, not at the walk's pace.
func TestNewEventsDuringBackoff(t *testing.T) {
	e := aiNew(t, true)
	skus := e.loadItems("bko", 3000, 1000) // walk bound ≈ 11.7s
	p := aiPick(skus, 6)
	var mu sync.Mutex
	down := true
	e.store.FailWith(func(ev stock.Event) error {
		mu.Lock()
		defer mu.Unlock()
		if down {
			return memstore.ErrDown
		}
		return nil
	})
	_ = aiStart(t, e.r, stock.RunOptions{Store: e.store, Relay: &stock.RelayOptions{MinBackoff: 200 * time.Millisecond, MaxBackoff: 500 * time.Millisecond}})
	var acks []aiAck
	for i := 0; i < 20; i++ {
		acks = append(acks, aiDeductEach(t, e.r, p, fmt.Sprintf("k%d", i), 1)...)
		time.Sleep(time.Duration(37+i*7) * time.Millisecond)
	}
	mu.Lock()
	down = false
	mu.Unlock()
	acks = append(acks, aiDeductEach(t, e.r, p, "last", 1)...)
	aiSettles(t, e.r, e.store, p, 25*time.Second, 500*time.Millisecond+aiPrompt, "after the store recovered (backoff ≤ 500ms)")
	aiCheckOnce(t, e.store, acks)
}

// TestSkewedClocks: the deducts come from processes whose clocks are ten minutes
// ahead and behind (WithClock), Run runs in a process on time: the hints those processes
// record are still taken promptly.
func TestSkewedClocks(t *testing.T) {
	e := aiNew(t, true)
	now := func(d time.Duration) func() time.Time {
		return func() time.Time { return e.env.Now().Add(d) }
	}
	ahead := testkit.NewReserver(t, e.c, stock.WithClock(now(10*time.Minute)))
	behind := testkit.NewReserver(t, e.c, stock.WithClock(now(-10*time.Minute)))
	skus := e.loadItems("skew", 3000, 100)
	_ = aiStart(t, e.r, stock.RunOptions{Store: e.store})
	p := aiPick(skus, 12)
	acks := aiDeductEach(t, ahead, p[0:6], "a", 1)
	acks = append(acks, aiDeductEach(t, behind, p[6:12], "b", 1)...)
	aiSettles(t, e.r, e.store, p, 20*time.Second, aiPrompt, "events from processes with skewed clocks")
	aiCheckOnce(t, e.store, acks)
}

// TestHoldHintWriterClock: holds of 1s taken by a process whose clock (WithClock)
// is off by the given skew, Run in a process on time, 3,000 items (walk ≈ 11.7s). README: hold
// "Deadlines come from the Redis clock"; the holds' hint is "scored by the earliest deadline".
// Expected: released about 1s after they were taken (within a few 200ms sweeps). Got (writer
// ahead): released only after ~skew, or at the walk's pace when the skew exceeds the walk
// (+3s skew: ~4.1s; +10m: ~10s): the hint's score follows the writing process's clock, not the
// deadline Redis recorded. Writer behind: prompt.
func TestHoldHintWriterClock(t *testing.T) {
	for _, skew := range []time.Duration{-10 * time.Minute, 10 * time.Minute, 3 * time.Second} {
		t.Run(skew.String(), func(t *testing.T) {
			e := aiNew(t, true)
			w := testkit.NewReserver(t, e.c, stock.WithClock(func() time.Time { return e.env.Now().Add(skew) }))
			skus := e.loadItems("hw", 3000, 100)
			_ = aiStart(t, e.r, stock.RunOptions{Store: e.store, SweepInterval: 200 * time.Millisecond})
			held := aiPick(skus, 6)
			aiHoldEach(t, w, held, 1, time.Second)
			aiReleases(t, e.r, held, 25*time.Second, time.Second+aiPrompt/2, fmt.Sprintf("1s holds from a process whose clock is off by %v", skew))
		})
	}
}

// TestRunSkewed: Run itself in a process whose clock is ten minutes behind or ahead
// of Redis's (WithClock): it delivers hinted events and releases due holds promptly. Expected:
// 1s holds released within ~1s + a few sweeps, in any case within the walk bound (≈ 11.7s).
// Got with the clock 10m behind: not released in 15s (the sweeper waits for its own clock to
// reach the Redis deadline); 10m ahead passes.
func TestRunSkewed(t *testing.T) {
	for _, skew := range []time.Duration{-10 * time.Minute, 10 * time.Minute} {
		t.Run(skew.String(), func(t *testing.T) {
			e := aiNew(t, true)
			runner := testkit.NewReserver(t, e.c, stock.WithClock(func() time.Time { return e.env.Now().Add(skew) }))
			skus := e.loadItems("rsk", 3000, 100)
			_ = aiStart(t, runner, stock.RunOptions{Store: e.store, SweepInterval: 200 * time.Millisecond})
			p := aiPick(skus, 12)
			acks := aiDeductEach(t, e.r, p[:6], "d", 1)
			aiSettles(t, e.r, e.store, p[:6], 20*time.Second, aiPrompt, fmt.Sprintf("Run with a clock off by %v: events", skew))
			aiHoldEach(t, e.r, p[6:], 1, time.Second)
			aiReleases(t, e.r, p[6:], 15*time.Second, time.Second+aiPrompt, fmt.Sprintf("Run with a clock off by %v: 1s holds", skew))
			aiCheckOnce(t, e.store, acks)
		})
	}
}

// TestRunClockBehindRedisHoldsNeverSwept: README "Testing your code" says to use
// Env.Client "to build relays, reconcilers or other Reservers on the same data". Such a
// Reserver (stock.New(e.Client), default clock time.Now) runs Run after the test has Advanced
// the Redis clock past a hold's deadline: its process clock is now behind Redis. README: hold
// "Deadlines come from the Redis clock"; Run "sweeps due holds every second". Expected: the
// due hold of a 10-item catalogue (the walk covers it whole every poll) is released within a
// few sweeps, as Sweep(ctx) on the same Reserver does at once. Got: Run releases nothing (the
// sweeper judges due-ness by the process clock), until that clock reaches the deadline.
func TestRunClockBehindRedisHoldsNeverSwept(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t)
	for i := 0; i < 10; i++ {
		require.NoError(t, e.Reserver.Load(ctx, fmt.Sprintf("s%d", i), 5))
	}
	if _, err := e.Reserver.Hold(ctx, stock.Request{SKU: "s7", ID: "cart", Qty: 2}, time.Minute); err != nil {
		t.Fatal(err)
	}
	e.Advance(2 * time.Minute)
	other := testkit.NewReserver(t, e.Client) // "other Reservers on the same data"
	stop := aiRun(t, other, stock.RunOptions{SweepInterval: 100 * time.Millisecond})
	took, diff := aiWaitHeld(t, other, map[string]int64{"s7": 0}, 5*time.Second)
	if err := stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	if len(diff) > 0 {
		n, err := stockops.Sweep(ctx, other)
		t.Errorf("a hold 1 minute past its Redis deadline, 10 items, sweep every 100ms: still held after %v of Run (%v); Sweep(ctx) on the same Reserver then released %d units (%v)", took.Round(time.Millisecond), diff, n, err)
	}
}
