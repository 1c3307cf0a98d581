package chaos_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
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
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/sqlstore"
	"github.com/stockres/stock/stockops"
)

// The environment of a relay child process (see TestRelayChildProcess).
const (
	crashEnvChild   = "STOCK_CRASH_CHILD"   // "1" in a child
	crashEnvRedis   = "STOCK_CRASH_REDIS"   // the redis-server address
	crashEnvDialect = "STOCK_CRASH_DIALECT" // "sqlite" or "postgres"
	crashEnvDSN     = "STOCK_CRASH_DSN"     // the database's DSN
	crashEnvPrefix  = "STOCK_CRASH_PREFIX"  // sqlstore table prefix
	crashEnvSKU     = "STOCK_CRASH_SKU"     // the item to drain
	crashEnvFault   = "STOCK_CRASH_FAULT"   // probability of each fault point, per store call
	crashEnvLease   = "STOCK_CRASH_LEASE"   // relay lease, in ms
)

// Figures of TestRelayKilledProcess: at least crashMinKills SIGKILLs of a relay child while
// crashWorkers goroutines make crashPerWorker deducts each (and restores, replays, conflicts),
// spread over crashDeductSpan at least.
const (
	crashWorkers    = 8
	crashPerWorker  = 1300
	crashDeductSpan = 5 * time.Second
	crashLoaded     = 30000
	crashMinKills   = 20
	crashKillWindow = 400 * time.Millisecond // a child is killed at most this long after the next one is ready
	crashBatch      = 16
	crashLease      = 150 * time.Millisecond
	crashFault      = 0.005 // per fault point and store call, in the child
	crashBudget     = 12 * time.Second
)

// crashDB is a database of record the relay children and the test share.
type crashDB struct {
	name, driver, dsn, prefix string
	dialect                   sqlstore.Dialect
}

func (d crashDB) open(t testing.TB) (*sql.DB, *sqlstore.Store) {
	t.Helper()
	db, err := sql.Open(d.driver, d.dsn)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	require.NoError(t, db.PingContext(context.Background()), "%s is configured but cannot be reached", d.name)
	s, err := sqlstore.New(db, d.dialect, sqlstore.WithTablePrefix(d.prefix))
	require.NoError(t, err)
	return db, s
}

// TestRelayKilledProcess: a relay in a separate process is killed with SIGKILL at random
// moments, at least crashMinKills times, and also kills itself at fault points (after the claim,
// during the store's transaction, after the store applied and before the ack), while deducts,
// restores and replays run; a relay started again each time, then a last one in this process,
// deliver everything: each deduct is applied in the store exactly once (restored ones given
// back), and Redis and the store agree. Runs only with STOCK_REDIS_SERVER (a private server);
// on SQLite and, with STOCK_TEST_POSTGRES, on PostgreSQL.
func TestRelayKilledProcess(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skipf("%s is not set: the relay crash test needs a real redis-server", redistest.EnvServer)
	}
	dbs := []crashDB{{
		name: "sqlite", driver: "sqlite", dialect: sqlstore.SQLite, prefix: "crash_",
		dsn: sqliteDSN(t.TempDir()),
	}}
	if dsn := os.Getenv("STOCK_TEST_POSTGRES"); dsn != "" {
		dbs = append(dbs, crashDB{name: "postgres", driver: "pgx", dialect: sqlstore.Postgres, dsn: dsn,
			prefix: fmt.Sprintf("stock_crash%d_%04x_", os.Getpid(), rand.IntN(1<<16))})
	}
	for _, d := range dbs {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel() // a server, tables and child processes of its own
			killedRelay(t, d)
		})
	}
}

// crashOp is what the test process knows of one id that took stock.
type crashOp struct {
	qty      int64
	restored bool
}

// crashCounts are the deducting goroutines' figures.
type crashCounts struct {
	deducts, taken, replays, conflicts, restores, restoreReplays, tombstones, soldOut int
}

func (c *crashCounts) add(o crashCounts) {
	c.deducts += o.deducts
	c.taken += o.taken
	c.replays += o.replays
	c.conflicts += o.conflicts
	c.restores += o.restores
	c.restoreReplays += o.restoreReplays
	c.tombstones += o.tombstones
	c.soldOut += o.soldOut
}

