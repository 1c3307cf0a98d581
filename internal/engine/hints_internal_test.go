package engine

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock/internal/protocol"
	"github.com/stockres/stock/internal/redistest"
)

// countingClient counts the script calls of claim.lua and sweep.lua, and every command.
type countingClient struct {
	rueidis.Client
	claims, sweeps, all atomic.Int64
}

func (c *countingClient) count(cmd rueidis.Completed) {
	c.all.Add(1)
	cs := cmd.Commands()
	if len(cs) < 2 || (cs[0] != "EVALSHA" && cs[0] != "EVAL" && cs[0] != "FCALL") {
		return
	}
	switch cs[1] {
	case protocol.Claim.SHA1, protocol.Claim.Source, protocol.Claim.Func:
		c.claims.Add(1)
	case protocol.Sweep.SHA1, protocol.Sweep.Source, protocol.Sweep.Func:
		c.sweeps.Add(1)
	}
}

func (c *countingClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	c.count(cmd)
	return c.Client.Do(ctx, cmd)
}

func (c *countingClient) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	for _, cmd := range cmds {
		c.count(cmd)
	}
	return c.Client.DoMulti(ctx, cmds...)
}

// newCounted returns a Reserver on a countingClient around c.
func newCounted(t *testing.T, c rueidis.Client) (*countingClient, *Reserver) {
	t.Helper()
	cc := &countingClient{Client: c}
	r, err := New(cc)
	require.NoError(t, err)
	return cc, r
}

// eachCountedBackend runs f on every backend, the backends in parallel, with a Reserver on a
// countingClient around the backend's client (cc.Client).
func eachCountedBackend(t *testing.T, f func(t *testing.T, b redistest.Backend, cc *countingClient, r *Reserver)) {
	t.Helper()
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		cc, r := newCounted(t, b.Client(t))
		f(t, b, cc, r)
	})
}

// loadMany loads n items named <p>-0 … through a pipeline of Load calls.
func loadMany(t *testing.T, r *Reserver, p string, n int) []string {
	t.Helper()
	skus := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				skus[i] = p + "-" + strconv.Itoa(i)
				if err := r.Load(context.Background(), skus[i], 100); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	require.NoError(t, <-errs)
	return skus
}

// runFor starts r.Run with opts and returns a stop function that waits for it.
func runFor(t *testing.T, r *Reserver, opts RunOptions) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, opts) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Error("Run did not return")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// idleCalls is how many commands, and claim and sweep calls, an idle Run makes in d, with n
// items loaded.
func idleCalls(t *testing.T, b redistest.Backend, n int, d time.Duration) (all, scripts int64) {
	cc, r := newCounted(t, b.Client(t))
	loadMany(t, r, "idle", n)
	pub := PublisherFunc(func(context.Context, Event) error { return nil })
	stop := runFor(t, r, RunOptions{Publisher: pub, SweepInterval: 20 * time.Millisecond,
		Relay: &RelayOptions{Poll: 10 * time.Millisecond}})
	time.Sleep(200 * time.Millisecond) // the first steps of the walks
	a0, s0 := cc.all.Load(), cc.claims.Load()+cc.sweeps.Load()
	time.Sleep(d)
	a1, s1 := cc.all.Load(), cc.claims.Load()+cc.sweeps.Load()
	stop()
	return a1 - a0, s1 - s0
}

// TestRunIdleCostFollowsWork: with nothing to do, Run's relay and sweeper make about as many
// commands with 2,000 items as with 20 (they look at the items with due-work hints and walk the
// registry slowly, reading a few items' sizes at a time), not a call per item per poll, and no
// script call at all.
func TestRunIdleCostFollowsWork(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) { // one at a time: it counts commands in a second of real time
			a20, s20 := idleCalls(t, b, 20, time.Second)
			a2k, s2k := idleCalls(t, b, 2000, time.Second)
			t.Logf("idle 1s: 20 items: %d commands, %d scripts; 2,000 items: %d commands, %d scripts", a20, s20, a2k, s2k)
			require.Positive(t, a20, "the loops ran")
			assert.Less(t, float64(a2k), 2*float64(a20), "the idle loops' commands grow with the catalogue")
			assert.Zero(t, s20+s2k, "idle loops call no script")
		})
	}
}

// TestRunDeliversByHint: among 2,000 idle items, a sale on one is delivered long before the
// slow walk could reach it: in a few passes, with far fewer claims than items.
func TestRunDeliversByHint(t *testing.T) {
	eachCountedBackend(t, func(t *testing.T, _ redistest.Backend, cc *countingClient, r *Reserver) {
		ctx := context.Background()
		skus := loadMany(t, r, "hint", 2000)
		var got atomic.Int64
		pub := PublisherFunc(func(_ context.Context, ev Event) error {
			if ev.Type == EventDeducted {
				got.Add(1)
			}
			return nil
		})
		runFor(t, r, RunOptions{Publisher: pub, SweepInterval: -1, Relay: &RelayOptions{Poll: 10 * time.Millisecond}})
		time.Sleep(200 * time.Millisecond)
		for i := range 5 {
			c0 := cc.claims.Load()
			_, err := r.Deduct(ctx, Request{SKU: skus[(i*397+1500)%len(skus)], ID: fmt.Sprint("o", i), Qty: 1})
			require.NoError(t, err)
			require.Eventually(t, func() bool { return got.Load() == int64(i+1) }, 10*time.Second, time.Millisecond)
			t.Logf("%s delivered after %d claims", skus[(i*397+1500)%len(skus)], cc.claims.Load()-c0)
			assert.Less(t, cc.claims.Load()-c0, int64(len(skus)/20), "delivered by the hint, not by walking the registry")
		}
	})
}

