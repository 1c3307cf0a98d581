// Package kit is what the system tests' fault suites share: their report, the clients they open
// and the errors that count as answers. The helpers every test uses are package testkit's.
package kit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"

	"github.com/stockres/stock"
	"github.com/stockres/stock/stockops"
)

// The fault-injection suite. Each scenario runs clients that deduct (some requests
// sent again with the same id), hold and confirm or cancel, restore, and cancel orders that
// never arrived, through the whole path: Reserver → outbox → Relay (running) → sqlstore on
// SQLite (and PostgreSQL with STOCK_TEST_POSTGRES), with a Reconciler running, while one kind
// of fault is injected. A client that gets an error wrapping none of the package's sentinels
// (an unknown outcome) retries the same id until it gets a definite answer. At the end the
// faults stop, the relay drains, the holds Redis kept live after losing their confirm or cancel
// are released as at their deadline (scenarios with losses; see FaultResult.AbandonedHolds), a
// reconcile pass runs, the relay drains again, and the checks compare what the clients were
// told with what Redis and the store hold.
//
// Each scenario also runs a negative control: the same harness against a deliberately broken
// variant (a client that retries an unknown outcome with a new id, a naive reconcile, a blind
// restore, a script call without the EVAL fallback, an AOF that loses its tail, a store that
// applies a redelivered event again, clients that a FailoverGuard does not fence), which the
// checks must flag.
//
// STOCK_FAULT_LONG=1 runs 5 times as long with twice the clients; STOCK_FAULT_REPORT=<file>
// writes the report as JSON.
const (
	FaultEnvLong   = "STOCK_FAULT_LONG"
	FaultEnvReport = "STOCK_FAULT_REPORT"

	FaultTraffic        = 3 * time.Second // a scenario's traffic, with faults
	FaultControlTraffic = 1500 * time.Millisecond
	FaultClients        = 8
	FaultSettle         = 20 * time.Second // how long a client retries one unknown outcome
	FaultHoldTTL        = 2 * time.Minute
	FaultScarce         = 120       // units of each scarce item: they sell out, restores bring some back
	FaultDeep           = 1_000_000 // units of each deep item: never sold out
)

