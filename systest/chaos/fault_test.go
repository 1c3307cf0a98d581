package chaos_test

import (
	"context"
	"crypto/sha1"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/faultproxy"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/sqlstore"
	"github.com/stockres/stock/stockops"
	"github.com/stockres/stock/systest/internal/kit"
)

var faultSKUs = []string{"scarce-0", "scarce-1", "deep-0", "deep-1"}

// faultControl names the broken variant a negative control runs.
type faultControl int

const (
	ctlNone           faultControl = iota
	ctlNewID                       // an unknown outcome is retried with a new id
	ctlNaiveReconcile              // HSET stock:{sku} a <store remaining>, under traffic, instead of the Reconciler
	ctlBlindRestore                // an order cancelled before its deduct: HINCRBY stock:{sku} a q instead of Restore
	ctlBareEvalsha                 // deducts sent as a bare EVALSHA, without the EVAL fallback
	ctlCutAOF                      // every kill also cuts the AOF's last second (an fsync that did not happen)
	ctlDoubleApply                 // the relay's store applies a redelivered deduct again
	ctlNoFence                     // the FailoverGuard fences another Reserver than the clients' one
	ctlNoOrder                     // queue consumers apply events as the broker hands them over (their sequence dropped)
)

var faultControlNames = map[faultControl]string{
	ctlNewID:          "retry with a new id",
	ctlNaiveReconcile: "naive reconcile (HSET a = store remaining)",
	ctlBlindRestore:   "blind restore (HINCRBY a q)",
	ctlBareEvalsha:    "bare EVALSHA (no EVAL fallback)",
	ctlCutAOF:         "AOF tail lost at each kill",
	ctlDoubleApply:    "store applies redeliveries again",
	ctlNoFence:        "clients not fenced (the guard fences another Reserver)",
	ctlNoOrder:        "consumers apply in delivery order (no sequence)",
}

// faultScenario is one kind of fault.
type faultScenario struct {
	name      string
	redisArgs []string
	proxy     bool // the clients' Reserver reaches Redis through a faultproxy
	guard     bool // a FailoverGuard fences the clients' Reserver after a restart or a failover
	// failover: Redis is a primary with a replica, both the clients and the relay (and the
	// reconciler) reach it through a faultproxy each, and inject fails over between the two.
	failover bool
	// loss: acknowledged writes may be lost (the AOF loses its unsynced tail, a failover
	// discards the old primary's last writes): lost deducts, repairs and store refusals are
	// measured and explained, not failures.
	loss       bool
	opTimeout  time.Duration // each call's deadline
	replays    bool          // retries after unknown outcomes must be answered as replays (> 0)
	relayLease time.Duration
	// queue: the relay only publishes, to an in-process broker that redelivers what a consumer
	// did not acknowledge after an ack wait, behind what it delivered since; consumers apply
	// the events through stock.Consume and are killed at random moments (fault_queue_test.go).
	queue   bool
	inject  func(h *faultHarness, ctx context.Context) // until ctx ends, then leaves things healthy
	control faultControl
}

var faultScenarios = []faultScenario{
	{name: "kill9-aof-always", redisArgs: []string{"--appendonly", "yes", "--appendfsync", "always"},
		guard: true, opTimeout: time.Second, inject: injectKill9(600*time.Millisecond, func(int) bool { return false }),
		control: ctlCutAOF},
	{name: "kill9-aof-everysec", redisArgs: []string{"--appendonly", "yes", "--appendfsync", "everysec"},
		guard: true, loss: true, opTimeout: time.Second,
		// The first kill comes after the load was synced (everysec: within a second). Kills 1,
		// 3, ... also drop the AOF's unsynced last second, as an OS crash would: a SIGKILL alone
		// loses nothing the kernel already has (Redis normally writes the AOF before it replies).
		inject:  injectKill9(1300*time.Millisecond, func(i int) bool { return i%2 == 0 }),
		control: ctlNaiveReconcile},
	{name: "script-flush-storm", opTimeout: time.Second, inject: injectScriptFlush, control: ctlBareEvalsha},
	{name: "proxy-reset", proxy: true, opTimeout: 300 * time.Millisecond, inject: injectReset, control: ctlNewID},
	{name: "proxy-latency", proxy: true, opTimeout: 300 * time.Millisecond, inject: injectLatency, control: ctlNewID},
	{name: "proxy-reply-lost", proxy: true, opTimeout: time.Second, replays: true, inject: injectReplyLost, control: ctlNewID},
	{name: "client-pause", opTimeout: 200 * time.Millisecond, inject: injectClientPause, control: ctlBlindRestore},
	{name: "relay-crash", opTimeout: time.Second, relayLease: 500 * time.Millisecond, control: ctlDoubleApply},
	{name: "queue-consumers-killed", opTimeout: time.Second, queue: true, control: ctlNoOrder},
	// A caught-up replica is promoted while the primary still takes writes (clients, relay and
	// reconciler on it) for 100-300ms; then everyone is switched to the promoted replica and
	// the old primary is demoted to a replica of it, which discards its last writes. The relay
	// delivers some of those writes to the store meanwhile: the promoted replica is behind the
	// store, and the final reconcile must leave Loaded and Sold exact (CountersOff).
	{name: "lossy-failover", redisArgs: []string{"--repl-diskless-sync-delay", "0"}, proxy: true, failover: true,
		guard: true, loss: true, opTimeout: time.Second, inject: injectLossyFailover, control: ctlNoFence},
}

// faultDB is a database of record.
type faultDB struct {
	name, driver, dsn string
	dialect           sqlstore.Dialect
}

// TestFaultInjection runs every scenario and its negative control, and prints the reliability
// report. It needs a real redis-server (STOCK_REDIS_SERVER) and returns at once without one.
func TestFaultInjection(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skipf("%s is not set: the fault-injection suite needs a real redis-server", redistest.EnvServer)
	}
	traffic, ctlTraffic, clients := kit.FaultTraffic, kit.FaultControlTraffic, kit.FaultClients
	if os.Getenv(kit.FaultEnvLong) == "1" {
		traffic, ctlTraffic, clients = 5*traffic, 5*ctlTraffic, 2*clients
	}
	dbs := []faultDB{{name: "sqlite", driver: "sqlite", dialect: sqlstore.SQLite}}
	if dsn := os.Getenv("STOCK_TEST_POSTGRES"); dsn != "" {
		dbs = append(dbs, faultDB{name: "postgres", driver: "pgx", dialect: sqlstore.Postgres, dsn: dsn})
	}
	began := time.Now()
	// A scenario's runs (one per store, and its control) run at once: each has its own servers,
	// proxies and tables, and most of a run waits on faults, restarts and settling.
	var (
		mu      sync.Mutex
		results []kit.FaultResult
	)
	for _, sc := range faultScenarios {
		t.Run(sc.name, func(t *testing.T) {
			for _, db := range dbs {
				t.Run(db.name, func(t *testing.T) {
					t.Parallel()
					res := runFault(t, sc, db, ctlNone, traffic, clients)
					mu.Lock()
					results = append(results, res)
					mu.Unlock()
					for _, f := range res.Flags {
						t.Errorf("%s on %s: %s", sc.name, db.name, f)
					}
				})
			}
			// The control checks the checks: SQLite is enough. Some controls show their bug
			// only when a call meets a short window (a fence up from the start to the end of
			// a take); a loaded machine can leave no call there, so a control run that was
			// not flagged runs again, up to 5 times, and the control fails when none was.
			t.Run("control", func(t *testing.T) {
				t.Parallel()
				res := kit.RerunControl(t, sc.name, faultControlNames[sc.control], runFault(t, sc, dbs[0], sc.control, ctlTraffic, clients),
					func() kit.FaultResult { return runFault(t, sc, dbs[0], sc.control, ctlTraffic, clients) })
				mu.Lock()
				results = append(results, res)
				mu.Unlock()
				if len(res.Flags) == 0 {
					t.Errorf("%s: the negative control (%s) was not flagged by any check", sc.name, faultControlNames[sc.control])
				}
			})
		})
	}
	kit.FaultReport(t, results, time.Since(began))
}

// faultHarness is one run of a scenario.
type faultHarness struct {
	t       *testing.T
	sc      faultScenario
	ctl     faultControl
	db      faultDB
	seed    uint64
	stopAt  time.Time
	injCtx  context.Context // ends with the traffic
	clients int
	settle  time.Duration // how long a client retries one unknown outcome

	srv          *redistest.Server // the first primary
	px           *faultproxy.Proxy // the clients' proxy, if any
	fo           *faultFo          // failover scenarios
	front, back  *stock.Reserver   // the clients' (through the proxy, if any) and the relay's
	fc, bc       rueidis.Client
	sqlDB        *sql.DB
	store        *sqlstore.Store
	items, recs  string // table names
	loaded       map[string]int64
	deductSHA    string // ctlBareEvalsha
	deductSrc    string
	aof          *aofTracker
	relayCancel  atomic.Pointer[context.CancelFunc]
	relay        atomic.Pointer[stockops.Relay] // the running relay, which also drains at the end
	broker       *faultBroker                   // queue scenarios
	seqStore     *faultSeqStore                 // queue scenarios: the consumers' store
	recMu        sync.Mutex                     // held by the background reconciler during a pass
	fence        *kit.Fence                     // the guard of the clients' Reserver (ctlNoFence: of another one)
	guardOn      bool                           // the fence's check loop runs
	log          *faultLog
	reconcileLog []string

	mu       sync.Mutex
	orders   []*faultOrder
	faults   map[string]int
	waitFrom time.Time // a fault ended and nothing was taken since
	staleMax time.Duration
	firsts   []time.Duration
	oddities []string

	ops, retries, unknown, replays, resends, resendReplays, resendRetook, waited atomic.Int64
	noscript, unresolved, unexpected                                             atomic.Int64
	breaks, minAvail, minStore                                                   atomic.Int64
	repaired, redelivered, outOfOrder                                            atomic.Int64
}

// faultOrder is one order as its client knows it. Only its client goroutine touches it until
// the clients are done.
type faultOrder struct {
	kind     string // "deduct", "hold", "ghost" (cancelled before its deduct arrived)
	sku      string
	qty      int64
	ids      []string // more than one only with ctlNewID
	state    string   // kept, soldout, tombstoned, cancelled, expired, lost-hold, unresolved, error
	kept     string   // the id the client holds stock under
	restored bool     // the client gave it back (a definite answer)
	unknowns int      // unknown outcomes met by its calls
	answers  []string // the definite answers of its take, in order (for the log of an anomaly)

	callAt     time.Time // when its last call started
	callFenced bool      // the guard had fenced Redis for the whole of its last call (see kit.Fence)
	tookAt     time.Time // when the call that took stock (not a replay) started
	tookDone   time.Time // and when it was answered
	tookFenced bool      // and that call was made while fenced
	tookID     string
}

