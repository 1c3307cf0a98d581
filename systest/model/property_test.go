package model_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

var (
	propSKUs  = []string{"A", "B"}
	propIDs   = []string{"i0", "i1", "i2", "i3", "i4", "i5"}
	propUsers = []string{"u0", "u1"}
)

const (
	propLease      = 20 * time.Millisecond
	propMaxBackoff = 10 * time.Millisecond // + up to half of it as jitter
	propSettle     = 40 * time.Millisecond // past any relay lease or backoff
)

// propMachine is one run of the state machine: a Reserver with a prefix of its own on the
// test's miniredis, a store, a relay, a reconciler, and the model.
type propMachine struct {
	c       rueidis.Client
	prefix  string
	limit   int64
	r       *stock.Reserver
	store   *testStore
	relay   *stockops.Relay
	rec     *stockops.Reconciler
	missing map[string]bool // item hashes this run deleted and no reconcile rebuilt yet
	lost    map[string]bool // sku/id whose ledger entry this run deleted, until a reconcile pass
	tainted map[string]bool // sku/id used while its entry was lost: Redis and the store may disagree on it for good
	fresh   map[string]int  // sku/id -> successful, not replayed Deducts and Holds since the id's entry was last lost
	back    map[string]int  // sku/id -> successful, not replayed Restores and Cancels since then
	stats   *propStats      // shared by the runs
	trace   []string        // what happened, for the failure message
	history []propReq       // deducts and holds sent, for retries
}

type propReq struct {
	req  stock.Request
	hold bool
	ttl  time.Duration
}

type propStats struct {
	runs, steps, fresh, replays, restores, refusals, rebuilt, adjusted, requeued, rerecorded, lostItems,
	lostEvents, lostEntries, humans, extraRounds atomic.Int64
}

func (m *propMachine) key(sku, suffix string) string { return m.prefix + ":{" + sku + "}" + suffix }

func (m *propMachine) logf(format string, args ...any) {
	m.trace = append(m.trace, fmt.Sprintf(format, args...))
}

func (m *propMachine) fail(t *rapid.T, format string, args ...any) {
	t.Helper()
	t.Fatalf("%s\ntrace:\n  %s", fmt.Sprintf(format, args...), strings.Join(m.trace, "\n  "))
}

func (m *propMachine) do(t *rapid.T, cmd rueidis.Completed) rueidis.RedisResult {
	t.Helper()
	res := m.c.Do(context.Background(), cmd)
	if err := res.Error(); err != nil && !rueidis.IsRedisNil(err) {
		m.fail(t, "redis: %v", err)
	}
	return res
}

// drawRef draws an item and an id of the pools.
func drawRef(t *rapid.T) (sku, id string) {
	return rapid.SampledFrom(propSKUs).Draw(t, "sku"), rapid.SampledFrom(propIDs).Draw(t, "id")
}

// expect fails the run on an error that is not one of allowed, and on ErrNotLoaded for an item
// this run did not lose (sku "": any item).
func (m *propMachine) expect(t *rapid.T, what, sku string, err error, allowed ...error) {
	t.Helper()
	if !oneOf(err, allowed...) {
		m.fail(t, "%s: unexpected error %v", what, err)
	}
	if sku != "" && errors.Is(err, stock.ErrNotLoaded) && !m.missing[sku] {
		m.fail(t, "%s: ErrNotLoaded for an item this run did not lose", what)
	}
}

// use records that an operation touched sku/id.
func (m *propMachine) use(sku, id string) {
	if k := sku + "/" + id; m.lost[k] {
		m.tainted[k] = true
	}
}

func (m *propMachine) deduct(t *rapid.T, hold bool) {
	sku, id := drawRef(t)
	qty := rapid.Int64Range(1, 3).Draw(t, "qty")
	user := ""
	if rapid.Bool().Draw(t, "user") {
		user = propUsers[slices.Index(propIDs, id)%len(propUsers)]
	}
	pr := propReq{req: stock.Request{SKU: sku, ID: id, User: user, Qty: qty}, hold: hold}
	if hold {
		pr.ttl = time.Duration(rapid.IntRange(10, 300).Draw(t, "ttl_ms")) * time.Millisecond
	}
	m.history = append(m.history, pr)
	m.take(t, pr, "")
}

