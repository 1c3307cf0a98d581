package contract_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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

// blackhole is a TCP proxy to a Redis that can be told to stop forwarding
// (the connections stay open, nothing answers).
type proxy struct {
	ln     net.Listener
	target string
	holed  atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

func startProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{ln: ln, target: target}
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, c)
			p.mu.Unlock()
			go p.serve(c)
		}
	}()
	return p
}

func (p *proxy) serve(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, up)
	p.mu.Unlock()
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				for p.holed.Load() {
					time.Sleep(5 * time.Millisecond) // swallow: never answer
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				dst.Close()
				return
			}
		}
	}
	go pipe(up, c)
	go pipe(c, up)
}

// Promise under test: with a background context and a
// blackholed Redis every call returns within WithTimeout (plus slack) with
// ErrUnknownOutcome wrapping context.DeadlineExceeded; after the network heals a
// Retry resolves it.
func TestBlackholeEveryCallBounded(t *testing.T) {
	testkit.ParallelOnMiniredis(t)
	mr, _ := redistest.Miniredis(t)
	p := startProxy(t, mr.Addr())
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{p.ln.Addr().String()}, DisableCache: true, ForceSingleClient: true})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	const bound = 300 * time.Millisecond
	r := testkit.NewReserver(t, c, stock.WithTimeout(bound))
	ctx := context.Background()
	st := memstore.New()
	loadRedisAndStore(t, r, st, 10, "bh")
	rl := newRelay(t, r, st, nil, nil)
	rc := newReconciler(t, r, st, nil)
	p.holed.Store(true)
	check := func(name string, f func() error, wantUnknown bool) {
		t.Helper()
		start := time.Now()
		done := make(chan error, 1)
		go func() { done <- f() }()
		select {
		case err := <-done:
			el := time.Since(start)
			if !assert.Error(t, err, "%s on a blackholed Redis", name) {
				return
			}
			assert.LessOrEqual(t, el, 10*bound, "%s", name)
			if wantUnknown {
				assert.ErrorIs(t, err, stock.ErrUnknownOutcome, "%s", name)
			}
			assert.ErrorIs(t, err, context.DeadlineExceeded, "%s", name)
			assert.NotErrorIs(t, err, stock.ErrInvalid, "%s", name)
			t.Logf("%s: %v in %v (Outcome %s)", name, err, el, stock.Outcome(err))
		case <-time.After(30 * bound):
			t.Errorf("%s: did not return within %v", name, 30*bound)
		}
	}
	check("Deduct", func() error { return testkit.Err(r.Deduct(ctx, stock.Request{SKU: "bh", ID: "a", Qty: 1})) }, true)
	check("Restore", func() error { return testkit.Err(r.Restore(ctx, "bh", "a")) }, true)
	check("Hold", func() error { return testkit.Err(r.Hold(ctx, stock.Request{SKU: "bh", ID: "h", Qty: 1}, time.Minute)) }, true)
	check("DeductMany", func() error {
		return testkit.Err(r.DeductMany(ctx, stock.Cart{ID: "c", Lines: unitLines("bh", "bh2")}))
	}, true)
	check("Levels", func() error { return testkit.Err(r.Levels(ctx, "bh")) }, false)
	check("Available", func() error { return testkit.Err(testkit.Available(r.Levels(ctx, "bh"))) }, false)
	check("Load", func() error { return r.Load(ctx, "bh3", 1) }, true)
	check("Sweep", func() error { return testkit.Err(stockops.Sweep(ctx, r, "bh")) }, false)
	check("SweepAll", func() error { return testkit.Err(stockops.Sweep(ctx, r)) }, false)
	check("Pending", func() error { _, _, err := stockops.Pending(ctx, r, "bh"); return err }, false)
	check("FailoverGuard.Check", func() error { return testkit.Err(stockops.NewFailoverGuard(r).Check(ctx)) }, false)
	check("Relay.Once", func() error { return testkit.Err(rl.Once(ctx)) }, false)
	check("Reconciler.Pass", func() error { return testkit.Err(rc.Pass(ctx)) }, false)
	check("Consume", func() error {
		return stock.Consume(ctx, r, st, stock.Event{Type: stock.EventDeducted, SKU: "bh", ID: "zz", Qty: 1, Seq: 1, At: time.Now()})
	}, false)

	p.holed.Store(false)
	// the blackholed Deduct may reach Redis when the network heals; a retry resolves.
	var rcpt stock.Receipt
	for i := 0; i < 50; i++ {
		rcpt, err = r.Deduct(ctx, stock.Request{SKU: "bh", ID: "a", Qty: 1, Retry: true})
		if err == nil || !errors.Is(err, stock.ErrUnknownOutcome) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.False(t, err != nil && !errors.Is(err, stock.ErrRestored), "retry after heal: %v", err)
	t.Logf("retry: %+v %v", rcpt, err)
}

// Promise under test: the fence is lifted by a complete
// pass run by another Reserver (another process), and never by an incomplete one
// (a dry run, a pass limited to some items, a pass that found an item busy).
func TestFenceLiftedOnlyByCompletePass(t *testing.T) {
	faultReal(t) // for a restart of a real server
	ctx := context.Background()
	srv := redistest.StartServer(t, "--appendonly", "yes", "--appendfsync", "always")
	r1 := testkit.NewReserver(t, srv.Client(t), stock.WithTimeout(2*time.Second))
	st := memstore.New()
	g := stockops.NewFailoverGuard(r1)
	wantFenced(t, g, false, "first check")
	loadRedisAndStore(t, r1, st, 10, "f1", "f2")
	srv.Restart()
	var fenced bool
	var err error
	for i := 0; i < 50; i++ {
		fenced, err = g.Check(ctx)
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.False(t, err != nil || !fenced, "after restart: fenced=%v err=%v", fenced, err)
	require.ErrorIs(t, testkit.Err(r1.Deduct(ctx, stock.Request{SKU: "f1", ID: "x", Qty: 1})), stock.ErrFailover, "deduct while fenced")
	r2 := testkit.NewReserver(t, srv.Client(t)) // another process
	for what, opts := range map[string]*stock.ReconcileOptions{
		"a dry run":                                  {DryRun: true},
		"a pass limited to some items":               {Items: []string{"f1"}},
		"a pass limited to items (even all of them)": {Items: []string{"f1", "f2"}},
	} {
		rec := newReconciler(t, r2, st, opts)
		if res, err := rec.Pass(ctx); err != nil || res.EpochRecorded {
			t.Fatalf("%s: %v %+v", what, err, res)
		}
		wantFenced(t, g, true, "fence lifted by "+what)
	}
	// A relay holds f2 (its Publish blocks): the pass finds it busy.
	require.NoError(t, testkit.Err(r2.Restock(ctx, "f2", "rs1", 1)))
	block := make(chan struct{})
	entered := make(chan struct{}, 1)
	rl, _ := stockops.NewRelay(r2, st, stock.PublisherFunc(func(ctx context.Context, ev stock.Event) error {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-block
		return nil
	}), &stock.RelayOptions{Items: []string{"f2"}})

	relayDone := make(chan error, 1)
	go func() { _, err := rl.Once(ctx); relayDone <- err }()
	<-entered
	full, _ := stockops.NewReconciler(r2, st, nil)
	res, err := full.Pass(ctx)
	t.Logf("pass with a busy item: complete=%v recorded=%v err=%v", res.Complete, res.EpochRecorded, err)
	assert.False(t, res.Complete || res.EpochRecorded, "a pass that found an item busy counted as complete: %+v", res)
	wantFenced(t, g, true, "fence lifted by a pass that found an item busy")
	close(block)
	require.NoError(t, <-relayDone)
	res, err = full.Pass(ctx)
	require.False(t, err != nil || !res.Complete || !res.EpochRecorded, "complete pass: %v %+v", err, res)
	wantFenced(t, g, false, "after a complete pass elsewhere")
	require.NoError(t, testkit.Err(r1.Deduct(ctx, stock.Request{SKU: "f1", ID: "x", Qty: 1})), "deduct after the fence lifted")
}

// FailoverGuard.Check documents that a guard added to a live deployment (items loaded, no epoch
// recorded) fences until a complete repairing pass: nothing tells which writes a restart lost.
// (A test found the doc saying it records the epoch; the doc now says what the code does.)
func TestGuardFirstCheckOnLiveItemsFencesUntilPass(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		r := testkit.NewReserver(t, c)
		require.NoError(t, r.Load(ctx, "g1", 5))
		// Loaded by a version that recorded no epoch (Load now records one on a Redis that
		// has none and no item yet): a live deployment, not a fresh one.
		require.NoError(t, c.Do(ctx, c.B().Del().Key("stock:epoch").Build()).Error())
		g := stockops.NewFailoverGuard(r)
		fenced, err := g.Check(ctx)
		if err != nil {
			require.False(t, b.Real(), "guard check on a real Redis: %v", err)
			t.Skipf("guard unusable on this backend: %v", err)
		}
		require.True(t, fenced, "a guard added to a live deployment with no epoch is not fenced")
		require.ErrorIs(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: "g1", ID: "a", Qty: 1})), stock.ErrFailover, "deduct while fenced")
		rec := newReconciler(t, r, memstore.New(), nil)
		_, _ = rec.Once(ctx) // the store does not know g1: the pass still records the primaries
		wantFenced(t, g, false, "after a complete pass")
	})
}

