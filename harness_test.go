package stock_test

// The package's test harness: the backends and Reservers every test runs on, the checks a call
// or a value is put through, the rig of a Reserver, a Store, a relay and a reconciler, the
// recorders of events and logs, and the clock tests move by hand.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

func TestMain(m *testing.M) { os.Exit(redistest.Run(m)) }

// ctx is the context of the tests' calls: none is cancelled from outside the test that makes it.
var ctx = context.Background()

// The helpers every test of the package uses, shared with the other packages' tests and the
// system tests (internal/testkit).
var (
	eachBackend       = testkit.EachBackend
	eachBackendSerial = testkit.EachBackendSerial
	newReserver       = testkit.NewReserver
	levels            = testkit.Levels
	ledger            = testkit.Ledger
	checkLedger       = testkit.CheckLedger
	drain             = testkit.Drain
	outboxLen         = testkit.OutboxLen
	available         = testkit.Available
)

// must requires the call it is given to succeed, and returns its receipt:
// rc := must(t)(r.Deduct(ctx, req)).
func must(t *testing.T, msgAndArgs ...any) func(stock.Receipt, error) stock.Receipt {
	return func(rc stock.Receipt, err error) stock.Receipt {
		t.Helper()
		require.NoError(t, err, msgAndArgs...)
		return rc
	}
}

// mustFail requires the call it is given to fail with want, and returns its receipt:
// rc := mustFail(t, stock.ErrSoldOut)(r.Deduct(ctx, req)).
func mustFail(t *testing.T, want error, msgAndArgs ...any) func(stock.Receipt, error) stock.Receipt {
	return func(rc stock.Receipt, err error) stock.Receipt {
		t.Helper()
		require.ErrorIs(t, err, want, msgAndArgs...)
		return rc
	}
}

// mustCart is must for a cart: rc := mustCart(t)(r.DeductMany(ctx, cart)).
func mustCart(t *testing.T, msgAndArgs ...any) func(stock.CartReceipt, error) stock.CartReceipt {
	return func(rc stock.CartReceipt, err error) stock.CartReceipt {
		t.Helper()
		require.NoError(t, err, msgAndArgs...)
		return rc
	}
}

// mustFailCart is mustFail for a cart.
func mustFailCart(t *testing.T, want error, msgAndArgs ...any) func(stock.CartReceipt, error) stock.CartReceipt {
	return func(rc stock.CartReceipt, err error) stock.CartReceipt {
		t.Helper()
		require.ErrorIs(t, err, want, msgAndArgs...)
		return rc
	}
}

// entry is id's ledger entry of sku, which must exist.
func entry(t *testing.T, r *stock.Reserver, sku, id string) stock.Entry {
	t.Helper()
	e, err := r.Ledger(context.Background(), sku, id)
	require.NoError(t, err)
	return e
}

// remaining is what the store has left of sku, which it must know.
func remaining(t *testing.T, store stock.Store, sku string) int64 {
	t.Helper()
	n, err := store.Remaining(context.Background(), sku)
	require.NoError(t, err)
	return n
}

// keyIn returns the first name prefix-<j> that goes to bucket b of n.
func keyIn(prefix string, b, n int) string {
	for j := 0; ; j++ {
		if k := fmt.Sprintf("%s-%d", prefix, j); testkit.HomeBucket(k, n) == b {
			return k
		}
	}
}

// eachReserver runs f on every backend, with a Reserver of opts on it.
func eachReserver(t *testing.T, opts []stock.Option, f func(t *testing.T, c rueidis.Client, r *stock.Reserver)) {
	t.Helper()
	eachBackend(t, func(t *testing.T, c rueidis.Client) { f(t, c, newReserver(t, c, opts...)) })
}

// logRecords is a slog handler that keeps the records of warnings and errors, each as
// "level=LEVEL message attrs".
type logRecords struct {
	mu   sync.Mutex
	msgs []string
}

func (w *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (w *logRecords) WithAttrs([]slog.Attr) slog.Handler       { return w }
func (w *logRecords) WithGroup(string) slog.Handler            { return w }
func (w *logRecords) Handle(_ context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return nil
	}
	msg := "level=" + r.Level.String() + " " + r.Message
	r.Attrs(func(a slog.Attr) bool { msg += " " + a.String(); return true })
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, msg)
	return nil
}

// count returns how many kept records contain s.
func (w *logRecords) count(s string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, m := range w.msgs {
		if strings.Contains(m, s) {
			n++
		}
	}
	return n
}

// String returns the kept records, one a line.
func (w *logRecords) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.msgs, "\n")
}

// rig is a Reserver on c with a Store, a relay and a reconciler between them.
type rig struct {
	r     *stock.Reserver
	c     rueidis.Client
	store *memstore.Store
	relay *stockops.Relay
	rec   *stockops.Reconciler
}