// retry sends an earlier deduct or hold again, unchanged: a client retrying after a timeout.
func (m *propMachine) retry(t *rapid.T) {
	if len(m.history) == 0 {
		return
	}
	m.take(t, rapid.SampledFrom(m.history).Draw(t, "retry"), "retry ")
}

func (m *propMachine) take(t *rapid.T, pr propReq, what string) {
	t.Helper()
	req, hold := pr.req, pr.hold
	sku, id, qty, user := req.SKU, req.ID, req.Qty, req.User
	m.use(sku, id)
	var rc stock.Receipt
	var err error
	if hold {
		what += "hold"
		rc, err = m.r.Hold(context.Background(), req, pr.ttl)
	} else {
		what += "deduct"
		rc, err = m.r.Deduct(context.Background(), req)
	}
	m.logf("%s %s/%s qty %d user %q: %+v %v", what, sku, id, qty, user, rc, err)
	m.expect(t, what, sku, err, stock.ErrSoldOut, stock.ErrInsufficient, stock.ErrConflict, stock.ErrRestored,
		stock.ErrUserLimit, stock.ErrExpired, stock.ErrNotLoaded)
	if err == nil && rc.Replayed {
		m.stats.replays.Add(1)
	}
	if err == nil && !rc.Replayed {
		m.stats.fresh.Add(1)
		m.once(t, m.fresh, sku, id, what+" took stock")
	}
}

// once counts in n a take or give-back of sku/id that was not a replay, and fails the run on a
// second one since the id's entry was last lost.
func (m *propMachine) once(t *rapid.T, n map[string]int, sku, id, did string) {
	t.Helper()
	k := sku + "/" + id
	if n[k]++; n[k] > 1 {
		m.fail(t, "%s of %s a second time", did, k)
	}
}

func (m *propMachine) giveBack(t *rapid.T, cancel bool) {
	sku, id := drawRef(t)
	m.use(sku, id)
	var rc stock.Receipt
	var err error
	what := "restore"
	if cancel {
		what = "cancel"
		rc, err = m.r.Cancel(context.Background(), sku, id)
	} else {
		rc, err = m.r.Restore(context.Background(), sku, id)
	}
	m.logf("%s %s/%s: %+v %v", what, sku, id, rc, err)
	m.expect(t, what, sku, err, stock.ErrUnknownID, stock.ErrConflict, stock.ErrConfirmed, stock.ErrNotLoaded)
	if err == nil && !rc.Replayed {
		m.stats.restores.Add(1)
		m.once(t, m.back, sku, id, what+" gave stock back")
	}
}

func (m *propMachine) confirm(t *rapid.T) {
	sku, id := drawRef(t)
	m.use(sku, id)
	rc, err := m.r.Confirm(context.Background(), sku, id)
	m.logf("confirm %s/%s: %+v %v", sku, id, rc, err)
	m.expect(t, "confirm", sku, err, stock.ErrExpired, stock.ErrRestored, stock.ErrUnknownID, stock.ErrConflict, stock.ErrNotLoaded)
}

func (m *propMachine) restock(t *rapid.T) {
	sku, id := drawRef(t)
	id = "r" + id
	qty := rapid.Int64Range(1, 3).Draw(t, "qty")
	rc, err := m.r.Restock(context.Background(), sku, id, qty)
	m.logf("restock %s/%s qty %d: %+v %v", sku, id, qty, rc, err)
	m.expect(t, "restock", sku, err, stock.ErrConflict, stock.ErrNotLoaded, stock.ErrRestored)
}

func (m *propMachine) sleep(t *rapid.T) {
	d := time.Duration(rapid.IntRange(1, 300).Draw(t, "ms")) * time.Millisecond
	m.logf("time passes: %v", d)
	redistest.Sleep(m.c, d)
}

