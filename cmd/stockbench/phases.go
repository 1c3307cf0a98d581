package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/protocol"
	"github.com/stockres/stock/stockops"
)

// bigStock is the stock of the items that must not sell out during a phase. It is the same in
// every phase so that ledger entries hold numbers of the same length, and it stays below 10^14
// so that the ledger-hash script, which formats numbers with tostring (%.14g), keeps every digit.
const bigStock = 1_000_000_000_000

// ringSize is how many of its recent successful requests a worker remembers for retries.
const ringSize = 64

// phase is one measured load. The runner calls setup, then op in a loop on every worker for the
// duration (in one or more rounds), then finish; teardown and the deletion of keys always run.
type phase struct {
	name  string
	g     int
	keys  []string // Redis keys the phase may create, deleted after it
	redis bool     // the load runs on Redis: report its CPU

	setup    func(ctx context.Context) error
	op       func(ctx context.Context, w *worker)
	finish   func(ctx context.Context, res *PhaseResult, ws []*worker) ([]Check, error)
	teardown func() // optional

	// Set by the runner.
	ws                        []*worker
	rounds                    int
	elapsed, clientCPU        time.Duration
	mallocs                   uint64
	redisCPU                  float64 // seconds
	clientRounds, redisRounds int     // rounds in which the CPU could be read
	commands, scripts         float64 // Redis commands (those in scripts included) and script calls
	scriptUsec                float64 // Redis CPU of the script calls (INFO commandstats usec)
	commandRounds             int     // rounds in which they could be counted
	perRound                  []roundStat

	// Per node, by address: the Redis CPU seconds of the nodes read both before and after a
	// round, and, with more than one node, their role ("master" or "replica").
	redisCPUNode map[string]float64
	nodeRoles    map[string]string
}

// roundStat is what one round of a phase measured; the ratios are medians over rounds.
type roundStat struct {
	secs       float64
	ops        int64
	scriptUsec float64 // -1 when it could not be read
}

// completed is how many operations p's workers completed so far.
func (p *phase) completed() int64 {
	var n int64
	for _, w := range p.ws {
		n += w.ok + w.replayed + w.soldOut
	}
	return n
}

// outcome of one operation.
type outcome int

const (
	outOK outcome = iota
	outReplayed
	outSoldOut
)

// worker is the state of one load goroutine. Nothing in it is shared.
type worker struct {
	idx  int
	rng  *rand.Rand
	hist histogram

	ok, replayed, soldOut, aborts, errs int64
	mismatch                            int64 // replays that did not repeat the original receipt
	firstErr                            error

	idBuf []byte
	idLen int
	seq   int64

	ring     []sent // recent successful requests, repeated by retries
	ringNext int

	fresh  []int64 // per item: units taken by fresh (non-replayed) requests
	undone []int64 // per item: units given back

	items int   // number of items
	qty   int64 // units per request
}

// sent is a request that succeeded, with what it answered.
type sent struct {
	item      int
	id        string
	remaining int64
}

func newWorker(idx, items int, seed uint64) *worker {
	w := &worker{
		idx:    idx,
		rng:    rand.New(rand.NewPCG(seed, uint64(idx))),
		items:  items,
		qty:    1,
		fresh:  make([]int64, items),
		undone: make([]int64, items),
	}
	w.idBuf = append(w.idBuf, 'w')
	w.idBuf = strconv.AppendInt(w.idBuf, int64(idx), 10)
	w.idBuf = append(w.idBuf, '-')
	w.idLen = len(w.idBuf)
	return w
}

// nextID returns a request id unique in the phase: "w<worker>-<seq>". One allocation.
func (w *worker) nextID() string {
	w.seq++
	w.idBuf = strconv.AppendInt(w.idBuf[:w.idLen], w.seq, 10)
	return string(w.idBuf)
}

