package model_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
)

const (
	linUnits   = 20  // the item's initial stock
	linIDs     = 256 // request ids id-0 .. id-255, handed out in order, then reused
	linWorkers = 12  // concurrent callers
	linOps     = 360 // operations per history, plus one final read
)

type linOp byte

const (
	linDeduct linOp = iota
	linRestore
	linRead
)

type linInput struct {
	op  linOp
	id  int   // deduct, restore
	qty int64 // deduct
}

// linCode is an operation's answer, as the caller sees it.
type linCode byte

const (
	linOK         linCode = iota // nil error, not replayed
	linReplay                    // nil error, Replayed
	linSoldOut                   // ErrSoldOut
	linShort                     // ErrInsufficient
	linRestored                  // ErrRestored
	linConflict                  // ErrConflict
	linUnknownID                 // ErrUnknownID
	linUnexpected                // another sentinel, or a receipt that contradicts its error: never legal
	linUnknown                   // a non-sentinel error: the outcome is unknown
)

var linCodeNames = [...]string{"ok", "replay", "sold out", "insufficient", "restored", "conflict", "unknown id", "unexpected", "unknown outcome"}

type linOutput struct {
	code           linCode
	remaining, qty int64 // the receipt's Remaining and Qty; for a read, remaining is the value
	err            string
}

// linEntry is the model of one id's ledger entry, small: porcupine keeps many states.
type linEntry struct {
	kind     byte // 0 none, 'D' deduct, 'T' tombstone
	restored bool
	qty      int16
	after    int16 // available right after the deduct: what a replay answers
}

// linState is the model's state: comparable, copied by value, so Step is pure.
type linState struct {
	avail int64
	ids   [linIDs]linEntry
}

// linStep is the sequential specification of one item (deduct.lua, restore.lua; no users, no
// holds): it returns the answer the operation must give in state s, and the next state.
func linStep(s linState, in linInput) (linOutput, linState) {
	switch in.op {
	case linRead:
		return linOutput{code: linOK, remaining: s.avail}, s
	case linRestore:
		e := s.ids[in.id]
		switch {
		case e.kind == 0:
			s.ids[in.id] = linEntry{kind: 'T'} // a tombstone: a late deduct of the id is refused
			return linOutput{code: linUnknownID}, s
		case e.kind == 'T':
			return linOutput{code: linUnknownID}, s
		case e.restored:
			return linOutput{code: linReplay, remaining: s.avail, qty: int64(e.qty)}, s
		}
		s.avail += int64(e.qty)
		e.restored = true
		s.ids[in.id] = e
		return linOutput{code: linOK, remaining: s.avail, qty: int64(e.qty)}, s
	}
	e := s.ids[in.id]
	switch {
	case e.kind == 'T':
		return linOutput{code: linRestored, remaining: s.avail, qty: in.qty}, s
	case e.kind == 'D' && int64(e.qty) != in.qty:
		return linOutput{code: linConflict, remaining: s.avail, qty: int64(e.qty)}, s
	case e.kind == 'D' && e.restored:
		return linOutput{code: linRestored, remaining: s.avail, qty: in.qty}, s
	case e.kind == 'D':
		return linOutput{code: linReplay, remaining: int64(e.after), qty: in.qty}, s
	case s.avail == 0:
		return linOutput{code: linSoldOut, remaining: 0, qty: in.qty}, s
	case s.avail < in.qty:
		return linOutput{code: linShort, remaining: s.avail, qty: in.qty}, s
	}
	s.avail -= in.qty
	s.ids[in.id] = linEntry{kind: 'D', qty: int16(in.qty), after: int16(s.avail)}
	return linOutput{code: linOK, remaining: s.avail, qty: in.qty}, s
}