// taken records that o's last call took stock (not a replay).
func (o *faultOrder) taken() {
	o.tookAt, o.tookDone, o.tookFenced, o.tookID = o.callAt, time.Now(), o.callFenced, o.id()
}

func (o *faultOrder) id() string { return o.ids[len(o.ids)-1] }

func (h *faultHarness) fault(kind string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.faults[kind]++
}

// faultEnded starts the clock of the time to the first success.
func (h *faultHarness) faultEnded() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.waitFrom = time.Now()
}

// tookNow is called after a deduct or hold took stock (not a replay).
func (h *faultHarness) tookNow() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.waitFrom.IsZero() {
		h.firsts = append(h.firsts, time.Since(h.waitFrom))
		h.waitFrom = time.Time{}
	}
}

func (h *faultHarness) unexpectedf(format string, args ...any) {
	h.unexpected.Add(1)
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.oddities) < 5 {
		h.oddities = append(h.oddities, fmt.Sprintf(format, args...))
	}
}

// runFault runs one scenario (or its control) and returns its line of the report.
func runFault(t *testing.T, sc faultScenario, db faultDB, ctl faultControl, traffic time.Duration, clients int) kit.FaultResult {
	h := &faultHarness{t: t, sc: sc, ctl: ctl, db: db, seed: rand.Uint64(), clients: clients,
		faults: map[string]int{}, log: &faultLog{}, settle: kit.FaultSettle}
	if ctl != ctlNone {
		h.settle = kit.FaultSettle / 4 // a broken variant may never settle
	}
	h.minAvail.Store(1 << 62)
	h.minStore.Store(1 << 62)
	t.Logf("seed %d", h.seed)
	began := time.Now()
	h.setup()
	ready := time.Now()

	ctx, stopBackground := context.WithCancel(context.Background())
	defer stopBackground()
	injCtx, stopInjecting := context.WithTimeout(ctx, traffic)
	defer stopInjecting()
	h.injCtx = injCtx
	h.stopAt = time.Now().Add(traffic)

	var bg sync.WaitGroup
	bg.Go(func() { h.runRelay(ctx) })
	bg.Go(func() { h.runReconcile(ctx) })
	bg.Go(func() { h.sample(ctx) })
	if sc.guard && ctl != ctlNaiveReconcile {
		stockops.NewFailoverGuard(h.back) // its reconcile passes record the reconciled primaries
		h.guardOn = true
		bg.Go(func() { h.fence.Loop(ctx, 25*time.Millisecond) })
	}
	if h.aof != nil {
		bg.Go(func() { h.aof.run(ctx) })
	}
	var inj sync.WaitGroup
	if sc.inject != nil {
		inj.Go(func() { sc.inject(h, injCtx) })
	}
	var cw sync.WaitGroup
	for n := range clients {
		cw.Go(func() { h.client(n) })
	}
	inj.Wait()
	h.heal()
	cw.Wait()
	settled := time.Now()
	stopBackground()
	bg.Wait()
	r := h.finish(traffic)
	r.Wall = time.Since(began).Seconds()
	t.Logf("setup %v, traffic and settling %v, drain and checks %v",
		ready.Sub(began).Round(time.Millisecond), settled.Sub(ready).Round(time.Millisecond), time.Since(settled).Round(time.Millisecond))
	return r
}

