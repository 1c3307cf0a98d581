package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/stockres/stock"
	"github.com/stockres/stock/sqlstore"
	"github.com/stockres/stock/stockops"
)

const userLimit = 2

// Report is what a run did and found.
type Report struct {
	Prefix    string        // the Redis key prefix of the run
	Buyers    int           // buyers who came before the sale ended
	Late      int           // buyers who would have come after it ended
	Ops       int64         // Reserver calls made by buyers, retries included
	Elapsed   time.Duration // the buying phase
	Items     []ItemReport
	Outcomes  []OutcomeCount
	Reconcile []stockops.Report // the final reconcile pass
	Checks    []Check
	Passed    bool   // every check passed
	Failover  string // what -failover-at did, or ""
}

// ItemReport is one item at the end of the sale.
type ItemReport struct {
	SKU         string
	Loaded      int64        // units loaded
	Bought      int64        // units buyers were told they bought and kept (not restored)
	Redis       stock.Levels // Redis's counters
	DBRemaining int64        // the database's remaining stock
	DBApplied   int64        // units of the database's applied deduct and confirm records
}

// OutcomeCount counts one outcome of one kind of call.
type OutcomeCount struct {
	Op, Outcome string // Outcome is stock.Outcome(err), or "replay" for a replayed success
	Count       int64
	Why         string // "" when the outcome is not one this call may have: unexplained
}

// Check is one invariant.
type Check struct {
	Name   string
	OK     bool
	Detail string
}

// The outcomes each call may have, and why. Anything else is unexplained and fails the run.
var (
	refusals = map[string]string{
		"sold_out":     "nothing left",
		"insufficient": "asked for 2, 1 left",
		"user_limit":   fmt.Sprintf("over the limit of %d per user", userLimit),
	}
	explained = map[string]map[string]string{
		"deduct":                with(refusals, "ok", "bought"),
		"deduct retry":          with(refusals, "replay", "same id again: the first answer, nothing taken twice", "ok", "first try refused, the retry bought"),
		"deduct same id, qty±1": with(refusals, "conflict", "id reused with another quantity: refused", "ok", "first try refused, this one bought"),
		"hold":                  with(refusals, "ok", "held"),
		"confirm":               {"ok": "paid and confirmed", "expired": "payment outlasted the hold: stock went back"},
		"confirm late":          {"expired": "hold past its TTL: stock went back"},
		"cancel":                {"ok": "hold given back"},
		"restore":               {"ok": "bought, then given back", "replay": "restored twice: given back once"},
	}
)

// patientExplained adds, to every call, the outcomes a failover explains: the calls were
// retried with the same request id until they got a definite answer.
func patientExplained() map[string]map[string]string {
	out := map[string]map[string]string{}
	for op, m := range explained {
		out[op] = with(m,
			"error", "unknown outcome while the primary changed: retried with the same id",
			"timeout", "unknown outcome while the primary changed: retried with the same id",
			"failover", "fenced until a reconcile pass compared the new primary with the database: retried",
			"not_replicated", "done, not yet acknowledged by the replicas: retried with the same id")
		if _, ok := out[op]["replay"]; !ok {
			out[op]["replay"] = "a retry after an unknown outcome: the first attempt had been done"
		}
	}
	// A short hold (hold-expire) whose first attempt was done, retried after its deadline.
	out["hold"]["expired"] = "a retry after an unknown outcome: the first attempt had held, and the hold expired meanwhile"
	return out
}