var linModel = porcupine.Model{
	Init: func() any { return linState{avail: linUnits} },
	Step: func(state, input, output any) (bool, any) {
		in, out := input.(linInput), output.(linOutput)
		want, next := linStep(state.(linState), in)
		if out.code == linUnknown {
			return true, next // it may have happened (here) or not (linearized after everything)
		}
		return out.code == want.code && out.remaining == want.remaining && out.qty == want.qty, next
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(linInput), output.(linOutput)
		var call string
		switch in.op {
		case linDeduct:
			call = fmt.Sprintf("deduct(id-%d, %d)", in.id, in.qty)
		case linRestore:
			call = fmt.Sprintf("restore(id-%d)", in.id)
		default:
			call = "available()"
		}
		if in.op == linRead && out.code == linOK {
			return fmt.Sprintf("%s -> %d", call, out.remaining)
		}
		return fmt.Sprintf("%s -> %s qty=%d remaining=%d %s", call, linCodeNames[out.code], out.qty, out.remaining, out.err)
	},
	DescribeState: func(state any) string {
		s := state.(linState)
		var b strings.Builder
		fmt.Fprintf(&b, "available=%d", s.avail)
		for i, e := range s.ids {
			switch {
			case e.kind == 'T':
				fmt.Fprintf(&b, " id-%d:tombstone", i)
			case e.kind == 'D':
				fmt.Fprintf(&b, " id-%d:%d", i, e.qty)
				if e.restored {
					b.WriteString("(restored)")
				}
			}
		}
		return b.String()
	},
}

// linTarget is what the history is recorded against: a *stock.Reserver or a fake.
type linTarget interface {
	Deduct(ctx context.Context, req stock.Request) (stock.Receipt, error)
	Restore(ctx context.Context, sku, id string) (stock.Receipt, error)
	Levels(ctx context.Context, sku string) (stock.Levels, error)
}

var linSentinels = []error{
	stock.ErrSoldOut, stock.ErrInsufficient, stock.ErrNotLoaded, stock.ErrLoaded, stock.ErrConflict,
	stock.ErrRestored, stock.ErrUserLimit, stock.ErrUnknownID, stock.ErrClosed, stock.ErrExpired,
	stock.ErrConfirmed, stock.ErrNotReplicated, stock.ErrInvalid, stock.ErrFailover,
}

// linErrs are the refusals the model answers, by code (a history's and the fake's).
var linErrs = map[linCode]error{linSoldOut: stock.ErrSoldOut, linShort: stock.ErrInsufficient, linRestored: stock.ErrRestored,
	linConflict: stock.ErrConflict, linUnknownID: stock.ErrUnknownID}

// linClassify turns a call's receipt and error into an output.
func linClassify(rc stock.Receipt, err error) linOutput {
	out := linOutput{remaining: rc.Remaining, qty: rc.Qty}
	if err != nil {
		out.err = err.Error()
	}
	switch {
	case err == nil && rc.Replayed:
		out.code = linReplay
	case err == nil:
		out.code = linOK
	case rc.Replayed:
		out.code = linUnexpected // a refusal never says replayed
	default:
		out.code = linUnknown
		for _, s := range linSentinels {
			if errors.Is(err, s) {
				out.code = linUnexpected
			}
		}
		for code, e := range linErrs {
			if errors.Is(err, e) {
				out.code = code
			}
		}
	}
	return out
}

type linStats struct {
	codes [len(linCodeNames)][3]int // per code, per op
}

func (st *linStats) String() string {
	var parts []string
	for c, byOp := range st.codes {
		for op, n := range byOp {
			if n > 0 {
				parts = append(parts, fmt.Sprintf("%s %s=%d", [...]string{"deduct", "restore", "read"}[op], linCodeNames[c], n))
			}
		}
	}
	return strings.Join(parts, ", ")
}