func killedRelay(t *testing.T, d crashDB) {
	ctx := context.Background()
	began := time.Now()
	srv := redistest.StartServer(t)
	c := srv.Client(t)
	r := testkit.NewReserver(t, c)
	db, store := d.open(t)
	require.NoError(t, store.Migrate(ctx))
	if d.dialect != sqlstore.SQLite {
		dropTables(t, db, d.prefix)
	}
	const sku = "crash-sku"
	require.NoError(t, r.Load(ctx, sku, crashLoaded))
	require.NoError(t, store.Load(ctx, sku, crashLoaded))

	// The deducts, in this process, while relay children come and go.
	var (
		mu     sync.Mutex
		ops    = map[string]*crashOp{} // every id that took stock
		counts crashCounts
		wg     sync.WaitGroup
		done   atomic.Bool
	)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	for g := range crashWorkers {
		wg.Go(func() {
			cnt, mine := crashDeducts(t, r, sku, g, seed, began)
			mu.Lock()
			defer mu.Unlock()
			counts.add(cnt)
			for id, op := range mine {
				_, dup := ops[id]
				assert.False(t, dup, "%s took stock in two goroutines", id)
				ops[id] = op
			}
		})
	}
	go func() { wg.Wait(); done.Store(true) }()
	t.Cleanup(wg.Wait) // no deduct outlives a failed test

	// Relay children, killed at random moments until at least crashMinKills SIGKILLs, the
	// deducts are done and the outbox is empty (or the budget is spent). Each child is started
	// while the one before still works, and takes over when the lease of the one killed runs
	// out: the relays' work is not held up by the children's start-up.
	kids := &crashChildren{t: t, running: map[*crashChild]bool{}, faults: map[string]int{}, env: append(os.Environ(),
		crashEnvChild+"=1",
		crashEnvRedis+"="+srv.Addr(),
		crashEnvDialect+"="+d.name,
		crashEnvDSN+"="+d.dsn,
		crashEnvPrefix+"="+d.prefix,
		crashEnvSKU+"="+sku,
		crashEnvFault+"="+strconv.FormatFloat(crashFault, 'g', -1, 64),
		crashEnvLease+"="+strconv.FormatInt(crashLease.Milliseconds(), 10),
	)}
	t.Cleanup(kids.stop)
	deadline := began.Add(crashBudget)
	var deductsFor time.Duration
	cur := kids.start()
	for !t.Failed() {
		if done.Load() && deductsFor == 0 {
			deductsFor = time.Since(began)
		}
		if kids.kills >= crashMinKills && done.Load() && (testkit.OutboxLen(t, c, sku) == 0 || time.Now().After(deadline)) {
			break
		}
		next := kids.start()
		time.Sleep(rand.N(crashKillWindow))
		kids.end(cur)
		cur = next
	}
	kids.end(cur)
	wg.Wait()
	if deductsFor == 0 {
		deductsFor = time.Since(began)
	}
	require.False(t, t.Failed())

	// What the dead relays left: events in the outbox, of which some claimed and not acked.
	pending := testkit.OutboxLen(t, c, sku)
	unacked, err := c.Do(ctx, c.B().Hlen().Key("stock:{"+sku+"}:r").Build()).AsInt64()
	require.NoError(t, err)

	// A last relay, in this process, drains the rest once the last child's lease runs out.
	rl, err := stockops.NewRelay(r, store, nil, &stock.RelayOptions{Batch: 128, Items: []string{sku}})
	require.NoError(t, err)
	var final stockops.RelayStats
	for end := time.Now().Add(time.Minute); ; {
		st, err := rl.Once(ctx)
		require.NoError(t, err)
		final.Add(st)
		if st.Claimed == 0 {
			if testkit.OutboxLen(t, c, sku) == 0 {
				break
			}
			require.True(t, time.Now().Before(end), "the outbox did not drain")
			time.Sleep(10 * time.Millisecond)
		}
	}
	assert.Zero(t, final.Refused)
	assert.Zero(t, final.Orphaned)
	assert.Zero(t, final.Retried)
	assert.Equal(t, int(unacked), final.Redelive, "the final relay delivers again what the dead ones claimed")

	// Every id that took stock is in the store exactly once, restored if it was restored;
	// nothing else is.
	mu.Lock()
	defer mu.Unlock()
	assert.GreaterOrEqual(t, len(ops), 10000, "deducts that took stock")
	var sold int64
	for _, op := range ops {
		if !op.restored {
			sold += op.qty
		}
	}
	records := d.prefix + "records"
	var dups int
	require.NoError(t, db.QueryRowContext(ctx, "SELECT COUNT(*) FROM (SELECT sku, id FROM "+records+
		" GROUP BY sku, id HAVING COUNT(*) > 1) AS d").Scan(&dups))
	assert.Zero(t, dups, "(sku, id) recorded twice")
	rows, err := db.QueryContext(ctx, "SELECT id, type, qty, status FROM "+records+" WHERE sku = '"+sku+"'")
	require.NoError(t, err)
	seen := map[string]bool{}
	var applied int64
	for rows.Next() {
		var id, typ, status string
		var qty int64
		require.NoError(t, rows.Scan(&id, &typ, &qty, &status))
		seen[id] = true
		if status == string(stock.StateApplied) {
			applied += qty
		}
		op, ok := ops[id]
		if !assert.True(t, ok, "record of %s, which took nothing (%s %s)", id, typ, status) {
			continue
		}
		want := stock.StateApplied
		if op.restored {
			want = stock.StateRestored
		}
		assert.Equal(t, string(stock.EventDeducted), typ, id)
		assert.Equal(t, op.qty, qty, id)
		assert.Equal(t, string(want), status, id)
	}
	require.NoError(t, rows.Err())
	rows.Close()
	missing := 0
	for id := range ops {
		if !seen[id] {
			missing++
			if missing <= 5 {
				t.Errorf("%s took stock and has no record in the store", id)
			}
		}
	}
	assert.Zero(t, missing, "ids missing from the store")
	assert.Equal(t, sold, applied, "units applied in the store")
	rem, err := store.Remaining(ctx, sku)
	require.NoError(t, err)
	assert.Equal(t, int64(crashLoaded)-sold, rem, "store remaining = loaded - applied")
	l := testkit.Levels(t, r, sku)
	assert.Equal(t, rem, l.Available, "Redis available = store remaining")
	assert.Equal(t, stock.Levels{Available: rem, Sold: sold, Loaded: crashLoaded}, l)
	for e, err := range stockops.Entries(ctx, r, sku) {
		require.NoError(t, err)
		if e.Kind == stock.KindTombstone {
			continue
		}
		want := stock.StateApplied
		if op := ops[e.ID]; op == nil {
			t.Errorf("ledger entry of %s, which took nothing", e.ID)
			continue
		} else if op.restored {
			want = stock.StateRestored
		}
		assert.Equal(t, want, e.State, e.ID)
	}
	assert.Zero(t, testkit.OutboxLen(t, c, sku))

	t.Logf("deducts: %d calls, %d took stock (%d units sold after %d restores, %d restore replays), "+
		"%d replays, %d conflicts, %d tombstones, %d sold out; done after %v",
		counts.deducts, counts.taken, sold, counts.restores, counts.restoreReplays,
		counts.replays, counts.conflicts, counts.tombstones, counts.soldOut, deductsFor.Round(time.Millisecond))
	t.Logf("relay children: %d started (ready after %v on average), %d SIGKILLed by the test, "+
		"%d killed at fault points %v", kids.started, (kids.startup / time.Duration(kids.started)).Round(time.Millisecond),
		kids.kills, kids.faultKills(), kids.faults)
	t.Logf("their store calls: %d events, %d of them claimed before by a relay that died "+
		"(%d already applied by it); %d events applied", kids.calls, kids.redelivered, kids.already, kids.applied)
	t.Logf("final relay: %d events pending, %d of them claimed by a dead relay (RelayStats.Redelive %d); "+
		"delivered %d; total %v", pending, unacked, final.Redelive, final.Delivered, time.Since(began).Round(time.Millisecond))
	t.Logf("redelivered in all: %d", kids.redelivered+final.Redelive)
	assert.GreaterOrEqual(t, kids.kills, crashMinKills)
}

