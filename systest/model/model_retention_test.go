package model_test

import (
	"maps"
	"slices"
	"testing"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/stockops"
)

// modelRetention is the Retention of the sequences that reconcile: a few ticks, so that a real
// server's run sleeps past it in tens of milliseconds.
const modelRetention = 5 * tick

// mRec is the model of one store record.
type mRec struct {
	typ      stock.EventType // deducted, confirmed, restocked or restored (a restore of an id it never had)
	qty      int64
	user     string
	status   stock.State // applied, restored or refused
	at, atHi int64       // when it was first written (a window on a real server)
}

// mStore is the model of the store's side of one item.
type mStore struct {
	loaded    bool
	remaining int64
	recs      map[string]*mRec
}

// mEvent is an event the library queued and no drain delivered yet.
type mEvent struct {
	typ  stock.EventType
	id   string
	qty  int64
	user string
}

// reconcileRig is what a sequence with a Retention reconciles with.
type reconcileRig struct {
	store                            *testStore
	relay                            *stockops.Relay
	rec                              *stockops.Reconciler
	stores                           map[string]*mStore
	pend                             map[string][]mEvent
	passes, trims, repairs, resynced int
	// unsure: entries whose trim the model cannot tell on a real server (their time and the
	// pass's cutoff too close): read back after the pass.
	unsure map[[2]string]bool
}

func (h *harness) mstore(sku string) *mStore {
	st := h.rc.stores[sku]
	if st == nil {
		st = &mStore{recs: map[string]*mRec{}}
		h.rc.stores[sku] = st
	}
	return st
}

// window widens [t0, t1] by slack on a real server.
func (h *harness) window(t0, t1 int64) (int64, int64) {
	if h.real {
		return t0 - slack, t1 + slack
	}
	return t0, t1
}

// noteEvents stamps the entries a step made or settled with its time, and queues the events
// the library queued for them: a deduct's and a confirm's "deducted", a restock's, a sale given
// back's "restored" (holds' events do not reach the store, nor do tombstones).
func (h *harness) noteEvents(s mstep, old *world, t0, t1 int64) {
	if h.rc == nil {
		return
	}
	lo, hi := h.window(t0, t1)
	if s.Op == "load" {
		if it := h.w.item(s.SKU); it != nil && old.item(s.SKU) == nil {
			st := h.mstore(s.SKU)
			st.loaded, st.remaining = true, s.Qty
			if err := h.rc.store.Load(h.ctx, s.SKU, s.Qty); err != nil {
				h.fail("store Load(%s, %d): %v", s.SKU, s.Qty, err)
			}
		}
	}
	for _, sku := range slices.Sorted(maps.Keys(h.w.items)) {
		it := h.w.items[sku]
		for _, id := range slices.Sorted(maps.Keys(it.ledger)) {
			e := it.ledger[id]
			var oe *mEntry
			if oi := old.items[sku]; oi != nil {
				oe = oi.ledger[id]
			}
			q := func(typ stock.EventType) {
				h.rc.pend[sku] = append(h.rc.pend[sku], mEvent{typ: typ, id: id, qty: e.qty, user: e.user})
			}
			if oe == nil {
				e.at, e.atHi = lo, hi
				switch {
				case e.kind == stock.KindRestock:
					q(stock.EventRestocked)
				case e.kind == stock.KindDeduct && e.state == stock.StateReserved:
					q(stock.EventDeducted)
				case e.kind == stock.KindDeduct && e.state == stock.StateRestored: // a cart's line undone
					q(stock.EventDeducted)
					q(stock.EventRestored)
					e.settled, e.settledHi = lo, hi
				}
				continue
			}
			switch {
			case oe.state == stock.StateHeld && e.state == stock.StateReserved:
				q(stock.EventConfirmed)
			case oe.state == stock.StateReserved && e.state == stock.StateRestored && e.kind != stock.KindRestock:
				q(stock.EventRestored)
				e.settled, e.settledHi = lo, hi
				if e.kind == stock.KindHold {
					// A confirmed hold given back: its last field becomes the latest of its
					// deadline and now (restore.lua), which Ledger reports as its Deadline.
					h.settleDeadline(sku, id, e, lo, hi)
				}
			}
		}
	}
}