// FaultResult is one line of the reliability report.
type FaultResult struct {
	Scenario string `json:"scenario"`
	Store    string `json:"store"`
	Control  string `json:"control,omitempty"` // the broken variant of a negative control

	Clients int            `json:"clients"`
	Seconds float64        `json:"seconds"` // of traffic
	Wall    float64        `json:"wall_seconds"`
	Orders  int            `json:"orders"`
	Ops     int64          `json:"operations"` // calls made by the clients, retries included
	Retries int64          `json:"retries"`    // calls again after an unknown outcome
	Unknown int64          `json:"unknown_outcomes"`
	Replays int64          `json:"replays_after_unknown"` // retries answered as a replay
	Resends int64          `json:"resends"`               // deliberate second and third sends of an id
	Waited  int64          `json:"failover_waits"`        // ErrFailover / ErrNotLoaded answers, retried later
	Faults  map[string]int `json:"faults"`

	Oversell        int64 `json:"oversell_units"`
	InvariantBreaks int64 `json:"invariant_breaks"` // samples with loaded != available + held + sold, or available < 0
	DoubleApplied   int   `json:"double_applied"`   // (sku, id) recorded twice, or one order taken under two ids
	Phantom         int   `json:"phantom_takes"`    // ids the store applied that no client holds
	// LateTakes are phantom takes of one kind: a retry after an unknown outcome was refused
	// (sold out), and the first attempt, still on its way, ran later and took stock
	// (TestFaultRefusalThenLateAttempt). Reported, not flagged here.
	LateTakes    int   `json:"late_takes_after_refusal"`
	LostDeducts  int   `json:"lost_deducts"`
	LostUnits    int64 `json:"lost_units"`
	LostRestores int   `json:"lost_restores"`
	LostHolds    int   `json:"lost_holds"`
	DriftFinal   int64 `json:"drift_after_final_reconcile"`
	// HeldConfirmed are holds live in Redis that the store has confirmed at the end (see
	// finish): the final reconcile must have made them final, so any is flagged.
	HeldConfirmed      int   `json:"holds_live_in_redis_confirmed_in_store"`
	HeldConfirmedUnits int64 `json:"holds_live_in_redis_confirmed_in_store_units"`
	// AbandonedHolds are holds live in Redis once the clients were done that their clients had
	// confirmed or cancelled, and the store has no record of: Redis lost the confirm or cancel
	// (with an old primary, or the AOF's tail) and kept the hold, which nobody settles before
	// its deadline. With losses they are released as their deadline would (see finish) before
	// the final reconcile; without, they are flagged.
	AbandonedHolds     int   `json:"holds_abandoned"`
	AbandonedHoldUnits int64 `json:"holds_abandoned_units"`
	DriftFound         int64 `json:"drift_found_by_final_reconcile"`
	Repaired           int64 `json:"repaired"` // units adjusted and entries requeued, rerecorded or rebuilt
	Refused            int64 `json:"refused_units"`
	BooksOff           int64 `json:"store_books_off"` // |loaded - applied - remaining| in the store
	// CountersOff is Σ |Loaded − loaded| + |Sold − the units the store holds as taken| over the
	// items, in Redis after the final reconcile: a repair moves the counter its cause moved
	// (a sale the promoted replica lost is sold again, not unloaded), so it must be 0, losses or not.
	CountersOff   int64 `json:"redis_counters_off"`
	NoScript      int64 `json:"noscript_errors"`
	Unresolved    int64 `json:"unresolved"`
	Unexpected    int64 `json:"unexpected"`
	ResendsRetook int64 `json:"resends_retook"`
	Redelivered   int64 `json:"redelivered"`
	DeadLetters   int64 `json:"dead_letters"`
	// OutOfOrder counts events the store applied (first application) after a later event of
	// their item (queue scenarios: the sequence the relay gave them).
	OutOfOrder int64 `json:"applied_out_of_order"`
	// OutOfOrderEvents are the first of them: the event, the later one applied before it.
	OutOfOrderEvents []string `json:"applied_out_of_order_events,omitempty"`

	FirstSuccessMs []float64 `json:"first_success_after_fault_ms,omitempty"`

	// FencedTakes are deducts and holds that took stock in a call made entirely while the
	// FailoverGuard had fenced Redis (a restart or a failover not reconciled yet): the fence
	// must have refused them with ErrFailover. FencedMs are the times the fence was up.
	FencedTakes int            `json:"takes_while_fenced"`
	FencedMs    []float64      `json:"fenced_ms,omitempty"`
	Failover    *FaultFoReport `json:"failover,omitempty"`

	Flags []string `json:"flags,omitempty"` // checks that failed
	Note  string   `json:"note,omitempty"`
}

