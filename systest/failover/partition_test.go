package failover_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/faultproxy"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
	"github.com/stockres/stock/systest/internal/kit"
)

const (
	ptBuyers  = 6
	ptAck     = 250 * time.Millisecond // WithReplicaAck's timeout
	ptBefore  = time.Second            // traffic before the partition
	ptAfter   = time.Second            // traffic on the promoted replica before the heal
	ptHealed  = 500 * time.Millisecond // traffic after the heal
	ptDeep    = 1_000_000              // each item's units: never sold out
	ptRestock = 500
)

var ptSKUs = []string{"part-0", "part-1"}

// ptOp is one request a buyer made and the answer it settled on.
type ptOp struct {
	kind         string // "deduct" or "hold" (confirmed at once)
	sku, id      string
	qty          int64
	acked        bool // nil error: taken (or replayed), a replica had it
	notRepl      bool // ErrNotReplicated: taken, no replica had it
	refused      error
	unknown      bool // no definite answer (the outcome may be either)
	restored     bool // a Restore of it was acknowledged (nil error)
	restoreTried bool // a Restore of it was sent, whatever its answer
}

type ptRun struct {
	t      *testing.T
	r      *stock.Reserver
	mu     sync.Mutex
	ops    []*ptOp
	calls  atomic.Int64
	unk    atomic.Int64
	fenced atomic.Int64
}