// settleDeadline sets a given-back hold's deadline to the latest of it and the give-back's
// time, reading it back where the model cannot tell (a real server).
func (h *harness) settleDeadline(sku, id string, e *mEntry, lo, hi int64) {
	switch {
	case e.deadline >= hi:
	case lo == hi:
		e.deadline = lo
	default:
		le, err := h.rs[0].Ledger(h.ctx, sku, id)
		if err != nil || le.Deadline.UnixMilli() < lo || le.Deadline.UnixMilli() > max(hi, e.deadline) {
			h.fail("Ledger(%s, %s) of a hold given back = %+v, %v: want its deadline in [%d, %d]", sku, id, le, err, lo, hi)
		}
		e.deadline = le.Deadline.UnixMilli()
	}
}

// retainedFrom is the window of when an entry's retention starts: the latest of when it was
// made, a hold's deadline and when a sale was given back (or the store refused it).
func (e *mEntry) retainedFrom() (int64, int64) {
	lo, hi := e.at, e.atHi
	if e.kind == stock.KindHold {
		lo, hi = max(lo, e.deadline), max(hi, e.deadline)
	}
	return max(lo, e.settled), max(hi, e.settledHi)
}

// runDrain delivers every queued event to the store, in the model and in the library.
func (h *harness) runDrain(s mstep) {
	h.t.Helper()
	h.steps = append(h.steps, s.String())
	h.drainBoth()
	h.compareAll(s)
}

// drainBoth drains the relay and the model's queue of events.
func (h *harness) drainBoth() {
	h.t.Helper()
	t0 := h.clk.now()
	h.drainLib()
	h.drainModel(t0, h.clk.now())
}

// compareAll compares the levels and the ledger of every item of the pool.
func (h *harness) compareAll(s mstep) {
	h.t.Helper()
	h.compare(s)
	for _, sku := range modelSKUs {
		h.compareLedger(s, sku)
	}
}

func (h *harness) drainLib() {
	h.t.Helper()
	for range 1000 {
		st, err := h.rc.relay.Once(h.ctx)
		if err != nil {
			h.fail("relay Once: %v", err)
		}
		if st.Claimed == 0 {
			return
		}
	}
	h.fail("the relay did not drain in 1000 rounds")
}

// drainModel applies the queued events to the model's store, as memstore does; a deduct or
// confirm it refuses is given back in Redis (refused).
func (h *harness) drainModel(t0, t1 int64) {
	lo, hi := h.window(t0, t1)
	for _, sku := range slices.Sorted(maps.Keys(h.rc.pend)) {
		st := h.mstore(sku)
		for _, ev := range h.rc.pend[sku] {
			rec := st.recs[ev.id]
			switch ev.typ {
			case stock.EventDeducted, stock.EventConfirmed:
				if rec != nil {
					continue // seen: applied once (a refused one is never queued again here)
				}
				rec = &mRec{typ: ev.typ, qty: ev.qty, user: ev.user, status: stock.StateApplied, at: lo, atHi: hi}
				st.recs[ev.id] = rec
				if !st.loaded || st.remaining < ev.qty {
					rec.status = stock.StateRefused
					h.refuse(sku, ev.id, lo, hi)
					continue
				}
				st.remaining -= ev.qty
			case stock.EventRestored:
				if rec == nil {
					st.recs[ev.id] = &mRec{typ: ev.typ, qty: ev.qty, user: ev.user, status: stock.StateRestored, at: lo, atHi: hi}
					continue
				}
				if rec.status == stock.StateApplied && rec.typ != stock.EventRestocked {
					rec.status = stock.StateRestored
					st.remaining += rec.qty
				}
			case stock.EventRestocked:
				if rec != nil {
					continue
				}
				if !st.loaded {
					h.fail("model: a restock of %s delivered to a store without the item", sku)
				}
				st.recs[ev.id] = &mRec{typ: ev.typ, qty: ev.qty, status: stock.StateApplied, at: lo, atHi: hi}
				st.remaining += ev.qty
			}
		}
	}
	h.rc.pend = map[string][]mEvent{}
}