// crashDeducts makes crashPerWorker deducts of goroutine g, with about 5% restores (some at
// once, some later, some twice), replays of earlier ids, conflicting reuses, tombstones, and
// ids shared with the goroutine g^1 (both deduct them; one takes, the other replays). It
// returns its figures and the ids it took stock with.
func crashDeducts(t *testing.T, r *stock.Reserver, sku string, g int, seed uint64, began time.Time) (crashCounts, map[string]*crashOp) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, uint64(g)))
	var cnt crashCounts
	mine := map[string]*crashOp{}
	var ids, later []string
	restore := func(id string) {
		op := mine[id]
		rc, err := r.Restore(ctx, sku, id)
		if assert.NoError(t, err, id) {
			assert.Equal(t, op.qty, rc.Qty, id)
			assert.Equal(t, op.restored, rc.Replayed, id)
		}
		if op.restored {
			cnt.restoreReplays++
		} else {
			cnt.restores++
		}
		op.restored = true
	}
	for i := range crashPerWorker {
		if t.Failed() {
			break
		}
		time.Sleep(time.Until(began.Add(crashDeductSpan * time.Duration(i) / crashPerWorker)))
		req := stock.Request{SKU: sku, ID: fmt.Sprintf("g%d-%d", g, i), User: fmt.Sprint("u", g), Qty: 1 + rng.Int64N(3)}
		shared := i%100 == 50
		if shared {
			req = stock.Request{SKU: sku, ID: fmt.Sprintf("pair%d-%d", g/2, i), User: "pair", Qty: 2}
		}
		rc, err := r.Deduct(ctx, req)
		cnt.deducts++
		switch {
		case errors.Is(err, stock.ErrSoldOut), errors.Is(err, stock.ErrInsufficient):
			cnt.soldOut++
			continue
		case !assert.NoError(t, err, req.ID):
			continue
		case rc.Replayed:
			assert.True(t, shared, "%s replayed on first use", req.ID)
			cnt.replays++
			continue
		}
		cnt.taken++
		mine[req.ID] = &crashOp{qty: req.Qty}
		if !shared {
			ids = append(ids, req.ID)
		}
		switch p := rng.IntN(1000); {
		case p < 25 && !shared:
			restore(req.ID)
		case p < 50 && !shared:
			later = append(later, req.ID)
		case p < 52 && len(ids) > 0: // a retry of an earlier id
			id := ids[rng.IntN(len(ids))]
			op := mine[id]
			rc, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: fmt.Sprint("u", g), Qty: op.qty})
			cnt.deducts++
			if op.restored {
				assert.ErrorIs(t, err, stock.ErrRestored, id)
			} else if assert.NoError(t, err, id) {
				assert.True(t, rc.Replayed, id)
				assert.Equal(t, op.qty, rc.Qty, id)
				cnt.replays++
			}
		case p < 60 && len(ids) > 0: // an earlier id with another quantity
			id := ids[rng.IntN(len(ids))]
			_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: fmt.Sprint("u", g), Qty: mine[id].qty + 1})
			cnt.deducts++
			assert.ErrorIs(t, err, stock.ErrConflict, id) // restored or not
			cnt.conflicts++
		case p < 62: // a restore that overtakes its deduct
			id := fmt.Sprintf("ghost%d-%d", g, i)
			_, err := r.Restore(ctx, sku, id)
			assert.ErrorIs(t, err, stock.ErrUnknownID, id)
			_, err = r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: 1})
			cnt.deducts++
			assert.ErrorIs(t, err, stock.ErrRestored, id)
			cnt.tombstones++
		case p < 64 && len(later) == 0 && len(ids) > 0: // a restore repeated
			if id := ids[rng.IntN(len(ids))]; mine[id].restored {
				restore(id)
			}
		}
		if len(later) > 0 && rng.IntN(20) == 0 {
			restore(later[0])
			later = later[1:]
		}
	}
	for _, id := range later {
		restore(id)
	}
	return cnt, mine
}