// FaultFoReport is what the lossy failovers of one run did.
type FaultFoReport struct {
	Promotions int `json:"promotions"`
	// The old primary's writes that the promoted replica never had, discarded when the old
	// primary was demoted (its ledger entries that the promoted replica lacked or had in another
	// state, relay acks aside): sales (deducts, confirmed holds), give-backs (restores,
	// cancels, refusals; an entry may count as both) and the rest (live holds, tombstones).
	DiscardedSales     int `json:"discarded_sales"`
	DiscardedGiveBacks int `json:"discarded_give_backs"`
	DiscardedOther     int `json:"discarded_other"`
	// Takes (deducts and holds, replays aside) by calls that started between a promotion and
	// the switch: answered by the old primary.
	OldPrimaryTakes int `json:"takes_on_old_primary_after_promotion"`
	// Takes by calls that started after the switch and before the guard had fenced the
	// clients' Reserver (it checks every 25ms): sold by the promoted replica before its
	// reconcile pass, and the units of them that the store then refused.
	GapTakes        int   `json:"takes_before_fence"`
	GapRefusedUnits int64 `json:"takes_before_fence_refused_units"`
	// For each failover, the time from the switch to the answer of the first take by a call
	// that started once the guard had fenced: with the fence, the first sale on the reconciled
	// new primary (FirstSuccessMs counts from the switch to any first take, one made before
	// the guard noticed the new primary included).
	FirstAfterFenceMs []float64 `json:"first_success_after_fence_ms,omitempty"`
	// Units of the takes while fenced (FencedTakes: the control) that the store refused.
	FencedRefusedUnits int64 `json:"takes_while_fenced_refused_units"`
	// Lost deducts, restores and holds whose id had writes among the discarded ones, and not.
	LostExplained   int `json:"lost_explained"`
	LostUnexplained int `json:"lost_unexplained"`
}

// RerunControl returns res, or, while it is not flagged, the result of up to 4 more runs of again:
// a negative control that shows its bug only when a call meets a short window (a fence up for a
// whole take, a write acknowledged and not yet replicated at a kill) can miss it on a loaded
// machine. The control still fails when no run was flagged.
func RerunControl(t *testing.T, scenario, control string, res FaultResult, again func() FaultResult) FaultResult {
	for try := 0; len(res.Flags) == 0 && try < 4; try++ {
		t.Logf("%s: the control (%s) was not flagged; run %d of 5", scenario, control, try+2)
		res = again()
	}
	return res
}

// FaultReport prints the report (t.Log, and stdout with -v) and writes it as JSON to
// STOCK_FAULT_REPORT if set.
func FaultReport(t *testing.T, results []FaultResult, took time.Duration) {
	var b strings.Builder
	fmt.Fprintf(&b, "reliability report (%d runs, %v):\n", len(results), took.Round(time.Millisecond))
	for _, r := range results {
		b.WriteString(r.Line())
		b.WriteByte('\n')
	}
	t.Log(b.String())
	if testing.Verbose() {
		fmt.Print(b.String())
	}
	if path := os.Getenv(FaultEnvReport); path != "" {
		out, err := json.MarshalIndent(map[string]any{
			"generated": time.Now().UTC().Format(time.RFC3339), "seconds": took.Seconds(),
			"long": os.Getenv(FaultEnvLong) == "1", "runs": results,
		}, "", "  ")
		if err == nil {
			err = os.WriteFile(path, append(out, '\n'), 0o644)
		}
		if err != nil {
			t.Errorf("writing %s: %v", path, err)
		}
	}
}