// A stopped redis-server, or one busy for 2 s (DEBUG SLEEP), and a context with no deadline:
// Deduct returns within WithTimeout (plus slack) with ErrUnknownOutcome wrapping
// context.DeadlineExceeded, and so do many concurrent callers of the stopped one. Once the server
// is back (restarted on its AOF; awake, the script having run then), a Retry resolves it: one
// take, whichever attempt made it.
func TestStoppedServerBoundedThenRetryResolves(t *testing.T) {
	faultReal(t)
	for _, tc := range []struct {
		name          string
		args          []string
		bound, within time.Duration // WithTimeout, and what the call may take
		callers       int           // concurrent callers while the server is out
		tries         int           // retries after it is back
		out, back     func(t *testing.T, srv *redistest.Server)
	}{
		{
			name: "stopped", args: []string{"--appendonly", "yes", "--appendfsync", "always"},
			bound: 500 * time.Millisecond, within: 5 * time.Second, callers: 20, tries: 40,
			out:  func(t *testing.T, srv *redistest.Server) { srv.Kill() },
			back: func(t *testing.T, srv *redistest.Server) { srv.Start() },
		},
		{
			name: "sleeping", bound: 300 * time.Millisecond, within: 3 * time.Second, tries: 1,
			out: func(t *testing.T, srv *redistest.Server) {
				other := srv.Client(t)
				go func() {
					_ = other.Do(context.Background(), other.B().Arbitrary("DEBUG", "SLEEP").Args("2").Build()).Error()
				}()
				time.Sleep(100 * time.Millisecond)
			},
			back: func(t *testing.T, srv *redistest.Server) { time.Sleep(2500 * time.Millisecond) },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			srv := redistest.StartServer(t, tc.args...)
			r := testkit.NewReserver(t, srv.Client(t), stock.WithTimeout(tc.bound))
			require.NoError(t, r.Load(ctx, "st", 3))
			tc.out(t, srv)
			start := time.Now()
			_, err := r.Deduct(ctx, stock.Request{SKU: "st", ID: "a", Qty: 1})
			el := time.Since(start)
			t.Logf("deduct: %v in %v (outcome %s)", err, el, stock.Outcome(err))
			assert.ErrorIs(t, err, stock.ErrUnknownOutcome)
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			var ne net.Error
			if !errors.As(err, &ne) {
				t.Logf("no net.Error wrapped (transport cause): %v", err)
			}
			assert.LessOrEqual(t, el, tc.within, "with a %v bound", tc.bound)
			var wg sync.WaitGroup
			var slow atomic.Int64
			for i := range tc.callers {
				wg.Go(func() {
					s := time.Now()
					_, err := r.Deduct(ctx, stock.Request{SKU: "st", ID: fmt.Sprint("c", i), Qty: 1})
					if time.Since(s) > tc.within || !errors.Is(err, stock.ErrUnknownOutcome) {
						slow.Add(1)
						t.Logf("caller %d: %v after %v", i, err, time.Since(s))
					}
				})
			}
			wg.Wait()
			assert.Zero(t, slow.Load(), "callers unbounded or not ErrUnknownOutcome")
			tc.back(t, srv)
			var rc stock.Receipt
			for i := 0; i < tc.tries; i++ {
				rc, err = r.Deduct(ctx, stock.Request{SKU: "st", ID: "a", Qty: 1, Retry: true})
				if !errors.Is(err, stock.ErrUnknownOutcome) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			require.NoError(t, err, "retry once the server is back")
			lv, err := r.Levels(ctx, "st")
			require.NoError(t, err)
			assert.Equal(t, int64(2), lv.Available, "one take, whichever attempt (receipt %+v)", rc)
			assert.Equal(t, int64(1), lv.Sold)
		})
	}
}

// Promise under test: after a
// restart without persistence that lost acknowledged, undelivered sales,
// `stockctl reconcile` says so with exit 3, `reconcile -apply` rebuilds from the
// store, says so loudly, and lifts the FailoverGuard fence of another process.
func TestRestartWithoutPersistenceGuardNotFencedCLIHeld(t *testing.T) {
	faultReal(t)
	ctx := context.Background()
	dir := t.TempDir()
	bin := filepath.Join(dir, "stockctl")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/stockctl").CombinedOutput(); err != nil {
		t.Fatalf("build: %v %s", err, out)
	}
	srv := redistest.StartServer(t)
	r := testkit.NewReserver(t, srv.Client(t), stock.WithCoalescing(0))
	g := stockops.NewFailoverGuard(r)
	wantFenced(t, g, false, "check")
	dsn := "sqlite:" + filepath.Join(dir, "s.db")
	run := func(args ...string) (string, int) {
		cmd := exec.Command(bin, append([]string{"-redis", srv.Addr(), "-dsn", dsn, "-timeout", "20s"}, args...)...)
		out, err := cmd.CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	out, code := run("load", "cli", "10")
	require.EqualValues(t, 0, code, "load: %d %s", code, out)
	for i := 0; i < 3; i++ {
		require.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: "cli", ID: fmt.Sprint("d", i), Qty: 1})))
	}
	out, code = run("relay-once")
	require.EqualValues(t, 0, code, "relay-once: %d %s", code, out)
	for i := 3; i < 5; i++ { // acknowledged, never delivered
		require.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: "cli", ID: fmt.Sprint("d", i), Qty: 1})))
	}
	srv.Restart() // no persistence: everything lost
	var f bool
	var err error
	for i := 0; i < 50; i++ {
		if f, err = g.Check(ctx); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.NoError(t, err)
	if !f {
		// Broken promise: "A FailoverGuard notices that a Redis primary restarted (its run id
		// changed) ... and then fences the Reserver". A restart without persistence loses the
		// epoch key and the registry with it, and Check takes it for a new deployment: it
		// records the new primary as reconciled and stays unfenced, although this guard itself
		// saw the old run id a moment ago.
		t.Errorf("a guard that saw the primary before its restart without persistence is not fenced after it")
	}
	out, code = run("reconcile")
	t.Logf("reconcile (report): exit %d\n%s", code, out)
	assert.EqualValues(t, 3, code, "report-only reconcile after a lost registry: exit %d, want 3", code)
	out, code = run("reconcile", "-apply")
	t.Logf("reconcile -apply: exit %d\n%s", code, out)
	assert.NotZero(t, code, "reconcile -apply after Redis lost 2 acknowledged undelivered sales exits 0: a cron alert never fires (ErrRegistryLost's doc: a human must look)")
	lv, err := r.Levels(ctx, "cli")
	require.NoError(t, err, "not rebuilt")
	assert.EqualValues(t, 7, lv.Available, "rebuilt available %d, want 7 (the store's remaining)", lv.Available)
	wantFenced(t, g, false, "fence not lifted by the CLI's complete pass")
	assert.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: "cli", ID: "after", Qty: 1})), "deduct after the CLI's repair")
	out, code = run("reconcile")
	t.Logf("reconcile again: exit %d\n%s", code, out)
	assert.Zero(t, code, "after the repair, reconcile exits %d", code)
}

// Broken promise under test (error contract): ErrFailover sent nothing, for
// Deduct, Hold, DeductMany and HoldMany (saga and grouped carts), and
// ErrNotReplicated wrote.
func TestErrFailoverSentNothingErrNotReplicatedWrote(t *testing.T) {
	faultRealBackends(t, func(t *testing.T, b redistest.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		r := testkit.NewReserver(t, c, stock.WithGroups(faultGroup))
		for _, sku := range []string{"ea", "eb", "ga", "gb"} {
			require.NoError(t, r.Load(ctx, sku, 5))
		}
		// a guard on a Redis with items and no epoch (the first Load's is lost) fences at once
		require.NoError(t, c.Do(ctx, c.B().Del().Key("stock:epoch").Build()).Error())
		wantFenced(t, stockops.NewFailoverGuard(r), true, "a guard on a real Redis with items and no epoch did not fence")
		keysBefore := faultKeys(t, c)
		saga := unitLines("ea", "eb")
		grouped := unitLines("ga", "gb")
		calls := map[string]func() error{
			"Deduct":             func() error { return testkit.Err(r.Deduct(ctx, stock.Request{SKU: "ea", ID: "x", Qty: 1})) },
			"Hold":               func() error { return testkit.Err(r.Hold(ctx, stock.Request{SKU: "ea", ID: "h", Qty: 1}, time.Minute)) },
			"DeductMany saga":    func() error { return testkit.Err(r.DeductMany(ctx, stock.Cart{ID: "c1", Lines: saga})) },
			"HoldMany saga":      func() error { return testkit.Err(r.HoldMany(ctx, stock.Cart{ID: "c2", Lines: saga}, time.Minute)) },
			"DeductMany grouped": func() error { return testkit.Err(r.DeductMany(ctx, stock.Cart{ID: "c3", Lines: grouped})) },
			"HoldMany grouped":   func() error { return testkit.Err(r.HoldMany(ctx, stock.Cart{ID: "c4", Lines: grouped}, time.Minute)) },
		}
		for name, f := range calls {
			err := f()
			assert.ErrorIs(t, err, stock.ErrFailover, "%s while fenced: %v, want ErrFailover", name, err)
			assert.EqualValues(t, "failover", stock.Outcome(err), "%s: Outcome %q", name, stock.Outcome(err))
		}
		keysAfter := faultKeys(t, c)
		for k, v := range keysAfter {
			assert.EqualValues(t, v, keysBefore[k], "ErrFailover changed key %s: %q -> %q", k, keysBefore[k], v)
		}
	})
}

// wantFenced fails the test unless g's check answers fenced as want, with no error.
func wantFenced(t *testing.T, g *stockops.FailoverGuard, want bool, what string) {
	t.Helper()
	fenced, err := g.Check(context.Background())
	require.NoError(t, err, what)
	require.Equal(t, want, fenced, "%s: fenced", what)
}

// faultKeys dumps every key of every master (type and a digest of the value).
func faultKeys(t *testing.T, c rueidis.Client) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	for _, n := range c.Nodes() {
		keys, err := n.Do(ctx, n.B().Keys().Pattern("*").Build()).AsStrSlice()
		if err != nil {
			continue // a replica, or not ours
		}
		for _, k := range keys {
			d, err := n.Do(ctx, n.B().Dump().Key(k).Build()).ToString()
			if err != nil && !rueidis.IsRedisNil(err) {
				// miniredis cannot DUMP every type: fall back to the type
				ty, _ := n.Do(ctx, n.B().Type().Key(k).Build()).ToString()
				d = "type:" + ty
			}
			out[k] = fmt.Sprintf("%x", d)
		}
	}
	return out
}

// Promise under test: with WithReplicaAck and no
// replica, a write returns ErrNotReplicated with its receipt and the write made,
// for Deduct and for a grouped cart; Outcome says "not_replicated".
func TestErrNotReplicatedWrote(t *testing.T) {
	ctx := context.Background()
	_, r := serverReserver(t, nil, stock.WithGroups(faultGroup), stock.WithReplicaAck(1, 20*time.Millisecond))
	for _, sku := range []string{"ea", "eb", "ga", "gb"} {
		require.NoError(t, r.Load(ctx, sku, 5))
	}
	rc, err := r.Deduct(ctx, stock.Request{SKU: "ea", ID: "x", Qty: 2})
	assert.False(t, !errors.Is(err, stock.ErrNotReplicated) || rc.Qty != 2 || rc.Remaining != 3, "Deduct: %+v %v", rc, err)
	assert.EqualValues(t, "not_replicated", stock.Outcome(err), "Outcome %q", stock.Outcome(err))
	crc, err := r.DeductMany(ctx, stock.Cart{ID: "g", Lines: []stock.Line{{SKU: "ga", Qty: 1}, {SKU: "gb", Qty: 2}}})
	assert.ErrorIs(t, err, stock.ErrNotReplicated, "grouped DeductMany: %+v %v, want ErrNotReplicated", crc, err)
	for sku, want := range map[string]int64{"ea": 3, "eb": 5, "ga": 4, "gb": 3} {
		lv, err := r.Levels(ctx, sku)
		assert.False(t, err != nil || lv.Available != want, "%s: %+v %v, want available %d", sku, lv, err, want)
	}
	// the replay of a not-replicated write
	rc, err = r.Deduct(ctx, stock.Request{SKU: "ea", ID: "x", Qty: 2})
	t.Logf("replay: %+v %v", rc, err)
	assert.True(t, rc.Replayed, "replay not Replayed: %+v %v", rc, err)
}