// setup starts Redis (and the proxy), opens the store and loads the items.
func (h *faultHarness) setup() {
	t := h.t
	ctx := context.Background()
	h.srv = redistest.StartServer(t, h.sc.redisArgs...)
	if slices.Contains(h.sc.redisArgs, "--appendonly") {
		h.aof = &aofTracker{dir: filepath.Join(h.srv.Dir(), "appendonlydir")}
	}
	addr, backAddr := h.srv.Addr(), h.srv.Addr()
	if h.sc.failover {
		// A replica of the first primary; the relay and the reconciler reach the primary
		// through a proxy too, so that the failover can switch them.
		args := append(slices.Clone(h.sc.redisArgs), "--replicaof", "127.0.0.1", strconv.Itoa(h.srv.Port()))
		h.fo = &faultFo{srv: [2]*redistest.Server{h.srv, redistest.StartServer(t, args...)}, diffs: map[string][]faultFoDiff{}}
		for i, s := range h.fo.srv {
			h.fo.adm[i] = kit.DirectClient(t, s.Addr())
		}
		px, err := faultproxy.Start(addr)
		require.NoError(t, err)
		t.Cleanup(func() { px.Close() })
		h.fo.backPx, backAddr = px, px.Addr()
	}
	if h.sc.proxy {
		px, err := faultproxy.Start(addr)
		require.NoError(t, err)
		t.Cleanup(func() { px.Close() })
		h.px, addr = px, px.Addr()
	}
	// The clients' client does not retry by itself, so that every unknown outcome reaches the
	// client code (rueidis would resend idempotent scripts after a broken connection itself).
	h.fc = kit.DirectClient(t, addr)
	// The relay's and reconciler's client does not retry either: when rueidis v1.0.79 resends
	// a command on a new connection after a kill -9, the race detector reports the dead
	// connection's writer reading the command while Do returns it to its pool (rueidis
	// internal/cmds.Put against pipe._backgroundWrite), which fails the run under -race.
	h.bc = kit.DirectClient(t, backAddr)
	logger := slog.New(h.log)
	var err error
	if h.front, err = stock.New(h.fc, stock.WithLogger(logger)); err != nil {
		t.Fatal(err)
	}
	if h.back, err = stock.New(h.bc, stock.WithLogger(logger)); err != nil {
		t.Fatal(err)
	}
	if h.ctl == ctlBareEvalsha {
		lib, err1 := os.ReadFile("../../lua/lib.lua")
		body, err2 := os.ReadFile("../../lua/deduct.lua")
		require.NoError(t, errors.Join(err1, err2))
		h.deductSrc = string(lib) + "\n" + string(body)
		sum := sha1.Sum([]byte(h.deductSrc))
		h.deductSHA = hex.EncodeToString(sum[:])
	}

	dsn, prefix := h.db.dsn, fmt.Sprintf("fault%d_%04x_", os.Getpid(), rand.IntN(1<<16))
	if h.db.dialect == sqlstore.SQLite {
		dsn = sqliteDSN(t.TempDir())
	}
	db, err := sql.Open(h.db.driver, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	require.NoError(t, db.PingContext(ctx), "%s is configured but cannot be reached", h.db.name)
	h.sqlDB, h.items, h.recs = db, prefix+"items", prefix+"records"
	if h.store, err = sqlstore.New(db, h.db.dialect, sqlstore.WithTablePrefix(prefix)); err != nil {
		t.Fatal(err)
	}
	require.NoError(t, h.store.Migrate(ctx))
	if h.db.dialect != sqlstore.SQLite {
		dropTables(t, db, prefix)
	}
	if h.sc.guard {
		gr := h.front
		if h.ctl == ctlNoFence { // the guard fences a Reserver that no client uses
			if gr, err = stock.New(h.fc, stock.WithLogger(logger)); err != nil {
				t.Fatal(err)
			}
		}
		h.fence = &kit.Fence{Guard: stockops.NewFailoverGuard(gr)}
		// The first check of an empty Redis records its primaries as reconciled.
		require.NoError(t, testkit.Err(h.fence.Guard.Check(ctx)))
	}
	h.loaded = map[string]int64{}
	for _, sku := range faultSKUs {
		n := int64(kit.FaultDeep)
		if strings.HasPrefix(sku, "scarce") {
			n = kit.FaultScarce
		}
		h.loaded[sku] = n
		require.NoError(t, h.back.Load(ctx, sku, n))
		require.NoError(t, h.store.Load(ctx, sku, n))
	}
}

// heal ends every fault the injector may have left (it ends them itself; this is a backstop).
func (h *faultHarness) heal() {
	if h.px != nil {
		h.px.CancelDrops()
		h.px.SetLatency(0)
		h.px.Heal()
	}
}

type faultClientState struct {
	h    *faultHarness
	n    int
	rng  *rand.Rand
	user string
	seq  int
	kept []*faultOrder // orders this client holds stock for, not restored
}

func (h *faultHarness) client(n int) {
	c := &faultClientState{h: h, n: n, rng: rand.New(rand.NewPCG(h.seed, uint64(n))), user: fmt.Sprint("u", n)}
	for time.Now().Before(h.stopAt) && !h.t.Failed() {
		sku := faultSKUs[c.rng.IntN(len(faultSKUs))]
		switch p := c.rng.IntN(100); {
		case p < 15 && len(c.kept) > 0:
			c.restore()
		case p < 23:
			c.ghost(sku)
		case p < 38:
			c.hold(sku)
		default:
			c.deduct(sku)
		}
		time.Sleep(time.Duration(c.rng.Int64N(int64(2 * time.Millisecond))))
	}
}

func (c *faultClientState) newOrder(kind, sku string) *faultOrder {
	c.seq++
	qty := 1 + c.rng.Int64N(3)
	if strings.HasPrefix(sku, "scarce") {
		qty = 1 + c.rng.Int64N(2)
	}
	o := &faultOrder{kind: kind, sku: sku, qty: qty, ids: []string{fmt.Sprintf("c%d-%d", c.n, c.seq)}}
	c.h.mu.Lock()
	c.h.orders = append(c.h.orders, o)
	c.h.mu.Unlock()
	return o
}

// renew is the broken variant's answer to an unknown outcome: a new id for the same order.
func (c *faultClientState) renew(o *faultOrder) func() {
	if c.h.ctl != ctlNewID {
		return nil
	}
	return func() { o.ids = append(o.ids, fmt.Sprintf("%s-n%d", o.ids[0], len(o.ids))) }
}

// settle makes a call until it gets a definite answer: success, or a sentinel. ErrFailover
// and ErrNotLoaded are definite but temporary (a fence until a reconcile pass, an item being
// rebuilt): the same id is tried again later. Any other error leaves the outcome unknown: the
// same id again (or, in the broken variant, renew picks a new one), with backoff, for at most
// faultSettle. ok is false when no definite answer came.
func (c *faultClientState) settle(o *faultOrder, call func(ctx context.Context) (stock.Receipt, error), renew func()) (stock.Receipt, error, bool) {
	h := c.h
	deadline := time.Now().Add(h.settle)
	wait := 2 * time.Millisecond
	unknown := false
	for {
		ctx, cancel := context.WithTimeout(context.Background(), h.sc.opTimeout)
		f0 := h.fence.State()
		o.callAt = time.Now()
		rc, err := call(ctx)
		o.callFenced = kit.FencedThrough(f0, h.fence.State())
		if o.callFenced && err == nil {
			// The take was made while fenced only if a check now still fences (kit.Fence).
			o.callFenced = h.fence.StillFenced(ctx)
		}
		cancel()
		h.ops.Add(1)
		if err != nil && strings.Contains(err.Error(), "NOSCRIPT") {
			h.noscript.Add(1)
		}
		switch {
		case errors.Is(err, stock.ErrFailover), errors.Is(err, stock.ErrNotLoaded):
			h.waited.Add(1)
		case err == nil || kit.FaultSentinel(err):
			if unknown && err == nil && rc.Replayed {
				h.replays.Add(1)
			}
			return rc, err, true
		default:
			unknown = true
			o.unknowns++
			h.unknown.Add(1)
			h.retries.Add(1)
			if renew != nil {
				renew()
			}
		}
		if time.Now().After(deadline) {
			h.unresolved.Add(1)
			return rc, err, false
		}
		time.Sleep(wait)
		wait = min(2*wait, 100*time.Millisecond)
	}
}

func (c *faultClientState) deductCall(o *faultOrder) func(ctx context.Context) (stock.Receipt, error) {
	h := c.h
	return func(ctx context.Context) (stock.Receipt, error) {
		req := stock.Request{SKU: o.sku, ID: o.id(), User: c.user, Qty: o.qty, Retry: o.unknowns > 0}
		if h.ctl == ctlBareEvalsha {
			return h.bareDeduct(ctx, req)
		}
		return h.front.Deduct(ctx, req)
	}
}

func (c *faultClientState) deduct(sku string) {
	o := c.newOrder("deduct", sku)
	call := c.deductCall(o)
	rc, err, ok := c.settle(o, call, c.renew(o))
	c.took(o, rc, err, ok)
	if o.state != "kept" || c.rng.IntN(5) != 0 {
		return
	}
	// The same request sent again, once or twice: a replay of the first answer.
	h := c.h
	for range 1 + c.rng.IntN(2) {
		h.resends.Add(1)
		rc, err, ok := c.settle(o, call, nil)
		switch {
		case ok && err == nil && rc.Replayed && rc.Qty == o.qty:
			h.resendReplays.Add(1)
		case ok && err == nil && !rc.Replayed && h.sc.loss:
			h.resendRetook.Add(1) // Redis lost the entry: the id took stock again (the store applies it once)
		case !ok:
		case h.sc.loss && (errors.Is(err, stock.ErrSoldOut) || errors.Is(err, stock.ErrInsufficient)):
		case h.sc.loss && errors.Is(err, stock.ErrRestored):
			// The store refused the id (it sold units Redis had lost track of) and Redis gave
			// them back: a retry of a refused id is answered ErrRestored (lua/deduct.lua).
		default:
			h.unexpectedf("resend of %s: %+v, %v (want a replay of %d)", o.id(), rc, err, o.qty)
		}
	}
}

// took records a deduct's (or hold's) definite answer.
func (c *faultClientState) took(o *faultOrder, rc stock.Receipt, err error, ok bool) {
	h := c.h
	o.answers = append(o.answers, fmt.Sprintf("%s: %+v, %v", time.Now().Format("15:04:05.000"), rc, err))
	switch {
	case !ok:
		o.state = "unresolved"
	case err == nil:
		if rc.Qty != o.qty {
			h.unexpectedf("%s took %d, asked %d", o.id(), rc.Qty, o.qty)
		}
		if o.kind == "ghost" && !h.sc.loss && h.ctl != ctlBlindRestore {
			h.unexpectedf("%s: a deduct after the restore of its id took stock", o.id())
		}
		o.state, o.kept = "kept", o.id()
		c.kept = append(c.kept, o)
		if !rc.Replayed {
			o.taken()
			h.tookNow()
		}
	case errors.Is(err, stock.ErrSoldOut), errors.Is(err, stock.ErrInsufficient):
		o.state = "soldout"
	case errors.Is(err, stock.ErrRestored) && o.kind == "ghost":
		o.state = "tombstoned"
	default:
		o.state = "error"
		h.unexpectedf("%s %s: %v", o.kind, o.id(), err)
	}
}

func (c *faultClientState) hold(sku string) {
	h := c.h
	o := c.newOrder("hold", sku)
	rc, err, ok := c.settle(o, func(ctx context.Context) (stock.Receipt, error) {
		return h.front.Hold(ctx, stock.Request{SKU: sku, ID: o.id(), User: c.user, Qty: o.qty}, kit.FaultHoldTTL)
	}, c.renew(o))
	if !ok || err != nil {
		c.took(o, rc, err, ok)
		return
	}
	if rc.Qty != o.qty {
		h.unexpectedf("hold %s took %d, asked %d", o.id(), rc.Qty, o.qty)
	}
	if !rc.Replayed {
		o.taken()
		h.tookNow()
	}
	// Confirmed, or (15%) cancelled.
	id, what := o.id(), "confirm"
	if c.rng.IntN(100) < 15 {
		what = "cancel"
	}
	_, err, ok = c.settle(o, func(ctx context.Context) (stock.Receipt, error) {
		if what == "cancel" {
			return h.front.Cancel(ctx, sku, id)
		}
		return h.front.Confirm(ctx, sku, id)
	}, nil)
	switch {
	case !ok:
		o.state = "unresolved"
	case err == nil && what == "cancel":
		o.state = "cancelled"
	case err == nil:
		o.state, o.kept = "kept", id
		c.kept = append(c.kept, o)
	case errors.Is(err, stock.ErrExpired) && what == "confirm":
		o.state = "expired"
	case errors.Is(err, stock.ErrUnknownID) && h.sc.loss:
		o.state = "lost-hold" // acknowledged, then lost with the AOF's tail: the confirm or cancel says so
	default:
		o.state = "error"
		h.unexpectedf("%s %s: %v", what, id, err)
	}
}

func (c *faultClientState) restore() {
	h := c.h
	i := c.rng.IntN(len(c.kept))
	o := c.kept[i]
	c.kept[i] = c.kept[len(c.kept)-1]
	c.kept = c.kept[:len(c.kept)-1]
	rc, err, ok := c.settle(o, func(ctx context.Context) (stock.Receipt, error) { return h.front.Restore(ctx, o.sku, o.kept) }, nil)
	switch {
	case !ok:
	case err == nil:
		o.restored = true
		if rc.Qty != o.qty {
			h.unexpectedf("restore %s gave back %d, took %d", o.kept, rc.Qty, o.qty)
		}
	case errors.Is(err, stock.ErrUnknownID) && h.sc.loss: // the entry was lost: nothing given back
	default:
		h.unexpectedf("restore %s: %v", o.kept, err)
	}
}

// ghost cancels an order whose deduct has not arrived yet, then the deduct arrives: the
// restore leaves a tombstone and the deduct is refused (the broken variant gives the stock
// back blindly instead).
func (c *faultClientState) ghost(sku string) {
	h := c.h
	o := c.newOrder("ghost", sku)
	if h.ctl == ctlBlindRestore {
		ctx, cancel := context.WithTimeout(context.Background(), h.sc.opTimeout)
		err := h.fc.Do(ctx, h.fc.B().Hincrby().Key("stock:{"+sku+"}").Field("a").Increment(o.qty).Build()).Error()
		cancel()
		h.ops.Add(1)
		if err == nil {
			h.fault("blind-restore")
		}
	} else {
		_, err, ok := c.settle(o, func(ctx context.Context) (stock.Receipt, error) { return h.front.Restore(ctx, sku, o.id()) }, nil)
		if ok && !errors.Is(err, stock.ErrUnknownID) {
			h.unexpectedf("restore of the unknown id %s: %v", o.id(), err)
		}
	}
	rc, err, ok := c.settle(o, c.deductCall(o), nil)
	c.took(o, rc, err, ok)
}

// bareDeduct is the broken variant's deduct: deduct.lua by EVALSHA only, with no EVAL fallback,
// so a NOSCRIPT after a SCRIPT FLUSH reaches the caller.
func (h *faultHarness) bareDeduct(ctx context.Context, req stock.Request) (stock.Receipt, error) {
	base := "stock:{" + req.SKU + "}"
	keys := []string{base, base + ":l", base + ":u", base + ":o", base + ":h"}
	args := []string{"0", "1", "D", "0", req.ID, strconv.FormatInt(req.Qty, 10), req.User}
	rc := stock.Receipt{SKU: req.SKU, ID: req.ID}
	vs, err := h.fc.Do(ctx, h.fc.B().Evalsha().Sha1(h.deductSHA).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).AsIntSlice()
	if re, ok := rueidis.IsRedisErr(err); ok && re.IsNoScript() {
		_ = h.fc.Do(ctx, h.fc.B().ScriptLoad().Script(h.deductSrc).Build()).Error() // for the next call
	}
	if err != nil {
		return rc, err
	}
	if len(vs) != 3 {
		return rc, fmt.Errorf("%w: %d values", stock.ErrInvalid, len(vs))
	}
	rc.Remaining, rc.Qty, rc.Replayed = vs[1], vs[2], vs[0] == 1
	switch vs[0] {
	case 0, 1:
		return rc, nil
	case 2:
		return rc, stock.ErrSoldOut
	case 3:
		return rc, stock.ErrInsufficient
	case 6:
		return rc, stock.ErrRestored
	}
	return rc, fmt.Errorf("%w: code %d", stock.ErrInvalid, vs[0])
}

func (h *faultHarness) newRelay(store stock.Store) *stockops.Relay {
	lease := h.sc.relayLease
	if lease == 0 {
		lease = time.Second
	}
	rl, err := stockops.NewRelay(h.back, store, nil, &stock.RelayOptions{Poll: 5 * time.Millisecond, MinBackoff: 5 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, Lease: lease, Batch: 64})
	require.NoError(h.t, err)
	return rl
}

func (h *faultHarness) runRelay(ctx context.Context) {
	if h.sc.queue {
		h.runQueue(ctx)
		return
	}
	if h.sc.name != "relay-crash" {
		rl := h.newRelay(h.store)
		h.relay.Store(rl)
		_ = rl.Run(ctx)
		return
	}
	// relay-crash: the relay's context is cancelled at random moments, and at crash points
	// around its store calls (faultRelayStore); it is started again at once, 2 times in 10 as
	// a new relay (another process's: it waits out the dead one's lease).
	store := &faultRelayStore{Store: h.store, h: h}
	rl := h.newRelay(store)
	h.relay.Store(rl)
	for h.injCtx.Err() == nil {
		rctx, cancel := context.WithCancel(ctx)
		h.relayCancel.Store(&cancel)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = rl.Run(rctx)
		}()
		timer := time.NewTimer(100*time.Millisecond + rand.N(300*time.Millisecond))
		select {
		case <-timer.C:
			h.fault("relay-cancel")
		case <-done: // cancelled at a crash point
		case <-h.injCtx.Done():
		}
		timer.Stop()
		cancel()
		<-done
		if rand.IntN(10) < 2 {
			rl = h.newRelay(store)
			h.relay.Store(rl)
			h.fault("relay-replaced")
		}
	}
	h.relayCancel.Store(nil)
	_ = rl.Run(ctx)
}