// refuse gives back in Redis a sale the store refused (restore.lua, reason refused).
func (h *harness) refuse(sku, id string, lo, hi int64) {
	it := h.w.item(sku)
	e := it.ledger[id]
	if e == nil || e.state != stock.StateReserved {
		return // given back before the drain: the restore event follows
	}
	it.putBack(e, stock.StateRefused)
	e.settled, e.settledHi = lo, hi
	if e.kind == stock.KindHold {
		h.settleDeadline(sku, id, e, lo, hi)
	}
}

// runPass drains the relay, runs one reconcile pass, and checks it against the model's.
func (h *harness) runPass(s mstep) {
	h.t.Helper()
	h.steps = append(h.steps, s.String())
	h.drainBoth()
	// Resolve the tombstones the model was unsure of before the pass judges them.
	for _, sku := range modelSKUs {
		h.compareLedger(mstep{Op: "drain"}, sku)
	}
	p0 := h.clk.now()
	reps, err := h.rc.rec.Once(h.ctx)
	p1 := h.clk.now()
	if err != nil {
		h.fail("reconcile Once: %v", err)
	}
	h.rc.passes++
	byItem := map[string]stockops.Report{}
	for _, rp := range reps {
		byItem[rp.SKU] = rp
	}
	h.rc.unsure = map[[2]string]bool{}
	for _, sku := range modelSKUs {
		it := h.w.item(sku)
		if it == nil {
			continue
		}
		rp, ok := byItem[sku]
		if !ok {
			h.fail("after %s: no report of %s (reports %v)", s, sku, reps)
		}
		if rp.Busy || rp.NeedsHuman != "" {
			h.fail("after %s: report of %s: %v", s, sku, rp)
		}
		h.passItem(s, sku, it, p0, p1)
	}
	// Read back what the model could not tell.
	for k := range h.rc.unsure {
		sku, id := k[0], k[1]
		if _, err := h.rs[0].Ledger(h.ctx, sku, id); err != nil {
			h.w.items[sku].trim(id)
		}
	}
	h.compareAll(s)
}

