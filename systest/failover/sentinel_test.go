package failover_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/faultproxy"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
	"github.com/stockres/stock/systest/internal/kit"
)

// snKind is the fault of a run.
type snKind int

const (
	snFailover  snKind = iota // SENTINEL FAILOVER under traffic
	snKill9                   // the primary is killed (SIGKILL) while its replicas lag 50ms behind
	snPartition               // the primary is cut off from the sentinels, the replicas and the Sentinel clients; clients pinned to it keep writing; it rejoins as a replica
)

// snControl is the deliberately broken variant of a negative control.
type snControl int

const (
	snNone         snControl = iota
	snNoFence                // the guard fences another Reserver than the buyers' one
	snNoReconcile            // no reconciler: the fence stays up and Redis is never brought back in line with the store
	snDoubleApply            // the relay's store takes every deduct's units twice
	snInjectLoss             // a deduct acknowledged before the fault, lost: the accounting must not explain it
	snNoReplicaAck           // the zero-loss check of the replica-ack scenario, on a run without WithReplicaAck
)

var snControlNames = map[snControl]string{
	snNoFence:      "clients not fenced (the guard fences another Reserver)",
	snNoReconcile:  "no reconcile after the failover",
	snDoubleApply:  "the store applies every deduct twice",
	snInjectLoss:   "an acknowledged deduct lost before the fault",
	snNoReplicaAck: "kill -9 without WithReplicaAck",
}

// snScenario is one Sentinel row of the report.
type snScenario struct {
	name     string
	kind     snKind
	ack      bool // min-replicas-to-write 1 on the data nodes, WithReplicaAck(1, …) on the buyers
	controls []snControl
}

var snScenarios = []snScenario{
	{name: "sentinel-failover", kind: snFailover, controls: []snControl{snNoFence, snDoubleApply}},
	{name: "sentinel-kill9", kind: snKill9, controls: []snControl{snNoReconcile}},
	{name: "sentinel-partition", kind: snPartition, controls: []snControl{snInjectLoss}},
	{name: "sentinel-kill9-replica-ack", kind: snKill9, ack: true, controls: []snControl{snNoReplicaAck}},
}

const (
	snBuyers     = 8
	snBefore     = time.Second             // traffic before the fault
	snAfter      = 1500 * time.Millisecond // traffic after the switch
	snReplicaAck = time.Second             // WithReplicaAck's timeout
	snLag        = 50 * time.Millisecond   // the replication links' latency, each way, in the kill -9 runs
)

var snSKUs = []string{"deep-0", "deep-1"}

// snDoubleStore is the broken store of a control: it takes the units of every deduct it
// applies a second time.
type snDoubleStore struct{ *memstore.Store }

func (s *snDoubleStore) Apply(ctx context.Context, ev stock.Event) error {
	return s.ApplyBatch(ctx, []stock.Event{ev})[0]
}

func (s *snDoubleStore) ApplyBatch(ctx context.Context, evs []stock.Event) []error {
	errs := s.Store.ApplyBatch(ctx, evs)
	for i, ev := range evs {
		if errs[i] == nil && ev.Type == stock.EventDeducted {
			if rem, err := s.Remaining(ctx, ev.SKU); err == nil {
				s.Set(ev.SKU, rem-ev.Qty)
			}
		}
	}
	return errs
}

// snOp is one deduct a buyer made.
type snOp struct {
	sku, id  string
	qty      int64
	acked    bool // a nil error: taken or replayed
	taken    bool // taken by this id (not a replay)
	notRepl  bool // done, with ErrNotReplicated: not acknowledged by a replica
	pinned   bool // sent to the old primary by a client pinned to it
	start    time.Time
	ackedAt  time.Time
	inFence  bool // the call was made while the guard had fenced the Reserver, from beginning to end
	resolved bool
}