func newRig(t *testing.T, c rueidis.Client, skus map[string]int64, opts ...*stock.ReconcileOptions) rig {
	t.Helper()
	return newRigWith(t, c, newReserver(t, c), skus, opts...)
}

// newRigWith is newRig on a Reserver of the caller's.
func newRigWith(t *testing.T, c rueidis.Client, r *stock.Reserver, skus map[string]int64, opts ...*stock.ReconcileOptions) rig {
	t.Helper()
	store := loadBoth(t, r, skus)
	relay := newRelay(t, r, store, nil, &stock.RelayOptions{MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	var o *stock.ReconcileOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	rec := newReconciler(t, r, store, o)
	return rig{r: r, c: c, store: store, relay: relay, rec: rec}
}

func (g rig) once(t *testing.T) map[string]stockops.Report {
	t.Helper()
	reps, err := g.rec.Once(context.Background())
	require.NoError(t, err)
	m := map[string]stockops.Report{}
	for _, rp := range reps {
		m[rp.SKU] = rp
	}
	return m
}

// agree checks that Redis and the store agree once the outbox is drained.
func (g rig) agree(t *testing.T, sku string) {
	t.Helper()
	drain(t, g.relay)
	l, err := g.r.Levels(context.Background(), sku)
	require.NoError(t, err)
	rem := remaining(t, g.store, sku)
	assert.Equal(t, rem, l.Available+l.Held, "redis available+held = store remaining")
	assert.GreaterOrEqual(t, rem, int64(0))
	assert.LessOrEqual(t, g.store.MaxApplications(), 1)
}

func del(t *testing.T, c rueidis.Client, keys ...string) {
	t.Helper()
	for _, k := range keys {
		require.NoError(t, c.Do(context.Background(), c.B().Del().Key(k).Build()).Error())
	}
}

// assertGone asserts that none of the keys base+suffix exists.
func assertGone(t *testing.T, c rueidis.Client, base string, suffixes ...string) {
	t.Helper()
	for _, suffix := range suffixes {
		n, err := c.Do(context.Background(), c.B().Exists().Key(base+suffix).Build()).AsInt64()
		require.NoError(t, err)
		assert.Zero(t, n, "%s%s is gone", base, suffix)
	}
}

// testClock is a clock for WithClock that tests move by hand.
type testClock struct {
	mu sync.Mutex
	at time.Time
}

func newTestClock() *testClock { return &testClock{at: time.Now()} }

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.at
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	c.at = c.at.Add(d)
	c.mu.Unlock()
}

// recorder is a Publisher that records what it got, deduplicated, and can be made to fail.
type recorder struct {
	mu    sync.Mutex
	seen  map[string]int
	evs   []stock.Event
	down  atomic.Bool
	fails atomic.Int64
}

func newRecorder() *recorder { return &recorder{seen: map[string]int{}} }

func (p *recorder) Publish(_ context.Context, ev stock.Event) error {
	if p.down.Load() {
		p.fails.Add(1)
		return errors.New("publisher down")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	k := ev.SKU + "/" + ev.ID + "/" + string(ev.Type)
	if p.seen[k] == 0 {
		p.evs = append(p.evs, ev)
	}
	p.seen[k]++
	return nil
}

func (p *recorder) count(t stock.EventType) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, ev := range p.evs {
		if ev.Type == t {
			n++
		}
	}
	return n
}

// reserverAndStore returns a Reserver on c and a memstore, each with the items of skus loaded
// with their quantities (a test seeds drift with store.Set).
func reserverAndStore(t *testing.T, c rueidis.Client, skus map[string]int64) (*stock.Reserver, *memstore.Store) {
	t.Helper()
	r := newReserver(t, c)
	return r, loadBoth(t, r, skus)
}

// loadBoth loads the items of skus with their quantities through r and into a new memstore,
// which it returns.
func loadBoth(t *testing.T, r *stock.Reserver, skus map[string]int64) *memstore.Store {
	t.Helper()
	store := memstore.New()
	for sku, n := range skus {
		require.NoError(t, r.Load(context.Background(), sku, n))
		require.NoError(t, store.Load(context.Background(), sku, n))
	}
	return store
}

// sellTo sells n units of sku to user, a request of one unit each: ids prefix0, prefix1, ...
func sellTo(t *testing.T, r *stock.Reserver, sku, prefix, user string, n int) {
	t.Helper()
	for i := range n {
		must(t, "sale %d", i)(r.Deduct(context.Background(), stock.Request{SKU: sku, ID: prefix + strconv.Itoa(i), User: user, Qty: 1}))
	}
}

// storeAgrees checks that the Store and Redis tell the same story of a split item after the
// relay delivered everything: what the Store has left is what Redis has available and held.
func storeAgrees(t *testing.T, r *stock.Reserver, store *memstore.Store, sku string) {
	t.Helper()
	l := levels(t, r, sku)
	rem := remaining(t, store, sku)
	assert.Equal(t, l.Available+l.Held, rem, "Redis %+v, store %d", l, rem)
}

// cartModes runs f for a saga cart (items in their own slots) and a one-script cart (items in
// one group).
// Their Reservers wait up to a minute for a command (WithTimeout): hundreds of concurrent carts
// on miniredis under -race, beside the other test groups, can keep one call waiting past the
// default 10 s, and these tests are about what carts answer, not about bounds.
func cartModes(t *testing.T, f func(t *testing.T, r *stock.Reserver)) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		t.Run("saga", func(t *testing.T) { f(t, newReserver(t, c, stock.WithPrefix("saga"), stock.WithTimeout(time.Minute))) })
		t.Run("group", func(t *testing.T) {
			f(t, newReserver(t, c, stock.WithPrefix("grp"), stock.WithGroups(func(string) string { return "g" }), stock.WithTimeout(time.Minute)))
		})
	})
}