// passItem is the model of one item's reconcile pass at a time in [p0, p1].
func (h *harness) passItem(s mstep, sku string, it *mItem, p0, p1 int64) {
	h.t.Helper()
	st := h.mstore(sku)
	ret := modelRetention.Milliseconds()
	cutLo, cutHi := h.window(p0-ret, p1-ret)
	plo, phi := h.window(p0, p1)
	ids := slices.Sorted(maps.Keys(it.ledger))
	// What the pass reads of each entry decides its lists; the resyncs write before the trim.
	type cand struct {
		id   string
		sure bool
	}
	var trim []cand
	for _, id := range ids {
		e := it.ledger[id]
		rlo, rhi := e.retainedFrom()
		if e.state != stock.StateHeld && rlo < cutHi {
			trim = append(trim, cand{id: id, sure: rhi < cutLo})
		}
	}
	for _, id := range ids {
		e := it.ledger[id]
		rec := st.recs[id]
		switch {
		case rec == nil:
		case e.kind != stock.KindRestock && e.kind != stock.KindTombstone && e.state == stock.StateReserved &&
			(rec.status == stock.StateRestored || rec.status == stock.StateRefused):
			// A sale the store gave back: given back in Redis, with no event.
			h.rc.resynced++
			it.putBack(e, rec.status) // restored or refused, as in the store
			e.settled, e.settledHi = plo, phi
			if e.kind == stock.KindHold {
				h.settleDeadline(sku, id, e, plo, phi)
			}
		case e.kind == stock.KindHold && e.state == stock.StateHeld && rec.typ == stock.EventConfirmed:
			// A live hold the store has confirmed: confirmed in Redis (applied, no event), or,
			// given back there, released.
			h.rc.resynced++
			switch {
			case rec.status == stock.StateApplied:
				e.state = stock.StateReserved
				it.held -= e.qty
				it.sold += e.qty
			case e.deadline <= plo:
				it.putBack(e, stock.StateExpired)
			case e.deadline > phi:
				it.putBack(e, stock.StateCancelled)
			default:
				h.fail("model: a hold of %s due during the pass resynced", sku)
			}
		}
	}
	for _, c := range trim {
		e := it.ledger[c.id]
		rlo, rhi := e.retainedFrom()
		if rlo >= cutHi {
			continue // resynced in this pass: settled now
		}
		sure := c.sure && rhi < cutLo
		if rec := st.recs[c.id]; rec != nil {
			if rec.at >= cutHi {
				continue // its store record is younger than the retention: kept
			}
			sure = sure && rec.atHi < cutLo
		}
		if !sure {
			h.rc.unsure[[2]string{sku, c.id}] = true
			continue
		}
		it.trim(c.id)
		h.rc.trims++
	}
	// Records the store has and Redis lost would be written back: with no fault, a record
	// whose entry was trimmed is older than the retention, and none is.
	for id, rec := range st.recs {
		if it.ledger[id] == nil && !h.rc.unsure[[2]string{sku, id}] && rec.at >= cutHi {
			h.fail("model: pass of %s would write back %s (%+v): not modelled", sku, id, *rec)
		}
	}
	// The drift: Redis's available and held stock against the store's (nothing pending).
	if !st.loaded {
		h.fail("model: %s is loaded in Redis and not in the store", sku)
	}
	d := st.remaining - (it.avail + it.held)
	if d == 0 {
		return
	}
	h.rc.repairs++
	if it.avail+d < 0 {
		h.fail("model: pass of %s: drift %d beyond the available %d", sku, -d, it.avail)
	}
	it.avail += d
	if d < 0 {
		it.sold -= d // units the store took that Redis counted as available: sold
		return
	}
	back := min(d, it.sold) // units Redis sold twice (an id sold again after its trim): back from sold
	it.sold -= back
	it.loaded += d - back
}

// setupReconcile gives a sequence with a Retention its store, relay and reconciler, on a
// Reserver of its own with the sequence's prefix and options (and, on miniredis, its clock).
func (h *harness) setupReconcile(c rueidis.Client, opts []stock.Option) {
	if mc, ok := h.clk.(*miniClock); ok {
		opts = append(opts, stock.WithClock(mc.nowTime))
	}
	r, err := stock.New(c, opts...)
	require.NoError(h.t, err)
	rg := &reconcileRig{stores: map[string]*mStore{}, pend: map[string][]mEvent{}, store: newTestStore(h.clk.now)}
	rg.relay, rg.rec = pipeline(h.t, r, rg.store, nil, &stock.ReconcileOptions{Retention: modelRetention})
	h.rc = rg
}