func (m *propMachine) sweep(t *rapid.T) {
	n, err := stockops.Sweep(context.Background(), m.r)
	m.logf("sweep: %d released, %v", n, err)
	if err != nil {
		m.fail(t, "sweep: %v", err)
	}
}

// relayOnce runs one relay pass, maybe with a store that fails after a few Apply calls.
func (m *propMachine) relayOnce(t *rapid.T) {
	okLeft, after := -1, false
	if rapid.Bool().Draw(t, "store_fails") {
		okLeft = rapid.IntRange(0, 3).Draw(t, "ok_before_failing")
		after = rapid.Bool().Draw(t, "fail_after_apply")
	}
	m.store.failAfter(okLeft, after)
	st, err := m.relay.Once(context.Background())
	m.store.failAfter(-1, false)
	m.stats.refusals.Add(int64(st.Refused))
	m.logf("relay (store ok for %d, after %v): %+v %v", okLeft, after, st, err)
	m.expect(t, "relay", "", err, memstore.ErrDown, errPropAfterApply, errPropNotApplied, stock.ErrNotLoaded)
}

// reconcile lets the relay leases and backoffs run out, then runs one reconcile pass.
func (m *propMachine) reconcile(t *rapid.T) []stockops.Report {
	t.Helper()
	redistest.Sleep(m.c, propSettle)
	reps, err := m.rec.Once(context.Background())
	clear(m.lost) // written back (or already used again: tainted)
	for _, rp := range reps {
		m.logf("reconcile: %s", rp)
		if rp.Busy {
			m.fail(t, "reconcile: %s is busy with no relay running", rp.SKU)
		}
		if rp.Rebuilt {
			m.stats.rebuilt.Add(1)
		}
		m.stats.adjusted.Add(max(rp.Adjusted, -rp.Adjusted))
		m.stats.requeued.Add(int64(rp.Requeued))
		m.stats.rerecorded.Add(int64(rp.Rerecorded))
		if rp.NeedsHuman != "" {
			m.stats.humans.Add(1)
		}
		if _, lerr := m.r.Levels(context.Background(), rp.SKU); lerr == nil {
			m.missing[rp.SKU] = false
		} else if rp.NeedsHuman == "" {
			m.fail(t, "reconcile left %s unreadable (%v) and reported nothing for a human: %s", rp.SKU, lerr, rp)
		}
	}
	if err != nil {
		m.fail(t, "reconcile: %v", err)
	}
	return reps
}

// loseItem deletes an item's hash (eviction, a restart, a failover before the load replicated).
func (m *propMachine) loseItem(t *rapid.T) {
	sku := rapid.SampledFrom(propSKUs).Draw(t, "sku")
	m.do(t, m.c.B().Del().Key(m.key(sku, "")).Build())
	m.missing[sku] = true
	m.stats.lostItems.Add(1)
	m.logf("LOSE item hash %s", sku)
}

// loseEvent removes one pending outbox event.
func (m *propMachine) loseEvent(t *rapid.T) {
	sku := rapid.SampledFrom(propSKUs).Draw(t, "sku")
	ms, err := m.do(t, m.c.B().Zrange().Key(m.key(sku, ":o")).Min("0").Max("-1").Build()).AsStrSlice()
	if err != nil {
		m.fail(t, "zrange: %v", err)
	}
	if len(ms) == 0 {
		return
	}
	ev := rapid.SampledFrom(ms).Draw(t, "event")
	m.do(t, m.c.B().Zrem().Key(m.key(sku, ":o")).Member(ev).Build())
	m.stats.lostEvents.Add(1)
	m.logf("LOSE outbox event %s %s", sku, ev)
}