// crashChildren runs relay children and counts how they ended and what they did.
type crashChildren struct {
	t   *testing.T
	env []string

	running map[*crashChild]bool

	started, kills int
	faults         map[string]int // kills at each fault point
	startup        time.Duration  // summed time from start to ready
	// Summed over the children: events passed to the store, of which claimed before, and of
	// which already applied; events the store applied.
	calls, redelivered, already, applied int
}

// crashChild is one relay child process and what its lines said: "crashtest-store <events>
// <claimed before> <already applied>" before a store call, "crashtest-applied <events>" after
// it, and "crashtest-fault <point>".
type crashChild struct {
	*childProc
	fault                                string
	calls, redelivered, already, applied int
}

func (k *crashChildren) faultKills() int {
	n := 0
	for _, v := range k.faults {
		n += v
	}
	return n
}

// start starts a child and waits until it is ready: connected to Redis and the database, and
// about to run its relay.
func (k *crashChildren) start() *crashChild {
	t := k.t
	ch := &crashChild{}
	var err error
	ch.childProc, err = startChild("TestRelayChildProcess", k.env, "crashtest-ready", ch.read)
	require.NoError(t, err)
	k.started++
	k.running[ch] = true
	began := time.Now()
	switch err := ch.awaitReady(30 * time.Second); {
	case err == nil:
		k.startup += time.Since(began)
	case !errors.Is(err, errChildExited):
		t.Errorf("relay child not ready after 30s:\n%s", ch.tail())
	}
	return ch
}