// TestRunFindsLostHints: events whose hints were never written (a process that died right
// after its call) are delivered by the slow walk, and holds due without a hint are released.
func TestRunFindsLostHints(t *testing.T) {
	eachCountedBackend(t, func(t *testing.T, _ redistest.Backend, cc *countingClient, r *Reserver) {
		ctx := context.Background()
		c := cc.Client
		skus := loadMany(t, r, "lost", 100)
		// Takes that write no hint: the scripts alone, as a process that died after them.
		for i, sku := range skus[:10] {
			kind, ttl := protocol.TakeDeduct, "0"
			if i%2 == 1 {
				kind, ttl = protocol.TakeHold, "50"
			}
			args := []string{"0", "1", kind, ttl, "0", "x", "1", "", "0"}
			o, err := decodeOne(protocol.Deduct.Exec(ctx, c, r.item(sku).ForItem(), args))
			require.NoError(t, err)
			require.Equal(t, protocol.OK, o.code)
		}
		redistest.Sleep(c, 100*time.Millisecond) // the holds are due
		var mu sync.Mutex
		seen := map[string]int{}
		pub := PublisherFunc(func(_ context.Context, ev Event) error {
			mu.Lock()
			seen[string(ev.Type)]++
			mu.Unlock()
			return nil
		})
		runFor(t, r, RunOptions{Publisher: pub, SweepInterval: 10 * time.Millisecond, Relay: &RelayOptions{Poll: 10 * time.Millisecond}})
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return seen[string(EventDeducted)] == 5 && seen[string(EventHeld)] == 5 && seen[string(EventExpired)] == 5
		}, 20*time.Second, 10*time.Millisecond, "every event delivered and every due hold released: %v", seen)
	})
}

// TestRunSweepsByHint: among 2,000 items, a hold due on one is released by Run's sweeper long
// before the slow walk could reach it.
func TestRunSweepsByHint(t *testing.T) {
	eachCountedBackend(t, func(t *testing.T, b redistest.Backend, cc *countingClient, r *Reserver) {
		ctx := context.Background()
		skus := loadMany(t, r, "sweep", 2000)
		runFor(t, r, RunOptions{SweepInterval: 10 * time.Millisecond})
		time.Sleep(100 * time.Millisecond)
		sku := skus[1777]
		s0 := cc.sweeps.Load()
		_, err := r.Hold(ctx, Request{SKU: sku, ID: "h", Qty: 3}, 30*time.Millisecond)
		require.NoError(t, err)
		// Past the deadline on the Redis clock (which stands still on miniredis until moved)
		// and on the process clock of the hint.
		redistest.Sleep(cc.Client, 40*time.Millisecond)
		if !b.Real() {
			time.Sleep(40 * time.Millisecond)
		}
		t0 := time.Now()
		defer func() { t.Logf("released %v after the deadline", time.Since(t0)) }()
		require.Eventually(t, func() bool {
			lv, err := r.Levels(ctx, sku)
			return err == nil && lv.Held == 0
		}, 10*time.Second, time.Millisecond)
		t.Logf("released after %d sweep calls", cc.sweeps.Load()-s0)
		assert.Less(t, cc.sweeps.Load()-s0, int64(len(skus)/4), "released by the hint, not by walking the registry")
	})
}

// TestHintsFlushUnderTraffic: flush returns once the hints recorded before it are written, even
// while other calls keep the writer busy (Run calls it before it returns).
func TestHintsFlushUnderTraffic(t *testing.T) {
	_, c := redistest.Miniredis(t)
	r, err := New(c)
	require.NoError(t, err)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
				r.noteEvents(fmt.Sprint("busy-", i%50))
				time.Sleep(50 * time.Microsecond)
			}
		}
	}()
	time.Sleep(20 * time.Millisecond)
	r.noteEvents("mine")
	done := make(chan struct{})
	go func() { r.hints.Flush(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("flush waited for a writer kept busy by other calls")
	}
	assert.True(t, hinted(t, c, protocol.RelayDue, "mine"), "the hint recorded before flush is written when flush returns")
}

// TestRestockUnknownItemLeavesNoHint: a restock refused because the item is not loaded writes
// nothing, not even a relay hint: a stockctl restock of an unknown
// item under load left one key behind (the hint writer flushed before the process ended).
func TestRestockUnknownItemLeavesNoHint(t *testing.T) {
	m, c := redistest.Miniredis(t)
	r, err := New(c)
	require.NoError(t, err)
	_, err = r.Restock(context.Background(), "ghost", "po", 5)
	require.ErrorIs(t, err, ErrNotLoaded)
	r.hints.Flush()
	assert.Empty(t, m.Keys(), "a refused restock wrote keys")
}