// loadItems loads the items of skus through r with their quantities.
func loadItems(t *testing.T, r *stock.Reserver, skus map[string]int64) {
	t.Helper()
	for sku, n := range skus {
		require.NoError(t, r.Load(context.Background(), sku, n), "load %q", sku)
	}
}

// commandCalls returns how many times a standalone server has run the named commands.
func commandCalls(t *testing.T, c rueidis.Client, names ...string) int64 {
	t.Helper()
	info, err := c.Do(context.Background(), c.B().Info().Section("commandstats").Build()).ToString()
	require.NoError(t, err)
	var n int64
	for line := range strings.SplitSeq(info, "\n") {
		for _, name := range names {
			cmd := "cmdstat_" + name + ":calls="
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd); ok {
				v, err := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				require.NoError(t, err)
				n += v
			}
		}
	}
	return n
}

// eachPair runs f in parallel on each backend with two clients of it: c for the Reserver under
// test, c2 for another process.
func eachPair(t *testing.T, f func(t *testing.T, b redistest.Backend, c, c2 rueidis.Client)) {
	t.Helper()
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		c, c2 := b.Pair(t)
		f(t, b, c, c2)
	})
}

// assertState asserts the state of id's ledger entry of sku.
func assertState(t *testing.T, r *stock.Reserver, sku, id string, want stock.State, msgAndArgs ...any) {
	t.Helper()
	assert.Equal(t, want, entry(t, r, sku, id).State, msgAndArgs...)
}

// holdMany holds n units of sku, one per id prefix-0..n-1, for ttl, in deadline order.
func holdMany(t *testing.T, r *stock.Reserver, sku, prefix string, n int, ttl time.Duration) {
	t.Helper()
	for i := range n {
		must(t)(r.Hold(context.Background(), stock.Request{SKU: sku, ID: fmt.Sprint(prefix, i), Qty: 1}, ttl))
	}
}

// findKey returns the one hash key whose name contains "{"+sku+"}" or ":"+sku and that match
// accepts, on any node.
func findKey(t *testing.T, c rueidis.Client, sku string, match func(context.Context, rueidis.Client, string) bool) string {
	t.Helper()
	var found []string
	for _, n := range c.Nodes() {
		keys, err := n.Do(ctx, n.B().Keys().Pattern("*").Build()).AsStrSlice()
		require.NoError(t, err)
		for _, k := range keys {
			if !strings.Contains(k, "{"+sku+"}") && !strings.Contains(k, ":"+sku) {
				continue
			}
			if typ, err := n.Do(ctx, n.B().Type().Key(k).Build()).ToString(); err != nil || typ != "hash" {
				continue
			}
			if match(ctx, n, k) {
				found = append(found, k)
			}
		}
	}
	require.Len(t, found, 1, "keys of %s: %v", sku, found)
	return found[0]
}

// stopped reports whether stop is closed: a background loop runs while !stopped(stop).
func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

// splitSAndGroupG are the options of a catalogue of plain items, items split over three
// buckets (their names start with S) and items of one group g (their names start with G).
var splitSAndGroupG = []stock.Option{
	stock.WithBuckets(func(sku string) int {
		if strings.HasPrefix(sku, "S") {
			return 3
		}
		return 0
	}),
	stock.WithGroups(func(sku string) string {
		if strings.HasPrefix(sku, "G") {
			return "g"
		}
		return ""
	}),
}

// newRelay and newReconciler are stockops.NewRelay and NewReconciler, which must succeed.
var (
	newRelay      = testkit.NewRelay
	newReconciler = testkit.NewReconciler
)