// faultRelayStore is the relay's store in relay-crash: it cancels the relay at crash points
// before and after the store's call (after: applied, not acked, so delivered again), counts
// redelivered events, and in the broken variant applies a redelivered deduct again.
type faultRelayStore struct {
	*sqlstore.Store
	h *faultHarness
}

func (s *faultRelayStore) Apply(ctx context.Context, ev stock.Event) error {
	s.crash("before-apply")
	again := s.already(ctx, []stock.Event{ev})
	err := s.Store.Apply(ctx, ev)
	s.applyAgain(ctx, []stock.Event{ev}, []error{err}, again)
	if s.crash("after-apply") && err == nil {
		// The process dies after the store committed, before the relay acks: the relay must
		// not learn that the store applied it, so the event is delivered again.
		return context.Canceled
	}
	return err
}

func (s *faultRelayStore) ApplyBatch(ctx context.Context, evs []stock.Event) []error {
	s.crash("before-apply")
	again := s.already(ctx, evs)
	errs := s.Store.ApplyBatch(ctx, evs)
	s.applyAgain(ctx, evs, errs, again)
	if s.crash("after-apply") {
		// Committed, never acked (see Apply).
		for i := range errs {
			errs[i] = context.Canceled
		}
	}
	return errs
}

// crash cancels the relay at a crash point in some of the store calls and reports whether it
// did.
func (s *faultRelayStore) crash(point string) bool {
	h := s.h
	p := 5 // percent of the store calls
	if point == "after-apply" {
		p = 15
	}
	if h.injCtx.Err() != nil || rand.IntN(100) >= p {
		return false
	}
	if cancel := h.relayCancel.Load(); cancel != nil {
		(*cancel)()
		h.fault("relay-crash-" + point)
		return true
	}
	return false
}

// already returns the deducts of evs the store has applied before (a redelivery), and counts
// every redelivered event.
func (s *faultRelayStore) already(ctx context.Context, evs []stock.Event) map[string]bool {
	ids := make([]string, len(evs))
	for i, ev := range evs {
		ids[i] = ev.ID
	}
	recs, err := s.Records(ctx, evs[0].SKU, ids)
	if err != nil {
		return nil
	}
	again := map[string]bool{}
	for _, ev := range evs {
		rec, ok := recs[ev.ID]
		switch {
		case !ok:
		case ev.Type == stock.EventDeducted || ev.Type == stock.EventConfirmed:
			s.h.redelivered.Add(1)
			again[ev.ID] = rec.Status == stock.StateApplied
		case rec.Status == stock.StateRestored || rec.Status == stock.StateRefused:
			s.h.redelivered.Add(1)
		}
	}
	return again
}

// applyAgain is the broken consumer: it takes a redelivered deduct's units a second time.
func (s *faultRelayStore) applyAgain(ctx context.Context, evs []stock.Event, errs []error, again map[string]bool) {
	h := s.h
	if h.ctl != ctlDoubleApply {
		return
	}
	q := "UPDATE " + h.items + " SET remaining = remaining - ? WHERE sku = ? AND remaining >= ?"
	if h.db.dialect == sqlstore.Postgres {
		q = "UPDATE " + h.items + " SET remaining = remaining - $1 WHERE sku = $2 AND remaining >= $1"
	}
	for i, ev := range evs {
		if again[ev.ID] && errs[i] == nil {
			args := []any{ev.Qty, ev.SKU, ev.Qty}
			if h.db.dialect == sqlstore.Postgres {
				args = args[:2]
			}
			if _, err := h.sqlDB.ExecContext(ctx, q, args...); err == nil {
				h.fault("double-apply")
			}
		}
	}
}

// runReconcile runs the Reconciler every 200ms during the traffic (the broken variant: a naive
// reconcile that overwrites Redis's available stock with the store's remaining stock, ignoring
// the events in flight, every 100ms) and counts its repairs.
func (h *faultHarness) runReconcile(ctx context.Context) {
	if h.ctl == ctlNaiveReconcile {
		for kit.SleepCtx(ctx, 100*time.Millisecond) {
			for _, sku := range faultSKUs {
				rem, err := h.store.Remaining(ctx, sku)
				if err != nil {
					continue
				}
				if h.bc.Do(ctx, h.bc.B().Hset().Key("stock:{"+sku+"}").FieldValue().FieldValue("a", strconv.FormatInt(rem, 10)).Build()).Error() == nil {
					h.fault("naive-reconcile")
				}
			}
		}
		return
	}
	rec, err := stockops.NewReconciler(h.back, h.store, nil)
	if err != nil {
		h.t.Error(err)
		return
	}
	kit.ReconcileLoop(ctx, rec, &h.recMu, h.countRepairs)
}

// countRepairs adds up what reconcile passes repaired.
func (h *faultHarness) countRepairs(reps []stockops.Report) {
	for _, rp := range reps {
		if n := kit.Repaired(rp); n > 0 || rp.NeedsHuman != "" {
			h.repaired.Add(n)
			h.mu.Lock()
			if len(h.reconcileLog) < 6 {
				h.reconcileLog = append(h.reconcileLog, rp.String())
			}
			h.mu.Unlock()
		}
	}
}

// sample checks Redis's books (loaded = available + held + sold, available ≥ 0) and the
// store's remaining stock every 20ms.
func (h *faultHarness) sample(ctx context.Context) {
	for kit.SleepCtx(ctx, 20*time.Millisecond) {
		h.sampleOnce(ctx)
	}
}

func (h *faultHarness) sampleOnce(ctx context.Context) {
	for _, sku := range faultSKUs {
		c, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		l, err := h.back.Levels(c, sku)
		if err == nil {
			storeMin(&h.minAvail, l.Available)
			if l.Available+l.Held+l.Sold != l.Loaded || l.Available < 0 {
				h.breaks.Add(1)
			}
		}
		if rem, err := h.store.Remaining(c, sku); err == nil {
			storeMin(&h.minStore, rem)
		}
		cancel()
	}
}