// snRun is one run of a Sentinel scenario.
type snRun struct {
	t     *testing.T
	sc    snScenario
	ctl   snControl
	d     *redistest.Sentinel
	store *memstore.Store
	front *stock.Reserver // the buyers'
	fc    rueidis.Client  // its client
	back  *stock.Reserver // the relay's and the reconciler's
	fence *kit.Fence      // the buyers' Reserver's guard (snNoFence: another Reserver's)
	recMu sync.Mutex

	mu                  sync.Mutex
	ops                 []*snOp
	injected, switchAt  time.Time                  // the fault; the sentinels agreed on the new primary
	clientAt            time.Time                  // the buyers' Sentinel client switched to the new primary
	snapAt              time.Time                  // when snap was read
	snap                map[string]map[string]bool // sku -> ids in the new primary's ledger right after the switch
	lossFrom            time.Time                  // writes acknowledged by the old primary from then on may be lost
	calls, unknown, ack atomic.Int64
	waited, repaired    atomic.Int64
	logged              atomic.Int64
}

// TestSentinelFailovers runs every Sentinel scenario and its negative control and prints their
// rows of the reliability report. It needs STOCK_REDIS_SERVER and STOCK_TEST_SENTINEL=1.
func TestSentinelFailovers(t *testing.T) {
	if !redistest.SentinelEnabled(t) { // fails t when it is 1 and STOCK_REDIS_SERVER is not set
		t.Skipf("%s is not 1: the Sentinel failovers start Sentinel deployments", redistest.EnvSentinel)
	}
	began := time.Now()
	var results []kit.FaultResult
	var kill9 *snRun // the kill -9 run without replica ack: the replica-ack scenario's control
	for _, sc := range snScenarios {
		t.Run(sc.name, func(t *testing.T) {
			run := runSentinel(t, sc, snNone)
			if sc.kind == snKill9 && !sc.ack {
				kill9 = run
			}
			res := run.result(snNone)
			results = append(results, res)
			for _, f := range res.Flags {
				t.Errorf("%s: %s", sc.name, f)
			}
			for _, ctl := range sc.controls {
				t.Run("control", func(t *testing.T) { results = append(results, snControlRun(t, sc, ctl, run, kill9)) })
			}
		})
	}
	kit.FaultReport(t, results, time.Since(began))
}

// snControlRun runs (or evaluates on run) the negative control ctl of sc; the checks must flag it.
func snControlRun(t *testing.T, sc snScenario, ctl snControl, run, kill9 *snRun) kit.FaultResult {
	var res kit.FaultResult
	switch ctl {
	case snInjectLoss: // checked on the same run, with a loss injected
		res = run.result(snInjectLoss)
	case snNoReplicaAck: // the zero-loss check, on the kill -9 run without replica ack
		if kill9 == nil {
			t.Fatal("the kill -9 run without replica ack did not run")
		}
		// Not flagged, it runs a kill -9 without replica ack of its own (see rerunControl).
		res = kit.RerunControl(t, sc.name, snControlNames[ctl], kill9.result(snNoReplicaAck), func() kit.FaultResult {
			k := sc
			k.ack = false
			return runSentinel(t, k, snNone).result(snNoReplicaAck)
		})
		res.Scenario = sc.name
	default:
		res = kit.RerunControl(t, sc.name, snControlNames[ctl], runSentinel(t, sc, ctl).result(ctl),
			func() kit.FaultResult { return runSentinel(t, sc, ctl).result(ctl) })
	}
	if len(res.Flags) == 0 {
		t.Errorf("%s: the negative control (%s) was not flagged by any check", sc.name, snControlNames[ctl])
	}
	return res
}