// read counts what one line of the child's output says (under ch.mu).
func (ch *crashChild) read(line string) {
	f := strings.Fields(line)
	n := make([]int, len(f))
	for i := 1; i < len(f); i++ {
		n[i], _ = strconv.Atoi(f[i])
	}
	switch {
	case len(f) == 4 && f[0] == "crashtest-store":
		ch.calls += n[1]
		ch.redelivered += n[2]
		ch.already += n[3]
	case len(f) == 2 && f[0] == "crashtest-applied":
		ch.applied += n[1]
	case len(f) == 2 && f[0] == "crashtest-fault":
		ch.fault = f[1]
	}
}

// end kills ch with SIGKILL, unless it killed itself at a fault point, and counts how it ended.
// Any other end fails the test.
func (k *crashChildren) end(ch *crashChild) {
	t := k.t
	killed := ch.kill()
	delete(k.running, ch)
	out := ch.output()
	assert.NotContains(t, out, "WARNING: DATA RACE", "data race in a relay child:\n%s", out)
	ch.mu.Lock()
	k.calls += ch.calls
	k.redelivered += ch.redelivered
	k.already += ch.already
	k.applied += ch.applied
	fault := ch.fault
	ch.mu.Unlock()
	switch {
	case fault != "":
		k.faults[fault]++
	case killed:
		k.kills++
	default:
		t.Errorf("relay child ended by itself (%v):\n%s", ch.cmd.ProcessState, ch.tail())
	}
}

// stop kills the children still running.
func (k *crashChildren) stop() {
	for ch := range k.running {
		ch.kill()
		delete(k.running, ch)
	}
}