// loseEntry removes the ledger entry of an id the store applied, and what it did to the counters
// and to its user's units, as a failover to a replica that missed the write would.
func (m *propMachine) loseEntry(t *rapid.T) {
	sku := rapid.SampledFrom(propSKUs).Draw(t, "sku")
	all, err := m.do(t, m.c.B().Hgetall().Key(m.key(sku, ":l")).Build()).AsStrMap()
	if err != nil {
		m.fail(t, "hgetall: %v", err)
	}
	var ids []string
	for id, e := range all {
		if len(e) > 2 && (e[0] == 'D' || e[0] == 'H') && e[1] == 'a' {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return
	}
	slices.Sort(ids)
	id := rapid.SampledFrom(ids).Draw(t, "entry")
	f := strings.Split(all[id], "|")
	qty, _ := strconv.ParseInt(f[1], 10, 64)
	user := f[4] // "KS|qty|after|at|user[|deadline]"
	m.do(t, m.c.B().Hdel().Key(m.key(sku, ":l")).Field(id).Build())
	counters := false
	if l, err := m.r.Levels(context.Background(), sku); err == nil && l.Sold >= qty {
		counters = true
		m.do(t, m.c.B().Hincrby().Key(m.key(sku, "")).Field("a").Increment(qty).Build())
		m.do(t, m.c.B().Hincrby().Key(m.key(sku, "")).Field("s").Increment(-qty).Build())
		if user != "" {
			n, err := m.do(t, m.c.B().Hincrby().Key(m.key(sku, ":u")).Field(user).Increment(-qty).Build()).AsInt64()
			if err == nil && n <= 0 {
				m.do(t, m.c.B().Hdel().Key(m.key(sku, ":u")).Field(user).Build())
			}
		}
	}
	k := sku + "/" + id
	m.fresh[k], m.back[k] = 0, 0
	m.lost[k] = true
	m.stats.lostEntries.Add(1)
	m.logf("LOSE ledger entry %s/%s %q (counters too: %v)", sku, id, all[id], counters)
}

// check asserts the invariants that hold after every step.
func (m *propMachine) check(t *rapid.T) {
	t.Helper()
	ctx := context.Background()
	for _, sku := range propSKUs {
		l, err := m.r.Levels(ctx, sku)
		switch {
		case errors.Is(err, stock.ErrNotLoaded):
			if !m.missing[sku] {
				m.fail(t, "%s is not loaded and this run did not lose it", sku)
			}
		case err != nil:
			m.fail(t, "levels %s: %v", sku, err)
		default:
			if l.Loaded != l.Available+l.Held+l.Sold || l.Available < 0 || l.Held < 0 {
				m.fail(t, "%s: levels %+v break loaded = available + held + sold, available >= 0, held >= 0", sku, l)
			}
		}
		rem, err := m.store.Remaining(ctx, sku)
		if err != nil || rem < 0 {
			m.fail(t, "store remaining of %s: %d %v", sku, rem, err)
		}
		if m.limit > 0 {
			units, err := m.do(t, m.c.B().Hgetall().Key(m.key(sku, ":u")).Build()).AsIntMap()
			if err != nil {
				m.fail(t, "users: %v", err)
			}
			for u, n := range units {
				if n <= 0 || n > m.limit {
					m.fail(t, "%s: user %s has %d units, limit %d", sku, u, n, m.limit)
				}
			}
		}
	}
	if n := m.store.MaxApplications(); n > 1 {
		m.fail(t, "the store applied an event %d times", n)
	}
}

// drain runs relay passes, letting backoffs run out, until a pass claims nothing and fails
// nothing. It reports whether it got there.
func (m *propMachine) drain(t *rapid.T) bool {
	t.Helper()
	for range 30 {
		redistest.Sleep(m.c, propSettle)
		st, err := m.relay.Once(context.Background())
		m.stats.refusals.Add(int64(st.Refused))
		m.logf("quiesce relay: %+v %v", st, err)
		if err == nil && st.Claimed == 0 {
			return true
		}
		m.expect(t, "quiesce relay", "", err, stock.ErrNotLoaded)
	}
	return false
}

// agree reports, per item, how far Redis's available + held is from the store's remaining.
func (m *propMachine) agree(t *rapid.T) map[string]string {
	ctx := context.Background()
	off := map[string]string{}
	for _, sku := range propSKUs {
		rem, _ := m.store.Remaining(ctx, sku)
		l, err := m.r.Levels(ctx, sku)
		if err != nil {
			off[sku] = fmt.Sprintf("redis: %v, store %d", err, rem)
			continue
		}
		if l.Available+l.Held != rem {
			off[sku] = fmt.Sprintf("redis %+v, store %d", l, rem)
		}
		n, err := m.do(t, m.c.B().Zcard().Key(m.key(sku, ":o")).Build()).AsInt64()
		if err != nil || n != 0 {
			off[sku] += fmt.Sprintf("; %d events still pending (%v)", n, err)
		}
	}
	return off
}

// quiesce drains the relay, reconciles and drains again, and then Redis and the store must
// agree. When the reconciler reported something for a human in that round, further rounds are
// allowed (the documented manual cases resolve once the refusals they wait for are given back).
func (m *propMachine) quiesce(t *rapid.T) {
	m.logf("QUIESCE")
	for round := 1; ; round++ {
		if round > 1 {
			// The reconciler cannot take back held units: let the holds expire.
			redistest.Sleep(m.c, time.Second)
			n, err := stockops.Sweep(context.Background(), m.r)
			m.logf("quiesce round %d: holds expire, sweep released %d %v", round, n, err)
		}
		m.drain(t)
		reps := m.reconcile(t)
		drained := m.drain(t)
		m.check(t)
		off := m.agree(t)
		if len(off) == 0 && drained {
			if round > 1 {
				m.stats.extraRounds.Add(1)
			}
			break
		}
		human := slices.ContainsFunc(reps, func(rp stockops.Report) bool { return rp.NeedsHuman != "" })
		// An id used with other parameters while its entry was lost (ErrConflict-worthy, but
		// Redis no longer knew it) has a store record that differs from its Redis entry: a
		// pending event of it is sized wrongly as in flight, and the pass after its delivery
		// corrects that. Not a case the guarantees cover; allow the extra round.
		if !human && len(m.tainted) == 0 || round == 3 {
			m.fail(t, "after %d quiesce rounds (drained %v) Redis and the store disagree: %v", round, drained, off)
		}
	}
	// Every id the store knows is known to Redis in the same state: sold in both, or given
	// back in both.
	ctx := context.Background()
	for _, sku := range propSKUs {
		all, err := m.do(t, m.c.B().Hgetall().Key(m.key(sku, ":l")).Build()).AsStrMap()
		if err != nil {
			m.fail(t, "hgetall: %v", err)
		}
		recs, err := m.store.List(ctx, sku, "", 1000)
		if err != nil {
			m.fail(t, "list: %v", err)
		}
		for _, rec := range recs {
			e, ok := all[rec.ID]
			if !ok {
				m.fail(t, "the store has %s/%s (%s) and Redis has no entry", sku, rec.ID, rec.Status)
			}
			if m.tainted[sku+"/"+rec.ID] {
				// The id was used between the loss of its entry and the reconcile pass that
				// would have written it back (a restore left a tombstone, a hold or a deduct
				// took stock again): the documented cost of a lost entry.
				continue
			}
			sold := e[1] == 'a' || e[1] == 'r'
			if sold != (rec.Status == stock.StateApplied) {
				m.fail(t, "%s/%s: Redis entry %q, store %s", sku, rec.ID, e, rec.Status)
			}
		}
	}
}

// TestPropertyInvariants runs random interleavings of deducts, holds, restores, relay passes
// (with a store that fails), reconcile passes and lost keys, events and ledger entries, on
// miniredis and the in-memory store, and checks the invariants after every step and agreement
// after a final quiesce.
func TestPropertyInvariants(t *testing.T) {
	// Unless given on the command line: leave no testdata/rapid/*.fail files in the module,
	// and spend at most 5s shrinking a failure.
	for name, v := range map[string]string{"rapid.nofailfile": "true", "rapid.shrinktime": "5s"} {
		env := "RAPID_" + strings.ToUpper(strings.TrimPrefix(name, "rapid."))
		if _, inEnv := os.LookupEnv(env); !inEnv && !flagSet(name) {
			setFlag(t, name, v)
		}
	}
	mr, c := redistest.Miniredis(t)
	stats := &propStats{}
	start := time.Now()
	rapid.Check(t, func(rt *rapid.T) {
		run := stats.runs.Add(1)
		mr.FlushAll() // the runs' keys have prefixes of their own; this only keeps miniredis small
		m := &propMachine{
			c: c, prefix: fmt.Sprintf("p%d", run),
			limit:   rapid.SampledFrom([]int64{0, 2, 4}).Draw(rt, "user_limit"),
			store:   newTestStore(nil),
			missing: map[string]bool{}, lost: map[string]bool{}, tainted: map[string]bool{}, fresh: map[string]int{}, back: map[string]int{},
			stats: stats,
		}
		var err error
		m.r, err = stock.New(c, stock.WithPrefix(m.prefix), stock.WithUserLimit(m.limit))
		require.NoError(rt, err)
		for _, sku := range propSKUs {
			n := rapid.Int64Range(0, 12).Draw(rt, "load_"+sku)
			loadBoth(rt, m.r, m.store, sku, n)
			m.logf("load %s %d", sku, n)
		}
		m.relay, m.rec = pipeline(rt, m.r, m.store, &stock.RelayOptions{Lease: propLease, MinBackoff: time.Millisecond,
			MaxBackoff: propMaxBackoff, Batch: rapid.IntRange(1, 4).Draw(rt, "batch")}, nil)
		actions := map[string]func(*rapid.T){
			"deduct":    func(t *rapid.T) { m.deduct(t, false) },
			"retry":     m.retry,
			"hold":      func(t *rapid.T) { m.deduct(t, true) },
			"restore":   func(t *rapid.T) { m.giveBack(t, false) },
			"cancel":    func(t *rapid.T) { m.giveBack(t, true) },
			"confirm":   m.confirm,
			"restock":   m.restock,
			"sleep":     m.sleep,
			"sweep":     m.sweep,
			"relay":     m.relayOnce,
			"reconcile": func(t *rapid.T) { m.reconcile(t) },
			"loseItem":  m.loseItem,
			"loseEvent": m.loseEvent,
			"loseEntry": m.loseEntry,
		}
		// Deducts and relay passes more often than the rest.
		names := []string{"deduct", "deduct", "deduct", "retry", "retry", "hold", "restore", "cancel", "confirm", "confirm",
			"restock", "sleep", "sweep", "relay", "relay", "reconcile", "loseItem", "loseEvent", "loseEntry", "loseEntry"}
		steps := rapid.IntRange(1, 50).Draw(rt, "steps")
		m.check(rt)
		for range steps {
			actions[rapid.SampledFrom(names).Draw(rt, "action")](rt)
			m.check(rt)
		}
		stats.steps.Add(int64(steps))
		m.quiesce(rt)
	})
	t.Logf("%d runs, %d steps in %v: %d fresh takes, %d replays, %d give-backs, %d store refusals given back; "+
		"lost %d item hashes, %d outbox events, %d ledger entries; repaired: %d rebuilt, %d units adjusted, "+
		"%d requeued, %d rerecorded; %d reports for a human; %d quiesces needed a second round",
		stats.runs.Load(), stats.steps.Load(), time.Since(start).Round(time.Millisecond), stats.fresh.Load(),
		stats.replays.Load(), stats.restores.Load(), stats.refusals.Load(), stats.lostItems.Load(),
		stats.lostEvents.Load(), stats.lostEntries.Load(), stats.rebuilt.Load(), stats.adjusted.Load(),
		stats.requeued.Load(), stats.rerecorded.Load(), stats.humans.Load(), stats.extraRounds.Load())
}

// propBackends runs f on every backend (miniredis; a real standalone and cluster when
// STOCK_REDIS_SERVER is set) with a fresh Reserver, store, relay and reconciler, item A loaded
// with n units in both.
func propBackends(t *testing.T, n int64, f func(t *testing.T, c rueidis.Client, g propRig)) {
	t.Helper()
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		c := b.Client(t)
		g := propRig{r: testkit.NewReserver(t, c), store: memstore.New()}
		loadBoth(t, g.r, g.store, "A", n)
		g.relay, g.rec = pipeline(t, g.r, g.store, nil, nil)
		f(t, c, g)
	})
}