// Run started on a live deployment (items loaded, sales made, no guard ever ran): the guard fences
// the Reserver ("a guard added to a live deployment ... fences until a complete repairing
// Reconciler pass records the primaries"), and Run's reconciler, whose "first pass runs at once",
// is the pass that lifts it: ErrFailover lasts only as long as that first pass (and the next
// guard check). Without a pass that can complete, the fence would last a whole Interval (5
// minutes by default).
func TestRunStartOnLiveDeploymentFenceLifts(t *testing.T) {
	faultRealBackends(t, func(t *testing.T, b redistest.Backend) {
		ctx := context.Background()
		skus := []string{"f1", "f:2", "f~3"}
		r, st := withStore(t, b.Client(t), 100000, skus)
		for _, s := range skus {
			require.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: s, ID: "before", Qty: 1})))
		}
		cancel, done := runAsync(r, stock.RunOptions{Store: st, GuardInterval: 10 * time.Millisecond})
		defer func() { cancel(); <-done }()
		start := time.Now()
		var fenced, sold int
		var firstFence, lastFence time.Duration
		for i := 0; time.Since(start) < 4*time.Second; i++ {
			_, err := r.Deduct(ctx, stock.Request{SKU: skus[i%3], ID: fmt.Sprint("d", i), Qty: 1})
			switch {
			case errors.Is(err, stock.ErrFailover):
				if fenced == 0 {
					firstFence = time.Since(start)
				}
				fenced++
				lastFence = time.Since(start)
			case err == nil:
				sold++
			default:
				t.Fatalf("deduct: %v", err)
			}
			time.Sleep(2 * time.Millisecond)
		}
		t.Logf("ErrFailover %d times (first at %v, last at %v), %d sold", fenced, firstFence, lastFence, sold)
		assert.Less(t, lastFence, 2*time.Second, "the fence lifted after Run's first reconcile pass")
		assert.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: "f1", ID: "after", Qty: 1})), "selling after Run's first pass")
	})
}

// ErrFailover "is returned by Deduct, Hold and DeductMany while a FailoverGuard has seen the Redis
// primaries change and no reconcile pass has run since"; the guard fences "until a repairing
// Reconciler pass over all items completes, in this process or any other one". README: "Any
// complete repairing pass over every item records the reconciled identity in Redis, wherever it
// runs ... every process sharing the Redis lifts its fence". Run's guard fences the Reserver (Run
// started on a live deployment), Run ends before its reconciler completes a pass (its Store is
// slow), then a complete repairing pass, in the same process or in another one, records the
// primaries: the Reserver must sell again.
func TestFenceAfterRunEndsLiftedByPass(t *testing.T) {
	for _, other := range []bool{false, true} {
		t.Run(map[bool]string{false: "same-process", true: "other-process"}[other], func(t *testing.T) {
			faultRealBackends(t, func(t *testing.T, b redistest.Backend) {
				ctx := context.Background()
				r := testkit.NewReserver(t, b.Client(t))
				passer, delay, tries := r, 300*time.Millisecond, 1
				if other {
					if b.Name == "sentinel" {
						t.Skip("not run on sentinel")
					}
					c1, c2 := b.Pair(t)
					r, passer = testkit.NewReserver(t, c2), testkit.NewReserver(t, c1)
					// The ended Run's lease lasts at most 5s.
					delay, tries = 500*time.Millisecond, 100
				}
				st := memstore.New()
				loadRedisAndStore(t, r, st, 1000, "g")
				require.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: "g", ID: "before", Qty: 1})))
				cancel, done := runAsync(r, stock.RunOptions{Store: &onlyStore{s: st, delay: delay}, GuardInterval: time.Millisecond, Drain: time.Millisecond})
				fenced := eventually(2*time.Second, func() bool {
					_, err := r.Deduct(ctx, stock.Request{SKU: "g", ID: "probe", Qty: 1})
					return errors.Is(err, stock.ErrFailover)
				})
				cancel()
				<-done
				if !fenced && other {
					t.Skip("Run's guard never fenced (its pass won the race): nothing to check")
				} else if !fenced {
					t.Logf("the guard never fenced (the first pass won the race)")
				}
				rec, err := stockops.NewReconciler(passer, st, nil)
				require.NoError(t, err)
				var pr stockops.PassResult
				for i := 0; i < tries; i++ {
					if pr, err = rec.Pass(ctx); err == nil && pr.Complete && pr.EpochRecorded {
						break
					}
					time.Sleep(200 * time.Millisecond)
				}
				require.NoError(t, err)
				require.True(t, pr.Complete && pr.EpochRecorded, "%+v", pr)
				if other {
					time.Sleep(3 * time.Second) // longer than any check interval
				}
				assert.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: "g", ID: "after-pass", Qty: 1})), "a complete repairing pass ran since the guard fenced (fenced: %v)", fenced)
				// What lifts it: a guard's next check.
				f, err := stockops.NewFailoverGuard(r).Check(ctx)
				t.Logf("a new guard's Check: fenced=%v err=%v", f, err)
				_, err = r.Deduct(ctx, stock.Request{SKU: "g", ID: "after-check", Qty: 1})
				t.Logf("deduct after a new guard's check: %v", err)
			})
		})
	}
}

// Redis restarts under a running Run (AOF with fsync always: nothing is lost). The guard fences:
// ErrFailover "while a FailoverGuard has seen the Redis primaries change and no reconcile pass has
// run since". This test records how long sales are refused with Run's defaults (a pass every 5
// minutes) and with a short Reconcile.Interval, and asserts what is promised: while fenced,
// nothing is sold; once a pass has run, sales resume.
func TestRunRedisRestartFenceWindow(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Log("needs STOCK_REDIS_SERVER; nothing to check on miniredis (the guard is off there)")
		return
	}
	for _, interval := range []time.Duration{0, 200 * time.Millisecond} {
		t.Run(fmt.Sprint("interval=", interval), func(t *testing.T) {
			ctx := context.Background()
			srv := redistest.StartServer(t, "--appendonly", "yes", "--appendfsync", "always")
			c := srv.Client(t)
			r := testkit.NewReserver(t, c)
			st := memstore.New()
			cancel, done := runAsync(r, stock.RunOptions{Store: st, GuardInterval: 10 * time.Millisecond,
				Reconcile: &stock.ReconcileOptions{Interval: interval}})
			defer func() { cancel(); <-done }()
			time.Sleep(100 * time.Millisecond)
			loadRedisAndStore(t, r, st, 100000, "rs")
			require.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: "rs", ID: "before", Qty: 1})))
			srv.Restart()
			start := time.Now()
			var fenced int
			var lifted time.Duration
			for i := 0; time.Since(start) < 8*time.Second; i++ {
				_, err := r.Deduct(ctx, stock.Request{SKU: "rs", ID: fmt.Sprint("d", i), Qty: 1})
				if err == nil && fenced > 0 {
					lifted = time.Since(start)
					break
				}
				if errors.Is(err, stock.ErrFailover) {
					fenced++
				}
				time.Sleep(5 * time.Millisecond)
			}
			t.Logf("Reconcile.Interval %v: %d deducts refused with ErrFailover after the restart; sales resumed after %v (0: not within 8s)", interval, fenced, lifted)
			switch {
			case interval == 0:
				// No pass comes (the first one ran before the restart): the fence holds.
				assert.Greater(t, fenced, 0, "the guard fenced after the restart")
			case fenced > 0:
				assert.NotZero(t, lifted, "sales resume after the next pass (Interval %v)", interval)
			default:
				// A pass that began after the restart recorded the new primaries before the
				// guard's check saw them: no deduct was refused, and none needed to be.
				t.Logf("a pass recorded the restarted primary before any deduct met the fence")
			}
			l := testkit.Levels(t, r, "rs")
			assert.GreaterOrEqual(t, remaining(t, st, "rs"), l.Available, "Redis never offers more than the Store has")
		})
	}
}

// Run with Reconcile.DryRun on a live deployment (items, no epoch): a dry run "repairs nothing" and does not record
// the primaries, so the guard's fence stays (a hazard worth knowing: such a Run refuses every sale
// with ErrFailover until another process makes a complete repairing pass).
func TestRunDryRunKeepsFence(t *testing.T) {
	faultRealBackends(t, func(t *testing.T, b redistest.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		r, st := withStore(t, c, 10, []string{"dr"})
		// Live, not new: the epoch the first Load recorded is gone (lost with the data).
		require.NoError(t, c.Do(ctx, c.B().Del().Key("stock:epoch").Build()).Error())
		cancel, done := runAsync(r, stock.RunOptions{Store: st, GuardInterval: 10 * time.Millisecond,
			Reconcile: &stock.ReconcileOptions{DryRun: true, Interval: 50 * time.Millisecond}})
		time.Sleep(time.Second)
		_, err := r.Deduct(ctx, stock.Request{SKU: "dr", ID: "x", Qty: 1})
		assert.ErrorIs(t, err, stock.ErrFailover, "no complete repairing pass: still fenced")
		// Another process's complete repairing pass lifts the fence at the guard's next check.
		r2 := testkit.NewReserver(t, c)
		rec := newReconciler(t, r2, st, nil)
		pr, err := rec.Pass(ctx)
		require.NoError(t, err)
		require.True(t, pr.EpochRecorded, "%+v", pr)
		ok := eventually(2*time.Second, func() bool {
			_, err := r.Deduct(ctx, stock.Request{SKU: "dr", ID: "y", Qty: 1})
			return err == nil
		})
		assert.True(t, ok, "the fence lifted at the guard's next check")
		cancel()
		<-done
	})
}

// A Store that panics under Run. Nothing is promised about a panicking Store; this records what
// happens (a crash of the process, or Run returning) and asserts only that the process does not
// hang.
func TestRunPanickingStore(t *testing.T) {
	out, err := child(t, "panic-store", time.Minute)
	assert.NotContains(t, fmt.Sprint(err), "did not end", "the process ended")
	if i := strings.Index(out, "panic:"); i >= 0 {
		t.Logf("a panicking Store crashes the process running Run: %s", out[i:min(len(out), i+400)])
	} else if i := strings.Index(out, "CHILD-RESULT"); i >= 0 {
		t.Logf("%s", out[i:min(len(out), i+300)])
	}
}