// TestRelayChildProcess is the relay process of TestRelayKilledProcess, which runs the test
// binary again with crashEnvChild set; otherwise it returns at once. It runs a relay of one
// item into the SQL store until it is killed, with fault points that kill it too (faultyStore).
func TestRelayChildProcess(t *testing.T) {
	if os.Getenv(crashEnvChild) != "1" {
		return
	}
	go func() { // the parent died: so do we
		_, _ = io.Copy(io.Discard, os.Stdin)
		crashSelf("parent-gone")
	}()
	ctx := context.Background()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{os.Getenv(crashEnvRedis)},
		ForceSingleClient: true, DisableCache: true})
	require.NoError(t, err)
	r := testkit.NewReserver(t, c)
	d := crashDB{name: os.Getenv(crashEnvDialect), dsn: os.Getenv(crashEnvDSN), prefix: os.Getenv(crashEnvPrefix)}
	switch d.name {
	case "sqlite":
		d.driver, d.dialect = "sqlite", sqlstore.SQLite
	case "postgres":
		d.driver, d.dialect = "pgx", sqlstore.Postgres
	default:
		t.Fatalf("%s=%q", crashEnvDialect, d.name)
	}
	_, s := d.open(t)
	p, err := strconv.ParseFloat(os.Getenv(crashEnvFault), 64)
	require.NoError(t, err)
	lease, err := strconv.Atoi(os.Getenv(crashEnvLease))
	require.NoError(t, err)
	rl, err := stockops.NewRelay(r, &faultyStore{Store: s, p: p, c: c}, nil, &stock.RelayOptions{Batch: crashBatch, Lease: time.Duration(lease) * time.Millisecond, MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, Poll: 5 * time.Millisecond, Items: []string{os.Getenv(crashEnvSKU)}})
	require.NoError(t, err)
	require.NoError(t, c.Do(ctx, c.B().Ping().Build()).Error())
	fmt.Fprintln(os.Stderr, "crashtest-ready")
	require.NoError(t, rl.Run(ctx)) // until killed
}

// faultyStore reports what it is given and applies on stderr, and kills its process with
// probability p at each of three points of a store call: after the relay claimed the batch and
// before the store applies it, a moment into the store's transaction (or just after it), and
// after the store applied it and before the relay acks it.
type faultyStore struct {
	*sqlstore.Store
	p float64
	c rueidis.Client
}

func (f *faultyStore) Apply(ctx context.Context, ev stock.Event) error {
	var err error
	f.apply(ctx, []stock.Event{ev}, func() { err = f.Store.Apply(ctx, ev) })
	return err
}

func (f *faultyStore) ApplyBatch(ctx context.Context, evs []stock.Event) []error {
	var errs []error
	f.apply(ctx, evs, func() { errs = f.Store.ApplyBatch(ctx, evs) })
	return errs
}

func (f *faultyStore) apply(ctx context.Context, evs []stock.Event, apply func()) {
	f.fault("before-apply")
	redelivered, already := f.before(ctx, evs)
	fmt.Fprintln(os.Stderr, "crashtest-store", len(evs), redelivered, already)
	if rand.Float64() < f.p {
		t := time.AfterFunc(rand.N(3*time.Millisecond), func() { crashSelf("during-apply") })
		defer t.Stop()
	}
	apply()
	fmt.Fprintln(os.Stderr, "crashtest-applied", len(evs))
	f.fault("after-apply")
}

func (f *faultyStore) fault(point string) {
	if rand.Float64() < f.p {
		crashSelf(point)
	}
}

// before counts the events of evs that a relay claimed before (their outbox attempts, which
// include this claim, are above 1) and those of them the store already applied: deliveries made
// again because a relay died after the claim, or after the store applied them and before the ack.
func (f *faultyStore) before(ctx context.Context, evs []stock.Event) (redelivered, already int) {
	sku := evs[0].SKU
	ids := make([]string, len(evs))
	members := make([]string, len(evs))
	for i, ev := range evs {
		ids[i] = ev.ID
		members[i] = "D:" + ev.ID
		if ev.Type == stock.EventRestored {
			members[i] = "R:" + ev.ID
		}
	}
	tries, err := f.c.Do(ctx, f.c.B().Hmget().Key("stock:{"+sku+"}:r").Field(members...).Build()).ToArray()
	if err != nil {
		return 0, 0
	}
	recs, err := f.Records(ctx, sku, ids)
	if err != nil {
		return 0, 0
	}
	for i, ev := range evs {
		if n, _ := tries[i].AsInt64(); n > 1 {
			redelivered++
		}
		rec, ok := recs[ev.ID]
		if ok && (ev.Type == stock.EventDeducted || rec.Status == stock.StateRestored) {
			already++
		}
	}
	return redelivered, already
}

// crashSelf says which fault point it is at and kills its process with SIGKILL.
func crashSelf(point string) {
	fmt.Fprintln(os.Stderr, "crashtest-fault", point)
	if p, err := os.FindProcess(os.Getpid()); err == nil {
		_ = p.Kill()
	}
	time.Sleep(time.Hour)
}