type propRig struct {
	r     *stock.Reserver
	store *memstore.Store
	relay *stockops.Relay
	rec   *stockops.Reconciler
}

func (g propRig) reconcile(t *testing.T) stockops.Report {
	t.Helper()
	reps, err := g.rec.Once(context.Background())
	if err != nil || len(reps) != 1 {
		t.Fatalf("reconcile: %v %v", reps, err)
	}
	t.Logf("report: %s", reps[0])
	return reps[0]
}

func (g propRig) drain(t *testing.T) { testkit.Drain(t, g.relay) }

// wantAgree checks that Redis's available + held stock of A is the store's remaining.
func (g propRig) wantAgree(t *testing.T, when string) {
	t.Helper()
	l, err := g.r.Levels(context.Background(), "A")
	require.NoError(t, err)
	rem, _ := g.store.Remaining(context.Background(), "A")
	if l.Available+l.Held != rem {
		t.Errorf("%s: Redis %d available + %d held, the store %d", when, l.Available, l.Held, rem)
	}
}

func propDo(t *testing.T, c rueidis.Client, cmd rueidis.Completed) {
	t.Helper()
	require.NoError(t, c.Do(context.Background(), cmd).Error())
}

// TestPropertyLostItemAndEvent: found by TestPropertyInvariants (fixed in 57ab49e). The item
// hash and the outbox event of a pending deduct are both lost. The reconciler's ledger pass
// requeues the event first (queue_event in lua/lib.lua runs HINCRBY <item> q 1), which creates
// the item hash with only the sequence field; rebuild.lua refused to rebuild an existing hash,
// so the item stayed unreadable for good (ErrNotLoaded everywhere, and Load said ErrLoaded).
func TestPropertyLostItemAndEvent(t *testing.T) {
	propBackends(t, 5, func(t *testing.T, c rueidis.Client, g propRig) {
		ctx := context.Background()
		_, err := g.r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1})
		require.NoError(t, err)
		propDo(t, c, c.B().Del().Key("stock:{A}:o").Build()) // the event: lost
		propDo(t, c, c.B().Del().Key("stock:{A}").Build())   // the item hash: lost
		for pass := range 2 {
			rp := g.reconcile(t)
			if rp.Requeued != 1 && pass == 0 {
				t.Errorf("requeued %d events, want 1", rp.Requeued)
			}
			l, err := g.r.Levels(ctx, "A")
			require.NoError(t, err, "pass %d: the item is still unreadable after the reconciler's rebuild (%v); report: %s", pass, err, rp)
			assert.EqualValues(t, 4, l.Available, "available %d, want 4 (the store's 5 minus the requeued deduct)", l.Available)
		}
		g.drain(t)
		if _, err := g.r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", Qty: 1}); err != nil {
			t.Fatalf("deducts do not resume: %v", err)
		}
	})
}

