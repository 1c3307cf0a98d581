package kit

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/stockres/stock/stockops"
)

// Fence runs the checks of a harness's FailoverGuard, one at a time, and keeps what they did:
// the number of checks started, whether one is running, and whether the last one left the
// Reserver fenced (State). A call during which State read the same before and after, fenced
// and no check running, was made while the Reserver was fenced from beginning to end
// (FencedThrough): a deduct or hold there must have been refused with ErrFailover. The
// Reserver's own requests may check and lift the fence too, at most once a second: a take
// made while fenced is confirmed by a check after it (StillFenced). A nil Fence (no guard) is
// never fenced.
type Fence struct {
	Guard *stockops.FailoverGuard

	mu    sync.Mutex    // one check at a time
	state atomic.Uint64 // checks started << 2 | a check running << 1 | fenced by the last check
	flips []FenceFlip   // under mu
}

// FenceFlip is a change of the fence a check saw.
type FenceFlip struct {
	At     time.Time
	Fenced bool
}

// Check runs one check of the guard.
func (f *Fence) Check(ctx context.Context) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v := f.state.Load()
	n := (v>>2 + 1) << 2
	f.state.Store(n | 2 | v&1)
	fenced, _ := f.Guard.Check(ctx)
	if fenced != (v&1 == 1) {
		f.flips = append(f.flips, FenceFlip{At: time.Now(), Fenced: fenced})
	}
	if fenced {
		n |= 1
	}
	f.state.Store(n)
}

// Loop checks the guard every interval until ctx ends, as FailoverGuard.Run does.
func (f *Fence) Loop(ctx context.Context, interval time.Duration) {
	for {
		f.Check(ctx)
		if !SleepCtx(ctx, interval) {
			return
		}
	}
}

// State is what the checks did so far (see Fence).
func (f *Fence) State() uint64 {
	if f == nil {
		return 0
	}
	return f.state.Load()
}

// Up reports whether the last check left the Reserver fenced.
func (f *Fence) Up() bool { return f.State()&1 == 1 }

// FencedThrough reports whether a call during which State read before and then after was made
// while the Reserver was fenced from beginning to end.
func FencedThrough(before, after uint64) bool { return before == after && before&3 == 1 }

// StillFenced runs a check and reports whether the Reserver is still fenced.
func (f *Fence) StillFenced(ctx context.Context) bool {
	f.Check(ctx)
	return f.Up()
}

// AwaitFenced waits until a check that began after State read since has ended and left the
// Reserver fenced (a check that failed on a broken connection leaves the fence as it was: the
// next one counts); false after timeout.
func (f *Fence) AwaitFenced(since uint64, timeout time.Duration) bool {
	checks := since >> 2
	for deadline := time.Now().Add(timeout); ; time.Sleep(time.Millisecond) {
		v := f.State()
		if (v>>2 > checks+1 || (v>>2 == checks+1 && v&2 == 0)) && v&1 == 1 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// Flips are the fence's ups and downs the checks saw, in order.
func (f *Fence) Flips() []FenceFlip {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]FenceFlip(nil), f.flips...)
}

// ReconcileLoop runs a pass of rec every 200ms until ctx ends, each under mu (which a harness
// holds to keep passes out while it fails over), and hands each pass's reports to seen. A pass
// is not cancelled mid-way: one whose context ends while its lock is being taken leaves the item
// locked for 30s (TestFaultReconcileLockLeak).
func ReconcileLoop(ctx context.Context, rec *stockops.Reconciler, mu *sync.Mutex, seen func([]stockops.Report)) {
	for SleepCtx(ctx, 200*time.Millisecond) {
		mu.Lock()
		reps, _ := rec.Once(context.Background())
		mu.Unlock()
		seen(reps)
	}
}

// Repaired is what a reconcile report repaired: units adjusted, entries requeued, rerecorded or
// resynced, and a rebuild.
func Repaired(rp stockops.Report) int64 {
	n := FaultAbs(rp.Adjusted) + int64(rp.Requeued+rp.Rerecorded+rp.Resynced)
	if rp.Rebuilt {
		n++
	}
	return n
}

// DirectClient is a client of the server at addr on one connection, with no client-side cache
// and no retries of its own: every unknown outcome reaches the caller.
func DirectClient(t *testing.T, addr string) rueidis.Client {
	return FaultRedisClient(t, rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true,
		DisableCache: true, DisableRetry: true})
}

// ReplicationInfo returns the fields of INFO replication.
func ReplicationInfo(ctx context.Context, c rueidis.Client) (map[string]string, error) {
	s, err := c.Do(ctx, c.B().Info().Section("replication").Build()).ToString()
	if err != nil {
		return nil, fmt.Errorf("INFO replication: %w", err)
	}
	m := map[string]string{}
	for line := range strings.SplitSeq(s, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = v
		}
	}
	return m, nil
}

// DrainRelay runs passes of rl until one claims nothing and fails nothing, and empty (if not
// nil) says the outboxes are empty, letting backoffs and leases (some of dead relays, or
// replicated from an old primary) run out. It returns the passes' stats summed, and an error
// with the last pass's once 30s have passed.
func DrainRelay(ctx context.Context, rl *stockops.Relay, empty func() bool) (stockops.RelayStats, error) {
	var all stockops.RelayStats
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st, err := rl.Once(ctx)
		all.Claimed += st.Claimed
		all.Delivered += st.Delivered
		all.Refused += st.Refused
		all.Redelive += st.Redelive
		if err == nil && st.Claimed == 0 && (empty == nil || empty()) {
			return all, nil
		}
		if time.Now().After(deadline) {
			return all, fmt.Errorf("the relay did not drain in 30s (last error %v)", err)
		}
	}
}