// linRecord runs ops operations from workers goroutines on target, then one read after all
// of them, and returns the history.
func linRecord(t *testing.T, target linTarget, sku string, seed uint64, workers int, ops int64) ([]porcupine.Operation, *linStats) {
	t.Helper()
	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }
	var (
		mu      sync.Mutex
		history []porcupine.Operation
		next    atomic.Int64 // operations started
		fresh   atomic.Int64 // ids handed out
		wg      sync.WaitGroup
	)
	call := func(client int, in linInput) linOutput {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		op := porcupine.Operation{ClientId: client, Input: in, Call: now()}
		var out linOutput
		id := fmt.Sprintf("id-%d", in.id)
		switch in.op {
		case linDeduct:
			out = linClassify(target.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: in.qty}))
		case linRestore:
			out = linClassify(target.Restore(ctx, sku, id))
		default:
			n, err := testkit.Available(target.Levels(ctx, sku))
			out = linClassify(stock.Receipt{Remaining: n}, err)
		}
		op.Return = now()
		if out.code == linUnknown {
			op.Return = math.MaxInt64 // it may take effect at any time after its call
		}
		op.Output = out
		mu.Lock()
		history = append(history, op)
		mu.Unlock()
		return out
	}
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			// A recently used id: a retry, a reuse with another quantity, a restore.
			recent := func() int { return max(0, int(fresh.Load())-1-rng.IntN(12)) }
			var mine []int // ids this worker bought: its orders to cancel
			for next.Add(1) <= ops {
				var in linInput
				switch p := rng.IntN(100); {
				case p < 40: // a new order
					in = linInput{op: linDeduct, id: min(int(fresh.Add(1))-1, linIDs-1)}
				case p < 52: // a retry of a recent one, sometimes with another quantity
					in = linInput{op: linDeduct, id: recent()}
				case p < 64 && len(mine) > 0: // a cancel of an order, sometimes repeated
					i := rng.IntN(len(mine))
					in = linInput{op: linRestore, id: mine[i]}
					if rng.IntN(100) < 70 {
						mine = slices.Delete(mine, i, i+1)
					}
				case p < 70:
					in = linInput{op: linRestore, id: recent()}
				case p < 73: // a cancel that overtakes its order: a tombstone
					in = linInput{op: linRestore, id: min(int(fresh.Add(1))-1, linIDs-1)}
				default:
					in = linInput{op: linRead}
				}
				if in.op == linDeduct {
					in.qty = 1 + int64(in.id%3) // each id has its quantity...
					if p := rng.IntN(100); p < 20 && in.id < int(fresh.Load())-1 {
						in.qty++ // ...and a retry may carry another one: a conflict
					}
				}
				if out := call(w, in); in.op == linDeduct && out.code == linOK {
					mine = append(mine, in.id)
				}
			}
		})
	}
	wg.Wait()
	call(workers, linInput{op: linRead}) // after everything: pins the final stock

	st := &linStats{}
	for _, op := range history {
		out := op.Output.(linOutput)
		st.codes[out.code][op.Input.(linInput).op]++
		if out.code == linUnexpected {
			t.Errorf("unexpected answer: %s", linModel.DescribeOperation(op.Input, op.Output))
		}
	}
	return history, st
}

// linCheck runs porcupine with a bound; on anything but want it writes a visualization.
func linCheck(t *testing.T, history []porcupine.Operation, want porcupine.CheckResult) {
	t.Helper()
	res, info := porcupine.CheckOperationsVerbose(linModel, history, 20*time.Second)
	if res == want {
		return
	}
	msg := fmt.Sprintf("porcupine: %s, want %s (%d operations)", res, want, len(history))
	if f, err := os.CreateTemp("", "linearizability-*.html"); err == nil {
		if err := porcupine.Visualize(linModel, info, f); err == nil {
			msg += "; visualization: " + f.Name()
		}
		f.Close()
	}
	t.Fatal(msg)
}

// TestLinearizability records concurrent histories of one item on every backend and checks
// that each has a linearization under the model, with coalescing on (the default) and off.
func TestLinearizability(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		client := b.Client(t)
		// The sold-out fast path is off: its answers may be stale by the invalidation delay
		// (TestSoldOutWindow measures it), which a linearizability check cannot allow for
		// without a search that does not end.
		off := stock.WithSoldOutCache(0)
		for i, opts := range [][]stock.Option{{off}, {off, stock.WithCoalescing(0)}} {
			name := []string{"coalescing", "one-by-one"}[i]
			t.Run(name, func(t *testing.T) {
				ctx := context.Background()
				r, err := stock.New(client, opts...)
				require.NoError(t, err)
				for round := range 2 {
					sku := fmt.Sprintf("lin-%s-%d", name, round)
					require.NoError(t, r.Load(ctx, sku, linUnits))
					history, st := linRecord(t, r, sku, uint64(round)*7919+uint64(i), linWorkers, linOps)
					t.Logf("%s: %s", sku, st)
					linCheck(t, history, porcupine.Ok)
					// The same history with its first read answering one unit more than
					// the item ever had has no linearization. (An early op: proving a
					// history Illegal searches every linearization before it.)
					tampered := slices.Clone(history)
					first := -1
					for i, op := range tampered {
						known := op.Output.(linOutput).code == linOK
						if op.Input.(linInput).op == linRead && known && (first < 0 || op.Return < tampered[first].Return) {
							first = i
						}
					}
					out := tampered[first].Output.(linOutput)
					out.remaining = linUnits + 1
					tampered[first].Output = out
					linCheck(t, tampered, porcupine.Illegal)
				}
			})
		}
	})
}

