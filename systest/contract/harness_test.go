package contract_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the database/sql drivers of the SQL stores the tests open
	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
	"github.com/stockres/stock/stocktest"
)

// TestMain starts and stops the real servers the tests ask for (redistest.Run).
func TestMain(m *testing.M) { os.Exit(redistest.Run(m)) }

// ctx is the context of every call a test makes without a deadline of its own.
var ctx = context.Background()

// must requires that a call answered no error and gives its value:
// rc := must(r.Deduct(ctx, req))(t, "what the call is").
func must[T any](v T, err error) func(t *testing.T, msgAndArgs ...any) T {
	return func(t *testing.T, msgAndArgs ...any) T {
		t.Helper()
		require.NoError(t, err, msgAndArgs...)
		return v
	}
}

// parallel runs f(0) … f(n-1) in goroutines at once and waits for them all.
func parallel(n int, f func(i int)) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { f(i) })
	}
	wg.Wait()
}

// req is the request of qty units of sku under id, by user ("" for none).
func req(sku, id, user string, qty int64) stock.Request {
	return stock.Request{SKU: sku, ID: id, User: user, Qty: qty}
}

// takenByID is the units of each of ids that sku's ledger holds as taken (ids it does not know
// are left out).
func takenByID(t *testing.T, r *stock.Reserver, sku string, ids []string) map[string]int64 {
	t.Helper()
	taken := map[string]int64{}
	for _, id := range ids {
		ent, err := r.Ledger(ctx, sku, id)
		if errors.Is(err, stock.ErrUnknownID) {
			continue
		}
		require.NoError(t, err)
		if ent.Taken() {
			taken[id] = ent.Qty
		}
	}
	return taken
}

// eventuallyDelivered requires that within d the outbox of each of skus is empty, with no dead
// letter.
func eventuallyDelivered(t *testing.T, r *stock.Reserver, d time.Duration, skus ...string) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, sku := range skus {
			p, dead, err := stockops.Pending(ctx, r, sku)
			if err != nil || p != 0 || dead != 0 {
				return false
			}
		}
		return true
	}, d, 50*time.Millisecond, "every event of %v delivered", skus)
}

// eventuallyRemaining requires that within d the store has want units of each of skus left.
func eventuallyRemaining(t *testing.T, store *memstore.Store, d time.Duration, want int64, skus ...string) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, sku := range skus {
			if n, err := store.Remaining(ctx, sku); err != nil || n != want {
				return false
			}
		}
		return true
	}, d, 20*time.Millisecond, "the store reaches %d remaining of %v", want, skus)
}

// check asserts loaded = available + held + sold, available >= 0, and that the ledger
// explains sold, held and loaded (initial + restocks).
func check(t *testing.T, r *stock.Reserver, sku string, initial int64) stock.Levels {
	t.Helper()
	l, _ := testkit.CheckLedger(t, r, sku, initial)
	return l
}

// loadEach loads each of skus with qty units.
func loadEach(t *testing.T, r *stock.Reserver, qty int64, skus ...string) {
	t.Helper()
	for _, sku := range skus {
		require.NoError(t, r.Load(context.Background(), sku, qty), sku)
	}
}

// unitLines is a cart's lines of one unit of each of skus.
func unitLines(skus ...string) []stock.Line {
	lines := make([]stock.Line, len(skus))
	for i, sku := range skus {
		lines[i] = stock.Line{SKU: sku, Qty: 1}
	}
	return lines
}

// requestEnv is a Reserver on one backend, with the backend's way to let time pass.
type requestEnv struct {
	name    string
	real    bool
	c       rueidis.Client
	r       *stock.Reserver
	advance func(d time.Duration) // miniredis: moves its clock; real servers: sleeps
	// another makes a second Reserver on the same data (another process).
	another func(opts ...stock.Option) *stock.Reserver
}

// split splits every item whose name does not start with "plain" into n buckets.
func split(n int) stock.Option {
	return stock.WithBuckets(func(sku string) int {
		if strings.HasPrefix(sku, "plain") {
			return 1
		}
		return n
	})
}

// mini runs f on miniredis (stocktest), whose clock the test moves on.
func mini(t *testing.T, opts []stock.Option, f func(t *testing.T, e *requestEnv)) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) {
		t.Parallel() // its own miniredis, beside the real backends
		env := stocktest.New(t, opts...)
		f(t, &requestEnv{
			name: "miniredis", c: env.Client, r: env.Reserver, advance: env.Advance,
			another: func(o ...stock.Option) *stock.Reserver {
				return testkit.NewReserver(t, env.Client, append([]stock.Option{stock.WithClock(env.Now)}, o...)...)
			},
		})
	})
}

// each runs f on a stocktest miniredis and on the real backends (standalone and cluster)
// when STOCK_REDIS_SERVER is set.
func each(t *testing.T, opts []stock.Option, f func(t *testing.T, e *requestEnv)) {
	t.Helper()
	mini(t, opts, f)
	for _, b := range redistest.Backends(t) {
		if !b.Real() {
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			c := b.Client(t)
			// A new deployment: record the primaries before any item is loaded, so that the
			// failover guard of a Run does not fence the tests' deducts.
			require.False(t, must(stockops.NewFailoverGuard(testkit.NewReserver(t, c)).Check(context.Background()))(t))
			f(t, &requestEnv{
				name: b.Name, real: true, c: c, r: testkit.NewReserver(t, c, opts...), advance: time.Sleep,
				another: func(o ...stock.Option) *stock.Reserver { return testkit.NewReserver(t, c, o...) },
			})
		})
	}
}