func storeMin(a *atomic.Int64, v int64) {
	for {
		old := a.Load()
		if v >= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}

// faultLog is the Reservers' logger: it counts NOSCRIPT in what the relay and reconciler log.
type faultLog struct {
	noscript atomic.Int64
}

func (l *faultLog) Enabled(context.Context, slog.Level) bool { return true }

func (l *faultLog) WithAttrs([]slog.Attr) slog.Handler { return l }

func (l *faultLog) WithGroup(string) slog.Handler { return l }

func (l *faultLog) Handle(_ context.Context, r slog.Record) error {
	text := r.Message
	r.Attrs(func(a slog.Attr) bool {
		text += " " + a.String()
		return true
	})
	if strings.Contains(text, "NOSCRIPT") {
		l.noscript.Add(1)
	}
	return nil
}

// injectKill9 kills redis-server with SIGKILL and starts it again, every 0.5–0.8s after a
// first kill at first (+ up to 0.3s); cut(i) says whether kill i also drops the AOF's
// unsynced tail (always with ctlCutAOF).
func injectKill9(first time.Duration, cut func(i int) bool) func(h *faultHarness, ctx context.Context) {
	return func(h *faultHarness, ctx context.Context) {
		wait := first + rand.N(300*time.Millisecond)
		for i := 0; kit.SleepCtx(ctx, wait); i++ {
			h.srv.Kill()
			h.fault("kill9")
			if cut(i) || h.ctl == ctlCutAOF {
				if n, err := h.aof.cut(); err != nil {
					h.t.Errorf("cutting the AOF: %v", err)
				} else if n > 0 {
					h.fault("aof-tail-cut")
				}
			}
			time.Sleep(50*time.Millisecond + rand.N(150*time.Millisecond)) // down
			h.srv.Start()
			h.faultEnded()
			h.staleLocks(cut(i) || h.ctl == ctlCutAOF)
			wait = 500*time.Millisecond + rand.N(300*time.Millisecond)
		}
	}
}

// staleLocks runs just after a restart. A reconcile pass holds an item's lock (30s to live)
// while it looks at the item, and releases it at the end. When Redis dies under a pass, the
// lock may survive it with nobody to release it: the pass's unlock failed while Redis was down
// (reconcile.go's unlock ignores its error), or the lock's SET ran and its reply was lost
// (TestFaultReconcileLockLeak), or the AOF was cut back to a moment a pass held it. The item
// then stays busy, no reconcile pass is complete and the FailoverGuard's fence stays up,
// refusing every deduct, until the lock expires. Once the background pass under way (if any)
// is over, any reconcile lock left is such a lock: it is counted (faults
// "stale-reconcile-lock", or "stale-reconcile-lock-cut" after a cut; its time left in the
// note) and removed, so that one run does not last 30s.
func (h *faultHarness) staleLocks(cut bool) {
	h.recMu.Lock()
	defer h.recMu.Unlock()
	h.staleLocksLocked(cut)
}

// staleLocksLocked is staleLocks for a caller that holds recMu.
func (h *faultHarness) staleLocksLocked(cut bool) {
	ctx := context.Background()
	for _, sku := range faultSKUs {
		key := "stock:{" + sku + "}:rl"
		holder, err := h.bc.Do(ctx, h.bc.B().Get().Key(key).Build()).ToString()
		if err != nil || !strings.HasPrefix(holder, "reconcile-") {
			continue
		}
		ttl, _ := h.bc.Do(ctx, h.bc.B().Pttl().Key(key).Build()).AsInt64()
		if h.bc.Do(ctx, h.bc.B().Del().Key(key).Build()).Error() == nil {
			if cut {
				h.fault("stale-reconcile-lock-cut")
			} else {
				h.fault("stale-reconcile-lock")
			}
			h.mu.Lock()
			h.staleMax = max(h.staleMax, time.Duration(ttl)*time.Millisecond)
			h.mu.Unlock()
		}
	}
}

// faultFo is the replicated Redis of a failover scenario.
type faultFo struct {
	srv    [2]*redistest.Server
	adm    [2]rueidis.Client // direct clients, for the injector
	cur    int               // the index of the primary
	backPx *faultproxy.Proxy // the relay's and reconciler's proxy (the clients' one is faultHarness.px)

	mu      sync.Mutex
	windows []faultFoWindow
	diffs   map[string][]faultFoDiff // sku/id
	report  kit.FaultFoReport
}

// faultFoWindow is one failover: the promotion, the switch of the clients, the first check
// of the guard that found the clients' Reserver fenced after the switch (zero if none did).
type faultFoWindow struct{ promoted, switched, fenced time.Time }

// faultFoDiff is a ledger entry of the old primary that the promoted replica lacked ("") or
// had in another state, when the clients were switched.
type faultFoDiff struct{ old, new string }

// injectLossyFailover fails over (see failover) after 0.4-0.7s of traffic, then again 0.4-0.8s
// after each failover's fence was lifted: each failover meets a reconciled primary.
func injectLossyFailover(h *faultHarness, ctx context.Context) {
	wait := 400*time.Millisecond + rand.N(300*time.Millisecond)
	for kit.SleepCtx(ctx, wait) && !h.t.Failed() {
		h.failover()
		for h.guardOn && h.fence.Up() {
			if !kit.SleepCtx(ctx, 5*time.Millisecond) {
				return
			}
		}
		wait = 400*time.Millisecond + rand.N(400*time.Millisecond)
	}
}

// failover runs one lossy failover under the traffic, as a Sentinel would after a partition
// that left the primary reachable to its clients: it waits until the replica has caught up,
// promotes it (REPLICAOF NO ONE) while the primary goes on taking the clients' writes and the
// relay's acks for 100-300ms, then switches the clients' and the relay's proxies to the promoted
// replica (resetting their connections, so every call on its way has an unknown outcome), and
// demotes the old primary to a replica of the new one, which discards what it took since the
// promotion. Before the demotion it records what the old primary had that the promoted replica
// did not (the writes that are lost), so that lost deducts can be explained. The background
// reconciler is kept out from the switch until the guard has seen the new primary (so that a
// pass on the new primary cannot lift the fence before a check could raise it), and the
// reconcile locks the promoted replica got from the old primary are removed (staleLocks).
func (h *faultHarness) failover() {
	t, fo := h.t, h.fo
	ctx := context.Background()
	oldI, newI := fo.cur, 1-fo.cur
	oc, nc := fo.adm[oldI], fo.adm[newI]
	newAddr := fo.srv[newI].Addr()

	// The replica has caught up: its link is up and it has what the primary had a moment ago.
	p, err := kit.ReplicationInfo(ctx, oc)
	if err != nil {
		t.Errorf("failover: %v", err)
		return
	}
	for deadline := time.Now().Add(15 * time.Second); ; {
		r, err := kit.ReplicationInfo(ctx, nc)
		if err == nil && r["master_link_status"] == "up" && faultAtoi(r["master_repl_offset"]) >= faultAtoi(p["master_repl_offset"]) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("failover: the replica did not catch up in 15s: primary %v, replica %v (%v)", p, r, err)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}

	if err := nc.Do(ctx, nc.B().Replicaof().No().One().Build()).Error(); err != nil {
		t.Errorf("failover: REPLICAOF NO ONE: %v", err)
		return
	}
	w := faultFoWindow{promoted: time.Now()}
	h.fault("promote")
	time.Sleep(100*time.Millisecond + rand.N(200*time.Millisecond)) // the old primary still takes writes
	newL, err := faultLedgers(ctx, nc)                              // the promoted replica, as promoted: nobody writes to it yet
	assert.NoError(t, err, "failover")

	// The switch. The guard's checks, which go through the clients' proxy, see the new primary.
	h.recMu.Lock()
	before := h.fence.State()
	h.px.SetTarget(newAddr)
	fo.backPx.SetTarget(newAddr)
	h.px.ResetAll()
	fo.backPx.ResetAll()
	w.switched = time.Now()
	h.faultEnded()
	if h.guardOn {
		// A check that began after the switch has ended and left the Reserver fenced.
		if h.fence.AwaitFenced(before, 10*time.Second) {
			w.fenced = time.Now()
		} else {
			h.unexpectedf("failover: the guard did not fence the Reserver within 10s of the switch")
		}
	}
	h.staleLocksLocked(false)
	h.recMu.Unlock()

	// What the old primary acknowledged that the promoted replica never got. The proxies
	// closed their connections to it: nothing it answers from now on reaches anyone.
	oldL, err := faultLedgers(ctx, oc)
	assert.NoError(t, err, "failover")
	fo.mu.Lock()
	defer fo.mu.Unlock()
	fo.cur = newI
	fo.windows = append(fo.windows, w)
	fo.report.Promotions++
	if err := oc.Do(ctx, oc.B().Replicaof().Host("127.0.0.1").Port(int64(fo.srv[newI].Port())).Build()).Error(); err != nil {
		t.Errorf("failover: REPLICAOF (demote the old primary): %v", err)
		return
	}
	h.fault("demote")
	for key, oe := range oldL {
		ne := newL[key]
		if len(oe) < 2 || (len(ne) >= 2 && (ne[:2] == oe[:2] || ne[:2] == oe[:1]+"r" && oe[1] == 'a')) {
			continue // the same, or an ack of the relay on the old primary only
		}
		fo.diffs[key] = append(fo.diffs[key], faultFoDiff{old: oe, new: ne})
		sale, giveBack := faultSold(oe) && !faultSold(ne), faultGivenBack(oe) && !faultGivenBack(ne)
		if sale {
			fo.report.DiscardedSales++
		}
		if giveBack {
			fo.report.DiscardedGiveBacks++
		}
		if !sale && !giveBack {
			fo.report.DiscardedOther++
		}
	}
}

// faultSold: a ledger entry of a sale (a deduct or a confirmed hold), given back since or not.
func faultSold(e string) bool {
	return len(e) >= 2 && (e[0] == 'D' || e[0] == 'H') && strings.ContainsRune("raxf", rune(e[1]))
}

// faultGivenBack: a ledger entry of a take that was given back.
func faultGivenBack(e string) bool {
	return len(e) >= 2 && e[0] != 'L' && e[0] != 'T' && strings.ContainsRune("xfce", rune(e[1]))
}

func faultAtoi(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// faultLedgers returns every item's ledger, as sku/id -> entry.
func faultLedgers(ctx context.Context, c rueidis.Client) (map[string]string, error) {
	out := map[string]string{}
	for _, sku := range faultSKUs {
		l, err := c.Do(ctx, c.B().Hgetall().Key("stock:{"+sku+"}:l").Build()).AsStrMap()
		if err != nil {
			return out, fmt.Errorf("ledger %s: %w", sku, err)
		}
		for id, e := range l {
			out[sku+"/"+id] = e
		}
	}
	return out, nil
}

// explained reports whether the failovers discarded a write of sku/id: a lost deduct, restore
// or hold of the id is then the loss of that write. (A restore that the old primary ran and
// whose answer the switch cut off is retried on the new primary, which never had the deduct:
// ErrUnknownID, and the deduct is lost although the old primary had it restored. A hold
// confirmed on the old primary only is cancelled by a restore on the new one, which the client
// sees as given back while the store keeps the sale the old relay delivered.)
func (fo *faultFo) explained(key string) bool {
	fo.mu.Lock()
	defer fo.mu.Unlock()
	return len(fo.diffs[key]) > 0
}

func injectScriptFlush(h *faultHarness, ctx context.Context) {
	for kit.SleepCtx(ctx, 2*time.Millisecond+rand.N(3*time.Millisecond)) {
		if h.bc.Do(ctx, h.bc.B().ScriptFlush().Build()).Error() == nil {
			h.fault("script-flush")
		}
	}
}

// injectReset resets every proxied connection every 60–150ms, and every ~0.7s holds
// everything back for 150–300ms (a blackhole that heals).
func injectReset(h *faultHarness, ctx context.Context) {
	next := time.Now().Add(700 * time.Millisecond)
	for kit.SleepCtx(ctx, 60*time.Millisecond+rand.N(90*time.Millisecond)) {
		if time.Now().After(next) {
			h.px.Blackhole(time.Hour)
			h.fault("blackhole")
			time.Sleep(150*time.Millisecond + rand.N(150*time.Millisecond))
			h.px.Heal()
			h.faultEnded()
			next = time.Now().Add(500*time.Millisecond + rand.N(400*time.Millisecond))
			continue
		}
		if h.px.ResetAll() > 0 {
			h.fault("reset")
		}
	}
}

// injectLatency varies the proxy's latency between 1 and 15ms each way, and every ~0.8s
// spikes it to 400ms for 300ms, above the clients' deadline of 300ms.
func injectLatency(h *faultHarness, ctx context.Context) {
	defer h.px.SetLatency(0)
	next := time.Now().Add(500 * time.Millisecond)
	for kit.SleepCtx(ctx, 100*time.Millisecond+rand.N(100*time.Millisecond)) {
		if time.Now().After(next) {
			h.px.SetLatency(400 * time.Millisecond)
			h.fault("latency-spike")
			time.Sleep(300 * time.Millisecond)
			h.px.SetLatency(time.Millisecond)
			h.faultEnded()
			next = time.Now().Add(600*time.Millisecond + rand.N(400*time.Millisecond))
			continue
		}
		h.px.SetLatency(time.Millisecond + rand.N(14*time.Millisecond))
		h.fault("latency")
	}
}

// injectReplyLost arms one dropped script reply every 20–50ms: the script runs, the client's
// connection breaks before it sees the answer.
func injectReplyLost(h *faultHarness, ctx context.Context) {
	defer h.px.CancelDrops()
	for kit.SleepCtx(ctx, 20*time.Millisecond+rand.N(30*time.Millisecond)) {
		if h.px.PendingDrops() == 0 {
			h.px.DropReplies(1, "EVALSHA", "EVAL", "FCALL")
		}
	}
}

// injectClientPause pauses the server's writes (CLIENT PAUSE 300 WRITE) every 0.4–0.7s; the
// clients' deadline is 200ms.
func injectClientPause(h *faultHarness, ctx context.Context) {
	for kit.SleepCtx(ctx, 400*time.Millisecond+rand.N(300*time.Millisecond)) {
		if h.bc.Do(ctx, h.bc.B().ClientPause().Timeout(300).Write().Build()).Error() == nil {
			h.fault("client-pause")
		}
	}
}

// aofTracker follows the size of the AOF's last file, so that a kill can cut it back to
// what it held a random 0.3–1s earlier: the unsynced tail an OS crash would lose with
// appendfsync everysec.
type aofTracker struct {
	dir  string
	mu   sync.Mutex
	hist []aofSize
}

type aofSize struct {
	at   time.Time
	size int64
}

// file is the AOF's incremental file with the highest sequence number.
func (a *aofTracker) file() (string, error) {
	ms, err := filepath.Glob(filepath.Join(a.dir, "*.incr.aof"))
	if err != nil || len(ms) == 0 {
		return "", fmt.Errorf("no incremental AOF in %s (%v)", a.dir, err)
	}
	seq := func(p string) int {
		f := strings.Split(filepath.Base(p), ".")
		if len(f) < 4 {
			return -1
		}
		n, _ := strconv.Atoi(f[len(f)-3])
		return n
	}
	return slices.MaxFunc(ms, func(x, y string) int { return seq(x) - seq(y) }), nil
}

func (a *aofTracker) run(ctx context.Context) {
	for kit.SleepCtx(ctx, 10*time.Millisecond) {
		f, err := a.file()
		if err != nil {
			continue
		}
		fi, err := os.Stat(f)
		if err != nil {
			continue
		}
		a.mu.Lock()
		a.hist = append(a.hist, aofSize{time.Now(), fi.Size()})
		if len(a.hist) > 1000 {
			a.hist = a.hist[500:]
		}
		a.mu.Unlock()
	}
}

// cut truncates the AOF (of a server that is down) to its size 0.3–1s ago (or as long ago
// as it knows) and returns the bytes it removed.
func (a *aofTracker) cut() (int64, error) {
	f, err := a.file()
	if err != nil {
		return 0, err
	}
	fi, err := os.Stat(f)
	if err != nil {
		return 0, err
	}
	target := time.Now().Add(-300*time.Millisecond - rand.N(700*time.Millisecond))
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.hist) == 0 {
		return 0, nil
	}
	size := a.hist[0].size
	for _, s := range a.hist {
		if s.at.After(target) {
			break
		}
		size = s.size
	}
	if size >= fi.Size() {
		return 0, nil
	}
	// The file is rewritten from size on: later samples no longer describe it.
	a.hist = slices.DeleteFunc(a.hist, func(s aofSize) bool { return s.size > size })
	return fi.Size() - size, os.Truncate(f, size)
}

// drain runs a relay until every outbox is empty (leases of dead relays run out).
func (h *faultHarness) drain(ctx context.Context) {
	if h.sc.queue {
		h.drainQueue(ctx)
		return
	}
	rl := h.relay.Load() // its own leases do not hold it up
	if rl == nil {
		rl = h.newRelay(h.store)
	}
	if _, err := kit.DrainRelay(ctx, rl, func() bool { return h.outboxes(ctx, ":o") == 0 }); err != nil {
		h.t.Error(err)
		for _, sku := range faultSKUs {
			k := "stock:{" + sku + "}"
			holder, _ := h.bc.Do(ctx, h.bc.B().Get().Key(k+":rl").Build()).ToString()
			ttl, _ := h.bc.Do(ctx, h.bc.B().Pttl().Key(k+":rl").Build()).AsInt64()
			n, _ := h.bc.Do(ctx, h.bc.B().Zcard().Key(k+":o").Build()).AsInt64()
			h.t.Logf("%s: %d events pending, lease %q for %dms", sku, n, holder, ttl)
		}
	}
}

// outboxes sums ZCARD of one sorted set of every item.
func (h *faultHarness) outboxes(ctx context.Context, suffix string) int64 {
	var n int64
	for _, sku := range faultSKUs {
		v, err := h.bc.Do(ctx, h.bc.B().Zcard().Key("stock:{"+sku+"}"+suffix).Build()).AsInt64()
		if err != nil {
			return -1
		}
		n += v
	}
	return n
}

func (h *faultHarness) finish(traffic time.Duration) kit.FaultResult {
	t := h.t
	ctx := context.Background()
	h.drain(ctx)
	abandoned := h.abandonedHolds(ctx)
	// One complete reconcile pass (an item is busy while a dead relay's lease lasts).
	rec, err := stockops.NewReconciler(h.back, h.store, nil)
	require.NoError(t, err)
	var found int64
	for i := 0; ; i++ {
		reps, err := rec.Once(ctx)
		busy := slices.ContainsFunc(reps, func(rp stockops.Report) bool { return rp.Busy })
		if err == nil && !busy {
			for _, rp := range reps {
				found += kit.FaultAbs(rp.Drift)
			}
			h.countRepairs(reps)
			break
		}
		if i == 100 {
			t.Fatalf("no complete reconcile pass: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	h.drain(ctx)
	h.sampleOnce(ctx)

	r := kit.FaultResult{Scenario: h.sc.name, Store: h.db.name, Clients: h.clients, Seconds: traffic.Seconds(),
		Orders: len(h.orders), Ops: h.ops.Load(), Retries: h.retries.Load(), Unknown: h.unknown.Load(),
		Replays: h.replays.Load(), Resends: h.resends.Load(), Waited: h.waited.Load(), Faults: h.faults,
		NoScript: h.noscript.Load() + h.log.noscript.Load(), Unresolved: h.unresolved.Load(),
		Unexpected: h.unexpected.Load(), ResendsRetook: h.resendRetook.Load(), Redelivered: h.redelivered.Load(), OutOfOrder: h.outOfOrder.Load(),
		Repaired: h.repaired.Load(), DriftFound: found, InvariantBreaks: h.breaks.Load(),
		AbandonedHolds: len(abandoned)}
	for _, a := range abandoned {
		r.AbandonedHoldUnits += a.qty
	}
	if h.ctl != ctlNone {
		r.Control = faultControlNames[h.ctl]
	}
	if s := h.seqStore; s != nil {
		s.mu.Lock()
		r.OutOfOrderEvents = slices.Clone(s.outOrder)
		s.mu.Unlock()
	}
	if h.px != nil {
		st := h.px.Stats()
		if st.DroppedReplies > 0 {
			r.Faults["reply-lost"] = st.DroppedReplies
		}
	}
	for _, d := range h.firsts {
		r.FirstSuccessMs = append(r.FirstSuccessMs, float64(d.Microseconds())/1000)
	}
	r.DeadLetters = h.outboxes(ctx, ":dl")

	// Redis against the store, now that nothing is pending.
	drift := map[string]int64{}
	final := map[string]stock.Levels{}
	for _, sku := range faultSKUs {
		l, err := h.back.Levels(ctx, sku)
		require.NoError(t, err, "levels %s", sku)
		final[sku] = l
		rem, err := h.store.Remaining(ctx, sku)
		require.NoError(t, err, "store remaining %s", sku)
		drift[sku] = l.Available + l.Held - rem
		r.DriftFinal += kit.FaultAbs(drift[sku])
	}

	// The store's records against what the clients were told.
	var dups int
	if err := h.sqlDB.QueryRowContext(ctx, "SELECT COUNT(*) FROM (SELECT sku, id FROM "+h.recs+
		" GROUP BY sku, id HAVING COUNT(*) > 1) AS d").Scan(&dups); err != nil {
		t.Fatal(err)
	}
	type recRow struct {
		typ, status string
		qty         int64
	}
	recs := map[string]recRow{} // sku/id
	rows, err := h.sqlDB.QueryContext(ctx, "SELECT sku, id, type, qty, status FROM "+h.recs)
	require.NoError(t, err)
	applied := map[string]int64{}
	for rows.Next() {
		var sku, id string
		var x recRow
		require.NoError(t, rows.Scan(&sku, &id, &x.typ, &x.qty, &x.status))
		recs[sku+"/"+id] = x
		if x.status == string(stock.StateApplied) && x.typ != string(stock.EventRestocked) {
			applied[sku] += x.qty
		}
		if x.status == string(stock.StateRefused) {
			r.Refused += x.qty
		}
	}
	require.NoError(t, rows.Err())
	rows.Close()
	for _, sku := range faultSKUs {
		rem, _ := h.store.Remaining(ctx, sku)
		r.BooksOff += kit.FaultAbs(h.loaded[sku] - applied[sku] - rem)
		if off := kit.FaultAbs(final[sku].Loaded-h.loaded[sku]) + kit.FaultAbs(final[sku].Sold-applied[sku]); off != 0 {
			r.CountersOff += off
			t.Logf("%s: Redis %+v after the final reconcile; loaded %d, the store holds %d units taken", sku, final[sku], h.loaded[sku], applied[sku])
		}
	}
	// Holds still live in Redis that the store has confirmed: a confirm that Redis lost (with
	// the AOF's tail, or with an old primary) after the relay had delivered it. A reconcile
	// pass makes such holds final (Reconciler: resyncHolds), so after the final pass there
	// must be none.
	ledgers, err := faultLedgers(ctx, h.bc)
	require.NoError(t, err)
	for key, e := range ledgers {
		x, ok := recs[key]
		if strings.HasPrefix(e, "Hh") && ok && x.typ == string(stock.EventConfirmed) && x.status == string(stock.StateApplied) {
			r.HeldConfirmed++
			r.HeldConfirmedUnits += x.qty
		}
	}
	took := func(x recRow, ok bool) bool { // the id's deduct reached the store (and may have been given back since)
		return ok && (x.typ == string(stock.EventDeducted) || x.typ == string(stock.EventConfirmed)) &&
			(x.status == string(stock.StateApplied) || x.status == string(stock.StateRestored))
	}
	r.DoubleApplied = dups
	var fo kit.FaultFoReport
	explain := func(key, what string) {
		if h.fo == nil {
			return
		}
		if h.fo.explained(key) {
			fo.LostExplained++
			return
		}
		fo.LostUnexplained++
		if fo.LostUnexplained <= 5 {
			t.Logf("lost %s %s is not among the old primaries' discarded writes %q", what, key, h.fo.diffs[key])
		}
	}
	for _, a := range abandoned {
		if a.state == "cancelled" { // a kept one is counted below, as a lost sale
			explain(a.key, "cancel")
		}
	}
	promised := map[string]int64{}
	held := map[string]bool{} // sku/id the clients hold or gave back
	for _, o := range h.orders {
		n := 0
		for _, id := range o.ids {
			if x, ok := recs[o.sku+"/"+id]; took(x, ok) {
				n++
			}
		}
		if n > 1 {
			r.DoubleApplied++
		}
		if o.state == "lost-hold" {
			r.LostHolds++
			explain(o.sku+"/"+o.id(), "hold")
		}
		if o.state != "kept" {
			continue
		}
		key := o.sku + "/" + o.kept
		held[key] = true
		x, ok := recs[key]
		switch {
		case o.restored && ok && x.status == string(stock.StateApplied):
			r.LostRestores++ // given back to the client, sold in the store
			explain(key, "give-back")
		case o.restored:
		case ok && x.status == string(stock.StateRefused):
		case ok && x.status == string(stock.StateApplied):
			promised[o.sku] += o.qty
		default:
			r.LostDeducts++ // acknowledged, not given back, and neither applied nor refused by the store
			r.LostUnits += o.qty
			promised[o.sku] += o.qty
			explain(key, "sale")
		}
	}
	// Takes made while the guard had fenced Redis, and in the failovers: before the
	// promotion was noticed, and those of them that the store refused.
	var firstAfter []time.Duration
	if h.fo != nil {
		h.fo.mu.Lock()
		firstAfter = make([]time.Duration, len(h.fo.windows))
		h.fo.mu.Unlock()
		for i := range firstAfter {
			firstAfter[i] = time.Duration(1 << 62)
		}
	}
	for _, o := range h.orders {
		if o.tookAt.IsZero() {
			continue
		}
		x, ok := recs[o.sku+"/"+o.tookID]
		refused := ok && x.status == string(stock.StateRefused)
		if o.tookFenced {
			r.FencedTakes++
			if refused {
				fo.FencedRefusedUnits += x.qty
			}
		}
		if h.fo == nil {
			continue
		}
		h.fo.mu.Lock()
		for i, w := range h.fo.windows {
			if !w.fenced.IsZero() && o.tookAt.After(w.fenced) && (i+1 == len(h.fo.windows) || o.tookAt.Before(h.fo.windows[i+1].promoted)) {
				firstAfter[i] = min(firstAfter[i], o.tookDone.Sub(w.switched))
			}
			switch {
			case o.tookAt.After(w.promoted) && o.tookAt.Before(w.switched):
				fo.OldPrimaryTakes++
			case !o.tookFenced && !w.fenced.IsZero() && o.tookAt.After(w.switched) && o.tookAt.Before(w.fenced):
				fo.GapTakes++
				if refused {
					fo.GapRefusedUnits += x.qty
				}
			}
		}
		h.fo.mu.Unlock()
	}
	if h.fence != nil {
		var up time.Time // how long the fence stayed up, each time
		for _, fl := range h.fence.Flips() {
			if fl.Fenced {
				up = fl.At
			} else {
				r.FencedMs = append(r.FencedMs, float64(fl.At.Sub(up).Microseconds())/1000)
			}
		}
	}
	if h.fo != nil {
		h.fo.mu.Lock()
		rep := h.fo.report
		h.fo.mu.Unlock()
		fo.Promotions, fo.DiscardedSales, fo.DiscardedGiveBacks, fo.DiscardedOther =
			rep.Promotions, rep.DiscardedSales, rep.DiscardedGiveBacks, rep.DiscardedOther
		for _, d := range firstAfter {
			if d < time.Duration(1<<62) {
				fo.FirstAfterFenceMs = append(fo.FirstAfterFenceMs, float64(d.Microseconds())/1000)
			}
		}
		r.Failover = &fo
	}
	byID := map[string]*faultOrder{}
	for _, o := range h.orders {
		for _, id := range o.ids {
			byID[o.sku+"/"+id] = o
		}
	}
	for key, x := range recs {
		if x.status == string(stock.StateApplied) && (x.typ == string(stock.EventDeducted) || x.typ == string(stock.EventConfirmed)) && !held[key] {
			o := byID[key]
			_, id, _ := strings.Cut(key, "/")
			if o != nil && o.state == "soldout" && o.unknowns > 0 && o.id() == id {
				r.LateTakes++
			} else {
				r.Phantom++
			}
			if o != nil && r.Phantom+r.LateTakes <= 5 && h.ctl == ctlNone {
				sku, id, _ := strings.Cut(key, "/")
				e, err := h.back.Ledger(ctx, sku, id)
				t.Logf("phantom take %s (%s, qty %d): the client's order is %s after %d unknown outcomes; its answers %q; "+
					"Redis ledger: %+v %v", key, x.typ, x.qty, o.state, o.unknowns, o.answers, e, err)
			}
		}
	}
	for _, sku := range faultSKUs {
		r.Oversell += max(0, promised[sku]-h.loaded[sku])
	}
	if v := h.minAvail.Load(); v < 0 {
		r.Oversell += -v
	}
	if v := h.minStore.Load(); v < 0 {
		r.Oversell += -v
	}

	r.Flags = h.check(&r)
	if h.staleMax > 0 {
		note := fmt.Sprintf("%d reconcile locks outlived the pass a restart interrupted (%d of them after an "+
			"AOF cut), up to %v to live: each would have kept its item busy and the failover fence up, refusing "+
			"every deduct, that long (see staleLocks); removed by the harness",
			r.Faults["stale-reconcile-lock"]+r.Faults["stale-reconcile-lock-cut"], r.Faults["stale-reconcile-lock-cut"],
			h.staleMax.Round(time.Millisecond))
		if h.fo != nil {
			note = fmt.Sprintf("%d reconcile locks the promoted replica got from the old primary (a pass held them at "+
				"the promotion), up to %v to live: each would have kept its item busy and the failover fence up, "+
				"refusing every deduct, that long (see staleLocks); removed by the harness",
				r.Faults["stale-reconcile-lock"], h.staleMax.Round(time.Millisecond))
		}
		r.Note = strings.TrimPrefix(r.Note+"; "+note, "; ")
	}
	for _, s := range h.oddities {
		t.Logf("unexpected: %s", s)
	}
	for _, s := range h.reconcileLog {
		t.Logf("reconcile: %s", s)
	}
	t.Log(r.Line())
	return r
}

// faultAbandoned is a hold live in Redis at the end whose client had confirmed or cancelled it.
type faultAbandoned struct {
	key, state string // sku/id; the client's state of the order (kept, cancelled)
	qty        int64
}

// abandonedHolds finds the holds live in Redis once the clients are done whose client had its
// confirm or cancel answered: a client confirms or cancels each hold it gets before its next
// call, so such a hold is one whose confirm or cancel Redis lost (with an old primary at a lossy
// failover, or with the AOF's unsynced tail) while the hold itself survived. Nobody will settle
// it: it stays live until its deadline (FaultHoldTTL, past the checks), its units held. When
// the lost write was a cancel, the old primary sold those units again and the relay may have
// delivered the sales: the store has sold them, and until the hold's deadline Redis holds units
// the store no longer has, which no reconcile can repair (it moves available stock only; the
// pass reports "Redis had sold N units more than the store has") and which the final drift and
// counters would count. In the scenarios with losses the hold's deadline is brought to now
// (Extend) and the holds are swept, as their deadline would: the final pass then compares the
// books their expiry leaves. A hold the store has a record of (a confirm the relay delivered
// from the old primary) is left to the final pass, which must settle it (resyncHolds; checked:
// HeldConfirmed). Without losses the holds are only counted, and flagged (check).
func (h *faultHarness) abandonedHolds(ctx context.Context) []faultAbandoned {
	t := h.t
	settled := map[string]*faultOrder{} // sku/id of holds whose confirm or cancel was answered
	for _, o := range h.orders {
		if o.kind == "hold" && (o.state == "kept" || o.state == "cancelled") {
			settled[o.sku+"/"+o.id()] = o
		}
	}
	var out []faultAbandoned
	var skus []string
	for _, sku := range faultSKUs {
		l, err := h.bc.Do(ctx, h.bc.B().Hgetall().Key("stock:{"+sku+"}:l").Build()).AsStrMap()
		require.NoError(t, err, "ledger %s", sku)
		var ids []string
		for id, e := range l {
			if o := settled[sku+"/"+id]; o != nil && strings.HasPrefix(e, "Hh") {
				ids = append(ids, id)
			}
		}
		if len(ids) == 0 {
			continue
		}
		recs, err := h.store.Records(ctx, sku, ids)
		require.NoError(t, err, "store records %s", sku)
		var released bool
		for _, id := range ids {
			if _, ok := recs[id]; ok {
				continue
			}
			o := settled[sku+"/"+id]
			out = append(out, faultAbandoned{key: sku + "/" + id, state: o.state, qty: o.qty})
			if !h.sc.loss {
				continue
			}
			require.NoError(t, testkit.Err(h.back.Extend(ctx, sku, id, time.Millisecond)), "extend the abandoned hold %s/%s to its end", sku, id)
			released = true
		}
		if released {
			skus = append(skus, sku)
		}
	}
	if len(skus) > 0 {
		// Released by the sweep, or by the Extend of another of the item's holds (it releases
		// the item's due holds first): each is then expired in the ledger.
		for deadline := time.Now().Add(5 * time.Second); ; {
			time.Sleep(5 * time.Millisecond) // past the deadlines, by Redis's clock
			require.NoError(t, testkit.Err(stockops.Sweep(ctx, h.back, skus...)), "sweep the abandoned holds")
			live := slices.ContainsFunc(out, func(a faultAbandoned) bool {
				sku, id, _ := strings.Cut(a.key, "/")
				e, err := h.bc.Do(ctx, h.bc.B().Hget().Key("stock:{"+sku+"}:l").Field(id).Build()).ToString()
				return err != nil || strings.HasPrefix(e, "Hh")
			})
			if !live {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the abandoned holds %v were not released in 5s", out)
			}
		}
		h.drain(ctx) // their expiry events (which the store ignores)
	}
	for i, a := range out {
		if i == 5 {
			break
		}
		t.Logf("abandoned hold %s (%d units): its client's order is %s; the failovers' discarded writes of it %q",
			a.key, a.qty, a.state, h.foDiffs(a.key))
	}
	return out
}

// foDiffs returns the failovers' discarded writes of sku/id (none without failovers).
func (h *faultHarness) foDiffs(key string) []faultFoDiff {
	if h.fo == nil {
		return nil
	}
	h.fo.mu.Lock()
	defer h.fo.mu.Unlock()
	return h.fo.diffs[key]
}

// check returns the checks r fails, under the scenario's expectations.
func (h *faultHarness) check(r *kit.FaultResult) []string {
	var f []string
	flag := func(bad bool, format string, args ...any) {
		if bad {
			f = append(f, fmt.Sprintf(format, args...))
		}
	}
	loss := h.sc.loss
	flag(r.Oversell > 0 && (!loss || r.Oversell > r.LostUnits), "oversell: %d units", r.Oversell)
	flag(r.InvariantBreaks > 0, "Redis books: loaded != available + held + sold in %d samples", r.InvariantBreaks)
	flag(r.DoubleApplied > 0, "double-applied: %d", r.DoubleApplied)
	flag(r.Phantom > 0 && !loss, "phantom takes: %d ids applied in the store that no client holds", r.Phantom)
	flag((r.LostDeducts > 0 || r.LostRestores > 0 || r.LostHolds > 0) && !loss,
		"lost: %d deducts, %d restores, %d holds acknowledged and lost", r.LostDeducts, r.LostRestores, r.LostHolds)
	flag(r.DriftFinal != 0, "drift after the final reconcile: %d", r.DriftFinal)
	flag(r.AbandonedHolds > 0 && !loss, "lost: %d holds (%d units) live in Redis at the end that their clients had confirmed or cancelled",
		r.AbandonedHolds, r.AbandonedHoldUnits)
	flag(r.HeldConfirmed > 0, "holds live in Redis after the final reconcile that the store confirmed: %d (%d units)",
		r.HeldConfirmed, r.HeldConfirmedUnits)
	flag(r.Repaired > 0 && !loss, "repairs: the reconciler repaired %d (units and entries)", r.Repaired)
	flag(r.Refused > 0 && !loss, "refused by the store: %d units", r.Refused)
	flag(r.BooksOff != 0, "store books: remaining != loaded - applied by %d units", r.BooksOff)
	flag(r.CountersOff != 0, "Redis's counters after the final reconcile: Loaded off what was loaded, or Sold off what the store holds as taken, by %d units", r.CountersOff)
	flag(r.NoScript > 0, "NOSCRIPT reached a caller or a log %d times", r.NoScript)
	flag(r.Unresolved > 0, "unresolved: %d calls without a definite answer after %v", r.Unresolved, h.settle)
	flag(r.Unexpected > 0, "unexpected answers: %d", r.Unexpected)
	flag(r.DeadLetters > 0, "dead letters: %d", r.DeadLetters)
	flag(r.OutOfOrder > 0, "applied out of order: %d events reached the store after a later event of their item: %s",
		r.OutOfOrder, strings.Join(r.OutOfOrderEvents, "; "))
	flag(h.sc.replays && r.Replays == 0, "no retry after an unknown outcome was answered as a replay")
	flag(h.resends.Load() != h.resendReplays.Load()+h.resendRetook.Load() && !loss, "resends not answered as replays: %d",
		h.resends.Load()-h.resendReplays.Load()-h.resendRetook.Load())
	injected := 0
	for _, v := range r.Faults {
		injected += v
	}
	flag(injected == 0, "no fault was injected")
	flag(r.FencedTakes > 0, "%d deducts or holds took stock in calls made while the failover guard had fenced Redis "+
		"(sold on a primary not reconciled yet)", r.FencedTakes)
	if fo := r.Failover; fo != nil {
		flag(fo.LostUnexplained > 0, "%d lost deducts, restores or holds are not among the writes the failovers discarded",
			fo.LostUnexplained)
		flag(fo.Promotions == 0, "no failover")
	}
	if fo := r.Failover; fo != nil && (r.LostDeducts > 0 || r.LostRestores > 0 || r.LostHolds > 0 || r.Phantom > 0 || r.Refused > 0) {
		r.Note = fmt.Sprintf("lost in the failovers (the old primary's writes after the promotion, discarded at its "+
			"demotion: the documented non-guarantee of asynchronous replication): %d acknowledged deducts (%d units) no "+
			"relay delivered, known to neither the new primary nor the store, %d restores, %d holds; %d of them found "+
			"among the discarded writes, %d not; %d phantom takes; the store refused %d units (%d of them sold by the new "+
			"primary before the guard fenced it); repaired into agreement (drift %d)",
			r.LostDeducts, r.LostUnits, r.LostRestores, r.LostHolds, fo.LostExplained, fo.LostUnexplained, r.Phantom,
			r.Refused, fo.GapRefusedUnits, r.DriftFinal)
	} else if loss && (r.LostDeducts > 0 || r.LostRestores > 0 || r.LostHolds > 0 || r.Phantom > 0) {
		r.Note = fmt.Sprintf("lost with the AOF's unsynced tail (the documented non-guarantee of appendfsync "+
			"everysec): %d acknowledged deducts (%d units) the relay had not delivered, known to neither Redis nor "+
			"the store, %d restores, %d holds; %d phantom takes; repaired into agreement (drift %d)",
			r.LostDeducts, r.LostUnits, r.LostRestores, r.LostHolds, r.Phantom, r.DriftFinal)
	}
	return f
}

// faultPair returns a Reserver whose client reaches a private redis-server through a
// faultproxy, and one on a direct client: two app instances, one of them behind a bad link.
func faultPair(t *testing.T) (*faultproxy.Proxy, *stock.Reserver, *stock.Reserver, rueidis.Client) {
	srv := redistest.StartServer(t)
	px, err := faultproxy.Start(srv.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { px.Close() })
	// One connection, opened now: a request sent later is on its way, not waiting for a dial.
	opt := rueidis.ClientOption{ForceSingleClient: true, DisableCache: true, DisableRetry: true, PipelineMultiplex: -1}
	opt.InitAddress = []string{px.Addr()}
	sc := kit.FaultRedisClient(t, opt)
	require.NoError(t, sc.Do(context.Background(), sc.B().Ping().Build()).Error())
	slow, err := stock.New(sc)
	require.NoError(t, err)
	opt.InitAddress = []string{srv.Addr()}
	dc := kit.FaultRedisClient(t, opt)
	direct, err := stock.New(dc)
	require.NoError(t, err)
	return px, slow, direct, dc
}

// TestFaultRefusalThenLateAttempt: a deduct times out (outcome unknown: its request is still
// on its way), its retry with the same id is answered ErrSoldOut; a unit comes back; then the
// first request arrives. The retry overtakes the first attempt whenever they travel on
// different connections (an HTTP retry lands on another instance). Because the retry is marked
// Request.Retry, its refusal is recorded for the id, and the late attempt is refused too: the
// buyer's answer, "sold out", stays the final one and no sale is made to nobody.
func TestFaultRefusalThenLateAttempt(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skipf("%s is not set: this check needs a real redis-server", redistest.EnvServer)
	}
	ctx := context.Background()
	px, slow, direct, _ := faultPair(t)
	const sku = "late"
	require.NoError(t, direct.Load(ctx, sku, 1))
	if _, err := direct.Deduct(ctx, stock.Request{SKU: sku, ID: "other", Qty: 1}); err != nil {
		t.Fatal(err)
	}
	px.Blackhole(time.Hour) // the first attempt is held on the way
	c, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := slow.Deduct(c, stock.Request{SKU: sku, ID: "order-1", Qty: 1})
	cancel()
	if err == nil || kit.FaultSentinel(err) {
		t.Fatalf("first attempt: %v, want an unknown outcome", err)
	}
	_, err = direct.Deduct(ctx, stock.Request{SKU: sku, ID: "order-1", Qty: 1, Retry: true}) // the retry, marked as one
	require.ErrorIs(t, err, stock.ErrSoldOut, "retry: %v, want ErrSoldOut", err)
	if _, err := direct.Restore(ctx, sku, "other"); err != nil { // a unit comes back
		t.Fatal(err)
	}
	px.Heal()
	time.Sleep(500 * time.Millisecond) // the first attempt arrives and runs
	e, err := direct.Ledger(ctx, sku, "order-1")
	if err != nil || e.Taken() {
		t.Errorf("order-1 was answered ErrSoldOut and then took stock: ledger %+v, %v", e, err)
	}
	if n, err := testkit.Available(direct.Levels(ctx, sku)); err != nil || n != 1 {
		t.Errorf("the unit that came back was taken by the late attempt: available %d, %v", n, err)
	}
}

// TestFaultReconcileLockLeak: a Reconciler pass whose lock's SET NX runs in Redis while the
// caller sees an error (its context ended, or the connection broke before the reply: a kill
// -9, a reset) returns that error and never releases the lock: Reconciler.lock (reconcile.go)
// returns the error of the SET, and Item returns before it defers rc.unlock. The item then
// stays locked for the lock's fixed 30s: no relay claims its events, and no reconcile pass is
// complete, so a FailoverGuard's fence stays up and every deduct is refused with ErrFailover.
// The suite met it as a 30s stall of its final drain when it stopped its background
// reconciler by cancelling its context; the kill9 scenarios count the locks a restart leaves
// behind (faults "stale-reconcile-lock"). This check cancels the context while the SET is
// delayed by a proxy.
func TestFaultReconcileLockLeak(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skipf("%s is not set: this check needs a real redis-server", redistest.EnvServer)
	}
	ctx := context.Background()
	px, slow, direct, dc := faultPair(t)
	const sku = "leak"
	store := memstore.New()
	require.NoError(t, direct.Load(ctx, sku, 10))
	require.NoError(t, store.Load(ctx, sku, 10))
	if _, err := direct.Deduct(ctx, stock.Request{SKU: sku, ID: "d-1", Qty: 1}); err != nil {
		t.Fatal(err)
	}
	rec, err := stockops.NewReconciler(slow, store, nil)
	require.NoError(t, err)
	px.SetLatency(150 * time.Millisecond)
	c, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, passErr := rec.Item(c, sku) // the context ends while the lock's SET is on its way
	cancel()
	if passErr == nil {
		t.Fatal("the pass ended without error; the latency did not work")
	}
	time.Sleep(400 * time.Millisecond) // the SET has run
	rl, err := stockops.NewRelay(direct, store, nil, nil)
	require.NoError(t, err)
	st, err := rl.Once(ctx)
	require.NoError(t, err)
	if st.Delivered != 1 {
		key := "stock:{" + sku + "}:rl"
		holder, _ := dc.Do(ctx, dc.B().Get().Key(key).Build()).ToString()
		ttl, _ := dc.Do(ctx, dc.B().Pttl().Key(key).Build()).AsInt64()
		t.Errorf("the relay delivered %d events, want 1: the cancelled reconcile pass (%v) left the item locked: "+
			"%s = %q for another %dms. Reconciler.lock returns the context's error without releasing the "+
			"SET NX PX 30000 that ran, and Item returns before it defers rc.unlock.", st.Delivered, passErr, key, holder, ttl)
	}
}