// line is the result as one line of the report.
func (r FaultResult) Line() string {
	name := r.Scenario + "/" + r.Store
	verdict := "PASS"
	if r.Control != "" {
		name = r.Scenario + "/control[" + r.Control + "]"
		verdict = "CAUGHT"
		if len(r.Flags) == 0 {
			verdict = "MISSED"
		}
	} else if len(r.Flags) > 0 {
		verdict = "FAIL"
	}
	kinds := make([]string, 0, len(r.Faults))
	for k, v := range r.Faults {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, v))
	}
	slices.Sort(kinds)
	first := "-"
	if n := len(r.FirstSuccessMs); n > 0 {
		first = fmt.Sprintf("%.0f/%.0fms (mean/max of %d)", Mean(r.FirstSuccessMs), slices.Max(r.FirstSuccessMs), n)
	}
	s := fmt.Sprintf("%-6s %-44s clients %d, ops %d (%d orders), retries %d (unknown %d, replays after unknown %d), "+
		"resends %d, faults [%s]; oversell %d, invariant breaks %d, double-applied %d, phantom %d, "+
		"late takes after a refusal %d, lost deducts %d (%d units; restores %d, holds %d), drift found %d -> after final reconcile %d, repaired %d, "+
		"first success after fault %s, refused by store %d units, NOSCRIPT %d, unresolved %d, unexpected %d, redelivered %d",
		verdict, name, r.Clients, r.Ops, r.Orders, r.Retries, r.Unknown, r.Replays,
		r.Resends, strings.Join(kinds, " "), r.Oversell, r.InvariantBreaks, r.DoubleApplied, r.Phantom,
		r.LateTakes, r.LostDeducts, r.LostUnits, r.LostRestores, r.LostHolds, r.DriftFound, r.DriftFinal, r.Repaired,
		first, r.Refused, r.NoScript, r.Unresolved, r.Unexpected, r.Redelivered)
	if r.Scenario != "" && strings.HasPrefix(r.Scenario, "queue") {
		s += fmt.Sprintf(", applied out of order %d", r.OutOfOrder)
	}
	if r.FencedTakes > 0 || len(r.FencedMs) > 0 {
		s += fmt.Sprintf(", takes while fenced %d", r.FencedTakes)
		if n := len(r.FencedMs); n > 0 {
			s += fmt.Sprintf(" (fence up %.0f/%.0fms, mean/max of %d)", Mean(r.FencedMs), slices.Max(r.FencedMs), n)
		}
	}
	if fo := r.Failover; fo != nil {
		after := "-"
		if n := len(fo.FirstAfterFenceMs); n > 0 {
			after = fmt.Sprintf("%.0f/%.0fms (mean/max of %d)", Mean(fo.FirstAfterFenceMs), slices.Max(fo.FirstAfterFenceMs), n)
		}
		s += fmt.Sprintf(", failover: %d promotions, old primary took %d after the promotion, discarded %d sales, "+
			"%d give-backs, %d other entries; lost explained %d, unexplained %d; taken before the fence %d "+
			"(%d units refused by the store), refused units of takes while fenced %d, first success after the fence %s",
			fo.Promotions, fo.OldPrimaryTakes, fo.DiscardedSales, fo.DiscardedGiveBacks, fo.DiscardedOther,
			fo.LostExplained, fo.LostUnexplained, fo.GapTakes, fo.GapRefusedUnits, fo.FencedRefusedUnits, after)
	}
	if r.AbandonedHolds > 0 {
		s += fmt.Sprintf(", holds abandoned (their confirm or cancel lost) %d (%d units)", r.AbandonedHolds, r.AbandonedHoldUnits)
	}
	if r.HeldConfirmed > 0 {
		s += fmt.Sprintf(", holds live in Redis and confirmed in the store %d (%d units)", r.HeldConfirmed, r.HeldConfirmedUnits)
	}
	if len(r.Flags) > 0 {
		s += "; flagged: " + strings.Join(r.Flags, "; ")
	}
	if r.Note != "" {
		s += "; " + r.Note
	}
	return s
}

func Mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func FaultRedisClient(t *testing.T, opt rueidis.ClientOption) rueidis.Client {
	c, err := rueidis.NewClient(opt)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// FaultSentinels are the package's definite answers.
var FaultSentinels = []error{stock.ErrSoldOut, stock.ErrInsufficient, stock.ErrNotLoaded, stock.ErrLoaded,
	stock.ErrConflict, stock.ErrRestored, stock.ErrUserLimit, stock.ErrUnknownID, stock.ErrClosed,
	stock.ErrExpired, stock.ErrConfirmed, stock.ErrNotReplicated, stock.ErrInvalid, stock.ErrFailover}

func FaultSentinel(err error) bool {
	for _, s := range FaultSentinels {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

func FaultAbs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// SleepCtx sleeps d; false when ctx ended first.
func SleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

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
		all.Add(st)
		if err == nil && st.Claimed == 0 && (empty == nil || empty()) {
			return all, nil
		}
		if time.Now().After(deadline) {
			return all, fmt.Errorf("the relay did not drain in 30s (last error %v)", err)
		}
	}
}