// item picks the item of the next request, uniformly.
func (w *worker) item() int {
	if w.items == 1 {
		return 0
	}
	return w.rng.IntN(w.items)
}

// retry picks an earlier successful request to repeat, with probability share.
func (w *worker) retry(share float64) (sent, bool) {
	if share <= 0 || len(w.ring) == 0 || w.rng.Float64() >= share {
		return sent{}, false
	}
	return w.ring[w.rng.IntN(len(w.ring))], true
}

func (w *worker) remember(s sent) {
	if len(w.ring) < ringSize {
		w.ring = append(w.ring, s)
		return
	}
	w.ring[w.ringNext] = s
	w.ringNext = (w.ringNext + 1) % ringSize
}

// done records a completed operation that started at t0.
func (w *worker) done(t0 time.Time, o outcome) {
	w.hist.record(time.Since(t0))
	switch o {
	case outOK:
		w.ok++
	case outReplayed:
		w.replayed++
	case outSoldOut:
		w.soldOut++
	}
}

// fail records an operation whose outcome is unknown (transport error) or unexpected.
func (w *worker) fail(err error) {
	w.errs++
	if w.firstErr == nil {
		w.firstErr = err
	}
}

// newPhase builds the phase called name.
func (b *bench) newPhase(name string) (*phase, error) {
	switch name {
	case phDeduct, phDeductNoUser:
		return b.deductPhase(name)
	case phSoldOut, phFastPath:
		return b.soldOutPhase(name)
	case phRestore:
		return b.restorePhase()
	case phLedgerHash:
		return b.ledgerHashPhase(), nil
	case phOnePerUser:
		return b.onePerUserPhase(), nil
	case phNoLedger:
		return b.noLedgerPhase(), nil
	case phWatch:
		return b.watchPhase(), nil
	case phPGHotRow:
		return b.pgPhase(), nil
	}
	return nil, fmt.Errorf("unknown phase %q", name)
}

// runPhases runs the configured phases and returns their results and checks. With one round,
// each phase is set up, measured, checked and deleted before the next one starts. With more,
// all phases are set up first and then measured in turn, each round for duration/rounds, so
// that a change in the machine's background load spreads over every phase alike.
func (b *bench) runPhases(ctx context.Context) ([]PhaseResult, []Check, error) {
	groups := [][]string{b.cfg.phases}
	if b.cfg.rounds == 1 {
		groups = nil
		for _, name := range b.cfg.phases {
			groups = append(groups, []string{name})
		}
	}
	slice := b.cfg.duration / time.Duration(b.cfg.rounds)
	var results []PhaseResult
	var checks []Check
	for _, group := range groups {
		if ctx.Err() != nil {
			break
		}
		rs, cs, err := b.runGroup(ctx, group, slice)
		results, checks = append(results, rs...), append(checks, cs...)
		if err != nil {
			return results, checks, err
		}
	}
	return results, checks, nil
}