// runSentinel runs one scenario (or a control that needs a run of its own).
func runSentinel(t *testing.T, sc snScenario, ctl snControl) *snRun {
	ctx := context.Background()
	h := &snRun{t: t, sc: sc, ctl: ctl, store: memstore.New()}
	cfg := redistest.SentinelConfig{Replicas: 2, ProxyPrimary: sc.kind == snPartition}
	if sc.kind == snKill9 {
		cfg.ReplicaLatency, cfg.FailoverTimeout = snLag, time.Minute
	}
	if sc.ack {
		cfg.Args = []string{"--min-replicas-to-write", "1", "--min-replicas-max-lag", "10"}
	}
	began := time.Now()
	h.d = redistest.StartSentinel(t, cfg)
	ready := time.Now()

	// The clients do not retry by themselves: every unknown outcome reaches the buyer, who
	// retries the same id (and see faultRedisClient on rueidis's retries under -race).
	opt := h.d.Option()
	opt.DisableCache, opt.DisableRetry = true, true
	fc, bc := kit.FaultRedisClient(t, opt), kit.FaultRedisClient(t, opt)
	h.fc = fc
	var opts []stock.Option
	if sc.ack {
		opts = append(opts, stock.WithReplicaAck(1, snReplicaAck))
	}
	var err error
	if h.front, err = stock.New(fc, opts...); err != nil {
		t.Fatal(err)
	}
	if h.back, err = stock.New(bc); err != nil {
		t.Fatal(err)
	}
	guarded := h.front
	if ctl == snNoFence {
		if guarded, err = stock.New(fc, opts...); err != nil {
			t.Fatal(err)
		}
	}
	stockops.NewFailoverGuard(h.back)
	h.fence = &kit.Fence{Guard: stockops.NewFailoverGuard(guarded)}
	if _, err := h.fence.Guard.Check(ctx); err != nil { // records the first primary as reconciled
		t.Fatal(err)
	}
	for _, sku := range snSKUs {
		require.NoError(t, h.back.Load(ctx, sku, kit.FaultDeep))
		require.NoError(t, h.store.Load(ctx, sku, kit.FaultDeep))
	}

	bgCtx, stopBg := context.WithCancel(ctx)
	defer stopBg()
	var bg sync.WaitGroup
	var relayStore stock.Store = h.store
	if ctl == snDoubleApply {
		relayStore = &snDoubleStore{Store: h.store}
	}
	relay, err := stockops.NewRelay(h.back, relayStore, nil, &stock.RelayOptions{Poll: 5 * time.Millisecond,
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, Lease: time.Second, Batch: 64})

	require.NoError(t, err)
	bg.Go(func() { _ = relay.Run(bgCtx) })
	bg.Go(func() { h.fence.Loop(bgCtx, 25*time.Millisecond) })
	if ctl != snNoReconcile {
		bg.Go(func() { h.reconcileLoop(bgCtx) })
	}

	var stop atomic.Bool
	var buyers sync.WaitGroup
	for w := range snBuyers {
		buyers.Go(func() { h.buyer(w, h.front, &stop, false) })
	}
	if !kit.SleepCtx(bgCtx, snBefore) {
		t.Fatal("cancelled")
	}
	h.inject(&stop, &buyers)
	time.Sleep(snAfter)
	stop.Store(true)
	buyers.Wait()
	stopBg()
	bg.Wait()
	h.quiesce(relay)
	t.Logf("setup %v, run %v", ready.Sub(began).Round(time.Millisecond), time.Since(ready).Round(time.Millisecond))
	return h
}