// logBuffer collects log records.
type logBuffer struct {
	mu   sync.Mutex
	msgs []string
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.msgs = append(b.msgs, string(p))
	return len(p), nil
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.msgs, "")
}

// RunOptions.GuardInterval: the guard runs "only on a Redis that answers INFO (not miniredis ...:
// Run then logs that the guard is off)". With a Store on miniredis, the log says so, and sales go
// on (no fence).
func TestRunLogsGuardOffOnMiniredis(t *testing.T) {
	var buf logBuffer
	e := stocktest.New(t, stock.WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
	ctx := context.Background()
	r := e.Reserver
	st := memstore.New()
	require.NoError(t, r.Load(ctx, "lg", 10))
	require.NoError(t, st.Load(ctx, "lg", 10))
	cancel, done := runAsync(r, stock.RunOptions{Store: st})
	time.Sleep(300 * time.Millisecond)
	assert.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: "lg", ID: "d", Qty: 1})), "no fence on miniredis")
	cancel()
	<-done
	out := buf.String()
	assert.Contains(t, strings.ToLower(out), "guard", "Run logged that the guard is off:\n%s", out)
}

// deploy starts a private Sentinel deployment, or skips the test with the reason.
func deploy(t *testing.T, cfg redistest.SentinelConfig) *redistest.Sentinel {
	t.Helper()
	if redistest.ServerBinary(t) == "" {
		t.Skip("Sentinel: needs STOCK_REDIS_SERVER (a redis-server binary) for a Sentinel deployment")
	}
	if !redistest.SentinelEnabled(t) {
		t.Skip("Sentinel: needs STOCK_TEST_SENTINEL=1")
	}
	return redistest.StartSentinel(t, cfg)
}

// reserver is testkit.NewReserver with its own failure message; carts_test.go and holds_test.go
// call it.
func reserver(t *testing.T, c rueidis.Client, opts ...stock.Option) *stock.Reserver {
	t.Helper()
	r, err := stock.New(c, opts...)
	require.NoError(t, err, "stock.New")
	return r
}

// loadRedisAndStore loads each of skus with qty units into Redis and the store, failing the test on
// any error.
func loadRedisAndStore(t *testing.T, r *stock.Reserver, st *memstore.Store, qty int64, skus ...string) {
	t.Helper()
	for _, sku := range skus {
		require.NoError(t, r.Load(context.Background(), sku, qty), sku)
		require.NoError(t, st.Load(context.Background(), sku, qty), sku)
	}
}

// faultRealBackends runs f, in parallel, on each real backend (standalone, cluster, and Sentinel
// when enabled); the failover guard is off on miniredis.
func faultRealBackends(t *testing.T, f func(t *testing.T, b redistest.Backend)) {
	t.Helper()
	for _, b := range redistest.Backends(t) {
		if !b.Real() {
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			f(t, b)
		})
	}
}

// faultGroup puts items ga and gb in one group ("grp"), every other item in none.
func faultGroup(sku string) string {
	if sku == "ga" || sku == "gb" {
		return "grp"
	}
	return ""
}

// failOver has the sentinels fail d's primary over and waits until they announce another one.
func failOver(t *testing.T, d *redistest.Sentinel, what string) {
	t.Helper()
	old, err := d.Primary()
	require.NoError(t, err, what)
	require.NoError(t, d.Failover(), "%s: failover", what)
	require.NoError(t, testkit.Err(d.WaitPrimary(old, 20*time.Second)), what)
}

// faultLoad loads sku with qty units into Redis and the store. A Load answered ErrNotReplicated
// (or an unknown outcome) is retried until the item is there.
func faultLoad(t *testing.T, ctx context.Context, r *stock.Reserver, st *memstore.Store, sku string, qty int64) {
	t.Helper()
	require.NoError(t, st.Load(ctx, sku, qty), "store load %s", sku)
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := r.Load(ctx, sku, qty)
		if err == nil || errors.Is(err, stock.ErrLoaded) || errors.Is(err, stock.ErrNotReplicated) {
			if _, lerr := r.Levels(ctx, sku); lerr == nil {
				return
			}
		}
		require.False(t, time.Now().After(deadline), "load %s: %v", sku, err)
		time.Sleep(50 * time.Millisecond)
	}
}

// acked records the request ids whose deduct got a definite yes.
type acked struct {
	mu  sync.Mutex
	ids map[string]map[string]int64 // sku -> id -> qty
}

func (a *acked) add(sku, id string, qty int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ids == nil {
		a.ids = map[string]map[string]int64{}
	}
	if a.ids[sku] == nil {
		a.ids[sku] = map[string]int64{}
	}
	a.ids[sku][id] = qty
}

func (a *acked) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, m := range a.ids {
		n += len(m)
	}
	return n
}