// runGroup sets up the phases of group, measures them for the configured rounds, checks them
// and deletes everything they created.
func (b *bench) runGroup(ctx context.Context, group []string, slice time.Duration) ([]PhaseResult, []Check, error) {
	if b.private {
		if err := b.flushDB(ctx); err != nil {
			return nil, nil, err
		}
	}
	var ps []*phase
	defer func() {
		for _, p := range ps {
			if p.teardown != nil {
				p.teardown()
			}
			b.deleteKeys(p.keys)
		}
	}()
	for _, name := range group {
		p, err := b.newPhase(name)
		if err != nil {
			return nil, nil, err
		}
		ps = append(ps, p)
		if err := p.setup(ctx); err != nil {
			return nil, nil, fmt.Errorf("phase %s: setup: %w", name, err)
		}
		seed := rand.Uint64()
		p.ws = make([]*worker, p.g)
		for i := range p.ws {
			p.ws[i] = newWorker(i, b.cfg.items, seed)
		}
	}
	for range b.cfg.rounds {
		for _, p := range ps {
			if ctx.Err() == nil {
				b.measure(ctx, p, slice)
			}
		}
	}
	// The checks run even after an interrupt: they say whether what did run was right. Requests
	// given up by an interrupt may still be queued to Redis; let them land first.
	if ctx.Err() != nil {
		time.Sleep(500 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	var results []PhaseResult
	var checks []Check
	for _, p := range ps {
		res := p.result()
		cs, err := p.finish(ctx, &res, p.ws)
		if err != nil {
			return results, checks, fmt.Errorf("phase %s: %w", p.name, err)
		}
		results, checks = append(results, res), append(checks, cs...)
	}
	return results, checks, nil
}

// measure runs p.op on every worker of p for d and adds the time, allocations and CPU used to
// p's totals. An operation in flight when time is up completes and counts.
func (b *bench) measure(ctx context.Context, p *phase, d time.Duration) {
	runtime.GC()
	var cmd0, scr0, usec0 float64
	var cpu0 map[string]float64 // by node
	var cpuErr, cmdErr error
	if p.redis {
		cpu0, cpuErr = b.nodeCPU(ctx)
		cmd0, scr0, usec0, cmdErr = b.commandCalls(ctx)
	}
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	cli0, cliErr := processCPU()
	ops0 := p.completed()

	var stop atomic.Bool
	var wg sync.WaitGroup
	start := time.Now()
	timer := time.AfterFunc(d, func() { stop.Store(true) })
	defer timer.Stop()
	for _, w := range p.ws {
		wg.Go(func() {
			for !stop.Load() && ctx.Err() == nil {
				p.op(ctx, w)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)

	runtime.ReadMemStats(&ms1)
	cli1, cliErr1 := processCPU()
	round := roundStat{secs: elapsed.Seconds(), ops: p.completed() - ops0, scriptUsec: -1}
	defer func() { p.perRound = append(p.perRound, round) }()
	p.rounds++
	p.elapsed += elapsed
	p.mallocs += ms1.Mallocs - ms0.Mallocs
	if cliErr == nil && cliErr1 == nil {
		p.clientCPU += cli1 - cli0
		p.clientRounds++
	}
	if p.redis && cpuErr == nil {
		if cpu1, err := b.nodeCPU(context.WithoutCancel(ctx)); err == nil {
			p.redisCPU += sumValues(cpu1) - sumValues(cpu0)
			p.redisRounds++
			if p.redisCPUNode == nil {
				p.redisCPUNode = map[string]float64{}
			}
			for addr, c1 := range cpu1 {
				if c0, ok := cpu0[addr]; ok {
					p.redisCPUNode[addr] += c1 - c0
				}
			}
		}
	}
	if p.redis && cmdErr == nil {
		if cmd1, scr1, usec1, err := b.commandCalls(context.WithoutCancel(ctx)); err == nil {
			p.commands += cmd1 - cmd0
			p.scripts += scr1 - scr0
			p.scriptUsec += usec1 - usec0
			round.scriptUsec = usec1 - usec0
			p.commandRounds++
		}
	}
	// The roles are read once the round is counted, so that they add nothing to its window.
	if p.redis && len(p.redisCPUNode) > 1 {
		if roles, err := b.nodeRoles(context.WithoutCancel(ctx)); err == nil {
			p.nodeRoles = roles
		}
	}
}

// sumValues returns the sum of m's values.
func sumValues(m map[string]float64) float64 {
	var s float64
	for _, v := range m {
		s += v
	}
	return s
}

// result sums the measurements of p's rounds and workers.
func (p *phase) result() PhaseResult {
	secs := p.elapsed.Seconds()
	res := PhaseResult{Name: p.name, Goroutines: p.g, Seconds: secs}
	if secs == 0 {
		return res
	}
	if p.clientRounds == p.rounds {
		v := p.clientCPU.Seconds() / secs
		res.ClientCPU = &v
	}
	if p.redis && p.redisRounds == p.rounds {
		v := p.redisCPU / secs
		res.RedisCPU = &v
		if len(p.redisCPUNode) > 1 { // a cluster: how the load spreads over the nodes
			res.RedisCPUPerNode = make(map[string]float64, len(p.redisCPUNode))
			for addr, s := range p.redisCPUNode {
				res.RedisCPUPerNode[addr] = s / secs
			}
			res.RedisNodeRoles = p.nodeRoles
		}
	}
	var h histogram
	for _, w := range p.ws {
		h.merge(&w.hist)
		res.OK += w.ok
		res.Replayed += w.replayed
		res.SoldOut += w.soldOut
		res.Aborts += w.aborts
		res.Errors += w.errs
		if w.firstErr != nil && res.FirstErr == "" {
			res.FirstErr = w.firstErr.Error()
		}
	}
	res.Ops = res.OK + res.Replayed + res.SoldOut
	res.OpsPerSec = float64(res.Ops) / secs
	if res.Ops > 0 {
		res.RedisUsPerOp = perOp(res.RedisCPU, secs, res.Ops)
		res.ClientUsPerOp = perOp(res.ClientCPU, secs, res.Ops)
		if res.RedisCPUPerNode != nil {
			res.RedisUsPerOpPerNode = make(map[string]float64, len(res.RedisCPUPerNode))
			for addr, cores := range res.RedisCPUPerNode {
				res.RedisUsPerOpPerNode[addr] = *perOp(&cores, secs, res.Ops)
			}
		}
	}
	res.P50us = micros(h.quantile(0.5))
	res.P99us = micros(h.quantile(0.99))
	res.P999us = micros(h.quantile(0.999))
	if res.Ops > 0 {
		res.AllocsPerOp = float64(p.mallocs) / float64(res.Ops)
	}
	if p.redis && p.commandRounds == p.rounds && res.Ops > 0 {
		cmds, scripts := p.commands/float64(res.Ops), p.scripts/float64(res.Ops)
		res.CommandsPerOp, res.ScriptsPerOp = &cmds, &scripts
		if p.scripts > 0 && p.scriptUsec > 0 {
			perCall, perReq := p.scriptUsec/p.scripts, p.scriptUsec/float64(res.Ops)
			res.ScriptUsPerCall, res.ScriptUsPerOp = &perCall, &perReq
		}
	}
	for _, r := range p.perRound {
		if r.secs <= 0 || r.ops <= 0 {
			continue
		}
		res.RoundOpsPerSec = append(res.RoundOpsPerSec, float64(r.ops)/r.secs)
		if r.scriptUsec > 0 {
			res.RoundScriptUsPerOp = append(res.RoundScriptUsPerOp, r.scriptUsec/float64(r.ops))
		}
	}
	return res
}

// perOp turns a number of cores busy for secs into microseconds of CPU per op.
func perOp(cores *float64, secs float64, ops int64) *float64 {
	if cores == nil {
		return nil
	}
	v := *cores * secs * 1e6 / float64(ops)
	return &v
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// skus names the items of a phase.
func skus(n int) []string {
	s := make([]string, n)
	for i := range s {
		s[i] = "item-" + strconv.Itoa(i)
	}
	return s
}

// warmSKU is an item outside the measured set, used to load the scripts before the clock starts.
const warmSKU = "warm"

// reserverPhase is the common part of the phases that drive a stock.Reserver: the reserver, on
// a prefix of its own, its items loaded with stock each, and the keys to delete afterwards. With
// -buckets N > 1 every item (the warm-up item too) is split over N buckets, each with keys of
// its own ("<prefix>:{sku|i|k}…", see itemBases).
func (b *bench) reserverPhase(name string, stock0 int64, more ...stock.Option) (*phase, *stock.Reserver, []string, error) {
	prefix := b.prefix(name)
	client, fast := b.client, stock.WithSoldOutCache(0)
	if name == phFastPath {
		client, fast = b.cached, stock.WithSoldOutCache(time.Second)
	}
	opts := append([]stock.Option{stock.WithPrefix(prefix), stock.WithOutbox(b.cfg.outbox), stock.WithCoalescing(b.cfg.coalesce), fast}, more...)
	if n := b.cfg.buckets; n > 1 {
		opts = append(opts, stock.WithBuckets(func(string) int { return n }))
	}
	r, err := stock.New(client, opts...)
	if err != nil {
		return nil, nil, nil, err
	}
	items := skus(b.cfg.items)
	p := &phase{name: name, g: b.cfg.g, redis: true, keys: []string{prefix + ":items", protocol.Probe(prefix)}}
	for n := range protocol.DueShards { // the relay's and the sweeper's due-work hints
		p.keys = append(p.keys, protocol.RelayDue(prefix, n), protocol.HoldsDue(prefix, n))
	}
	for _, sku := range append([]string{warmSKU}, items...) {
		for _, base := range b.itemBases(name, sku) {
			for _, suffix := range []string{"", ":l", ":u", ":o", ":h", ":r", ":rl", ":b", ":dl", ":p", ":x", ":xf", ":i"} {
				p.keys = append(p.keys, base+suffix)
			}
		}
	}
	p.setup = func(ctx context.Context) error {
		for _, sku := range items {
			if err := r.Load(ctx, sku, stock0); err != nil {
				return err
			}
		}
		// One deduct and one restore on an item outside the measured set loads both scripts.
		if err := r.Load(ctx, warmSKU, bigStock); err != nil {
			return err
		}
		if _, err := r.Deduct(ctx, stock.Request{SKU: warmSKU, ID: "warm", Qty: 1}); err != nil {
			return err
		}
		_, err := r.Restore(ctx, warmSKU, "warm")
		return err
	}
	return p, r, items, nil
}

// itemBases returns the bases of the keys that hold an item of a phase (see the key layout in
// the README): "<prefix>:{sku}", or with -buckets N > 1 the bases of its N buckets,
// "<prefix>:{sku|i|k}" (protocol.BucketBase: bucket i's keys in the i-th of N slot ranges).
func (b *bench) itemBases(phase, sku string) []string {
	prefix := b.prefix(phase)
	if b.cfg.buckets <= 1 {
		return []string{prefix + ":{" + sku + "}"}
	}
	out := make([]string, b.cfg.buckets)
	for i := range out {
		out[i] = protocol.BucketBase(prefix, sku, i, b.cfg.buckets)
	}
	return out
}

// ledgerKeys returns the ledger hashes of an item: one, or one per bucket.
func (b *bench) ledgerKeys(phase, sku string) []string {
	bases := b.itemBases(phase, sku)
	for i := range bases {
		bases[i] += ":l"
	}
	return bases
}

// buyerLimit is the per-user limit of the deduct phase: a flash sale's "at most 2 per buyer".
const buyerLimit = 2

// deductPhase: unique ids on items that never sell out, a share of retries of earlier ids. In
// the deduct phase every request is by a buyer of its own ("u" + the id) under a per-user limit;
// in deduct-nouser requests have no buyer.
func (b *bench) deductPhase(name string) (*phase, error) {
	var more []stock.Option
	buyers := name == phDeduct
	if buyers {
		more = append(more, stock.WithUserLimit(buyerLimit))
	}
	p, r, items, err := b.reserverPhase(name, b.cfg.stock, more...)
	if err != nil {
		return nil, err
	}
	buyer := func(id string) string {
		if !buyers {
			return ""
		}
		return "u" + id
	}
	share := b.cfg.retry
	p.op = func(ctx context.Context, w *worker) {
		if s, ok := w.retry(share); ok {
			t0 := time.Now()
			rc, err := r.Deduct(ctx, stock.Request{SKU: items[s.item], ID: s.id, Qty: w.qty, User: buyer(s.id)})
			if err != nil {
				w.fail(err)
				return
			}
			w.done(t0, outReplayed)
			if !rc.Replayed || rc.Remaining != s.remaining || rc.Qty != w.qty {
				w.mismatch++
			}
			return
		}
		i, id := w.item(), w.nextID()
		t0 := time.Now()
		rc, err := r.Deduct(ctx, stock.Request{SKU: items[i], ID: id, Qty: w.qty, User: buyer(id)})
		switch {
		case err == nil && !rc.Replayed:
			w.done(t0, outOK)
			w.fresh[i] += w.qty
			w.remember(sent{item: i, id: id, remaining: rc.Remaining})
		case err == nil: // a fresh id answered as a replay: taken twice or never
			w.done(t0, outReplayed)
			w.mismatch++
		case errors.Is(err, stock.ErrSoldOut):
			w.done(t0, outSoldOut)
		default:
			w.fail(err)
		}
	}
	p.finish = func(ctx context.Context, res *PhaseResult, ws []*worker) ([]Check, error) {
		return b.reserverChecks(ctx, name, r, items, res, ws, b.cfg.stock)
	}
	return p, nil
}

// soldOutPhase: unique ids on items loaded with nothing, with the sold-out fast path off
// (phSoldOut) or on (phFastPath).
func (b *bench) soldOutPhase(name string) (*phase, error) {
	p, r, items, err := b.reserverPhase(name, 0)
	if err != nil {
		return nil, err
	}
	p.op = func(ctx context.Context, w *worker) {
		i, id := w.item(), w.nextID()
		t0 := time.Now()
		_, err := r.Deduct(ctx, stock.Request{SKU: items[i], ID: id, Qty: w.qty})
		switch {
		case errors.Is(err, stock.ErrSoldOut):
			w.done(t0, outSoldOut)
		case err == nil: // stock out of nothing
			w.done(t0, outOK)
			w.fresh[i] += w.qty
		default:
			w.fail(err)
		}
	}
	p.finish = func(ctx context.Context, res *PhaseResult, ws []*worker) ([]Check, error) {
		checks, err := b.reserverChecks(ctx, name, r, items, res, ws, 0)
		checks = append(checks, Check{Phase: name, Name: "every deduct refused as sold out",
			OK: res.OK == 0 && res.SoldOut > 0, Detail: fmt.Sprintf("%d sold out, %d taken, %d of them in-process", res.SoldOut, res.OK, stockops.SoldOutAnswers(r))})
		return checks, err
	}
	return p, nil
}

// restorePhase: a deduct and the restore of the same id, each call counted. With little stock
// (-stock) a deduct may be refused as sold out: counted, and nothing to restore.
func (b *bench) restorePhase() (*phase, error) {
	p, r, items, err := b.reserverPhase(phRestore, b.cfg.stock)
	if err != nil {
		return nil, err
	}
	p.op = func(ctx context.Context, w *worker) {
		i, id := w.item(), w.nextID()
		t0 := time.Now()
		rc, err := r.Deduct(ctx, stock.Request{SKU: items[i], ID: id, Qty: w.qty})
		if errors.Is(err, stock.ErrSoldOut) {
			w.done(t0, outSoldOut)
			return
		}
		if err != nil {
			w.fail(fmt.Errorf("deduct: %w", err))
			return
		}
		if rc.Replayed { // a fresh id answered as a replay
			w.done(t0, outReplayed)
			w.mismatch++
			return
		}
		w.done(t0, outOK)
		w.fresh[i] += w.qty
		t1 := time.Now()
		rc, err = r.Restore(ctx, items[i], id)
		switch {
		case err == nil && !rc.Replayed && rc.Qty == w.qty:
			w.done(t1, outOK)
			w.undone[i] += w.qty
		case err == nil:
			w.done(t1, outReplayed)
			w.mismatch++
		default:
			w.fail(fmt.Errorf("restore: %w", err))
		}
	}
	p.finish = func(ctx context.Context, res *PhaseResult, ws []*worker) ([]Check, error) {
		return b.reserverChecks(ctx, phRestore, r, items, res, ws, b.cfg.stock)
	}
	return p, nil
}

// reserverChecks reads the levels and ledgers of a Reserver phase's items, sets the ledger
// memory per entry, and checks, per item:
//   - loaded = available + held + sold, available >= 0, loaded = what was loaded;
//   - sold = units taken by fresh requests - units given back;
//   - ledger entries = fresh requests (one entry per id: replays and restores add none),
//     counted with stockops.Entries, which reads every bucket of a split item; the ledger keys
//     read for the memory per entry must hold as many entries (they cover every bucket);
//   - every replay answered with the original receipt, no fresh id answered as a replay;
//   - with -buckets, no transfer of stock between buckets left in flight.
//
// A request that failed with a transport error may or may not have run: each one widens the
// accepted range of sold and of the ledger's length by one either way.
func (b *bench) reserverChecks(ctx context.Context, phase string, r *stock.Reserver, items []string,
	res *PhaseResult, ws []*worker, loaded int64) ([]Check, error) {
	var ledgers []string
	for _, sku := range items {
		ledgers = append(ledgers, b.ledgerKeys(phase, sku)...)
	}
	hlens, bytes, err := b.ledgerStats(ctx, ledgers)
	if err != nil {
		return nil, err
	}
	res.LedgerBytes = bytes
	var inLedgers int64
	kept := slices.Clone(ledgers) // the ledgers, the buyers' counts and the items' hashes
	for _, sku := range items {
		for _, base := range b.itemBases(phase, sku) {
			kept = append(kept, base+":u", base)
		}
	}
	for _, n := range hlens {
		inLedgers += n
	}
	res.RequestBytes = b.requestBytes(ctx, kept, inLedgers)
	perBucket := len(ledgers) / len(items)
	keyLens := make([]int64, len(items)) // HLEN of the item's ledger keys
	for i := range items {
		for _, n := range hlens[i*perBucket : (i+1)*perBucket] {
			keyLens[i] += n
		}
	}
	lens := make([]int64, len(items)) // entries stockops.Entries yields
	for i, sku := range items {
		for _, err := range stockops.Entries(ctx, r, sku) {
			if err != nil {
				return nil, err
			}
			lens[i]++
		}
	}

	var fresh, undone, mismatch, slack int64
	perFresh := make([]int64, len(items))
	perUndone := make([]int64, len(items))
	for _, w := range ws {
		for i := range items {
			perFresh[i] += w.fresh[i]
			perUndone[i] += w.undone[i]
		}
		mismatch += w.mismatch
		slack += w.errs
	}
	var sum stock.Levels
	balanced, matched, ledgered := "", "", ""
	for i, sku := range items {
		lv, err := r.Levels(ctx, sku)
		if err != nil {
			return nil, err
		}
		sum.Available += lv.Available
		sum.Held += lv.Held
		sum.Sold += lv.Sold
		sum.Loaded += lv.Loaded
		fresh += perFresh[i]
		undone += perUndone[i]
		if balanced == "" && (lv.Loaded != lv.Available+lv.Held+lv.Sold || lv.Available < 0 || lv.Loaded != loaded) {
			balanced = fmt.Sprintf("%s: %+v, loaded with %d", sku, lv, loaded)
		}
		if want := perFresh[i] - perUndone[i]; matched == "" && !within(lv.Sold, want, slack) {
			matched = fmt.Sprintf("%s: sold %d, fresh deducts - restores = %d (%d unknown outcomes)", sku, lv.Sold, want, slack)
		}
		if ledgered == "" && !within(lens[i], perFresh[i], slack) {
			ledgered = fmt.Sprintf("%s: %d ledger entries, %d successful ids (%d unknown outcomes)", sku, lens[i], perFresh[i], slack)
		}
		if ledgered == "" && keyLens[i] != lens[i] {
			ledgered = fmt.Sprintf("%s: %d ledger entries, but %d in the ledger keys %v", sku, lens[i], keyLens[i], ledgers[i*perBucket:(i+1)*perBucket])
		}
	}
	var entries int64
	for _, n := range lens {
		entries += n
	}
	soldName := "sold = successful fresh deducts"
	if phase == phRestore {
		soldName = "sold = fresh deducts - restores"
	}
	entriesDetail := fmt.Sprintf("%d entries, %d ids", entries, fresh)
	if b.cfg.buckets > 1 {
		entriesDetail += fmt.Sprintf(" (over %d buckets per item)", b.cfg.buckets)
	}
	checks := []Check{
		{Phase: phase, Name: "loaded = available + held + sold", OK: balanced == "",
			Detail: orElse(balanced, fmt.Sprintf("%d = %d + %d + %d", sum.Loaded, sum.Available, sum.Held, sum.Sold))},
		{Phase: phase, Name: soldName, OK: matched == "",
			Detail: orElse(matched, fmt.Sprintf("sold %d, fresh %d, restored %d", sum.Sold, fresh, undone))},
		{Phase: phase, Name: "no id applied twice (ledger entries = successful ids)", OK: ledgered == "",
			Detail: orElse(ledgered, entriesDetail)},
		{Phase: phase, Name: "replays repeat the original receipt", OK: mismatch == 0,
			Detail: fmt.Sprintf("%d replays, %d mismatched", res.Replayed, mismatch)},
	}
	if phase == phDeduct || phase == phDeductNoUser {
		// Requests take one unit and nothing gives stock back: a refusal as sold out means
		// the item had nothing left, split or not, and then it never has again.
		checks = append(checks, Check{Phase: phase, Name: "sold out only when nothing is left",
			OK:     res.SoldOut == 0 || within(sum.Available, 0, slack),
			Detail: fmt.Sprintf("%d refused as sold out, %d available at the end", res.SoldOut, sum.Available)})
	}
	if b.cfg.buckets > 1 {
		c, err := b.transferCheck(ctx, phase, items, res)
		if err != nil {
			return nil, err
		}
		checks = append(checks, c)
	}
	return checks, nil
}

// transferCheck counts the transfers of stock between the buckets of a phase's items (the
// entries "O|…" of the buckets' transfers hashes, one per transfer, kept once it ended) into
// res.Transfers, and checks that none is left in flight (the buckets' ":xf" sets are empty):
// every transfer of the phase completed.
func (b *bench) transferCheck(ctx context.Context, phase string, items []string, res *PhaseResult) (Check, error) {
	c := b.client
	var transfers, inFlight int64
	for _, sku := range items {
		for _, base := range b.itemBases(phase, sku) {
			vals, err := c.Do(ctx, c.B().Hvals().Key(base+":x").Build()).AsStrSlice()
			if err != nil {
				return Check{}, fmt.Errorf("HVALS %s:x: %w", base, err)
			}
			for _, v := range vals {
				if strings.HasPrefix(v, "O|") {
					transfers++
				}
			}
			n, err := c.Do(ctx, c.B().Zcard().Key(base+":xf").Build()).AsInt64()
			if err != nil {
				return Check{}, fmt.Errorf("ZCARD %s:xf: %w", base, err)
			}
			inFlight += n
		}
	}
	res.Transfers = &transfers
	return Check{Phase: phase, Name: "no transfer between buckets left in flight", OK: inFlight == 0,
		Detail: fmt.Sprintf("%d transfers, %d in flight", transfers, inFlight)}, nil
}

// within reports whether got is want give or take slack (requests of unknown outcome).
func within(got, want, slack int64) bool {
	return got >= want-slack && got <= want+slack
}