// inject runs the fault and returns once the sentinels agree on a new primary (and, for a
// partition, the old primary has rejoined).
func (h *snRun) inject(stop *atomic.Bool, buyers *sync.WaitGroup) {
	t, d := h.t, h.d
	old, err := d.Primary()
	require.NoError(t, err)
	h.recMu.Lock() // no reconcile pass on the new primary before the guard has seen it
	before := h.fence.State()
	var pinnedStop atomic.Bool
	var pinned sync.WaitGroup
	switch h.sc.kind {
	case snFailover:
		h.setInjected(time.Now())
		require.NoError(t, d.Failover())
	case snKill9:
		// The replicas are snLag behind: what the primary sent them in its last snLag dies
		// with it (the replication proxy's connections are reset at the kill).
		h.setInjected(time.Now())
		old.Kill()
		d.ReplicaProxy().ResetAll()
	case snPartition:
		// Clients pinned to the old primary, through a proxy of their own, keep writing.
		px, err := faultproxy.Start(old.Addr())
		require.NoError(t, err)
		t.Cleanup(func() { px.Close() })
		pc := kit.DirectClient(t, px.Addr())
		pr, err := stock.New(pc)
		require.NoError(t, err)
		h.setInjected(time.Now())
		d.Proxy().Blackhole(time.Hour)
		for w := range 2 {
			pinned.Go(func() { h.buyer(100+w, pr, &pinnedStop, true) })
		}
	}
	p, err := d.WaitPrimary(old, 30*time.Second)
	require.NoError(t, err)
	h.mu.Lock()
	h.switchAt = time.Now()
	h.mu.Unlock()
	t.Logf("%s: %s -> %s, the sentinels agreed %v after the fault", h.sc.name, old.Addr(), p.Addr(), h.switchAt.Sub(h.injected).Round(time.Millisecond))
	// What the promoted replica has: its ledgers, read before any reconcile pass could write
	// back what the store has.
	pc := kit.DirectClient(t, p.Addr())
	snap := map[string]map[string]bool{}
	snapAt := time.Now()
	for _, sku := range snSKUs {
		ids, err := pc.Do(context.Background(), pc.B().Hkeys().Key("stock:{"+sku+"}:l").Build()).AsStrSlice()
		require.NoError(t, err, "HKEYS on the new primary")
		snap[sku] = map[string]bool{}
		for _, id := range ids {
			snap[sku][id] = true
		}
	}
	h.mu.Lock()
	h.snap, h.snapAt = snap, snapAt
	h.mu.Unlock()
	var switched sync.WaitGroup
	switched.Go(func() { // the buyers' client follows +switch-master
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if _, ok := h.fc.Nodes()[p.Addr()]; ok {
				h.mu.Lock()
				h.clientAt = time.Now()
				h.mu.Unlock()
				return
			}
		}
		t.Errorf("the buyers' Sentinel client did not switch to %s within 30s", p.Addr())
	})
	defer switched.Wait()

	// The guard has seen the new primary: a check that began after the switch fenced.
	if !h.fence.AwaitFenced(before, 10*time.Second) {
		t.Logf("the guard did not fence the Reserver within 10s of the switch")
	}
	h.recMu.Unlock()
	if h.sc.kind == snPartition {
		// The partition heals: what the proxy held back is dropped, and the sentinels make the
		// old primary a replica of the new one, which discards what the pinned clients wrote.
		time.Sleep(snAfter / 2)
		d.Proxy().ResetAll()
		d.Proxy().Heal()
		require.NoError(t, d.WaitReady(30*time.Second), "the old primary did not rejoin")
		t.Logf("%s: the old primary rejoined as a replica %v after the heal", h.sc.name, time.Since(h.switchAt).Round(time.Millisecond))
		pinnedStop.Store(true)
		pinned.Wait()
	}
}

func (h *snRun) setInjected(at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.injected = at
	// Writes acknowledged from then on may be lost (the documented non-guarantee): SENTINEL
	// FAILOVER promotes a replica while the old primary still answers the clients that have not
	// switched; after the replicas stopped reading, the primary's writes reach no one; a
	// partitioned primary keeps answering the clients pinned to it; a killed primary takes
	// what its replicas had not received yet (they lag snLag behind in the kill -9 runs). Before
	// that, the replicas were caught up.
	h.lossFrom = at.Add(-50*time.Millisecond - 2*snLag)
}

// buyer deducts with new ids until stop, each id retried until it gets a definite answer.
func (h *snRun) buyer(w int, r *stock.Reserver, stop *atomic.Bool, pinned bool) {
	for i := 0; !stop.Load() && !h.t.Failed(); i++ {
		op := &snOp{sku: snSKUs[i%len(snSKUs)], id: fmt.Sprintf("b%d-%d", w, i), qty: int64(1 + i%2), pinned: pinned}
		h.settle(op, r, stop, pinned)
		h.mu.Lock()
		h.ops = append(h.ops, op)
		h.mu.Unlock()
		if pinned && !op.resolved {
			return // the old primary is a replica now (READONLY) or gone
		}
		time.Sleep(time.Millisecond)
	}
}