// TestPropertyOversoldReport: found by TestPropertyInvariants. Redis holds more units than the
// store has (here: the store lost two units; in the property test: phantom units after a
// failover lost a sale, then taken by a hold). The reconciler cannot take held units back, and
// must say so.
//
//   - present: the NeedsHuman text (reconcile.go, the adjust branch) prints -rp.Drift-o.remaining,
//     which is negative whenever it is shown: "Redis had sold -1 units more than the store has".
//   - missing: when the item hash is also gone, the rebuild branch computes available as
//     expected − held and rebuild.lua clamps it at 0, so Redis ends with available + held above
//     the store's figure; NeedsHuman is set only when expected < 0, so the report says
//     "rebuilt" and nothing for a human.
func TestPropertyOversoldReport(t *testing.T) {
	for _, missing := range []bool{false, true} {
		t.Run(map[bool]string{false: "present", true: "missing"}[missing], func(t *testing.T) {
			propBackends(t, 4, func(t *testing.T, c rueidis.Client, g propRig) {
				ctx := context.Background()
				_, err := g.r.Hold(ctx, stock.Request{SKU: "A", ID: "h1", Qty: 3}, time.Hour)
				require.NoError(t, err)
				g.drain(t)
				g.store.Set("A", 2) // the store has 2; Redis holds 3 and has 1 available
				if missing {
					propDo(t, c, c.B().Del().Key("stock:{A}").Build())
				}
				rp := g.reconcile(t)
				l, err := g.r.Levels(ctx, "A")
				require.NoError(t, err)
				if l.Available+l.Held != 2 && rp.NeedsHuman == "" {
					t.Errorf("Redis has %d available + %d held, the store 2, and the report leaves nothing for a human: %s",
						l.Available, l.Held, rp)
				}
				assert.NotContains(t, rp.NeedsHuman, "sold -", "negative count in %q: Redis is 1 unit over the store", rp.NeedsHuman)
			})
		})
	}
}