func with(base map[string]string, kv ...string) map[string]string {
	m := map[string]string{}
	for k, v := range base {
		m[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// What buyers do, with weights.
var behaviours = []struct {
	name   string
	weight int
}{
	{"buy", 40},          // one deduct
	{"retry", 15},        // presses the button 2-3 times: the same request id
	{"change", 4},        // a buggy client reuses its request id with another quantity
	{"greedy", 10},       // three orders at once: one is over the per-user limit
	{"hold-confirm", 13}, // hold, pay, confirm
	{"hold-cancel", 7},   // hold, change their mind, cancel
	{"hold-expire", 5},   // hold with a short TTL and walk away (half come back to confirm, too late)
	{"buy-restore", 6},   // buy, then give it back (some twice)
}

// Final states of a request id, as its buyer knows it.
const (
	stNone      = ""          // took nothing
	stSold      = "sold"      // bought (deduct or confirmed hold) and kept
	stRestored  = "restored"  // bought and given back
	stCancelled = "cancelled" // held and cancelled
	stExpired   = "expired"   // held and expired
)

type idRecord struct {
	sku, id, user string
	qty           int64
	hold          bool
	state         string
}

type sale struct {
	cfg config
	// patient: on Sentinel, where the primary can change under the sale, an unknown outcome,
	// ErrFailover and ErrNotReplicated are retried with the same request id until a definite
	// answer (up to 5 minutes), and explained by the failover.
	patient   bool
	explained map[string]map[string]string
	fo        *failoverRun // -failover-at
	r         *stock.Reserver
	watch     *stock.Reserver // on its own client, for the progress line
	skus      []string
	ctx       context.Context // for Reserver calls: not cancelled when the sale ends

	stop    chan struct{} // closed when the sale ends: buyers start nothing new
	endOnce sync.Once

	ops, refusals, arrived, late atomic.Int64

	mu        sync.Mutex
	counts    map[[2]string]int64
	ids       []idRecord
	anomalies []string // answers that break a promise of the library
}

func (s *sale) end() { s.endOnce.Do(func() { close(s.stop) }) }

func (s *sale) ended() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

func (s *sale) anomaly(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.anomalies = append(s.anomalies, fmt.Sprintf(format, args...))
}

// do makes one call and counts its outcome. An unknown outcome (a transport error) is retried
// with the same request id, as the library asks; it is still counted, and fails the run.
func (s *sale) do(op string, f func() (stock.Receipt, error)) (stock.Receipt, error) {
	deadline := time.Now().Add(5 * time.Minute)
	for try := 1; ; try++ {
		start := time.Now()
		rc, err := f()
		if err == nil && s.fo != nil {
			s.fo.succeeded(start)
		}
		out := stock.Outcome(err)
		if err == nil && rc.Replayed {
			out = "replay"
		}
		s.ops.Add(1)
		if err != nil {
			s.refusals.Add(1)
		}
		s.mu.Lock()
		s.counts[[2]string{op, out}]++
		s.mu.Unlock()
		if (out == "error" || out == "timeout") && try < 5 {
			time.Sleep(time.Duration(try) * 50 * time.Millisecond)
			continue
		}
		if s.patient && (out == "error" || out == "timeout" || out == "failover" || out == "not_replicated") && time.Now().Before(deadline) {
			time.Sleep(min(time.Duration(try)*50*time.Millisecond, time.Second))
			continue
		}
		return rc, err
	}
}

func pause(rng *rand.Rand, max time.Duration) {
	time.Sleep(time.Duration(rng.Int64N(int64(max) + 1)))
}

// buyer plays buyer b: arrives within the arrival window, does what its behaviour says.
func (s *sale) buyer(b int, arrival time.Duration) {
	rng := rand.New(rand.NewPCG(s.cfg.Seed, uint64(b)))
	delay := time.Duration(rng.Int64N(int64(arrival) + 1))
	w := rng.IntN(100)
	kind := behaviours[len(behaviours)-1].name
	for _, bh := range behaviours {
		if w < bh.weight {
			kind = bh.name
			break
		}
		w -= bh.weight
	}
	sku := s.skus[rng.IntN(len(s.skus))]
	qty := int64(1)
	if rng.IntN(8) == 0 {
		qty = 2
	}
	req := stock.Request{SKU: sku, ID: fmt.Sprintf("b%d-1", b), User: fmt.Sprintf("user-%d", b), Qty: qty}

	t := time.NewTimer(delay)
	select {
	case <-s.stop:
		t.Stop()
		s.late.Add(1)
		return
	case <-t.C:
	}
	s.arrived.Add(1)

	ctx, r := s.ctx, s.r
	deduct := func(op string, q stock.Request) (stock.Receipt, error) {
		return s.do(op, func() (stock.Receipt, error) { return r.Deduct(ctx, q) })
	}
	var recs []idRecord
	record := func(q stock.Request, hold bool, state string) {
		recs = append(recs, idRecord{sku: q.SKU, id: q.ID, user: q.User, qty: q.Qty, hold: hold, state: state})
	}
	switch kind {
	case "buy":
		_, err := deduct("deduct", req)
		record(req, false, soldIf(err == nil))

	case "retry":
		_, err := deduct("deduct", req)
		ok := err == nil
		for range 1 + rng.IntN(2) {
			if s.ended() {
				break
			}
			pause(rng, 20*time.Millisecond)
			rc, err := deduct("deduct retry", req)
			if ok && (err != nil || !rc.Replayed) {
				s.anomaly("retry of sold %s/%s: replayed=%v err=%v", req.SKU, req.ID, rc.Replayed, err)
			}
			ok = ok || err == nil
		}
		record(req, false, soldIf(ok))

	case "change":
		_, err := deduct("deduct", req)
		other := req
		other.Qty = 3 - req.Qty
		_, err2 := deduct("deduct same id, qty±1", other)
		switch {
		case err == nil:
			if !errors.Is(err2, stock.ErrConflict) {
				s.anomaly("reuse of sold %s/%s with qty %d: %v, want a conflict", req.SKU, req.ID, other.Qty, err2)
			}
			record(req, false, stSold)
		case err2 == nil:
			record(other, false, stSold)
		default:
			record(req, false, stNone)
		}

	case "greedy": // three orders at once, from three browser tabs: at most two go through
		var mu sync.Mutex
		var tabs sync.WaitGroup
		got := 0
		for k := 1; k <= 3; k++ {
			q := req
			q.ID, q.Qty = fmt.Sprintf("b%d-%d", b, k), 1
			tabs.Go(func() {
				_, err := deduct("deduct", q)
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					got++
				}
				record(q, false, soldIf(err == nil))
			})
		}
		tabs.Wait()
		if got > userLimit {
			s.anomaly("user %s bought %d units, over the limit of %d", req.User, got, userLimit)
		}

	case "hold-confirm", "hold-cancel":
		_, err := s.do("hold", func() (stock.Receipt, error) { return r.Hold(ctx, req, s.cfg.HoldTTL) })
		if err != nil {
			record(req, true, stNone)
			break
		}
		pause(rng, 30*time.Millisecond) // the payment
		state := stSold
		if kind == "hold-confirm" {
			_, err = s.do("confirm", func() (stock.Receipt, error) { return r.Confirm(ctx, req.SKU, req.ID) })
			if errors.Is(err, stock.ErrExpired) {
				state = stExpired
			}
		} else {
			state = stCancelled
			_, err = s.do("cancel", func() (stock.Receipt, error) { return r.Cancel(ctx, req.SKU, req.ID) })
		}
		if err != nil && state != stExpired {
			s.anomaly("%s of live hold %s/%s: %v", kind, req.SKU, req.ID, err)
		}
		record(req, true, state)

	case "hold-expire":
		_, err := s.do("hold", func() (stock.Receipt, error) { return r.Hold(ctx, req, s.cfg.ExpireTTL) })
		if err != nil {
			record(req, true, stNone)
			break
		}
		// Walk away past the deadline, even when the sale ends: the hold must be gone (swept)
		// before the checks.
		time.Sleep(2 * s.cfg.ExpireTTL)
		if rng.IntN(2) == 0 {
			_, err = s.do("confirm late", func() (stock.Receipt, error) { return r.Confirm(ctx, req.SKU, req.ID) })
			if !errors.Is(err, stock.ErrExpired) {
				s.anomaly("late confirm of %s/%s: %v, want expired", req.SKU, req.ID, err)
			}
		}
		record(req, true, stExpired)

	case "buy-restore":
		_, err := deduct("deduct", req)
		if err != nil || s.ended() {
			record(req, false, soldIf(err == nil))
			break
		}
		pause(rng, 50*time.Millisecond)
		times := 1 + rng.IntN(3)/2
		for i := range times {
			rc, err := s.do("restore", func() (stock.Receipt, error) { return r.Restore(ctx, req.SKU, req.ID) })
			// (A restore retried after an unknown outcome may find its first attempt done.)
			if err != nil || (rc.Replayed != (i > 0) && !(s.patient && rc.Replayed)) || rc.Qty != req.Qty {
				s.anomaly("restore %d of %s/%s: qty %d replayed=%v err=%v", i+1, req.SKU, req.ID, rc.Qty, rc.Replayed, err)
			}
		}
		record(req, false, stRestored)
	}
	s.mu.Lock()
	s.ids = append(s.ids, recs...)
	s.mu.Unlock()
}

func soldIf(ok bool) string {
	if ok {
		return stSold
	}
	return stNone
}

// progress writes a progress line every tick until done is closed, then a last one.
func (s *sale) progress(out io.Writer, start time.Time, done <-chan struct{}) {
	every := time.Second
	if s.cfg.TTY {
		every = 200 * time.Millisecond
	}
	t := time.NewTicker(every)
	defer t.Stop()
	lastOps, lastAt := int64(0), start
	line := func() string {
		var sold, held, avail, loaded int64
		for _, sku := range s.skus {
			lv, err := s.watch.Levels(s.ctx, sku)
			if err != nil {
				continue
			}
			sold, held, avail, loaded = sold+lv.Sold, held+lv.Held, avail+lv.Available, loaded+lv.Loaded
		}
		now, ops := time.Now(), s.ops.Load()
		rate := float64(ops-lastOps) / max(now.Sub(lastAt).Seconds(), 1e-3)
		lastOps, lastAt = ops, now
		return fmt.Sprintf("%5.1fs  buyers %d/%d  sold %d/%d  held %d  remaining %d  refused %d  %.0f ops/s",
			now.Sub(start).Seconds(), s.arrived.Load(), s.cfg.Buyers, sold, loaded, held, avail, s.refusals.Load(), rate)
	}
	show := func() {
		if s.cfg.TTY {
			fmt.Fprintf(out, "\r%s\033[K", line())
		} else {
			fmt.Fprintln(out, line())
		}
	}
	for {
		select {
		case <-done:
			if s.cfg.TTY {
				show()
				fmt.Fprintln(out)
			}
			return
		case <-t.C:
			show()
		}
	}
}

// logCounter is a slog handler that counts warnings and errors and keeps the first few.
type logCounter struct {
	mu    sync.Mutex
	n     int
	first []string
}

func (h *logCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h *logCounter) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h *logCounter) WithGroup(string) slog.Handler                { return h }
func (h *logCounter) Handle(ctx context.Context, r slog.Record) error {
	if ctx.Err() != nil {
		return nil // the background work being stopped at the end of the sale
	}
	var b strings.Builder
	b.WriteString(r.Level.String() + " " + r.Message)
	r.Attrs(func(a slog.Attr) bool { b.WriteString(" " + a.String()); return true })
	h.mu.Lock()
	defer h.mu.Unlock()
	h.n++
	if len(h.first) < 5 {
		h.first = append(h.first, b.String())
	}
	return nil
}

// observer counts the relay's and the reconciler's work.
type observer struct {
	reconciles, drifts, reconcileErrs, relayBatches, relayErrs atomic.Int64
	local                                                      atomic.Int64 // sold out, answered in-process
}

func (o *observer) Observe(ctx context.Context, ob stock.Observation) {
	if ctx.Err() != nil {
		return // the background work being stopped at the end of the sale: not a failure
	}
	if ob.Local {
		o.local.Add(1)
	}
	switch ob.Op {
	case "reconcile":
		o.reconciles.Add(1)
		if ob.Units != 0 {
			o.drifts.Add(1)
		}
		if ob.Outcome != "ok" {
			o.reconcileErrs.Add(1)
		}
	case "relay":
		o.relayBatches.Add(1)
		if ob.Outcome != "ok" {
			o.relayErrs.Add(1)
		}
	}
}

// run runs one flash sale as cfg says, prints the progress and the report to out, and
// returns the report. An error means the sale could not run; a failed check is
// Report.Passed == false.
func run(ctx context.Context, cfg config, out io.Writer) (rep Report, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return rep, err
	}
	rep.Prefix = cfg.Prefix
	// Reserver calls and the clean-up finish even when ctx is cancelled (an interrupt).
	octx := context.WithoutCancel(ctx)

	// Two clients: the buyers' calls queue on the first one's connection, the progress line
	// reads on the second, so it is not stuck behind thousands of buyers.
	clients, rdesc, closeRedis, err := openRedis(cfg, 2)
	if err != nil {
		return rep, err
	}
	defer closeRedis()
	client := clients[0]
	db, err := openDB(cfg)
	if err != nil {
		return rep, err
	}
	defer db.close(cfg.Keep, out)

	logs := &logCounter{}
	obs := &observer{}
	ropts := []stock.Option{stock.WithPrefix(cfg.Prefix), stock.WithUserLimit(userLimit),
		stock.WithLogger(slog.New(logs)), stock.WithObserver(obs)}
	if cfg.ReplicaAck > 0 {
		ropts = append(ropts, stock.WithReplicaAck(cfg.ReplicaAck, 2*time.Second))
	}
	// Every Reserver of the run splits the items alike: one that does not finds them not loaded.
	var split []stock.Option
	if n := cfg.Buckets; n > 1 {
		split = append(split, stock.WithBuckets(func(string) int { return n }))
	}
	ropts = append(ropts, split...)
	r, err := stock.New(client, ropts...)
	if err != nil {
		return rep, err
	}
	// On Sentinel a FailoverGuard fences the Reserver when the primary changes, until a
	// reconcile pass has compared the new primary with the database. Its first check, before
	// anything is loaded under the run's prefix, records the current primary as reconciled.
	var guard *stockops.FailoverGuard
	if cfg.Sentinel != "" {
		guard = stockops.NewFailoverGuard(r)
		if _, err := guard.Check(octx); err != nil {
			return rep, err
		}
	}
	watch, err := stock.New(clients[1], append([]stock.Option{stock.WithPrefix(cfg.Prefix)}, split...)...)
	if err != nil {
		return rep, err
	}
	tprefix := tablePrefix(cfg.Prefix)
	store, err := sqlstore.New(db.db, db.dialect, sqlstore.WithTablePrefix(tprefix))
	if err != nil {
		return rep, err
	}
	created := !db.tableExists(octx, tprefix+"items")
	if err := store.Migrate(octx); err != nil {
		return rep, err
	}
	skus := make([]string, cfg.Items)
	for i := range skus {
		skus[i] = fmt.Sprintf("item-%d", i+1)
	}

	// Clean up what this run wrote, and only that: nothing when an item already existed.
	var loaded []string
	defer func() {
		if cfg.Keep {
			fmt.Fprintf(out, "kept the Redis keys under %q and the tables %sitems, %srecords\n", cfg.Prefix, tprefix, tprefix)
			return
		}
		cctx, cancel := context.WithTimeout(octx, 30*time.Second)
		defer cancel()
		if err := deleteKeys(cctx, client, cfg.Prefix, itemNames(loaded, cfg.Buckets)); err != nil {
			fmt.Fprintln(out, "clean-up of the Redis keys:", err)
		}
		if err := db.dropOrDelete(cctx, tprefix, created, loaded); err != nil {
			fmt.Fprintln(out, "clean-up of the tables:", err)
		}
		if cfg.cleaned != nil {
			cfg.cleaned(cctx, client)
		}
	}()
	for _, sku := range skus {
		// The database of record first: an item in the database and not in Redis is what the
		// reconciler rebuilds; the other way round it could sell what nobody records.
		if err := store.Load(octx, sku, cfg.Stock); err != nil {
			return rep, fmt.Errorf("load %s in the database (pick another -prefix?): %w", sku, err)
		}
		if err := r.Load(octx, sku, cfg.Stock); err != nil {
			db.dropOrDelete(octx, tprefix, false, []string{sku})
			return rep, fmt.Errorf("load %s in Redis (pick another -prefix?): %w", sku, err)
		}
		loaded = append(loaded, sku)
	}

	relayItems := skus
	if cfg.Buckets > 1 {
		// A relay limited to a split item drains only the item's own outbox, where a split item
		// has no event: each bucket keeps its own. The registry lists the buckets, and the run's
		// prefix is its own: every item in it is the run's.
		relayItems = nil
	}
	relay, err := stockops.NewRelay(r, store, nil, &stock.RelayOptions{Items: relayItems, MinBackoff: 50 * time.Millisecond, MaxBackoff: 2 * time.Second})
	if err != nil {
		return rep, err
	}
	recOpts := &stock.ReconcileOptions{Items: skus, Interval: cfg.Reconcile}
	if guard != nil {
		// Only a pass over every item lifts the guard's fence: the run's prefix is its own,
		// so every item is the run's.
		recOpts.Items = nil
	}
	rec, err := stockops.NewReconciler(r, store, recOpts)
	if err != nil {
		return rep, err
	}
	// Only reports: used to see whether the outbox is empty.
	peek, err := stockops.NewReconciler(r, store, &stock.ReconcileOptions{Items: skus, DryRun: true})
	if err != nil {
		return rep, err
	}

	splitDesc := ""
	if cfg.Buckets > 1 {
		splitDesc = fmt.Sprintf(", each split over %d buckets", cfg.Buckets)
	}
	fmt.Fprintf(out, "flash sale: %d buyers, %d items x %d units%s, limit %d per user; %s, %s, prefix %s\n",
		cfg.Buyers, cfg.Items, cfg.Stock, splitDesc, userLimit, rdesc, db.desc, cfg.Prefix)

	bg, stopBG := context.WithCancel(octx)
	var bgWG sync.WaitGroup
	bgWG.Go(func() { relay.Run(bg) })
	bgWG.Go(func() { rec.Run(bg) })
	bgWG.Go(func() { r.Run(bg, stock.RunOptions{SweepInterval: 100 * time.Millisecond}) })
	if guard != nil {
		bgWG.Go(func() { guard.Run(bg, 100*time.Millisecond) })
	}
	defer func() { stopBG(); bgWG.Wait() }()

	s := &sale{cfg: cfg, r: r, watch: watch, skus: skus, ctx: octx, stop: make(chan struct{}), counts: map[[2]string]int64{},
		patient: cfg.Sentinel != "", explained: explained}
	if s.patient {
		s.explained = patientExplained()
	}
	var foWG sync.WaitGroup
	if cfg.FailoverAt > 0 {
		s.fo = &failoverRun{client: client}
		foWG.Go(func() {
			want := int64(cfg.FailoverAt * float64(cfg.Buyers))
			for s.arrived.Load() < want {
				select {
				case <-s.stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
			}
			s.fo.run(octx, cfg.Sentinel, s.arrived.Load())
		})
	}
	start := time.Now()
	timer := time.AfterFunc(cfg.Duration, s.end)
	defer timer.Stop()
	stopOnInterrupt := context.AfterFunc(ctx, s.end)
	defer stopOnInterrupt()
	arrival := min(cfg.Duration/5, time.Second)
	var buyers sync.WaitGroup
	for b := range cfg.Buyers {
		buyers.Go(func() { s.buyer(b, arrival) })
	}
	shown := make(chan struct{})
	progressDone := make(chan struct{})
	go func() { s.progress(out, start, shown); close(progressDone) }()
	buyers.Wait()
	s.end()
	foWG.Wait()
	rep.Elapsed = time.Since(start)
	if s.fo != nil {
		rep.Failover = s.fo.summary(start)
	}
	close(shown)
	<-progressDone
	if ctx.Err() != nil {
		return rep, fmt.Errorf("interrupted: %w", ctx.Err())
	}

	// Wind down: release the holds left to expire, stop the background work, drain the
	// relay, reconcile once more.
	if _, err := stockops.Sweep(octx, r); err != nil {
		return rep, err
	}
	stopBG()
	bgWG.Wait()
	passes, drifts, recErrs := obs.reconciles.Load(), obs.drifts.Load(), obs.reconcileErrs.Load()
	if err := drain(octx, relay, peek); err != nil {
		return rep, err
	}
	if cfg.tamper != nil {
		if err := cfg.tamper(octx, client); err != nil {
			return rep, err
		}
	}
	rep.Reconcile, err = rec.Once(octx)
	if err != nil {
		return rep, fmt.Errorf("final reconcile: %w", err)
	}

	rep.Buyers, rep.Late, rep.Ops = int(s.arrived.Load()), int(s.late.Load()), s.ops.Load()
	if err := s.check(octx, &rep, store, db, tprefix); err != nil {
		return rep, err
	}
	if s.patient {
		recErrs = 0 // passes that failed while the primary changed; the final pass must be clean
	}
	rep.Checks = append(rep.Checks, reconcileCheck(rep.Reconcile, passes, drifts, recErrs))
	rep.Passed = true
	for _, c := range rep.Checks {
		rep.Passed = rep.Passed && c.OK
	}
	printReport(out, rep, obs, logs)
	return rep, nil
}

// drain runs the relay until every item's outbox is empty.
func drain(ctx context.Context, relay *stockops.Relay, peek *stockops.Reconciler) error {
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := relay.Once(ctx)
		if err == nil && st.Claimed == 0 {
			reps, err := peek.Once(ctx)
			empty := err == nil
			for _, rp := range reps {
				empty = empty && !rp.Busy && rp.Pending == 0
			}
			if empty {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the relay did not drain the outbox in a minute (last error: %v)", err)
		}
		if st.Claimed == 0 {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// check compares what the buyers were told with Redis and the database, item by item.
func (s *sale) check(ctx context.Context, rep *Report, store *sqlstore.Store, db *database, tprefix string) error {
	byItem := map[string]map[string]idRecord{}
	perUser := map[string]int64{}
	for _, rc := range s.ids {
		if byItem[rc.sku] == nil {
			byItem[rc.sku] = map[string]idRecord{}
		}
		byItem[rc.sku][rc.id] = rc
		if rc.state == stSold {
			perUser[rc.user] += rc.qty
		}
	}

	var soldBad, overBad, avBad, applyBad, ledgerBad, lostBad []string
	var soldIDs, restoredIDs, units int64
	for _, sku := range s.skus {
		it := ItemReport{SKU: sku, Loaded: s.cfg.Stock}
		var err error
		if it.Redis, err = s.r.Levels(ctx, sku); err != nil {
			return err
		}
		if it.DBRemaining, err = store.Remaining(ctx, sku); err != nil {
			return err
		}
		recs := map[string]stock.Record{}
		for after := ""; ; {
			page, err := store.List(ctx, sku, after, 1000)
			if err != nil {
				return err
			}
			for _, rc := range page {
				recs[rc.ID], after = rc, rc.ID
			}
			if len(page) < 1000 {
				break
			}
		}
		// Every bucket's ledger, for a split item: an id is in one of them, never in two.
		entries := map[string]stock.Entry{}
		for e, err := range stockops.Entries(ctx, s.r, sku) {
			if err != nil {
				return err
			}
			if prev, dup := entries[e.ID]; dup && prev != e {
				ledgerBad = append(ledgerBad, fmt.Sprintf("%s/%s: two ledger entries, %q and %q", sku, e.ID, prev.State, e.State))
			}
			entries[e.ID] = e
		}
		for _, rc := range recs {
			if rc.Status == stock.StateApplied && (rc.Type == stock.EventDeducted || rc.Type == stock.EventConfirmed) {
				it.DBApplied += rc.Qty
			}
		}
		ids := byItem[sku]
		for _, id := range slices.Sorted(maps.Keys(ids)) {
			b := ids[id]
			rc, has := recs[id]
			e, inLedger := entries[id]
			wantType := stock.EventDeducted
			if b.hold {
				wantType = stock.EventConfirmed
			}
			if (b.state == stSold || b.state == stRestored) && !has && !inLedger {
				lostBad = append(lostBad, fmt.Sprintf("%s %s/%s: in neither the Redis ledger nor the database", b.state, sku, id))
			}
			switch b.state {
			case stSold:
				it.Bought += b.qty
				soldIDs++
				if !has || rc.Status != stock.StateApplied || rc.Qty != b.qty || rc.Type != wantType {
					applyBad = append(applyBad, fmt.Sprintf("sold %s/%s: database has %+v", sku, id, rc))
				}
				if !inLedger || e.State != stock.StateApplied || e.Qty != b.qty {
					ledgerBad = append(ledgerBad, fmt.Sprintf("sold %s/%s: ledger %q", sku, id, e.State))
				}
			case stRestored:
				restoredIDs++
				if !has || rc.Status != stock.StateRestored {
					applyBad = append(applyBad, fmt.Sprintf("restored %s/%s: database has %+v", sku, id, rc))
				}
				if !inLedger || e.State != stock.StateRestored {
					ledgerBad = append(ledgerBad, fmt.Sprintf("restored %s/%s: ledger %q", sku, id, e.State))
				}
			case stCancelled, stExpired:
				if has {
					applyBad = append(applyBad, fmt.Sprintf("%s hold %s/%s: database has %+v", b.state, sku, id, rc))
				}
				if want := stock.State(b.state); !inLedger || e.State != want {
					ledgerBad = append(ledgerBad, fmt.Sprintf("%s %s/%s: ledger %q", b.state, sku, id, e.State))
				}
			default:
				if has {
					applyBad = append(applyBad, fmt.Sprintf("refused %s/%s: database has %+v", sku, id, rc))
				}
				if inLedger && e.Taken() {
					ledgerBad = append(ledgerBad, fmt.Sprintf("refused %s/%s: ledger %q", sku, id, e.State))
				}
			}
		}
		for id, rc := range recs {
			if _, ok := ids[id]; !ok {
				applyBad = append(applyBad, fmt.Sprintf("%s/%s: a record no buyer made: %+v", sku, id, rc))
			}
		}
		for id, e := range entries {
			if _, ok := ids[id]; !ok && e.Taken() {
				ledgerBad = append(ledgerBad, fmt.Sprintf("%s/%s: a ledger entry no buyer made: %q", sku, id, e.State))
			}
		}

		lv := it.Redis
		units += it.Bought
		if it.Bought != lv.Sold || lv.Sold != lv.Loaded-lv.Available-lv.Held || lv.Held != 0 ||
			it.Loaded-it.DBRemaining != it.Bought || it.DBApplied != it.Bought {
			soldBad = append(soldBad, fmt.Sprintf("%s: bought %d, redis sold %d = %d-%d-%d held, database %d-%d applied %d",
				sku, it.Bought, lv.Sold, lv.Loaded, lv.Available, lv.Held, it.Loaded, it.DBRemaining, it.DBApplied))
		}
		if lv.Available < 0 || it.DBRemaining < 0 || lv.Loaded != lv.Available+lv.Held+lv.Sold || lv.Loaded != it.Loaded || it.Bought > it.Loaded {
			overBad = append(overBad, fmt.Sprintf("%s: available %d held %d sold %d loaded %d, database remaining %d",
				sku, lv.Available, lv.Held, lv.Sold, lv.Loaded, it.DBRemaining))
		}
		if lv.Available+lv.Held != it.DBRemaining {
			avBad = append(avBad, fmt.Sprintf("%s: redis %d+%d, database %d", sku, lv.Available, lv.Held, it.DBRemaining))
		}
		rep.Items = append(rep.Items, it)
	}

	var dups int64
	q := "SELECT COUNT(*) FROM (SELECT sku, id FROM " + db.quote(tprefix+"records") + " GROUP BY sku, id HAVING COUNT(*) > 1) d"
	if err := db.db.QueryRowContext(ctx, q).Scan(&dups); err != nil {
		return fmt.Errorf("count duplicate records: %w", err)
	}
	if dups > 0 {
		applyBad = append(applyBad, fmt.Sprintf("%d (sku, id) pairs with more than one record", dups))
	}

	var overLimit []string
	for u, n := range perUser {
		if n > userLimit {
			overLimit = append(overLimit, fmt.Sprintf("%s has %d", u, n))
		}
	}

	var total, unexplained, unknown int64
	var bad []string
	for k, n := range s.counts {
		why := s.explained[k[0]][k[1]]
		rep.Outcomes = append(rep.Outcomes, OutcomeCount{Op: k[0], Outcome: k[1], Count: n, Why: why})
		if k[1] != "ok" && k[1] != "replay" {
			total += n
		}
		if k[1] == "error" || k[1] == "timeout" {
			unknown += n
		}
		if why == "" {
			unexplained += n
			bad = append(bad, fmt.Sprintf("%s: %s x%d", k[0], k[1], n))
		}
	}
	slices.SortFunc(rep.Outcomes, func(a, b OutcomeCount) int {
		if c := strings.Compare(a.Op, b.Op); c != 0 {
			return c
		}
		return strings.Compare(a.Outcome, b.Outcome)
	})

	rep.Checks = append(rep.Checks,
		check("sold = loaded - remaining, in Redis and in the database",
			fmt.Sprintf("%d units bought and kept over %d items; no hold left", units, len(s.skus)), soldBad),
		check("no oversell", "available >= 0, database remaining >= 0, loaded = available + held + sold", overBad),
		check("no double apply",
			fmt.Sprintf("0 (sku, id) with two records; %d sold ids applied once, %d restored ids given back, no other record", soldIDs, restoredIDs), applyBad),
		check("exactly once per request id",
			"retries replayed, reused ids refused, the Redis ledger matches every buyer's outcome", append(s.anomalies, ledgerBad...)),
		check("per-user limit", fmt.Sprintf("nobody kept more than %d units of an item", userLimit), overLimit),
		check("Redis available + held = database remaining", "for every item", avBad),
		check("every refusal explained",
			fmt.Sprintf("%d refusals, %d unexplained, %d unknown outcomes", total, unexplained, unknown), bad),
	)
	if s.patient {
		rep.Checks = append(rep.Checks, check("nothing acknowledged lost",
			fmt.Sprintf("%d sales the buyers were told of (%d given back since), each in the Redis ledger or the database", soldIDs+restoredIDs, restoredIDs), lostBad))
	}
	return nil
}

func reconcileCheck(reps []stockops.Report, passes, drifts, errs int64) Check {
	var bad []string
	if drifts > 0 || errs > 0 {
		bad = append(bad, fmt.Sprintf("during the sale: %d item passes found drift, %d failed", drifts, errs))
	}
	for _, rp := range reps {
		if rp.Busy || rp.Drift != 0 || rp.NeedsHuman != "" || rp.Pending != 0 || rp.Rebuilt || rp.Adjusted != 0 || rp.Requeued != 0 || rp.Rerecorded != 0 {
			bad = append(bad, rp.String())
		}
	}
	return check("reconciler finds nothing to repair",
		fmt.Sprintf("%d item passes during the sale, drift 0; final pass: drift 0, outbox empty, no repair", passes), bad)
}

func check(name, detail string, bad []string) Check {
	if len(bad) == 0 {
		return Check{Name: name, OK: true, Detail: detail}
	}
	slices.Sort(bad)
	more := ""
	if len(bad) > 5 {
		more = fmt.Sprintf(" (and %d more)", len(bad)-5)
		bad = bad[:5]
	}
	return Check{Name: name, Detail: strings.Join(bad, "; ") + more}
}

// printReport writes the report.
func printReport(out io.Writer, rep Report, obs *observer, logs *logCounter) {
	fmt.Fprintf(out, "\nbuyers: %d of %d came while the sale was open", rep.Buyers, rep.Buyers+rep.Late)
	if rep.Late > 0 {
		fmt.Fprintf(out, "; %d were due after it had ended and did not come", rep.Late)
	}
	fmt.Fprintf(out, "\ncalls: %d in %.1fs (%.0f/s); %d sold-out refusals answered in-process, without a round trip to Redis\n",
		rep.Ops, rep.Elapsed.Seconds(), float64(rep.Ops)/max(rep.Elapsed.Seconds(), 1e-3), obs.local.Load())
	fmt.Fprintf(out, "relay: %d batches delivered, %d failed and retried; library warnings: %d\n",
		obs.relayBatches.Load(), obs.relayErrs.Load(), logs.n)
	if rep.Failover != "" {
		fmt.Fprintln(out, rep.Failover)
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "ITEM\tLOADED\tBOUGHT\tREDIS SOLD\tAVAILABLE\tHELD\tDB REMAINING\tDB APPLIED\t")
	for _, it := range rep.Items {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", it.SKU, it.Loaded, it.Bought, it.Redis.Sold,
			it.Redis.Available, it.Redis.Held, it.DBRemaining, it.DBApplied)
	}
	tw.Flush()
	for _, it := range rep.Items {
		if it.Redis.Available > 0 && it.Bought > 0 {
			fmt.Fprintf(out, "%s ends with %d unit(s) unsold: given back (restores, cancels, expired holds) after the last buyer of it, or asked for by a buyer who wanted more than was left\n",
				it.SKU, it.Redis.Available)
		}
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CALL\tOUTCOME\tCOUNT\tWHY")
	for _, o := range rep.Outcomes {
		why := o.Why
		if why == "" {
			why = "UNEXPLAINED"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", o.Op, o.Outcome, o.Count, why)
	}
	tw.Flush()
	fmt.Fprintln(out)
	for _, rp := range rep.Reconcile {
		fmt.Fprintln(out, "reconcile", rp.String())
	}
	for _, l := range logs.first {
		fmt.Fprintln(out, "log:", l)
	}
	fmt.Fprintln(out)
	failed := 0
	for _, c := range rep.Checks {
		mark := "PASS"
		if !c.OK {
			mark = "FAIL"
			failed++
		}
		fmt.Fprintf(out, "%s  %s: %s\n", mark, c.Name, c.Detail)
	}
	if failed == 0 {
		fmt.Fprintln(out, "PASS: every check holds")
	} else {
		fmt.Fprintf(out, "FAIL: %d of %d checks failed\n", failed, len(rep.Checks))
	}
}