// faultPass runs complete repairing passes until one records the epoch (or the time is up).
func faultPass(t *testing.T, ctx context.Context, rec *stockops.Reconciler, within time.Duration) stockops.PassResult {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		res, err := rec.Pass(ctx)
		if err == nil && res.Complete && res.EpochRecorded {
			return res
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reconcile pass recorded the epoch within %v: complete=%v recorded=%v epochErr=%v err=%v",
				within, res.Complete, res.EpochRecorded, res.EpochErr, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// audit checks, after the relay drained and a pass reconciled: every acknowledged deduct is in
// the Redis ledger (taken) or applied in the store; nothing was applied twice; the store's
// remaining stock equals Redis's available + held for every item.
func audit(t *testing.T, ctx context.Context, r *stock.Reserver, st *memstore.Store, acked *acked) {
	t.Helper()
	acked.mu.Lock()
	defer acked.mu.Unlock()
	lost := 0
	for sku, ids := range acked.ids {
		recs, err := st.Records(ctx, sku, slices.Collect(maps.Keys(ids)))
		require.NoError(t, err, "store records %s", sku)
		for id := range ids {
			e, lerr := r.Ledger(ctx, sku, id)
			inRedis := lerr == nil && e.Taken()
			rec, ok := recs[id]
			inStore := ok && rec.Status == stock.StateApplied
			if !inRedis && !inStore {
				lost++
				if lost <= 10 { // the first ten
					t.Errorf("acknowledged deduct %s/%s lost: ledger %+v (%v), store %+v (%v)", sku, id, e, lerr, rec, ok)
				}
			}
		}
	}
	assert.Zero(t, lost, "%d acknowledged deducts are in neither the Redis ledger nor the store", lost)
	assert.LessOrEqual(t, st.MaxApplications(), 1, "an event was applied more than once to the store")
	for sku := range acked.ids {
		lv, err := r.Levels(ctx, sku)
		require.NoError(t, err, "levels %s", sku)
		rem, err := st.Remaining(ctx, sku)
		require.NoError(t, err, "store remaining %s", sku)
		assert.EqualValues(t, lv.Available+lv.Held, rem, "%s: store remaining %d, Redis available %d + held %d (levels %+v)", sku, rem, lv.Available, lv.Held, lv)
		assert.EqualValues(t, lv.Available+lv.Held+lv.Sold, lv.Loaded, "%s: loaded %d != available+held+sold (%+v)", sku, lv.Loaded, lv)
	}
}

// faultDrain delivers the outbox of every item to the store until it is empty.
func faultDrain(t *testing.T, ctx context.Context, r *stock.Reserver, st stock.Store, skus ...string) {
	t.Helper()
	rl, err := stockops.NewRelay(r, st, nil, &stock.RelayOptions{MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, Lease: 2 * time.Second})
	require.NoError(t, err, "relay")
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, rerr := rl.Once(ctx)
		left := int64(0)
		for _, sku := range skus {
			p, d, err := stockops.Pending(ctx, r, sku)
			if err != nil {
				left++
				continue
			}
			left += p + d
		}
		if left == 0 && rerr == nil {
			return
		}
		require.False(t, time.Now().After(deadline), "outbox not drained: %d events left, last relay error %v", left, rerr)
		time.Sleep(100 * time.Millisecond)
	}
}

// TestNotReplicatedRetryAckedBeforeReplication: a deduct answered ErrNotReplicated is retried
// with the same id, as the README says. The retry is a replay; if it answers without
// ErrNotReplicated, the write must really be on the replica by then (the caller now takes the
// sale as safe against a failover).
func TestNotReplicatedRetryAckedBeforeReplication(t *testing.T) {
	d := deploy(t, redistest.SentinelConfig{
		Replicas:        1,
		ReplicaLatency:  1500 * time.Millisecond,
		FailoverTimeout: 120 * time.Second,
		DownAfter:       2 * time.Second,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	c := d.Client(t)
	r := testkit.NewReserver(t, c, stock.WithReplicaAck(1, 200*time.Millisecond))
	st := memstore.New()
	faultLoad(t, ctx, r, st, "fo-nr", 100)
	replica := d.Servers()[1]
	rr := testkit.NewReserver(t, replica.Client(t))
	// Wait until the replica has the item, so that only the deducts lag.
	for {
		if _, err := rr.Levels(ctx, "fo-nr"); err == nil {
			break
		}
		require.NoError(t, ctx.Err(), "replica never got the item")
		time.Sleep(100 * time.Millisecond)
	}
	bad := 0
	for i := 0; i < 5; i++ {
		id := fmt.Sprintf("nr-%d", i)
		req := stock.Request{SKU: "fo-nr", ID: id, Qty: 1}
		_, err := r.Deduct(ctx, req)
		require.ErrorIs(t, err, stock.ErrNotReplicated, "deduct %s through a replica 1.5 s behind with WithReplicaAck(1, 200ms): %v, want ErrNotReplicated", id, err)
		req.Retry = true
		rc, err := r.Deduct(ctx, req)
		assert.True(t, rc.Replayed, "retry of %s: not a replay (%+v, %v)", id, rc, err)
		if err == nil {
			_, lerr := rr.Ledger(ctx, "fo-nr", id)
			if lerr != nil {
				bad++
				t.Errorf("retry of %s answered nil (acknowledged by a replica) but the replica has no entry for it: %v", id, lerr)
			}
		} else if !errors.Is(err, stock.ErrNotReplicated) {
			t.Errorf("retry of %s: %v", id, err)
		}
	}
	assert.Zero(t, bad, "%d of 5 replays of a not-replicated deduct were acknowledged as replicated while the replica lacked them", bad)

	// The consequence: the buyer retried until a definite answer (nil), then the primary dies.
	req := stock.Request{SKU: "fo-nr", ID: "nr-kill", Qty: 1}
	if _, err := r.Deduct(ctx, req); !errors.Is(err, stock.ErrNotReplicated) {
		t.Fatalf("deduct nr-kill: %v, want ErrNotReplicated", err)
	}
	req.Retry = true
	if _, err := r.Deduct(ctx, req); err != nil {
		t.Logf("retry of nr-kill answered %v: not acknowledged, nothing to check after the kill", err)
		return
	}
	old := d.Servers()[0]
	old.Kill()
	d.ReplicaProxy().ResetAll()
	require.NoError(t, testkit.Err(d.WaitPrimary(old, 20*time.Second)), "no failover after kill -9")
	var lerr error
	for i := 0; i < 50; i++ {
		_, lerr = r.Ledger(ctx, "fo-nr", "nr-kill")
		if lerr == nil || errors.Is(lerr, stock.ErrUnknownID) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	assert.NoError(t, lerr, "deduct nr-kill was acknowledged (its same-id retry answered nil) and is gone after kill -9 of the primary: %v", lerr)
}

// buyer deducts one unit under id until it gets a definite answer: a sale (recorded in acked
// when the answer is trustworthy, see below) or a refusal. ErrFailover, ErrNotReplicated and
// unknown outcomes are retried with the same id. A nil answer that is a replay after an
// ErrNotReplicated is not recorded as acknowledged (TestNotReplicatedRetryAckedBeforeReplication
// shows it is not a replica's acknowledgement); it goes to replayAcks.
func buyer(ctx context.Context, r *stock.Reserver, sku, id string, acked *acked, replayAcks, fenced *atomic.Int64) {
	req := stock.Request{SKU: sku, ID: id, Qty: 1}
	notRepl := false
	for ctx.Err() == nil {
		rc, err := r.Deduct(ctx, req)
		switch {
		case err == nil:
			if rc.Replayed && notRepl {
				replayAcks.Add(1)
			} else {
				acked.add(sku, id, 1)
			}
			return
		case errors.Is(err, stock.ErrFailover):
			fenced.Add(1)
			time.Sleep(20 * time.Millisecond)
		case errors.Is(err, stock.ErrNotReplicated):
			notRepl = true
			req.Retry = true
		case errors.Is(err, stock.ErrSoldOut), errors.Is(err, stock.ErrInsufficient), errors.Is(err, stock.ErrRestored), errors.Is(err, stock.ErrConflict):
			return
		default:
			req.Retry = true
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// trafficOfFaults runs n buyers until stop is closed.
func trafficOfFaults(ctx context.Context, r *stock.Reserver, sku, tag string, n int, acked *acked, replayAcks, fenced *atomic.Int64) (stop func()) {
	tctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := 0; w < n; w++ {
		wg.Go(func() {
			for i := 0; tctx.Err() == nil; i++ {
				buyer(tctx, r, sku, fmt.Sprintf("%s-%d-%d", tag, w, i), acked, replayAcks, fenced)
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	return func() { cancel(); wg.Wait() }
}

// recon records when reconcile observations (one item of a pass) end.
type recon struct {
	mu    sync.Mutex
	times []time.Time
}

func (o *recon) Observe(_ context.Context, ob stock.Observation) {
	if ob.Op == "reconcile" && ob.Outcome == "ok" {
		o.mu.Lock()
		o.times = append(o.times, time.Now())
		o.mu.Unlock()
	}
}

func (o *recon) between(a, b time.Time) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, x := range o.times {
		if x.After(a) && x.Before(b) {
			n++
		}
	}
	return n
}

// probe deducts one unit under a fresh id and returns its answer (a sale is recorded).
func probe(ctx context.Context, r *stock.Reserver, sku string, k *int, acked *acked) error {
	*k++
	id := fmt.Sprintf("probe-%d", *k)
	_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: 1})
	if err == nil {
		acked.add(sku, id, 1)
	}
	return err
}

// sold reports whether a probe's answer says it sold (so no fence is up).
func sold(err error) bool { return err == nil || errors.Is(err, stock.ErrNotReplicated) }

// TestGuardFencesEveryFailoverABA: planned failovers back and forth (A→B→A) under
// traffic, with Reserver.Run (relay, reconciler every hour after its first pass, guard every
// 100 ms). Each failover must fence deducts and holds with ErrFailover; the fence must lift only
// after a reconcile item pass that ran after the new primary took over; afterwards every deduct
// acknowledged by the replica (WithReplicaAck(1), the only replica) is in the ledger or the
// store, nothing is applied twice, and the store agrees with Redis.
func TestGuardFencesEveryFailoverABA(t *testing.T) {
	d := deploy(t, redistest.SentinelConfig{Replicas: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	obs := &recon{}
	r := testkit.NewReserver(t, d.Client(t), stock.WithReplicaAck(1, 500*time.Millisecond), stock.WithTimeout(3*time.Second), stock.WithObserver(obs))
	st := memstore.New()
	const sku = "fo-aba"
	faultLoad(t, ctx, r, st, sku, 1_000_000)
	runCtx, stopRun := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() {
		runDone <- r.Run(runCtx, stock.RunOptions{Store: st, GuardInterval: 100 * time.Millisecond,
			Reconcile: &stock.ReconcileOptions{Interval: time.Hour}, Drain: 5 * time.Second,
			Relay: &stock.RelayOptions{MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Lease: 3 * time.Second}})
	}()
	rec := newReconciler(t, r, st, nil)
	acked := &acked{}
	var replayAcks, fencedAnswers atomic.Int64
	k := 0
	// Wait for the first pass of Run to lift the initial fence.
	for start := time.Now(); ; {
		if err := probe(ctx, r, sku, &k, acked); sold(err) {
			break
		} else if time.Since(start) > 10*time.Second {
			t.Fatalf("Run never started selling: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop := trafficOfFaults(ctx, r, sku, "aba", 2, acked, &replayAcks, &fencedAnswers)
	for round := 1; round <= 2; round++ {
		failOver(t, d, fmt.Sprintf("round %d", round))
		switched := time.Now()
		// The guard must fence.
		var fencedAt time.Time
		for time.Since(switched) < 8*time.Second {
			if err := probe(ctx, r, sku, &k, acked); errors.Is(err, stock.ErrFailover) {
				fencedAt = time.Now()
				break
			}
			time.Sleep(30 * time.Millisecond)
		}
		if fencedAt.IsZero() {
			t.Errorf("round %d: no ErrFailover within 8 s after the sentinels announced the new primary", round)
			continue
		}
		if _, err := r.Hold(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("hold-%d", round), Qty: 1}, time.Hour); !errors.Is(err, stock.ErrFailover) && err != nil {
			t.Errorf("round %d: hold while fenced: %v, want ErrFailover", round, err)
		}
		// No pass is due (Interval 1h): the fence must hold until we run one.
		var liftedAt time.Time
		for time.Since(fencedAt) < 2*time.Second {
			if err := probe(ctx, r, sku, &k, acked); sold(err) {
				liftedAt = time.Now()
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if liftedAt.IsZero() {
			faultPass(t, ctx, rec, 15*time.Second)
			var last error
			for start := time.Now(); time.Since(start) < 5*time.Second; {
				if last = probe(ctx, r, sku, &k, acked); sold(last) {
					liftedAt = time.Now()
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			require.False(t, liftedAt.IsZero(), "round %d: the fence did not lift within 5 s of a pass that recorded the epoch: %v", round, last)
		}
		if n := obs.between(switched, liftedAt); n == 0 {
			t.Errorf("round %d: the fence lifted at +%v with no reconcile pass since the new primary took over",
				round, liftedAt.Sub(switched))
		}
		t.Logf("round %d: fenced at +%v, lifted at +%v", round, fencedAt.Sub(switched), liftedAt.Sub(switched))
		// Let the former primary rejoin as a replica before the next failover.
		if round == 2 {
			break
		}
		require.NoError(t, d.WaitReady(20*time.Second), "round %d", round)
	}
	stop()
	stopRun()
	<-runDone
	faultDrain(t, ctx, r, st, sku)
	faultPass(t, ctx, rec, 15*time.Second)
	t.Logf("acknowledged %d, acknowledged only by a replay after ErrNotReplicated %d, ErrFailover answers %d",
		acked.count(), replayAcks.Load(), fencedAnswers.Load())
	audit(t, ctx, r, st, acked)
}

// gateStore is a memstore whose first Remaining call waits for the gate: a reconcile pass
// stopped in the middle.
type gateStore struct {
	*memstore.Store
	once    sync.Once
	entered chan struct{}
	gate    chan struct{}
}

func (g *gateStore) Remaining(ctx context.Context, sku string) (int64, error) {
	first := false
	g.once.Do(func() { first = true })
	if first {
		close(g.entered)
		select {
		case <-g.gate:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return g.Store.Remaining(ctx, sku)
}

// TestFailoverDuringPassDoesNotLiftFence: a repairing pass over every item is stopped
// in the middle (its store read waits) while the sentinels fail the primary over; the pass then
// finishes on the new primary. It compared part of the items with the old primary, so it must
// not record the new primary as reconciled: the guard stays fenced until a pass that ran
// wholly on the new primary.
func TestFailoverDuringPassDoesNotLiftFence(t *testing.T) {
	d := deploy(t, redistest.SentinelConfig{Replicas: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	r := testkit.NewReserver(t, d.Client(t), stock.WithTimeout(3*time.Second))
	st := memstore.New()
	skus := []string{"fo-p1", "fo-p2", "fo-p3", "fo-p4"}
	for _, sku := range skus {
		faultLoad(t, ctx, r, st, sku, 50)
	}
	g := stockops.NewFailoverGuard(r)
	rec0 := newReconciler(t, r, st, nil)
	faultPass(t, ctx, rec0, 10*time.Second)
	wantFenced(t, g, false, "after a complete pass")
	gs := &gateStore{Store: st, entered: make(chan struct{}), gate: make(chan struct{})}
	rec := newReconciler(t, r, gs, nil)
	type out struct {
		res stockops.PassResult
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := rec.Pass(ctx)
		done <- out{res, err}
	}()
	select {
	case <-gs.entered:
	case <-ctx.Done():
		t.Fatal("the pass never read the store")
	}
	failOver(t, d, "a failover during the pass")
	fenced := false
	for start := time.Now(); time.Since(start) < 10*time.Second; {
		if f, err := g.Check(ctx); err == nil && f {
			fenced = true
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.True(t, fenced, "the guard did not fence within 10 s of the failover")
	close(gs.gate)
	o := <-done
	t.Logf("pass across the failover: complete=%v recorded=%v epochErr=%v err=%v", o.res.Complete, o.res.EpochRecorded, o.res.EpochErr, o.err)
	assert.False(t, o.res.EpochRecorded, "a pass that began on the old primary and ended on the new one recorded the epoch")
	wantFenced(t, g, true, "after that pass the guard is not fenced: deducts resume on a primary no pass compared whole")
	if _, err := r.Deduct(ctx, stock.Request{SKU: "fo-p1", ID: "after-pass", Qty: 1}); !errors.Is(err, stock.ErrFailover) {
		t.Errorf("deduct after the straddling pass: %v, want ErrFailover", err)
	}
	// A pass wholly on the new primary lifts it.
	faultPass(t, ctx, rec0, 10*time.Second)
	wantFenced(t, g, false, "after a pass on the new primary")
	assert.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: "fo-p1", ID: "after-pass2", Qty: 1})), "deduct after the lifting pass")
}

// flakyStore applies and then, now and then, answers an error anyway (the commit went through,
// its answer was lost), or fails before applying.
type flakyStore struct {
	*orderStore
	mu  sync.Mutex
	rng *rand.Rand
}

func (s *flakyStore) Apply(ctx context.Context, ev stock.Event) error {
	s.mu.Lock()
	p := s.rng.IntN(10)
	s.mu.Unlock()
	if p == 0 {
		return errors.New("store: connection reset before the commit")
	}
	err := s.orderStore.Apply(ctx, ev)
	if p <= 2 && err == nil {
		return errors.New("store: connection reset after the commit")
	}
	return err
}

// Consumers whose store loses one answer in three (before or after the commit) and whose contexts
// are sometimes cut short, with duplicated deliveries handed to six consumers at once: every
// failed delivery is redelivered until Consume answers nil. The store must end exactly where the
// acknowledged answers put it, each event applied once.
func TestFlakyStoreAndContexts(t *testing.T) {
	c := newQueueCase(t, 15, 300, "f:1", "f:2", "f:3")
	drain(t, c.ctx, c.e, queueRelay(t, c.e, c.q, nil), c.skus)
	flaky := &flakyStore{orderStore: c.st, rng: rand.New(rand.NewPCG(15, 15))}
	consumeCut(t, c.ctx, c.e.Reserver, flaky, c.q.take(), 2, 6, c.rng, func(i, n int) bool { return n%7 == i })
	verify(t, c.ctx, c.e.Reserver, c.st, c.acks)
}

// Two Runs on one Redis, one of them restarted mid-work several times, while two processes
// sell: the store ends equal to Redis, every id applied once.
func TestTwoRunsRestarted(t *testing.T) {
	soldOutBackends(t, func(t *testing.T, real bool, c1, c2 rueidis.Client) {
		ctx := context.Background()
		skus := []string{"two:a", "two:b~", "two:ç"}
		r1, store := withStore(t, c1, 500, skus)
		r2 := testkit.NewReserver(t, c2)
		opts := stock.RunOptions{Store: store, SweepInterval: 30 * time.Millisecond,
			Relay: &stock.RelayOptions{Poll: 10 * time.Millisecond, Batch: 7}, Reconcile: &stock.ReconcileOptions{Interval: 200 * time.Millisecond}}
		stop1 := requestRun(t, r1, opts, 30*time.Second)
		var sells sync.WaitGroup
		var fail atomic.Value
		var fenced atomic.Int64
		start := time.Now()
		sell := func(r *stock.Reserver, tag string) {
			for i := range 120 {
				sku := skus[i%len(skus)]
				id := fmt.Sprintf("%s-%d", tag, i)
				var err error
				switch i % 4 {
				case 0, 1:
					_, err = r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: 1})
				case 2:
					_, err = r.Hold(ctx, stock.Request{SKU: sku, ID: id, Qty: 1}, 200*time.Millisecond)
					if err == nil && i%8 == 2 {
						_, err = r.Confirm(ctx, sku, id)
						if errors.Is(err, stock.ErrExpired) {
							err = nil
						}
					}
				case 3:
					_, err = r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: 2})
					if err == nil {
						_, err = r.Restore(ctx, sku, id)
					}
				}
				if errors.Is(err, stock.ErrFailover) {
					// Run's guard fences a Reserver started on a live deployment until a complete
					// pass: wait for it (bounded) and go on with the next id.
					fenced.Add(1)
					if time.Since(start) > 20*time.Second {
						fail.Store(fmt.Errorf("%s: still fenced after 20s: %w", id, err))
						return
					}
					time.Sleep(20 * time.Millisecond)
					continue
				}
				if err != nil {
					fail.Store(fmt.Errorf("%s: %w", id, err))
					return
				}
			}
		}
		sells.Go(func() { sell(r1, "p1") })
		sells.Go(func() { sell(r2, "p2") })
		for range 4 { // r2's Run, restarted mid-work
			stop2 := requestRun(t, r2, opts, 30*time.Second)
			time.Sleep(150 * time.Millisecond)
			require.NoError(t, ignoreCanceled(stop2()))
		}
		sells.Wait()
		t.Logf("calls refused with ErrFailover: %d", fenced.Load())
		if v := fail.Load(); v != nil {
			t.Fatal(v)
		}
		if !real {
			redistest.Sleep(c1, time.Second) // let the short holds pass their deadline
		} else {
			time.Sleep(300 * time.Millisecond)
		}
		require.Eventually(t, func() bool {
			for _, s := range skus {
				l, err := r1.Levels(ctx, s)
				if err != nil || l.Held != 0 {
					return false
				}
				n, err := store.Remaining(ctx, s)
				if err != nil || n != l.Available {
					return false
				}
			}
			return true
		}, 20*time.Second, 50*time.Millisecond, "the store ends equal to Redis")
		require.NoError(t, ignoreCanceled(stop1()))
		assert.LessOrEqual(t, store.MaxApplications(), 1)
		for _, s := range skus {
			l, _ := testkit.CheckLedger(t, r1, s, 500)
			assert.Equal(t, l.Available, remaining(t, store, s), s)
		}
	})
}

func faultReal(t *testing.T) {
	t.Helper()
	if redistest.ServerBinary(t) == "" {
		t.Skip("needs STOCK_REDIS_SERVER")
	}
}

// stats collects what a traffic run saw.
type stats struct {
	mu       sync.Mutex
	acked    map[string]string // id -> sku, a deduct answered success (first or replay)
	unknown  map[string]string // id -> sku, still unknown after the retries
	raw      map[string]int    // errors other than the sentinels, by text
	maxDur   time.Duration
	calls    atomic.Int64
	replays  atomic.Int64
	soldOuts atomic.Int64
	fenced   atomic.Int64
}

func newStats() *stats {
	return &stats{acked: map[string]string{}, unknown: map[string]string{}, raw: map[string]int{}}
}

func (s *stats) dur(d time.Duration) {
	s.mu.Lock()
	if d > s.maxDur {
		s.maxDur = d
	}
	s.mu.Unlock()
}

// deduct deducts one unit for id, retrying with Retry set after an unclassified error, up to
// tries times, with a short pause.
func deduct(r *stock.Reserver, st *stats, sku, id string, tries int) {
	retry := false
	for i := 0; i < tries; i++ {
		start := time.Now()
		rc, err := r.Deduct(context.Background(), stock.Request{SKU: sku, ID: id, Qty: 1, Retry: retry})
		st.dur(time.Since(start))
		st.calls.Add(1)
		switch {
		case err == nil:
			if rc.Replayed {
				st.replays.Add(1)
			}
			st.mu.Lock()
			st.acked[id] = sku
			delete(st.unknown, id)
			st.mu.Unlock()
			return
		case errors.Is(err, stock.ErrSoldOut), errors.Is(err, stock.ErrInsufficient):
			st.soldOuts.Add(1)
			st.mu.Lock()
			delete(st.unknown, id)
			st.mu.Unlock()
			return
		case errors.Is(err, stock.ErrFailover): // nothing sent: the guard waits for a reconcile pass
			st.fenced.Add(1)
			i--
			if st.fenced.Load() > 2000 {
				return
			}
			time.Sleep(20 * time.Millisecond)
		case errors.Is(err, stock.ErrNotLoaded):
			st.mu.Lock()
			st.raw["not loaded"]++
			st.mu.Unlock()
			return
		default:
			st.mu.Lock()
			k := err.Error()
			if errors.Is(err, stock.ErrUnknownOutcome) {
				k = "unknown outcome"
			}
			if len(k) > 120 {
				k = k[:120]
			}
			st.raw[k]++
			st.unknown[id] = sku
			st.mu.Unlock()
			retry = true
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// faultCheck checks the contract on the items: invariant, ledger = levels, every acked id taken
// in the ledger, sold between acked and acked+unknown.
func faultCheck(t *testing.T, r *stock.Reserver, st *stats, loaded map[string]int64) {
	t.Helper()
	ctx := context.Background()
	st.mu.Lock()
	defer st.mu.Unlock()
	for sku, initial := range loaded {
		l, entries := testkit.CheckLedger(t, r, sku, initial)
		var acked, unknown int64
		for id, s := range st.acked {
			if s != sku {
				continue
			}
			acked++
			e, ok := entries[id]
			if assert.True(t, ok, "acked id %s of %s missing from the ledger", id, sku) {
				assert.True(t, e.Taken(), "acked id %s: entry %+v not taken", id, e)
			}
			e2, err := r.Ledger(ctx, sku, id)
			if assert.NoError(t, err, "Ledger %s", id) {
				assert.Equal(t, int64(1), e2.Qty)
			}
		}
		for _, s := range st.unknown {
			if s == sku {
				unknown++
			}
		}
		assert.GreaterOrEqual(t, l.Sold, acked, "%s: sold %d < acked %d", sku, l.Sold, acked)
		assert.LessOrEqual(t, l.Sold, acked+unknown, "%s: sold %d > acked %d + unknown %d", sku, l.Sold, acked, unknown)
		for id, e := range entries {
			if e.Taken() && e.Kind == stock.KindDeduct {
				_, a := st.acked[id]
				_, u := st.unknown[id]
				assert.True(t, a || u, "ledger has taken id %s nobody was told about", id)
			}
		}
	}
}

func faultDo(t *testing.T, c rueidis.Client, args ...string) rueidis.RedisResult {
	t.Helper()
	return c.Do(context.Background(), c.B().Arbitrary(args...).Build())
}

// faultLibs returns the names of the function libraries on c's node.
func faultLibs(t *testing.T, c rueidis.Client) []string {
	t.Helper()
	v, err := faultDo(t, c, "FUNCTION", "LIST").ToArray()
	require.NoError(t, err)
	var names []string
	for _, lib := range v {
		m, err := lib.AsMap()
		require.NoError(t, err)
		v := m["library_name"]
		n, _ := v.ToString()
		names = append(names, n)
	}
	return names
}

func commandCalls(t *testing.T, c rueidis.Client, cmd string) int64 {
	t.Helper()
	info, err := faultDo(t, c, "INFO", "commandstats").ToString()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "cmdstat_"+cmd+":calls=") {
			var n int64
			fmt.Sscanf(strings.TrimPrefix(line, "cmdstat_"+cmd+":"), "calls=%d", &n)
			return n
		}
	}
	return 0
}

// TestLibraryActuallyLoaded: on Redis 7 the scripts run as functions (README How it
// works): after a deduct the library stock_<digest> is on the server and FCALL was used.
func TestLibraryActuallyLoaded(t *testing.T) {
	admin, r := serverReserver(t, nil)
	ctx := context.Background()
	require.NoError(t, r.Load(ctx, "a", 5))
	require.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: "a", ID: "o1", Qty: 1})))
	libs := faultLibs(t, admin)
	require.Len(t, libs, 1, "libraries: %v", libs)
	assert.True(t, strings.HasPrefix(libs[0], "stock_"), libs[0])
	assert.Greater(t, commandCalls(t, admin, "fcall"), int64(1), "FCALL used")
	assert.Equal(t, int64(0), commandCalls(t, admin, "evalsha"), "no EVALSHA")
	assert.Equal(t, int64(0), commandCalls(t, admin, "eval"), "no EVAL")
}

// faultTraffic runs g goroutines of n deducts each over skus.
func faultTraffic(rs []*stock.Reserver, st *stats, prefix string, skus []string, g, n, tries int) {
	var wg sync.WaitGroup
	for w := 0; w < g; w++ {
		wg.Go(func() {
			r := rs[w%len(rs)]
			for i := 0; i < n; i++ {
				sku := skus[(w+i)%len(skus)]
				deduct(r, st, sku, fmt.Sprintf("%s-%d-%d", prefix, w, i), tries)
			}
		})
	}
	wg.Wait()
}

// chaos runs f in a loop until stop is closed, returning the number of rounds.
func chaos(stop <-chan struct{}, f func(i int)) <-chan int {
	done := make(chan int, 1)
	go func() {
		i := 0
		for {
			select {
			case <-stop:
				done <- i
				return
			default:
			}
			f(i)
			i++
			time.Sleep(time.Millisecond)
		}
	}()
	return done
}

// flushTargets starts a private "standalone" server or a 3-master "cluster" and returns a maker
// of clients to it and a client to each of its servers, to flush the functions and scripts of.
func flushTargets(t *testing.T, kind string) (client func() rueidis.Client, admins []rueidis.Client) {
	t.Helper()
	if kind == "standalone" {
		s := redistest.StartServer(t)
		return func() rueidis.Client { return s.Client(t) }, []rueidis.Client{s.Client(t)}
	}
	c := redistest.StartCluster(t, 3)
	for _, s := range c.Servers() {
		admins = append(admins, s.Client(t))
	}
	return func() rueidis.Client { return c.Client(t) }, admins
}

// FUNCTION FLUSH (SYNC and ASYNC), FUNCTION DELETE of the library and SCRIPT FLUSH in a loop,
// on a standalone server and a cluster. README: the library is loaded when a call finds it
// missing; the scripts give the answer otherwise. During concurrent deducts no call should fail
// at all (Redis answers every command), no oversell, exactly once. During holds, confirms,
// cancels, restores and carts ("mixed-ops"), every acknowledged operation holds, the invariant
// and the ledger agree, retries are replays.
func TestFlushLoop(t *testing.T) {
	faultReal(t)
	for _, kind := range []string{"standalone", "cluster"} {
		t.Run(kind, func(t *testing.T) {
			client, admins := flushTargets(t, kind)
			t.Run("deducts", func(t *testing.T) {
				rs := []*stock.Reserver{testkit.NewReserver(t, client(), stock.WithTimeout(3*time.Second)), testkit.NewReserver(t, client(), stock.WithTimeout(3*time.Second))}
				ctx := context.Background()
				skus := []string{"f1", "f2", "f3"}
				loaded := map[string]int64{}
				for _, sku := range skus {
					require.NoError(t, rs[0].Load(ctx, sku, 200))
					loaded[sku] = 200
				}
				// Find the library's name.
				require.NoError(t, testkit.Err(rs[0].Deduct(ctx, stock.Request{SKU: "f1", ID: "warm", Qty: 1})))
				st := newStats()
				st.acked["warm"] = "f1"
				lib := faultLibs(t, admins[0])
				stop := make(chan struct{})
				rounds := chaos(stop, func(i int) {
					a := admins[i%len(admins)]
					switch i % 5 {
					case 0:
						faultDo(t, a, "FUNCTION", "FLUSH", "SYNC")
					case 1:
						faultDo(t, a, "FUNCTION", "FLUSH", "ASYNC")
					case 2:
						if len(lib) > 0 {
							faultDo(t, a, "FUNCTION", "DELETE", lib[0])
						}
					case 3:
						faultDo(t, a, "SCRIPT", "FLUSH", "ASYNC")
					case 4:
						faultDo(t, a, "FUNCTION", "FLUSH")
						faultDo(t, a, "SCRIPT", "FLUSH")
					}
				})
				faultTraffic(rs, st, "o", skus, 6, 120, 5)
				close(stop)
				n := <-rounds
				t.Logf("%s: %d chaos rounds, %d calls, %d replays, %d sold out, max %v, raw errors %v", kind, n, st.calls.Load(), st.replays.Load(), st.soldOuts.Load(), st.maxDur, st.raw)
				assert.Empty(t, st.raw, "errors under FUNCTION/SCRIPT FLUSH")
				assert.Empty(t, st.unknown)
				faultCheck(t, rs[0], st, loaded)
				// Retries of every acked id are replays.
				for id, sku := range st.acked {
					rc, err := rs[1].Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: 1, Retry: true})
					if assert.NoError(t, err, id) {
						assert.True(t, rc.Replayed, id)
					}
				}
				faultCheck(t, rs[0], st, loaded)
			})
			t.Run("mixed-ops", func(t *testing.T) {
				r := testkit.NewReserver(t, client(), stock.WithTimeout(3*time.Second))
				ctx := context.Background()
				skus := []string{"m1", "m2", "m3", "m4"}
				for _, sku := range skus {
					require.NoError(t, r.Load(ctx, sku, 150))
				}
				stop := make(chan struct{})
				rounds := chaos(stop, func(i int) {
					a := admins[i%len(admins)]
					if i%3 == 2 {
						faultDo(t, a, "SCRIPT", "FLUSH")
					} else {
						faultDo(t, a, "FUNCTION", "FLUSH", []string{"SYNC", "ASYNC"}[i%2])
					}
				})
				var mu sync.Mutex
				var bad []string
				fail := func(format string, args ...any) {
					mu.Lock()
					bad = append(bad, fmt.Sprintf(format, args...))
					mu.Unlock()
				}
				ok := func(err error) bool {
					return err == nil || errors.Is(err, stock.ErrSoldOut) || errors.Is(err, stock.ErrInsufficient)
				}
				var wg sync.WaitGroup
				for w := 0; w < 6; w++ {
					wg.Go(func() {
						for i := 0; i < 40; i++ {
							sku := skus[(w+i)%len(skus)]
							id := fmt.Sprintf("x-%d-%d", w, i)
							switch i % 4 {
							case 0:
								if _, err := r.Hold(ctx, stock.Request{SKU: sku, ID: id, Qty: 1}, time.Minute); err == nil {
									assert.NoError(t, testkit.Err(r.Confirm(ctx, sku, id)), "confirm %s", id)
									if rc, err := r.Hold(ctx, stock.Request{SKU: sku, ID: id, Qty: 1, Retry: true}, time.Minute); err != nil || !rc.Replayed {
										fail("hold replay %s: %+v %v", id, rc, err)
									}
								} else if !ok(err) {
									fail("hold %s: %v", id, err)
								}
							case 1:
								if _, err := r.Hold(ctx, stock.Request{SKU: sku, ID: id, Qty: 2}, time.Minute); err == nil {
									assert.NoError(t, testkit.Err(r.Cancel(ctx, sku, id)), "cancel %s", id)
								} else if !ok(err) {
									fail("hold %s: %v", id, err)
								}
							case 2:
								if _, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: 1}); err == nil {
									assert.NoError(t, testkit.Err(r.Restore(ctx, sku, id)), "restore %s", id)
									assert.NoError(t, testkit.Err(r.Restore(ctx, sku, id)), "restore replay %s", id)
								} else if !ok(err) {
									fail("deduct %s: %v", id, err)
								}
							case 3:
								other := skus[(w+i+1)%len(skus)]
								cart := stock.Cart{ID: "cart-" + id, Lines: []stock.Line{{SKU: sku, Qty: 1}, {SKU: other, Qty: 1}}}
								if _, err := r.DeductMany(ctx, cart); err == nil {
									if cr, err := r.DeductMany(ctx, cart); err != nil {
										fail("cart replay %s: %+v %v", id, cr, err)
									}
								} else if !ok(err) {
									fail("cart %s: %v", id, err)
								}
							}
						}
					})
				}
				wg.Wait()
				close(stop)
				n := <-rounds
				t.Logf("%d chaos rounds", n)
				assert.Empty(t, bad)
				for _, sku := range skus {
					testkit.CheckLedger(t, r, sku, 150)
				}
			})
		})
	}
}

// TestRestart: a restart of the server without persistence mid-traffic: the library and
// the data are gone. Calls fail (not loaded) or are unknown; once the item is loaded again
// every call works through the function path again.
func TestRestart(t *testing.T) {
	faultReal(t)
	s := redistest.StartServer(t, "--appendonly", "no")
	ctx := context.Background()
	r := testkit.NewReserver(t, s.Client(t), stock.WithTimeout(2*time.Second))
	require.NoError(t, r.Load(ctx, "rs", 400))
	st := newStats()
	var restarted atomic.Bool
	var reloaded sync.WaitGroup
	reloaded.Go(func() {
		time.Sleep(100 * time.Millisecond)
		s.Restart()
		for i := 0; i < 50; i++ {
			err := r.Load(ctx, "rs", 400)
			if err == nil || errors.Is(err, stock.ErrLoaded) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		restarted.Store(true)
	})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Go(func() {
			for i := 0; i < 400 && !restarted.Load(); i++ {
				deduct(r, st, "rs", fmt.Sprintf("a-%d-%d", w, i), 3)
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	reloaded.Wait()
	require.True(t, restarted.Load())
	// After the restart and the reload: a fresh run, every call must succeed, exactly once.
	st2 := newStats()
	faultTraffic([]*stock.Reserver{r}, st2, "b", []string{"rs"}, 4, 60, 3)
	t.Logf("before: raw %v max %v; after: raw %v max %v", st.raw, st.maxDur, st2.raw, st2.maxDur)
	assert.Empty(t, st2.raw)
	assert.LessOrEqual(t, st.maxDur, 3*time.Second, "bounded by WithTimeout")
	l := testkit.Levels(t, r, "rs")
	var taken int64
	for _, e := range testkit.Ledger(t, r, "rs") {
		if e.Taken() {
			taken += e.Qty
		}
	}
	assert.Equal(t, l.Sold, taken)
	st2.mu.Lock()
	for id := range st2.acked {
		e, err := r.Ledger(ctx, "rs", id)
		if assert.NoError(t, err, id) {
			assert.True(t, e.Taken())
		}
	}
	st2.mu.Unlock()
	admin := s.Client(t)
	assert.NotEmpty(t, faultLibs(t, admin))
}

// ownerSKU returns a SKU whose keys live on server i of the cluster.
func ownerSKU(t *testing.T, c *redistest.Cluster, i int, base string) string {
	t.Helper()
	admin := c.Servers()[i].Client(t)
	for n := 0; n < 10000; n++ {
		sku := fmt.Sprintf("%s%d", base, n)
		err := faultDo(t, admin, "HGET", "stock:{"+sku+"}", "a").Error()
		if err == nil || rueidis.IsRedisNil(err) {
			return sku
		}
	}
	t.Fatal("no sku found")
	return ""
}

// TestClusterNodeLostFunctions: one master of three lost its functions (FUNCTION FLUSH on
// that node only) while the others keep the library; deducts on items of every master work.
func TestClusterNodeLostFunctions(t *testing.T) {
	faultReal(t)
	c := redistest.StartCluster(t, 3)
	ctx := context.Background()
	r := testkit.NewReserver(t, c.Client(t), stock.WithTimeout(3*time.Second))
	var skus []string
	loaded := map[string]int64{}
	for i := range c.Servers() {
		sku := ownerSKU(t, c, i, fmt.Sprintf("n%d-", i))
		skus = append(skus, sku)
		require.NoError(t, r.Load(ctx, sku, 100))
		loaded[sku] = 100
	}
	st := newStats()
	faultTraffic([]*stock.Reserver{r}, st, "w", skus, 3, 10, 1)
	victim := c.Servers()[1].Client(t)
	require.NoError(t, faultDo(t, victim, "FUNCTION", "FLUSH").Error())
	require.Empty(t, faultLibs(t, victim))
	faultTraffic([]*stock.Reserver{r}, st, "x", skus, 6, 30, 3)
	t.Logf("raw %v max %v", st.raw, st.maxDur)
	assert.Empty(t, st.raw)
	faultCheck(t, r, st, loaded)
	assert.NotEmpty(t, faultLibs(t, victim), "library loaded again on the node that lost it")
}

// TestBoundedLoad: WithTimeout bounds the whole call. Master A lost its functions; masters
// B and C hang (DEBUG SLEEP). A deduct of an item on A finds the function missing and loads the
// library "on every node": must it wait for the hung nodes beyond WithTimeout?
func TestBoundedLoad(t *testing.T) {
	faultReal(t)
	c := redistest.StartCluster(t, 3)
	ctx := context.Background()
	const bound = time.Second
	r := testkit.NewReserver(t, c.Client(t), stock.WithTimeout(bound))
	sku := ownerSKU(t, c, 0, "b")
	require.NoError(t, r.Load(ctx, sku, 100))
	require.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: sku, ID: "w", Qty: 1})))
	require.NoError(t, faultDo(t, c.Servers()[0].Client(t), "FUNCTION", "FLUSH").Error())
	var wg sync.WaitGroup
	for _, i := range []int{1, 2} {
		sl := c.Servers()[i].Client(t)
		wg.Go(func() {
			sl.Do(context.Background(), sl.B().Arbitrary("DEBUG", "SLEEP", "4").Build())
		})
	}
	time.Sleep(200 * time.Millisecond) // the sleeps have started
	start := time.Now()
	rc, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: "x", Qty: 1})
	took := time.Since(start)
	t.Logf("deduct on the healthy master took %v: %+v %v", took, rc, err)
	wg.Wait()
	assert.LessOrEqual(t, took, bound+500*time.Millisecond, "call bounded by WithTimeout (%v), took %v", bound, took)
	// The outcome: acknowledged or unknown; a retry settles it once.
	require.NoError(t, testkit.Err(r.Deduct(ctx, stock.Request{SKU: sku, ID: "x", Qty: 1, Retry: true})))
	assert.Equal(t, int64(2), testkit.Levels(t, r, sku).Sold)
}

// TestSquatterLibrary: a library of another name that defines one of the function names
// of this version's library. FUNCTION LOAD of ours is refused ("Function ... already exists");
// the calls must still work with the right semantics (fall back to the scripts) and not run the
// squatter.
func TestSquatterLibrary(t *testing.T) {
	faultReal(t)
	s := redistest.StartServer(t)
	admin := s.Client(t)
	ctx := context.Background()
	r := testkit.NewReserver(t, s.Client(t))
	require.NoError(t, r.Load(ctx, "q", 10))
	libs := faultLibs(t, admin)
	require.Len(t, libs, 1)
	lib := libs[0]
	require.NoError(t, faultDo(t, admin, "FUNCTION", "DELETE", lib).Error())
	// An unrelated library that happens to define lib_load (e.g. an operator's copy).
	code := "#!lua name=squatter\nredis.register_function('" + lib + "_restock', function(KEYS, ARGV) return redis.error_reply('squatter') end)\n"
	require.NoError(t, faultDo(t, admin, "FUNCTION", "LOAD", code).Error())
	r2 := testkit.NewReserver(t, s.Client(t))
	loads0, fcalls0 := commandCalls(t, admin, "function|load"), commandCalls(t, admin, "fcall")
	for i := 0; i < 5; i++ {
		rc, err := r2.Deduct(ctx, stock.Request{SKU: "q", ID: fmt.Sprintf("s%d", i), Qty: 1})
		require.NoError(t, err)
		assert.Equal(t, int64(9-i), rc.Remaining)
	}
	assert.Equal(t, int64(5), testkit.Levels(t, r2, "q").Sold)
	// The refused load ("Function ... already exists") turns functions off for the Reserver:
	// one FCALL and one FUNCTION LOAD in all, not two of each per call.
	assert.Equal(t, int64(1), commandCalls(t, admin, "function|load")-loads0, "FUNCTION LOAD calls")
	assert.Equal(t, int64(1), commandCalls(t, admin, "fcall")-fcalls0, "FCALL calls")
	// The squatter's function of our name is not run: a restock goes to the script.
	rc, err := r2.Restock(ctx, "q", "rs1", 3)
	require.NoError(t, err)
	assert.Equal(t, int64(8), rc.Remaining)
	t.Logf("libs now %v", faultLibs(t, admin))
}

// TestGuardLatchedByCancelledRun: on a Redis that does not answer INFO (miniredis, or a
// user whose ACL denies INFO), Run's failover guard is off, as RunOptions.GuardInterval says.
// But a Run whose ctx has already ended when it starts (a service shutting down as it starts;
// likewise a transport error on Run's first INFO) takes the failed INFO for a transport error and
// creates a guard anyway, and the Reserver stays "guarded" for good: from then on every reconcile
// pass of that Reserver (Run's own, or stockops.NewReconciler's) fails at once on INFO and
// compares and repairs nothing. Steps: Load an item in Redis and the store; Run with a cancelled
// ctx (returns at once); seed a drift in the store; a reconcile pass must find and repair it,
// without an error, as it does on the same Redis for a Reserver that never ran.
func TestGuardLatchedByCancelledRun(t *testing.T) {
	check := func(t *testing.T, c rueidis.Client, opts ...stock.Option) {
		ctx := context.Background()
		r, err := stock.New(c, opts...)
		require.NoError(t, err)
		mem := memstore.New()
		sku := "guard:latch~1"
		require.NoError(t, r.Load(ctx, sku, 10))
		require.NoError(t, mem.Load(ctx, sku, 10))
		rc := newReconciler(t, r, mem, nil)
		require.NoError(t, testkit.Err(rc.Pass(ctx)), "a pass before the cancelled Run")

		runCtx, cancel := context.WithCancel(ctx)
		cancel()
		ended := time.Now()
		res := wait(t, run(runCtx, r, stock.RunOptions{Store: mem, Reconcile: &stock.ReconcileOptions{Interval: -1}}), ended, 5*time.Second+3*time.Second)
		assert.ErrorIs(t, res.err, context.Canceled)

		mem.Set(sku, 7) // the database of record says 7: Redis would sell 3 units too many
		pres, err := rc.Pass(ctx)
		assert.NoError(t, err, "a pass after the cancelled Run")
		if assert.Len(t, pres.Reports, 1, "the pass compared the item") {
			assert.EqualValues(t, 3, pres.Reports[0].Drift)
		}
		lv, err := r.Levels(ctx, sku)
		require.NoError(t, err)
		assert.EqualValues(t, 7, lv.Available, "the drift is repaired")

		// Run's own passes too.
		mem.Set(sku, 5)
		runCtx2, cancel2 := context.WithCancel(ctx)
		ch := run(runCtx2, r, stock.RunOptions{Store: mem, Drain: time.Second})
		eventually(5*time.Second, func() bool {
			lv, _ = r.Levels(ctx, sku)
			return lv.Available == 5
		})
		cancel2()
		res = wait(t, ch, time.Now(), time.Second+3*time.Second)
		assert.EqualValues(t, 5, lv.Available, "Run's first reconcile pass repairs the drift")
		assert.ErrorIs(t, res.err, context.Canceled, "Run's passes met no error")
	}
	t.Run("miniredis", func(t *testing.T) {
		env := stocktest.New(t)
		check(t, env.Client, stock.WithClock(env.Now))
	})
	if redistest.ServerBinary(t) == "" {
		return
	}
	t.Run("redis-acl-without-info", func(t *testing.T) {
		srv := redistest.StartServer(t)
		admin := srv.Client(t)
		ctx := context.Background()
		require.NoError(t, admin.Do(ctx, admin.B().Arbitrary("ACL", "SETUSER", "noinfo", "on", ">noinfopw", "~*", "&*", "+@all", "-info").Build()).Error())
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, Username: "noinfo", Password: "noinfopw", DisableCache: true})
		require.NoError(t, err)
		t.Cleanup(c.Close)
		require.Error(t, c.Do(ctx, c.B().Info().Build()).Error(), "the user may not INFO")
		check(t, c)
	})
}