// levels reads an item's levels and checks the invariant a plain item keeps at every moment.
func levels(t *testing.T, r *stock.Reserver, sku string) stock.Levels {
	t.Helper()
	l := testkit.Levels(t, r, sku) // loaded = available + held + sold, available >= 0
	require.GreaterOrEqual(t, l.Held, int64(0), "%+v", l)
	require.GreaterOrEqual(t, l.Sold, int64(0), "%+v", l)
	return l
}

// watch reads an item's levels in a loop until stop is closed and reports every reading that
// breaks loaded = available + held + sold, a negative counter, or a Loaded other than loaded.
func watch(r *stock.Reserver, sku string, loaded int64, stop <-chan struct{}) (wait func() (reads int, bad []string)) {
	var reads int
	var bad []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			l, err := r.Levels(context.Background(), sku)
			reads++
			switch {
			case err != nil:
				bad = append(bad, err.Error())
			case l.Loaded != l.Available+l.Held+l.Sold, l.Available < 0, l.Held < 0, l.Sold < 0,
				loaded >= 0 && l.Loaded != loaded:
				bad = append(bad, fmt.Sprintf("%+v", l))
			}
		}
	}()
	return func() (int, []string) { <-done; return reads, bad }
}

// untilStopped starts a goroutine, counted in wg, that calls f(0), f(1), ... until stop is closed.
func untilStopped(wg *sync.WaitGroup, stop <-chan struct{}, f func(i int)) {
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			f(i)
		}
	})
}

// requestRun starts r.Run and returns a stop function that cancels it and returns its error, failing
// the test if it does not return within bound.
func requestRun(t *testing.T, r *stock.Reserver, opts stock.RunOptions, bound time.Duration) func() error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, opts) }()
	var once sync.Once
	var res error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case res = <-done:
			case <-time.After(bound):
				t.Errorf("Run did not return within %v after its ctx ended", bound)
				res = errors.New("run hung")
			}
		})
		return res
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func ignoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// runAsync starts r.Run(ctx, opts) and returns its cancel and a channel with its result.
func runAsync(r *stock.Reserver, opts stock.RunOptions) (context.CancelFunc, <-chan error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, opts) }()
	return cancel, done
}

// waitRun waits up to d for Run's result.
func waitRun(t *testing.T, done <-chan error, d time.Duration) (error, bool) {
	t.Helper()
	select {
	case err := <-done:
		return err, true
	case <-time.After(d):
		return nil, false
	}
}

// stopRunWithin cancels a Run started by runAsync and requires it to return context.Canceled
// within d.
func stopRunWithin(t *testing.T, cancel context.CancelFunc, done <-chan error, d time.Duration) {
	t.Helper()
	cancel()
	err, ok := waitRun(t, done, d)
	require.True(t, ok, "Run returned after ctx ended")
	assert.ErrorIs(t, err, context.Canceled)
}

// eventually polls cond every 10ms for up to d.
func eventually(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if cond() {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return cond()
}

// soldOutBackends runs f on every backend with two clients on one database (two processes).
func soldOutBackends(t *testing.T, f func(t *testing.T, real bool, c1, c2 rueidis.Client)) {
	t.Helper()
	for _, b := range redistest.Backends(t) {
		if b.Name == "sentinel" {
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			c1, c2 := b.Pair(t)
			f(t, b.Real(), c1, c2)
		})
	}
}

// itemsOf lists r's items (stockops.Items), failing the test on an error.
func itemsOf(t *testing.T, r *stock.Reserver) []string {
	t.Helper()
	var items []string
	for it, err := range stockops.Items(context.Background(), r) {
		require.NoError(t, err)
		items = append(items, it)
	}
	return items
}

// serverReserver starts a real redis-server with args (skipping without STOCK_REDIS_SERVER) and
// returns an admin client of it and a Reserver with opts on a client of its own, closed when the
// test ends.
func serverReserver(t *testing.T, args []string, opts ...stock.Option) (admin rueidis.Client, r *stock.Reserver) {
	t.Helper()
	faultReal(t)
	s := redistest.StartServer(t, args...)
	r = testkit.NewReserver(t, s.Client(t), opts...)
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	return s.Client(t), r
}

// outsideKeys lists every key of c's server.
func outsideKeys(t *testing.T, c rueidis.Client) []string {
	t.Helper()
	return must(c.Do(ctx, c.B().Keys().Pattern("*").Build()).AsStrSlice())(t)
}

// clientReserver is a client of b and a Reserver with opts on it.
func clientReserver(t *testing.T, b redistest.Backend, opts ...stock.Option) (rueidis.Client, *stock.Reserver) {
	c := b.Client(t)
	return c, testkit.NewReserver(t, c, opts...)
}

// pairReservers is b.Pair (two clients of one database, two processes) and a Reserver on each.
func pairReservers(t *testing.T, b redistest.Backend) (c1, c2 rueidis.Client, r1, r2 *stock.Reserver) {
	c1, c2 = b.Pair(t)
	return c1, c2, testkit.NewReserver(t, c1), testkit.NewReserver(t, c2)
}