// TestSentinelPartitionKeepsCountersExact: see the comment above. It needs STOCK_REDIS_SERVER
// and STOCK_TEST_SENTINEL=1.
func TestSentinelPartitionKeepsCountersExact(t *testing.T) {
	if !redistest.SentinelEnabled(t) { // fails t when it is 1 and STOCK_REDIS_SERVER is not set
		t.Skipf("%s is not 1: the partition test starts a Sentinel deployment", redistest.EnvSentinel)
	}
	ctx := context.Background()
	d := redistest.StartSentinel(t, redistest.SentinelConfig{Replicas: 1, ProxyPrimary: true})
	old, err := d.Primary()
	require.NoError(t, err)

	// The clients' own way to the primary: re-pointed at the failover.
	cp, err := faultproxy.Start(old.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { cp.Close() })
	c := kit.DirectClient(t, cp.Addr())
	r, err := stock.New(c, stock.WithReplicaAck(1, ptAck))
	require.NoError(t, err)
	h := &ptRun{t: t, r: r}
	store := memstore.New()
	loaded := map[string]int64{}
	for i, sku := range ptSKUs {
		require.NoError(t, r.Load(ctx, sku, ptDeep))
		require.NoError(t, store.Load(ctx, sku, ptDeep))
		loaded[sku] = ptDeep
		if i == 1 {
			_, err := r.Restock(ctx, sku, "restock-1", ptRestock)
			require.NoError(t, err, "a restock a replica acknowledged")
			loaded[sku] += ptRestock
		}
	}

	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	runDone := make(chan error, 1)
	go func() {
		runDone <- r.Run(runCtx, stock.RunOptions{Store: store, GuardInterval: 50 * time.Millisecond,
			Relay: &stock.RelayOptions{Poll: 5 * time.Millisecond, MinBackoff: 5 * time.Millisecond,
				MaxBackoff: 100 * time.Millisecond, Lease: time.Second, Batch: 64},
			Reconcile: &stock.ReconcileOptions{Interval: 200 * time.Millisecond}})
	}()

	var stop atomic.Bool
	var buyers sync.WaitGroup
	for w := range ptBuyers {
		buyers.Go(func() { h.buyer(w, &stop) })
	}
	time.Sleep(ptBefore)

	// The partition: the primary loses its replica and the sentinels; the clients still reach it.
	partitionAt := time.Now()
	d.Proxy().Blackhole(time.Hour)
	p, err := d.WaitPrimary(old, 30*time.Second)
	require.NoError(t, err)
	t.Logf("the sentinels promoted %s %v after the partition; %d calls so far", p.Addr(), time.Since(partitionAt).Round(time.Millisecond), h.calls.Load())
	// What the promoted replica lacks that the store has, read before any client reaches it.
	behind := h.behind(p.Addr(), store)
	t.Logf("the promoted replica lacks %d ids the store holds", behind)
	require.Positive(t, behind, "the promoted replica is behind the store (else the test proved nothing)")
	cp.SetTarget(p.Addr()) // the clients are re-pointed
	cp.ResetAll()
	time.Sleep(ptAfter)

	// The heal: the sentinels make the old primary a replica of the new one; it loses what it
	// took alone.
	d.Proxy().ResetAll()
	d.Proxy().Heal()
	require.NoError(t, d.WaitReady(30*time.Second), "the old primary rejoins as a replica")
	time.Sleep(ptHealed)
	stop.Store(true)
	buyers.Wait()
	stopRun()
	select {
	case err := <-runDone:
		// Run returns the first error a pass met (the re-pointing reset its connections); the
		// next pass retried it.
		t.Logf("Run returned: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return 30s after its context ended")
	}

	// Settle: the relay drains, reconcile passes, the relay drains again.
	relay, err := stockops.NewRelay(r, store, nil, &stock.RelayOptions{Lease: time.Second, MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	require.NoError(t, err)
	rec, err := stockops.NewReconciler(r, store, nil)
	require.NoError(t, err)
	h.settle(relay, rec)

	h.mu.Lock()
	ops := h.ops
	h.mu.Unlock()
	var acked, notRepl, unknown int
	for _, op := range ops {
		switch {
		case op.acked:
			acked++
		case op.notRepl:
			notRepl++
		case op.unknown:
			unknown++
		}
	}
	t.Logf("%d requests in %d calls (%d unknown outcomes retried, %d answered ErrFailover): %d acknowledged, %d done without a replica (ErrNotReplicated), %d with no definite answer",
		len(ops), h.calls.Load(), h.unk.Load(), h.fenced.Load(), acked, notRepl, unknown)
	require.Positive(t, notRepl, "the partitioned primary took writes no replica had (else the test proved nothing)")

	for _, sku := range ptSKUs {
		h.exact(store, sku, loaded[sku], ops)
	}

	// Every sale given back.
	for _, sku := range ptSKUs {
		for id, e := range testkit.Ledger(t, r, sku) {
			switch {
			case e.Kind == stock.KindRestock || !e.Taken():
			case e.State == stock.StateHeld:
				_, err := r.Cancel(ctx, sku, id)
				require.True(t, err == nil || errors.Is(err, stock.ErrNotReplicated), "cancel %s/%s: %v", sku, id, err)
			default:
				_, err := r.Restore(ctx, sku, id)
				require.True(t, err == nil || errors.Is(err, stock.ErrNotReplicated), "restore %s/%s: %v", sku, id, err)
			}
		}
	}
	h.settle(relay, rec)
	for _, sku := range ptSKUs {
		l := testkit.Levels(t, r, sku)
		assert.Equal(t, stock.Levels{Available: loaded[sku], Loaded: loaded[sku]}, l, "%s: every sale given back", sku)
		assert.Zero(t, storeTaken(t, store, sku), "%s: the store holds nothing taken", sku)
		rem, err := store.Remaining(ctx, sku)
		require.NoError(t, err)
		assert.Equal(t, loaded[sku], rem, "%s: the store's remaining stock", sku)
	}
	assert.LessOrEqual(t, store.MaxApplications(), 1, "no event applied twice")
}

// behind counts the ids the store has that the server at addr has no ledger entry for.
func (h *ptRun) behind(addr string, store *memstore.Store) int {
	t, ctx := h.t, context.Background()
	pc := kit.DirectClient(t, addr)
	n := 0
	for _, sku := range ptSKUs {
		ids, err := pc.Do(ctx, pc.B().Hkeys().Key("stock:{"+sku+"}:l").Build()).AsStrSlice()
		require.NoError(t, err)
		has := map[string]bool{}
		for _, id := range ids {
			has[id] = true
		}
		recs, err := store.List(ctx, sku, "", 1<<30)
		require.NoError(t, err)
		for _, rc := range recs {
			if !has[rc.ID] {
				n++
			}
		}
	}
	return n
}

// settle drains the relay, runs a reconcile pass over every item, drains again, and runs a
// last pass that must find everything in line.
func (h *ptRun) settle(relay *stockops.Relay, rec *stockops.Reconciler) {
	t := h.t
	foDrain(t, relay)
	for _, rp := range foReconcile(t, rec, ptSKUs) {
		t.Logf("reconcile: %s", rp)
	}
	foDrain(t, relay)
	for _, rp := range foReconcile(t, rec, ptSKUs) {
		assert.Zero(t, rp.Drift, "drift after the repair: %s", rp)
		assert.Zero(t, rp.Pending, "events pending after the drain: %s", rp)
		assert.Empty(t, rp.NeedsHuman, "%s", rp)
	}
}

// exact checks one item after the heal.
func (h *ptRun) exact(store *memstore.Store, sku string, loaded int64, ops []*ptOp) {
	t, ctx := h.t, context.Background()
	l := testkit.Levels(t, h.r, sku)
	t.Logf("%s: %+v", sku, l)
	assert.Equal(t, loaded, l.Loaded, "%s: Loaded is what was loaded and restocked: %+v", sku, l)
	taken, rem := checkBooks(t, store, sku, l)
	assert.Equal(t, loaded-taken, rem, "%s: the store's books: loaded - taken = remaining", sku)

	recs, err := store.List(ctx, sku, "", 1<<30)
	require.NoError(t, err)
	byID := map[string]stock.Record{}
	for _, rc := range recs {
		byID[rc.ID] = rc
	}
	sent := map[string]*ptOp{}
	for _, op := range ops {
		if op.sku == sku {
			sent[op.id] = op
		}
	}
	var phantom, lost, notGivenBack int
	for id, rc := range byID {
		if rc.Status != stock.StateApplied || (rc.Type != stock.EventDeducted && rc.Type != stock.EventConfirmed) {
			continue
		}
		op, ok := sent[id]
		if !ok || op.qty != rc.Qty || op.refused != nil {
			phantom++
			if phantom <= 5 {
				t.Errorf("%s/%s: the store holds %d units taken that no buyer was sold (op %+v)", sku, id, rc.Qty, op)
			}
		}
	}
	for id, op := range sent {
		if !op.acked || (op.restoreTried && !op.restored) {
			continue // not acknowledged, or given back with an outcome a failover may have lost
		}
		rc, ok := byID[id]
		taken := ok && rc.Status == stock.StateApplied
		switch {
		case !op.restored && !taken:
			if lost++; lost <= 5 {
				t.Errorf("%s/%s: acknowledged (a replica had it) and the store does not hold it as taken: %+v", sku, id, rc)
			}
		case op.restored && taken:
			if notGivenBack++; notGivenBack <= 5 {
				t.Errorf("%s/%s: its restore was acknowledged and the store still holds it as taken", sku, id)
			}
		}
	}
	assert.Zero(t, phantom+lost+notGivenBack, "%s: %d taken without a sale, %d acknowledged sales lost, %d acknowledged restores lost", sku, phantom, lost, notGivenBack)
}

// buyer makes requests with fresh ids until stop: deducts of one or two units, a hold confirmed
// at once now and then, a restore of one of its earlier sales now and then, and a repeat of an
// earlier id (a replay, or ErrRestored).
func (h *ptRun) buyer(w int, stop *atomic.Bool) {
	var mine []*ptOp
	for i := 0; !stop.Load(); i++ {
		op := &ptOp{kind: "deduct", sku: ptSKUs[i%len(ptSKUs)], id: fmt.Sprintf("w%d-%d", w, i), qty: int64(1 + i%2)}
		if i%7 == 5 {
			op.kind = "hold"
		}
		h.send(op)
		h.mu.Lock()
		h.ops = append(h.ops, op)
		h.mu.Unlock()
		mine = append(mine, op)
		switch {
		case i%5 == 4: // a restore of an earlier sale
			if prev := mine[len(mine)/2]; (prev.acked || prev.notRepl) && !prev.restored {
				_, err := h.call(func(ctx context.Context) (stock.Receipt, error) { return h.r.Restore(ctx, prev.sku, prev.id) })
				prev.restored, prev.restoreTried = err == nil, true
			}
		case i%5 == 2: // a repeat of an earlier id: never a second sale
			prev := mine[len(mine)/3]
			if prev.kind == "deduct" && (prev.acked || prev.notRepl) {
				rc, err := h.call(func(ctx context.Context) (stock.Receipt, error) {
					return h.r.Deduct(ctx, stock.Request{SKU: prev.sku, ID: prev.id, Qty: prev.qty, Retry: true})
				})
				// An ErrNotReplicated sale may be lost with the old primary before the relay
				// delivered it (known to no one: sold anew); an acknowledged one never.
				if err == nil && !rc.Replayed && prev.acked {
					h.t.Errorf("%s/%s: a repeat of an acknowledged deduct took stock again", prev.sku, prev.id)
				}
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// send makes op's request until a definite answer (see call), and records it.
func (h *ptRun) send(op *ptOp) {
	req := stock.Request{SKU: op.sku, ID: op.id, Qty: op.qty}
	_, err := h.call(func(ctx context.Context) (stock.Receipt, error) {
		if op.kind == "hold" {
			_, err := h.r.Hold(ctx, req, time.Minute)
			if err != nil && !errors.Is(err, stock.ErrNotReplicated) {
				return stock.Receipt{}, err
			}
			req.Retry = true
			return h.r.Confirm(ctx, op.sku, op.id)
		}
		rc, err := h.r.Deduct(ctx, req)
		req.Retry = true
		return rc, err
	})
	switch {
	case err == nil:
		op.acked = true
	case errors.Is(err, stock.ErrNotReplicated):
		op.notRepl = true
	case errors.Is(err, stock.ErrUnknownOutcome) || !kit.FaultSentinel(err):
		op.unknown = true
	default:
		op.refused = err
	}
}

// call makes a request until its answer is definite: a nil error, ErrNotReplicated or another
// sentinel. ErrFailover (the guard's fence until a reconcile pass) and unknown outcomes are
// retried with the same id, for up to 20s; the last error is returned then.
func (h *ptRun) call(f func(ctx context.Context) (stock.Receipt, error)) (stock.Receipt, error) {
	deadline := time.Now().Add(20 * time.Second)
	wait := 2 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		rc, err := f(ctx)
		cancel()
		h.calls.Add(1)
		switch {
		case err == nil || (kit.FaultSentinel(err) && !errors.Is(err, stock.ErrFailover)):
			return rc, err
		case errors.Is(err, stock.ErrFailover):
			h.fenced.Add(1)
		default:
			h.unk.Add(1)
		}
		if time.Now().After(deadline) {
			return rc, err
		}
		time.Sleep(wait)
		wait = min(2*wait, 100*time.Millisecond)
	}
}