// TestPropertyStoreAlreadyRestored: found by TestPropertyInvariants (an id reused after its
// entry was lost), seen in TestLossyFailover (drift found by the final pass), and reduced to
// the failover case: the promoted replica has a deduct pending
// (entry reserved, event queued) that the old primary's relay had delivered and then restored
// in the store before the failover (the replica missed the restore). The reconciler counts the
// pending deduct as in flight (reconcile.go: InFlight += storeNet(rec) − redisNet(entry) = 0 −
// (−2)), as if the store would still take 2 units; but the store already settled the id and
// answers the redelivery as the first time (nil, no change). The pass finds no drift; after the
// relay, Redis is 2 units short of the store until the next pass.
func TestPropertyStoreAlreadyRestored(t *testing.T) {
	propBackends(t, 10, func(t *testing.T, c rueidis.Client, g propRig) {
		ctx := context.Background()
		_, err := g.r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 2})
		require.NoError(t, err)
		// What the old primary's relay delivered before the failover.
		for _, typ := range []stock.EventType{stock.EventDeducted, stock.EventRestored} {
			require.NoError(t, g.store.Apply(ctx, stock.Event{Type: typ, SKU: "A", ID: "o1", Qty: 2, At: time.Now()}))
		}
		rp := g.reconcile(t)
		g.drain(t)
		g.wantAgree(t, fmt.Sprintf("after reconcile + relay (the pass reported drift %d)", rp.Drift))
	})
}