// linFake is an in-memory item with the model's semantics and one optional fault.
type linFake struct {
	mu     sync.Mutex
	s      linState
	prev   int64 // available before the last change, for "stale read"
	fault  string
	faults int // how many times the fault changed an answer or the state
}

func (f *linFake) apply(in linInput) linOutput {
	f.mu.Lock()
	defer f.mu.Unlock()
	out, next := linStep(f.s, in)
	switch {
	case f.fault == "double apply" && in.op == linDeduct && out.code == linReplay && next.avail >= in.qty:
		next.avail -= in.qty // the retry takes the stock a second time
		f.faults++
	case f.fault == "restore twice" && in.op == linRestore && out.code == linReplay:
		next.avail += out.qty // the second restore gives the stock back again
		f.faults++
	case f.fault == "stale read" && in.op == linRead && f.prev != f.s.avail:
		out.remaining = f.prev // a read served from before the last write
		f.faults++
	}
	if next.avail != f.s.avail {
		f.prev = f.s.avail
	}
	f.s = next
	return out
}

func linReceipt(sku, id string, out linOutput) (stock.Receipt, error) {
	rc := stock.Receipt{SKU: sku, ID: id, Qty: out.qty, Remaining: out.remaining, Replayed: out.code == linReplay}
	return rc, linErrs[out.code]
}

func linFakeID(id string) int {
	var n int
	fmt.Sscanf(id, "id-%d", &n)
	return n
}

func (f *linFake) Deduct(_ context.Context, req stock.Request) (stock.Receipt, error) {
	return linReceipt(req.SKU, req.ID, f.apply(linInput{op: linDeduct, id: linFakeID(req.ID), qty: req.Qty}))
}

func (f *linFake) Restore(_ context.Context, sku, id string) (stock.Receipt, error) {
	return linReceipt(sku, id, f.apply(linInput{op: linRestore, id: linFakeID(id)}))
}

func (f *linFake) Levels(context.Context, string) (stock.Levels, error) {
	return stock.Levels{Available: f.apply(linInput{op: linRead}).remaining}, nil
}

// TestLinearizabilityControls: a correct in-memory item passes; broken ones (a replay that
// takes the stock again, a second restore that gives it back again, a read from before the
// last write) are found Illegal.
func TestLinearizabilityControls(t *testing.T) {
	for _, fault := range []string{"", "double apply", "restore twice", "stale read"} {
		name := fault
		if name == "" {
			name = "correct"
		}
		t.Run(strings.ReplaceAll(name, " ", "-"), func(t *testing.T) {
			var (
				f       *linFake
				history []porcupine.Operation
			)
			for seed := uint64(42); seed < 62; seed++ { // until the fault shows (at once, in practice)
				f = &linFake{s: linState{avail: linUnits}, fault: fault}
				var st *linStats
				// Shorter histories: proving one Illegal searches every linearization
				// up to the fault, which grows fast with the history's length.
				history, st = linRecord(t, f, "fake", seed, linWorkers/2, linOps/4)
				t.Logf("%s: %s; fault applied %d times", name, st, f.faults)
				if fault == "" || f.faults > 0 {
					break
				}
			}
			if fault == "" {
				linCheck(t, history, porcupine.Ok)
				return
			}
			require.Positive(t, f.faults, "the history never exercised the fault")
			linCheck(t, history, porcupine.Illegal)
		})
	}
}