// modelRetentionCases are the edges of the retention and the repair, as named sequences. All but
// the last failed on the code before the retention counted from when an entry settled and a
// repair kept Loaded what was loaded and restocked; the last guards the resync of a sale the
// store gave back.
var modelRetentionCases = []modelCase{
	// A hold that lives longer than the retention, cancelled after the retention has passed
	// since it was made: its entry is kept for the retention after its deadline, so a repeated
	// cancel is a replay and a repeated hold takes nothing.
	{name: "LongHoldCancelledKeepsItsEntry", cfg: mconfig{Retention: true}, steps: []mstep{
		{Op: "load", SKU: "tee", Qty: 5},
		{Op: "hold", SKU: "tee", ID: "o1", Qty: 2, TTL: 2 * modelRetention},
		{Op: "advance", TTL: modelRetention + tick},
		{Op: "cancel", SKU: "tee", ID: "o1"},
		{Op: "pass"},
		{Op: "cancel", SKU: "tee", ID: "o1"},
		{Op: "hold", SKU: "tee", ID: "o1", Qty: 2, TTL: tick},
		{Op: "advance", TTL: 2 * modelRetention},
		{Op: "pass"},
		{Op: "hold", SKU: "tee", ID: "o1", Qty: 2, TTL: tick},
	}},
	// A hold that lives longer than the retention and expires: a confirm after a pass still
	// answers ErrExpired, and a repeated hold takes nothing.
	{name: "LongHoldExpiredKeepsItsEntry", cfg: mconfig{Retention: true}, steps: []mstep{
		{Op: "load", SKU: "tee", Qty: 5},
		{Op: "hold", SKU: "tee", ID: "o1", Qty: 2, TTL: modelRetention + tick},
		{Op: "advance", TTL: modelRetention + 3*tick},
		{Op: "sweep", SKU: "tee"},
		{Op: "pass"},
		{Op: "confirm", SKU: "tee", ID: "o1"},
		{Op: "hold", SKU: "tee", ID: "o1", Qty: 2, TTL: tick},
	}},
	// A sale given back after the retention: the entry is kept for the retention after the
	// restore, so a repeated deduct takes nothing and a repeated restore is a replay.
	{name: "SaleGivenBackLateKeepsItsEntry", cfg: mconfig{Retention: true}, steps: []mstep{
		{Op: "load", SKU: "tee", Qty: 5},
		{Op: "deduct", SKU: "tee", ID: "o1", Qty: 2},
		{Op: "drain"},
		{Op: "advance", TTL: modelRetention + tick},
		{Op: "restore", SKU: "tee", ID: "o1"},
		{Op: "pass"},
		{Op: "deduct", SKU: "tee", ID: "o1", Qty: 2},
		{Op: "restore", SKU: "tee", ID: "o1"},
	}},
	// A confirmed hold given back late: the same, for a hold's sale.
	{name: "ConfirmedHoldGivenBackLateKeepsItsEntry", cfg: mconfig{Retention: true}, steps: []mstep{
		{Op: "load", SKU: "tee", Qty: 5},
		{Op: "hold", SKU: "tee", ID: "o1", Qty: 2, TTL: tick},
		{Op: "confirm", SKU: "tee", ID: "o1"},
		{Op: "advance", TTL: modelRetention + 3*tick},
		{Op: "restore", SKU: "tee", ID: "o1"},
		{Op: "pass"},
		{Op: "confirm", SKU: "tee", ID: "o1"},
		{Op: "restore", SKU: "tee", ID: "o1"},
	}},
	// An id sold again after its entry was trimmed, which the store took once: the repair
	// takes the unit back from sold (Loaded stays 10), and restores give back what they took.
	{name: "RepairOfIDSoldAgainAfterTrim", cfg: mconfig{Retention: true}, steps: []mstep{
		{Op: "load", SKU: "tee", Qty: 10},
		{Op: "deduct", SKU: "tee", ID: "o1", Qty: 1},
		{Op: "deduct", SKU: "tee", ID: "o2", Qty: 2},
		{Op: "pass"},
		{Op: "advance", TTL: modelRetention + tick},
		{Op: "pass"},
		{Op: "deduct", SKU: "tee", ID: "o1", Qty: 1},
		{Op: "pass"},
		{Op: "restore", SKU: "tee", ID: "o1"},
		{Op: "restore", SKU: "tee", ID: "o2"},
		{Op: "pass"},
	}},
	// An id sold and given back, trimmed, then sold again: the store has it given back, so the
	// pass gives it back in Redis too (no event), and nothing goes below zero.
	{name: "ResyncOfIDSoldAgainAfterItsRestoreWasTrimmed", cfg: mconfig{Retention: true}, steps: []mstep{
		{Op: "load", SKU: "tee", Qty: 10},
		{Op: "deduct", SKU: "tee", ID: "o1", Qty: 1},
		{Op: "restore", SKU: "tee", ID: "o1"},
		{Op: "advance", TTL: modelRetention + tick},
		{Op: "pass"},
		{Op: "deduct", SKU: "tee", ID: "o1", Qty: 1},
		{Op: "pass"},
		{Op: "restore", SKU: "tee", ID: "o1"},
		{Op: "pass"},
	}},
}

// TestModelRetentionRegressions runs the named cases of retention time and repairs.
func TestModelRetentionRegressions(t *testing.T) { runCases(t, modelRetentionCases) }