// TestPropertyLostRestore: found by TestLossyFailover. A restore that the store has (the old
// primary's relay delivered it) is lost by the promoted replica, whose entry still says sold.
// The reconciler repairs the counters (drift) but not the entry: ledgerPass writes back only
// entries Redis lacks altogether (rerecord.lua is HSETNX; ids already in the ledger are skipped
// as seen). A retry of the restore, which the buyer's side may well send after a failover, is
// then answered OK rather than as a replay and gives the units back a second time in Redis; the
// store ignores it (already restored), so Redis offers units the store does not have until the
// next pass.
func TestPropertyLostRestore(t *testing.T) {
	propBackends(t, 10, func(t *testing.T, c rueidis.Client, g propRig) {
		ctx := context.Background()
		_, err := g.r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 2})
		require.NoError(t, err)
		g.drain(t)
		sold, err := c.Do(ctx, c.B().Hget().Key("stock:{A}:l").Field("o1").Build()).ToString()
		require.NoError(t, err)
		_, err = g.r.Restore(ctx, "A", "o1")
		require.NoError(t, err)
		g.drain(t) // the store has the restore
		// The promoted replica missed the restore: the entry and counters as they were.
		propDo(t, c, c.B().Hset().Key("stock:{A}:l").FieldValue().FieldValue("o1", sold).Build())
		propDo(t, c, c.B().Hincrby().Key("stock:{A}").Field("a").Increment(-2).Build())
		propDo(t, c, c.B().Hincrby().Key("stock:{A}").Field("s").Increment(2).Build())

		g.reconcile(t)
		rc, err := g.r.Restore(ctx, "A", "o1")
		require.NoError(t, err)
		if !rc.Replayed {
			t.Errorf("a retry of a restore the store already has was given back again: %+v", rc)
		}
		g.drain(t)
		g.wantAgree(t, "after the retried restore")
	})
}