// settle sends the deduct until a definite answer: success, ErrNotReplicated (done, not
// acknowledged), or another sentinel error; ErrFailover is retried later with the same id, like
// any unknown outcome.
func (h *snRun) settle(op *snOp, r *stock.Reserver, stop *atomic.Bool, pinned bool) {
	deadline := time.Now().Add(20 * time.Second)
	wait := 2 * time.Millisecond
	for unknown := false; time.Now().Before(deadline); {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		f0 := h.fence.State()
		op.start = time.Now()
		rc, err := r.Deduct(ctx, stock.Request{SKU: op.sku, ID: op.id, Qty: op.qty, Retry: unknown})
		f1 := h.fence.State()
		cancel()
		h.calls.Add(1)
		op.inFence = !pinned && kit.FencedThrough(f0, f1)
		if op.inFence && (err == nil || errors.Is(err, stock.ErrNotReplicated)) {
			// The take was made while fenced only if a check now still fences (kit.Fence).
			op.inFence = h.fence.StillFenced(context.Background())
		}
		switch {
		case err == nil || errors.Is(err, stock.ErrNotReplicated):
			op.resolved, op.acked, op.notRepl, op.taken, op.ackedAt = true, err == nil, err != nil, !rc.Replayed, time.Now()
			if err == nil {
				h.ack.Add(1)
			}
			return
		case errors.Is(err, stock.ErrFailover):
			h.waited.Add(1)
			if stop.Load() {
				return // fenced to the end (the control without a reconciler)
			}
		case kit.FaultSentinel(err):
			op.resolved = true
			return
		default:
			unknown = true
			h.unknown.Add(1)
			if pinned && (stop.Load() || strings.Contains(err.Error(), "READONLY")) {
				return
			}
		}
		time.Sleep(wait)
		wait = min(2*wait, 100*time.Millisecond)
	}
}

// fenceAfterFault returns when the fence first went up after the fault, when it next came down
// (zero times when it did not), and how many times it went up again after that.
func (h *snRun) fenceAfterFault() (up, down time.Time, again int) {
	h.mu.Lock()
	injected := h.injected
	h.mu.Unlock()
	for _, f := range h.fence.Flips() {
		switch {
		case f.Fenced && up.IsZero() && f.At.After(injected):
			up = f.At
		case !f.Fenced && !up.IsZero() && down.IsZero():
			down = f.At
		case f.Fenced && !down.IsZero():
			again++
		}
	}
	return up, down, again
}

// reconcileLoop runs a reconcile pass every 200ms.
func (h *snRun) reconcileLoop(ctx context.Context) {
	rec, err := stockops.NewReconciler(h.back, h.store, nil)
	if err != nil {
		h.t.Error(err)
		return
	}
	kit.ReconcileLoop(ctx, rec, &h.recMu, h.countRepairs)
}

func (h *snRun) countRepairs(reps []stockops.Report) {
	for _, rp := range reps {
		n := kit.Repaired(rp)
		h.repaired.Add(n)
		if n > 0 && h.logged.Add(1) <= 4 {
			h.t.Logf("reconcile repaired: %s", rp)
		}
	}
}

// snFinal is what the quiescence found.
type snFinal struct {
	driftFound, driftFinal int64
	mismatch               []string // items whose Redis available + held differs from the store
	booksOff               int64    // |loaded - applied - remaining| in the store, over the items
	fencedAfter            bool     // the guard still fenced after the final reconcile
	ledger                 map[string]map[string]stock.Entry
	records                map[string]map[string]stock.Record
}

var snFinals sync.Map

// quiesce drains the relay, reconciles (twice, the relay drained in between) unless the control
// has no reconciler, and reads Redis's ledgers and the store's records.
func (h *snRun) quiesce(relay *stockops.Relay) {
	t, ctx := h.t, context.Background()
	foDrain(t, relay)
	f := snFinal{ledger: map[string]map[string]stock.Entry{}, records: map[string]map[string]stock.Record{}}
	if h.ctl != snNoReconcile {
		rec, err := stockops.NewReconciler(h.back, h.store, nil)
		require.NoError(t, err)
		for _, rp := range foReconcile(t, rec, snSKUs) {
			f.driftFound += kit.FaultAbs(rp.Drift)
			h.countRepairs([]stockops.Report{rp})
		}
		foDrain(t, relay)
		for _, rp := range foReconcile(t, rec, snSKUs) {
			f.driftFinal += kit.FaultAbs(rp.Drift)
			h.countRepairs([]stockops.Report{rp})
		}
		foDrain(t, relay)
	}
	fenced, err := h.fence.Guard.Check(ctx)
	f.fencedAfter = fenced || err != nil
	for _, sku := range snSKUs {
		l, err := h.front.Levels(ctx, sku)
		require.NoError(t, err)
		rem, err := h.store.Remaining(ctx, sku)
		require.NoError(t, err)
		if l.Available+l.Held != rem || l.Loaded != l.Available+l.Held+l.Sold {
			f.mismatch = append(f.mismatch, fmt.Sprintf("%s: redis %+v, store remaining %d", sku, l, rem))
		}
		// The store's books: what it has left is what was loaded minus its applied sales.
		if applied := storeTaken(t, h.store, sku); kit.FaultDeep-applied != rem {
			f.booksOff += kit.FaultAbs(kit.FaultDeep - applied - rem)
		}
		f.ledger[sku] = testkit.Ledger(t, h.front, sku)
		recs, err := h.store.List(ctx, sku, "", 1<<30)
		require.NoError(t, err)
		f.records[sku] = map[string]stock.Record{}
		for _, r := range recs {
			f.records[sku][r.ID] = r
		}
	}
	snFinals.Store(h, f)
}

// result checks the run as the control ctl (snNone: the scenario itself) and returns its row.
func (h *snRun) result(ctl snControl) kit.FaultResult {
	v, _ := snFinals.Load(h)
	f := v.(snFinal)
	h.mu.Lock()
	ops := slices.Clone(h.ops)
	h.mu.Unlock()
	if ctl == snInjectLoss {
		// A deduct acknowledged at the start of the traffic that neither Redis nor the store has.
		ops = append(ops, &snOp{sku: snSKUs[0], id: "injected-loss", qty: 1, acked: true, taken: true, resolved: true,
			start: h.injected.Add(-snBefore), ackedAt: h.injected.Add(-snBefore)})
	}
	r := kit.FaultResult{Scenario: h.sc.name, Store: "memstore", Clients: snBuyers, Seconds: (snBefore + snAfter).Seconds(),
		Ops: h.calls.Load(), Retries: h.unknown.Load(), Unknown: h.unknown.Load(), Waited: h.waited.Load(),
		Faults:     map[string]int{map[snKind]string{snFailover: "sentinel-failover", snKill9: "kill9", snPartition: "partition"}[h.sc.kind]: 1},
		DriftFound: f.driftFound, DriftFinal: f.driftFinal, Repaired: h.repaired.Load(), Orders: len(ops),
		Failover: &kit.FaultFoReport{Promotions: 1}}
	if ctl != snNone {
		r.Control = snControlNames[ctl]
	}
	flag := func(format string, args ...any) { r.Flags = append(r.Flags, fmt.Sprintf(format, args...)) }

	if n := h.store.MaxApplications(); n > 1 {
		r.DoubleApplied = n - 1
		flag("the store applied an event %d times", n)
	}
	if r.BooksOff = f.booksOff; r.BooksOff != 0 {
		flag("the store's remaining stock is off its applied sales by %d units (applied twice)", r.BooksOff)
	}

	var lostLate, lostEarly, notRepl, taken, pinnedAcks int
	var first, firstAfterFence time.Duration = -1, -1
	fencedAt, lifted, again := h.fenceAfterFault()
	for _, op := range ops {
		if op.notRepl {
			notRepl++
		}
		if op.pinned && op.acked {
			pinnedAcks++
		}
		if op.taken && (op.acked || op.notRepl) {
			taken++
			if op.inFence {
				r.FencedTakes++
			}
			if !op.pinned && op.start.After(h.switchAt) && op.start.Before(h.clientAt) {
				r.Failover.OldPrimaryTakes++ // answered by the old primary, promoted or not
			}
			if !op.pinned && op.start.After(h.clientAt) {
				if d := op.ackedAt.Sub(h.switchAt); first < 0 || d < first {
					first = d
				}
				if op.start.After(lifted) && lifted.After(h.switchAt) {
					if d := op.ackedAt.Sub(h.switchAt); firstAfterFence < 0 || d < firstAfterFence {
						firstAfterFence = d
					}
				}
			}
		}
		if !op.acked {
			continue
		}
		if op.taken && op.ackedAt.Before(h.snapAt) && !h.snap[op.sku][op.id] {
			r.Failover.DiscardedSales++ // acknowledged, and not on the promoted replica
		}
		if _, ok := f.ledger[op.sku][op.id]; ok {
			continue
		}
		if _, ok := f.records[op.sku][op.id]; ok {
			continue
		}
		r.LostDeducts++
		r.LostUnits += op.qty
		if op.ackedAt.After(h.lossFrom) {
			lostLate++
		} else {
			lostEarly++
		}
	}
	r.Failover.LostExplained, r.Failover.LostUnexplained = lostLate, lostEarly
	if lostEarly > 0 {
		flag("%d acknowledged deducts lost that were acknowledged before the fault (not the documented loss)", lostEarly)
	}
	if (h.sc.ack || ctl == snNoReplicaAck) && r.LostDeducts+r.Failover.DiscardedSales > 0 {
		flag("with min-replicas-to-write 1 and WithReplicaAck(1, %v), %d acknowledged deducts were not on the promoted replica and %d are lost (want 0)",
			snReplicaAck, r.Failover.DiscardedSales, r.LostDeducts)
	}
	if r.FencedTakes > 0 {
		flag("%d deducts took stock in calls made while the guard fenced the Reserver", r.FencedTakes)
	}
	switch {
	case fencedAt.IsZero():
		flag("the guard did not fence after the switch")
	case lifted.IsZero():
		flag("no reconcile pass lifted the fence during the traffic")
	default:
		r.FencedMs = []float64{float64(lifted.Sub(fencedAt).Microseconds()) / 1000}
	}
	if again > 0 {
		h.t.Logf("the guard fenced %d more times after a pass lifted its first fence (each lifted by a later pass, or flagged below if the final reconcile did not)", again)
	}
	if f.fencedAfter {
		flag("the guard still fences after the final reconcile")
	}
	if f.driftFinal != 0 {
		flag("drift %d after the final reconcile", f.driftFinal)
	}
	for _, m := range f.mismatch {
		flag("after quiescence %s", m)
	}
	if first >= 0 {
		r.FirstSuccessMs = []float64{float64(first.Microseconds()) / 1000}
	} else {
		flag("no deduct took stock after the switch")
	}
	if firstAfterFence >= 0 {
		r.Failover.FirstAfterFenceMs = []float64{float64(firstAfterFence.Microseconds()) / 1000}
	}
	if first >= 0 {
		r.Note = fmt.Sprintf("first deduct on the new primary %v after the fault; ", (first + h.switchAt.Sub(h.injected)).Round(time.Millisecond))
	}
	r.Note += fmt.Sprintf("sentinels agreed on the new primary %v after the fault, the buyers' client switched %v later; "+
		"%d deducts taken, %d acknowledged and not on the promoted replica, %d acknowledged lost "+
		"(%d acknowledged by the old primary after the fault, the documented loss), %d done but not acknowledged by a replica (ErrNotReplicated), %d acknowledged by the old primary to pinned clients",
		h.switchAt.Sub(h.injected).Round(time.Millisecond), h.clientAt.Sub(h.switchAt).Round(time.Millisecond), taken, r.Failover.DiscardedSales, r.LostDeducts, lostLate, notRepl, pinnedAcks)
	if ctl == snNone {
		h.t.Logf("%s", r.Line())
	}
	return r
}
