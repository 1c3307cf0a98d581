package systest_test

// Attack 24: outside tests of the Redis-functions path (FCALL, FUNCTION LOAD on "Function not
// found", fallback to EVALSHA/EVAL) through the exported API only, on real redis-server
// processes each test starts for itself (STOCK_REDIS_SERVER). The contract checked every time:
// no oversell (Loaded = Available + Held + Sold, Available >= 0), exactly once per request id
// (a retry with Retry set is a replay), every acknowledged deduct is in the ledger, only
// documented errors, and every call returns within WithTimeout.

import (
	"context"
	"errors"
	"fmt"
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
	"github.com/stockres/stock/memstore"
)

func a24Real(t *testing.T) {
	t.Helper()
	if redistest.ServerBinary(t) == "" {
		t.Skip("needs STOCK_REDIS_SERVER")
	}
}

// a24Stats collects what a traffic run saw.
type a24Stats struct {
	mu       sync.Mutex
	acked    map[string]string // id -> sku, a deduct answered success (first or replay)
	unknown  map[string]string // id -> sku, still unknown after the retries
	raw      map[string]int    // errors other than the sentinels, by text
	maxDur   time.Duration
	calls    atomic.Int64
	replays  atomic.Int64
	soldOuts atomic.Int64
	fenced   atomic.Int64
}

func newA24Stats() *a24Stats {
	return &a24Stats{acked: map[string]string{}, unknown: map[string]string{}, raw: map[string]int{}}
}

func (s *a24Stats) dur(d time.Duration) {
	s.mu.Lock()
	if d > s.maxDur {
		s.maxDur = d
	}
	s.mu.Unlock()
}

// a24Deduct deducts one unit for id, retrying with Retry set after an unclassified error, up to
// tries times, with a short pause.
func a24Deduct(r *stock.Reserver, st *a24Stats, sku, id string, tries int) {
	retry := false
	for i := 0; i < tries; i++ {
		start := time.Now()
		rc, err := r.Deduct(context.Background(), stock.Request{SKU: sku, ID: id, Qty: 1, Retry: retry})
		st.dur(time.Since(start))
		st.calls.Add(1)
		switch {
		case err == nil:
			if rc.Replayed {
				st.replays.Add(1)
			}
			st.mu.Lock()
			st.acked[id] = sku
			delete(st.unknown, id)
			st.mu.Unlock()
			return
		case errors.Is(err, stock.ErrSoldOut), errors.Is(err, stock.ErrInsufficient):
			st.soldOuts.Add(1)
			st.mu.Lock()
			delete(st.unknown, id)
			st.mu.Unlock()
			return
		case errors.Is(err, stock.ErrFailover): // nothing sent: the guard waits for a reconcile pass
			st.fenced.Add(1)
			i--
			if st.fenced.Load() > 2000 {
				return
			}
			time.Sleep(20 * time.Millisecond)
		case errors.Is(err, stock.ErrNotLoaded):
			st.mu.Lock()
			st.raw["not loaded"]++
			st.mu.Unlock()
			return
		default:
			st.mu.Lock()
			k := err.Error()
			if errors.Is(err, stock.ErrUnknownOutcome) {
				k = "unknown outcome"
			}
			if len(k) > 120 {
				k = k[:120]
			}
			st.raw[k]++
			st.unknown[id] = sku
			st.mu.Unlock()
			retry = true
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// a24Check checks the contract on the items: invariant, ledger = levels, every acked id taken
// in the ledger, sold between acked and acked+unknown.
func a24Check(t *testing.T, r *stock.Reserver, st *a24Stats, loaded map[string]int64) {
	t.Helper()
	ctx := context.Background()
	st.mu.Lock()
	defer st.mu.Unlock()
	for sku, initial := range loaded {
		l, entries := checkLedger(t, r, sku, initial)
		var acked, unknown int64
		for id, s := range st.acked {
			if s != sku {
				continue
			}
			acked++
			e, ok := entries[id]
			if assert.True(t, ok, "acked id %s of %s missing from the ledger", id, sku) {
				assert.True(t, e.Taken(), "acked id %s: entry %+v not taken", id, e)
			}
			e2, err := r.Ledger(ctx, sku, id)
			if assert.NoError(t, err, "Ledger %s", id) {
				assert.Equal(t, int64(1), e2.Qty)
			}
		}
		for _, s := range st.unknown {
			if s == sku {
				unknown++
			}
		}
		assert.GreaterOrEqual(t, l.Sold, acked, "%s: sold %d < acked %d", sku, l.Sold, acked)
		assert.LessOrEqual(t, l.Sold, acked+unknown, "%s: sold %d > acked %d + unknown %d", sku, l.Sold, acked, unknown)
		for id, e := range entries {
			if e.Taken() && e.Kind == stock.KindDeduct {
				_, a := st.acked[id]
				_, u := st.unknown[id]
				assert.True(t, a || u, "ledger has taken id %s nobody was told about", id)
			}
		}
	}
}

func a24Do(t *testing.T, c rueidis.Client, args ...string) rueidis.RedisResult {
	t.Helper()
	return c.Do(context.Background(), c.B().Arbitrary(args...).Build())
}

// a24Libs returns the names of the function libraries on c's node.
func a24Libs(t *testing.T, c rueidis.Client) []string {
	t.Helper()
	v, err := a24Do(t, c, "FUNCTION", "LIST").ToArray()
	require.NoError(t, err)
	var names []string
	for _, lib := range v {
		m, err := lib.AsMap()
		require.NoError(t, err)
		v := m["library_name"]
		n, _ := v.ToString()
		names = append(names, n)
	}
	return names
}

func a24CommandCalls(t *testing.T, c rueidis.Client, cmd string) int64 {
	t.Helper()
	info, err := a24Do(t, c, "INFO", "commandstats").ToString()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "cmdstat_"+cmd+":calls=") {
			var n int64
			fmt.Sscanf(strings.TrimPrefix(line, "cmdstat_"+cmd+":"), "calls=%d", &n)
			return n
		}
	}
	return 0
}

// TestAttack24LibraryActuallyLoaded: on Redis 7 the scripts run as functions (README How it
// works): after a deduct the library stock_<digest> is on the server and FCALL was used.
func TestAttack24LibraryActuallyLoaded(t *testing.T) {
	a24Real(t)
	s := redistest.StartServer(t)
	admin := s.Client(t)
	r := newReserver(t, s.Client(t))
	ctx := context.Background()
	require.NoError(t, r.Load(ctx, "a", 5))
	_, err := r.Deduct(ctx, stock.Request{SKU: "a", ID: "o1", Qty: 1})
	require.NoError(t, err)
	libs := a24Libs(t, admin)
	require.Len(t, libs, 1, "libraries: %v", libs)
	assert.True(t, strings.HasPrefix(libs[0], "stock_"), libs[0])
	assert.Greater(t, a24CommandCalls(t, admin, "fcall"), int64(1), "FCALL used")
	assert.Equal(t, int64(0), a24CommandCalls(t, admin, "evalsha"), "no EVALSHA")
	assert.Equal(t, int64(0), a24CommandCalls(t, admin, "eval"), "no EVAL")
}

// a24Traffic runs g goroutines of n deducts each over skus.
func a24Traffic(rs []*stock.Reserver, st *a24Stats, prefix string, skus []string, g, n, tries int) {
	var wg sync.WaitGroup
	for w := 0; w < g; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rs[w%len(rs)]
			for i := 0; i < n; i++ {
				sku := skus[(w+i)%len(skus)]
				a24Deduct(r, st, sku, fmt.Sprintf("%s-%d-%d", prefix, w, i), tries)
			}
		}()
	}
	wg.Wait()
}

// a24Chaos runs f in a loop until stop is closed, returning the number of rounds.
func a24Chaos(stop <-chan struct{}, f func(i int)) <-chan int {
	done := make(chan int, 1)
	go func() {
		i := 0
		for {
			select {
			case <-stop:
				done <- i
				return
			default:
			}
			f(i)
			i++
			time.Sleep(time.Millisecond)
		}
	}()
	return done
}

// TestAttack24FlushLoop: FUNCTION FLUSH (SYNC and ASYNC), FUNCTION DELETE of the library and
// SCRIPT FLUSH in a loop during concurrent deducts. README: the library is loaded when a call
// finds it missing; the scripts give the answer otherwise. No call should fail at all (Redis
// answers every command), no oversell, exactly once.
func TestAttack24FlushLoop(t *testing.T) {
	a24Real(t)
	for _, kind := range []string{"standalone", "cluster"} {
		t.Run(kind, func(t *testing.T) {
			var client func() rueidis.Client
			var admins []rueidis.Client
			if kind == "standalone" {
				s := redistest.StartServer(t)
				client = func() rueidis.Client { return s.Client(t) }
				admins = []rueidis.Client{s.Client(t)}
			} else {
				c := redistest.StartCluster(t, 3)
				client = func() rueidis.Client { return c.Client(t) }
				for _, s := range c.Servers() {
					admins = append(admins, s.Client(t))
				}
			}
			rs := []*stock.Reserver{newReserver(t, client(), stock.WithTimeout(3*time.Second)), newReserver(t, client(), stock.WithTimeout(3*time.Second))}
			ctx := context.Background()
			skus := []string{"f1", "f2", "f3"}
			loaded := map[string]int64{}
			for _, sku := range skus {
				require.NoError(t, rs[0].Load(ctx, sku, 200))
				loaded[sku] = 200
			}
			// Find the library's name.
			_, err := rs[0].Deduct(ctx, stock.Request{SKU: "f1", ID: "warm", Qty: 1})
			require.NoError(t, err)
			st := newA24Stats()
			st.acked["warm"] = "f1"
			lib := a24Libs(t, admins[0])
			stop := make(chan struct{})
			rounds := a24Chaos(stop, func(i int) {
				a := admins[i%len(admins)]
				switch i % 5 {
				case 0:
					a24Do(t, a, "FUNCTION", "FLUSH", "SYNC")
				case 1:
					a24Do(t, a, "FUNCTION", "FLUSH", "ASYNC")
				case 2:
					if len(lib) > 0 {
						a24Do(t, a, "FUNCTION", "DELETE", lib[0])
					}
				case 3:
					a24Do(t, a, "SCRIPT", "FLUSH", "ASYNC")
				case 4:
					a24Do(t, a, "FUNCTION", "FLUSH")
					a24Do(t, a, "SCRIPT", "FLUSH")
				}
			})
			a24Traffic(rs, st, "o", skus, 6, 120, 5)
			close(stop)
			n := <-rounds
			t.Logf("%s: %d chaos rounds, %d calls, %d replays, %d sold out, max %v, raw errors %v", kind, n, st.calls.Load(), st.replays.Load(), st.soldOuts.Load(), st.maxDur, st.raw)
			assert.Empty(t, st.raw, "errors under FUNCTION/SCRIPT FLUSH")
			assert.Empty(t, st.unknown)
			a24Check(t, rs[0], st, loaded)
			// Retries of every acked id are replays.
			for id, sku := range st.acked {
				rc, err := rs[1].Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: 1, Retry: true})
				if assert.NoError(t, err, id) {
					assert.True(t, rc.Replayed, id)
				}
			}
			a24Check(t, rs[0], st, loaded)
		})
	}
}

// TestAttack24ConcurrentFirstLoad: many Reservers (own clients) make their first call at once on
// a server without the library: concurrent FUNCTION LOADs, all but one answered "already
// exists". No call may fail.
func TestAttack24ConcurrentFirstLoad(t *testing.T) {
	a24Real(t)
	s := redistest.StartServer(t)
	admin := s.Client(t)
	ctx := context.Background()
	const n = 8
	rs := make([]*stock.Reserver, n)
	for i := range rs {
		rs[i] = newReserver(t, s.Client(t))
	}
	require.NoError(t, rs[0].Load(ctx, "c", 1000))
	st := newA24Stats()
	for round := 0; round < 6; round++ {
		require.NoError(t, a24Do(t, admin, "FUNCTION", "FLUSH", "SYNC").Error())
		require.NoError(t, a24Do(t, admin, "SCRIPT", "FLUSH", "SYNC").Error())
		// New Reservers each round, so each starts with functions on.
		for i := range rs {
			rs[i] = newReserver(t, s.Client(t))
		}
		var wg sync.WaitGroup
		gate := make(chan struct{})
		for i := range rs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				a24Deduct(rs[i], st, "c", fmt.Sprintf("r%d-%d", round, i), 1)
			}()
		}
		close(gate)
		wg.Wait()
	}
	t.Logf("raw %v, max %v", st.raw, st.maxDur)
	assert.Empty(t, st.raw)
	a24Check(t, rs[0], st, map[string]int64{"c": 1000})
	assert.Len(t, a24Libs(t, admin), 1)
}

// a24ACL is the README's least-privilege user for prefix shop, plus extra.
func a24ACL(t *testing.T, admin rueidis.Client, user, extra string) {
	t.Helper()
	rule := "reset on >pw resetchannels ~shop:{* ~shop:items ~shop:epoch ~shop:carts{~} ~shop:carts{~}:p ~shop:carts{~}:w ~shop:probe ~shop:due{~* ~shop:holdsdue{~* -@all +ping +client|tracking +client|caching +multi +exec +pttl +cluster|slots +cluster|shards +role +evalsha +eval +get +getrange +set +del +exists +pexpire +setbit +time +hget +hmget +hset +hsetnx +hdel +hexists +hincrby +hscan +zadd +zrem +zcard +zcount +zrange +zrangebyscore +zscore +sadd +srem +scard +sscan +sismember +wait +info " + extra
	args := append([]string{"ACL", "SETUSER", user}, strings.Fields(rule)...)
	require.NoError(t, a24Do(t, admin, args...).Error())
}

// a24Ops runs every exported operation once and asserts their answers.
func a24Ops(t *testing.T, r *stock.Reserver, tag string, between func()) {
	t.Helper()
	ctx := context.Background()
	sku := "acl-" + tag
	require.NoError(t, r.Load(ctx, sku, 10), "Load")
	between()
	rc, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: "d1", Qty: 2})
	require.NoError(t, err, "Deduct")
	assert.Equal(t, int64(8), rc.Remaining)
	between()
	rc, err = r.Deduct(ctx, stock.Request{SKU: sku, ID: "d1", Qty: 2, Retry: true})
	require.NoError(t, err, "Deduct replay")
	assert.True(t, rc.Replayed)
	between()
	_, err = r.Hold(ctx, stock.Request{SKU: sku, ID: "h1", Qty: 1}, time.Minute)
	require.NoError(t, err, "Hold")
	between()
	_, err = r.Confirm(ctx, sku, "h1")
	require.NoError(t, err, "Confirm")
	between()
	_, err = r.Restore(ctx, sku, "d1")
	require.NoError(t, err, "Restore")
	between()
	_, err = r.Deduct(ctx, stock.Request{SKU: sku, ID: "d1", Qty: 2})
	require.ErrorIs(t, err, stock.ErrRestored)
	between()
	require.NoError(t, r.Load(ctx, sku+"b", 3))
	between()
	_, err = r.DeductMany(ctx, stock.Cart{ID: "cart-" + tag, Lines: []stock.Line{{SKU: sku, Qty: 1}, {SKU: sku + "b", Qty: 1}}})
	require.NoError(t, err, "DeductMany")
	between()
	l := levels(t, r, sku)
	assert.Equal(t, int64(8), l.Available, "%+v", l)
	e, err := r.Ledger(ctx, sku, "h1")
	require.NoError(t, err)
	assert.True(t, e.Taken())
}

// TestAttack24ACL: a user with the README's ACL (no +fcall), with +fcall but no
// +function|load, with both, and a user whose +fcall is taken away mid-run. Every operation
// must work in each case, with the library flushed between calls.
func TestAttack24ACL(t *testing.T) {
	a24Real(t)
	s := redistest.StartServer(t)
	admin := s.Client(t)
	flush := func() {
		a24Do(t, admin, "FUNCTION", "FLUSH", "SYNC")
	}
	noop := func() {}
	userClient := func(user string) rueidis.Client {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr()}, ForceSingleClient: true, Username: user, Password: "pw"})
		require.NoError(t, err)
		t.Cleanup(c.Close)
		return c
	}
	cases := []struct{ user, extra string }{
		{"nofcall", ""},
		{"fcallonly", "+fcall"},
		{"loadonly", "+function|load"},
		{"full", "+fcall +function|load"},
		{"fcallro", "+fcall_ro +function|load"},
	}
	for _, cs := range cases {
		t.Run(cs.user, func(t *testing.T) {
			a24ACL(t, admin, cs.user, cs.extra)
			r := newReserver(t, userClient(cs.user), stock.WithPrefix("shop"))
			a24Ops(t, r, cs.user+"1", noop)
			r2 := newReserver(t, userClient(cs.user), stock.WithPrefix("shop"))
			a24Ops(t, r2, cs.user+"2", flush)
			// The library loaded by an admin, the user may only call it.
			r3 := newReserver(t, userClient(cs.user), stock.WithPrefix("shop"))
			a24Ops(t, r3, cs.user+"3", func() {
				ra := newReserver(t, admin, stock.WithPrefix("other"))
				_ = ra.Load(context.Background(), "x", 1) // loads the library as admin
			})
		})
	}
	t.Run("revoked", func(t *testing.T) {
		a24ACL(t, admin, "rev", "+fcall +function|load")
		r := newReserver(t, userClient("rev"), stock.WithPrefix("shop"), stock.WithTimeout(3*time.Second))
		ctx := context.Background()
		require.NoError(t, r.Load(ctx, "rev", 500))
		st := newA24Stats()
		stop := make(chan struct{})
		rounds := a24Chaos(stop, func(i int) {
			switch i % 4 {
			case 0:
				a24Do(t, admin, "ACL", "SETUSER", "rev", "-fcall")
			case 1:
				a24Do(t, admin, "FUNCTION", "FLUSH")
			case 2:
				a24Do(t, admin, "ACL", "SETUSER", "rev", "+fcall", "-function|load")
			case 3:
				a24Do(t, admin, "ACL", "SETUSER", "rev", "+fcall", "+function|load")
			}
			time.Sleep(3 * time.Millisecond)
		})
		a24Traffic([]*stock.Reserver{r}, st, "v", []string{"rev"}, 4, 80, 3)
		close(stop)
		<-rounds
		t.Logf("raw %v", st.raw)
		assert.Empty(t, st.raw)
		a24Check(t, r, st, map[string]int64{"rev": 500})
	})
}

// TestAttack24OOM: maxmemory below the used memory with noeviction. FCALL is refused (OOM) before
// it runs; the script path answers. Replays and sold-out answers still work; new takes fail
// with an error (not an acknowledgement). Then memory is raised and retries take exactly once.
func TestAttack24OOM(t *testing.T) {
	a24Real(t)
	s := redistest.StartServer(t)
	admin := s.Client(t)
	ctx := context.Background()
	r := newReserver(t, s.Client(t), stock.WithTimeout(3*time.Second))
	require.NoError(t, r.Load(ctx, "m", 300))
	require.NoError(t, r.Load(ctx, "z", 1))
	_, err := r.Deduct(ctx, stock.Request{SKU: "z", ID: "z1", Qty: 1})
	require.NoError(t, err)
	st := newA24Stats()
	st.acked["z1"] = "z"
	a24Traffic([]*stock.Reserver{r}, st, "pre", []string{"m"}, 4, 25, 1)
	require.Empty(t, st.raw)
	// Go OOM: fill with a big value, then cap memory below the use.
	require.NoError(t, a24Do(t, admin, "SET", "ballast", strings.Repeat("x", 4<<20)).Error())
	require.NoError(t, a24Do(t, admin, "CONFIG", "SET", "maxmemory-policy", "noeviction").Error())
	require.NoError(t, a24Do(t, admin, "CONFIG", "SET", "maxmemory", "1mb").Error())
	// A flushed library must be loaded again: FUNCTION LOAD is itself refused under OOM.
	require.NoError(t, a24Do(t, admin, "FUNCTION", "FLUSH").Error())
	// Replays: on the sold-out item they answer; on the item with stock, see TestAttack24OOMReplay.
	rc, err := r.Deduct(ctx, stock.Request{SKU: "z", ID: "z1", Qty: 1, Retry: true})
	if assert.NoError(t, err, "replay of z1 under OOM") {
		assert.True(t, rc.Replayed)
	}
	// Sold out answers (without Retry: no write).
	_, err = r.Deduct(ctx, stock.Request{SKU: "z", ID: "z2", Qty: 1})
	assert.ErrorIs(t, err, stock.ErrSoldOut, "sold out under OOM")
	l := levels(t, r, "m")
	// New takes fail, and are retried later.
	var failed []string
	for i := 0; i < 20; i++ {
		id := fmt.Sprintf("oom-%d", i)
		start := time.Now()
		_, err := r.Deduct(ctx, stock.Request{SKU: "m", ID: id, Qty: 1})
		st.dur(time.Since(start))
		if err == nil {
			st.mu.Lock()
			st.acked[id] = "m"
			st.mu.Unlock()
			continue
		}
		t.Logf("deduct under OOM: %v", err)
		assert.NotErrorIs(t, err, stock.ErrSoldOut)
		failed = append(failed, id)
		st.mu.Lock()
		st.unknown[id] = "m"
		st.mu.Unlock()
	}
	_, err = r.Hold(ctx, stock.Request{SKU: "m", ID: "oomhold", Qty: 1}, time.Minute)
	t.Logf("hold under OOM: %v", err)
	assert.Equal(t, l.Sold, levels(t, r, "m").Sold+0, "nothing taken under OOM")
	require.NoError(t, a24Do(t, admin, "CONFIG", "SET", "maxmemory", "0").Error())
	for _, id := range failed {
		a24Deduct(r, st, "m", id, 3)
	}
	_, err = r.Hold(ctx, stock.Request{SKU: "m", ID: "oomhold", Qty: 1, Retry: true}, time.Minute)
	require.NoError(t, err)
	_, err = r.Confirm(ctx, "m", "oomhold")
	require.NoError(t, err)
	st.mu.Lock()
	st.acked["oomhold"] = "m"
	st.mu.Unlock()
	t.Logf("raw %v max %v", st.raw, st.maxDur)
	assert.Empty(t, st.unknown)
	a24Check(t, r, st, map[string]int64{"m": 300, "z": 1})
	assert.NotEmpty(t, a24Libs(t, admin), "library loaded again after the OOM")
}

// TestAttack24Restart: a restart of the server without persistence mid-traffic: the library and
// the data are gone. Calls fail (not loaded) or are unknown; once the item is loaded again
// every call works through the function path again.
func TestAttack24Restart(t *testing.T) {
	a24Real(t)
	s := redistest.StartServer(t, "--appendonly", "no")
	ctx := context.Background()
	r := newReserver(t, s.Client(t), stock.WithTimeout(2*time.Second))
	require.NoError(t, r.Load(ctx, "rs", 400))
	st := newA24Stats()
	var restarted atomic.Bool
	var reloaded sync.WaitGroup
	reloaded.Add(1)
	go func() {
		defer reloaded.Done()
		time.Sleep(100 * time.Millisecond)
		s.Restart()
		for i := 0; i < 50; i++ {
			err := r.Load(ctx, "rs", 400)
			if err == nil || errors.Is(err, stock.ErrLoaded) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		restarted.Store(true)
	}()
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 400 && !restarted.Load(); i++ {
				a24Deduct(r, st, "rs", fmt.Sprintf("a-%d-%d", w, i), 3)
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	reloaded.Wait()
	require.True(t, restarted.Load())
	// After the restart and the reload: a fresh run, every call must succeed, exactly once.
	st2 := newA24Stats()
	a24Traffic([]*stock.Reserver{r}, st2, "b", []string{"rs"}, 4, 60, 3)
	t.Logf("before: raw %v max %v; after: raw %v max %v", st.raw, st.maxDur, st2.raw, st2.maxDur)
	assert.Empty(t, st2.raw)
	assert.LessOrEqual(t, st.maxDur, 3*time.Second, "bounded by WithTimeout")
	l := levels(t, r, "rs")
	var taken int64
	for _, e := range ledger(t, r, "rs") {
		if e.Taken() {
			taken += e.Qty
		}
	}
	assert.Equal(t, l.Sold, taken)
	st2.mu.Lock()
	for id := range st2.acked {
		e, err := r.Ledger(ctx, "rs", id)
		if assert.NoError(t, err, id) {
			assert.True(t, e.Taken())
		}
	}
	st2.mu.Unlock()
	admin := s.Client(t)
	assert.NotEmpty(t, a24Libs(t, admin))
}

// a24OwnerSKU returns a SKU whose keys live on server i of the cluster.
func a24OwnerSKU(t *testing.T, c *redistest.Cluster, i int, base string) string {
	t.Helper()
	admin := c.Servers()[i].Client(t)
	for n := 0; n < 10000; n++ {
		sku := fmt.Sprintf("%s%d", base, n)
		err := a24Do(t, admin, "HGET", "stock:{"+sku+"}", "a").Error()
		if err == nil || rueidis.IsRedisNil(err) {
			return sku
		}
	}
	t.Fatal("no sku found")
	return ""
}

// TestAttack24ClusterNodeLostFunctions: one master of three lost its functions (FUNCTION FLUSH on
// that node only) while the others keep the library; deducts on items of every master work.
func TestAttack24ClusterNodeLostFunctions(t *testing.T) {
	a24Real(t)
	c := redistest.StartCluster(t, 3)
	ctx := context.Background()
	r := newReserver(t, c.Client(t), stock.WithTimeout(3*time.Second))
	var skus []string
	loaded := map[string]int64{}
	for i := range c.Servers() {
		sku := a24OwnerSKU(t, c, i, fmt.Sprintf("n%d-", i))
		skus = append(skus, sku)
		require.NoError(t, r.Load(ctx, sku, 100))
		loaded[sku] = 100
	}
	st := newA24Stats()
	a24Traffic([]*stock.Reserver{r}, st, "w", skus, 3, 10, 1)
	victim := c.Servers()[1].Client(t)
	require.NoError(t, a24Do(t, victim, "FUNCTION", "FLUSH").Error())
	require.Empty(t, a24Libs(t, victim))
	a24Traffic([]*stock.Reserver{r}, st, "x", skus, 6, 30, 3)
	t.Logf("raw %v max %v", st.raw, st.maxDur)
	assert.Empty(t, st.raw)
	a24Check(t, r, st, loaded)
	assert.NotEmpty(t, a24Libs(t, victim), "library loaded again on the node that lost it")
}

// TestAttack24BoundedLoad: WithTimeout bounds the whole call. Master A lost its functions; masters
// B and C hang (DEBUG SLEEP). A deduct of an item on A finds the function missing and loads the
// library "on every node": must it wait for the hung nodes beyond WithTimeout?
func TestAttack24BoundedLoad(t *testing.T) {
	a24Real(t)
	c := redistest.StartCluster(t, 3)
	ctx := context.Background()
	const bound = time.Second
	r := newReserver(t, c.Client(t), stock.WithTimeout(bound))
	sku := a24OwnerSKU(t, c, 0, "b")
	require.NoError(t, r.Load(ctx, sku, 100))
	_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: "w", Qty: 1})
	require.NoError(t, err)
	require.NoError(t, a24Do(t, c.Servers()[0].Client(t), "FUNCTION", "FLUSH").Error())
	var wg sync.WaitGroup
	for _, i := range []int{1, 2} {
		sl := c.Servers()[i].Client(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			sl.Do(context.Background(), sl.B().Arbitrary("DEBUG", "SLEEP", "4").Build())
		}()
	}
	time.Sleep(200 * time.Millisecond) // the sleeps have started
	start := time.Now()
	rc, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: "x", Qty: 1})
	took := time.Since(start)
	t.Logf("deduct on the healthy master took %v: %+v %v", took, rc, err)
	wg.Wait()
	assert.LessOrEqual(t, took, bound+500*time.Millisecond, "call bounded by WithTimeout (%v), took %v", bound, took)
	// The outcome: acknowledged or unknown; a retry settles it once.
	_, err = r.Deduct(ctx, stock.Request{SKU: sku, ID: "x", Qty: 1, Retry: true})
	require.NoError(t, err)
	l := levels(t, r, sku)
	assert.Equal(t, int64(2), l.Sold)
}

// TestAttack24SquatterLibrary: a library of another name that defines one of the function names
// of this version's library. FUNCTION LOAD of ours is refused ("Function ... already exists");
// the calls must still work with the right semantics (fall back to the scripts) and not run the
// squatter.
func TestAttack24SquatterLibrary(t *testing.T) {
	a24Real(t)
	s := redistest.StartServer(t)
	admin := s.Client(t)
	ctx := context.Background()
	r := newReserver(t, s.Client(t))
	require.NoError(t, r.Load(ctx, "q", 10))
	libs := a24Libs(t, admin)
	require.Len(t, libs, 1)
	lib := libs[0]
	require.NoError(t, a24Do(t, admin, "FUNCTION", "DELETE", lib).Error())
	// An unrelated library that happens to define lib_load (e.g. an operator's copy).
	code := "#!lua name=squatter\nredis.register_function('" + lib + "_restock', function(KEYS, ARGV) return redis.error_reply('squatter') end)\n"
	require.NoError(t, a24Do(t, admin, "FUNCTION", "LOAD", code).Error())
	r2 := newReserver(t, s.Client(t))
	loads0, fcalls0 := a24CommandCalls(t, admin, "function|load"), a24CommandCalls(t, admin, "fcall")
	for i := 0; i < 5; i++ {
		rc, err := r2.Deduct(ctx, stock.Request{SKU: "q", ID: fmt.Sprintf("s%d", i), Qty: 1})
		require.NoError(t, err)
		assert.Equal(t, int64(9-i), rc.Remaining)
	}
	l := levels(t, r2, "q")
	assert.Equal(t, int64(5), l.Sold)
	// The refused load ("Function ... already exists") turns functions off for the Reserver:
	// one FCALL and one FUNCTION LOAD in all, not two of each per call.
	assert.Equal(t, int64(1), a24CommandCalls(t, admin, "function|load")-loads0, "FUNCTION LOAD calls")
	assert.Equal(t, int64(1), a24CommandCalls(t, admin, "fcall")-fcalls0, "FCALL calls")
	// The squatter's function of our name is not run: a restock goes to the script.
	rc, err := r2.Restock(ctx, "q", "rs1", 3)
	require.NoError(t, err)
	assert.Equal(t, int64(8), rc.Remaining)
	t.Logf("libs now %v", a24Libs(t, admin))
}

// TestAttack24RunMemstore: Run with a memstore while the library is flushed in a loop: every
// acknowledged deduct reaches the store exactly once.
func TestAttack24RunMemstore(t *testing.T) {
	a24Real(t)
	s := redistest.StartServer(t)
	admin := s.Client(t)
	ctx := context.Background()
	r := newReserver(t, s.Client(t), stock.WithTimeout(3*time.Second))
	store := memstore.New()
	require.NoError(t, store.Load(ctx, "rm", 300))
	require.NoError(t, r.Load(ctx, "rm", 300))
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- r.Run(rctx, stock.RunOptions{Store: store, Relay: &stock.RelayOptions{Poll: 20 * time.Millisecond}})
	}()
	st := newA24Stats()
	stop := make(chan struct{})
	rounds := a24Chaos(stop, func(i int) {
		if i%2 == 0 {
			a24Do(t, admin, "FUNCTION", "FLUSH", "ASYNC")
		} else {
			a24Do(t, admin, "SCRIPT", "FLUSH")
		}
		time.Sleep(2 * time.Millisecond)
	})
	a24Traffic([]*stock.Reserver{r}, st, "rm", []string{"rm"}, 4, 100, 3)
	// Some restores too.
	var restored int
	st.mu.Lock()
	var ids []string
	for id := range st.acked {
		ids = append(ids, id)
	}
	st.mu.Unlock()
	for _, id := range ids[:min(20, len(ids))] {
		if _, err := r.Restore(ctx, "rm", id); err == nil {
			restored++
		} else {
			t.Logf("restore %s: %v", id, err)
		}
	}
	close(stop)
	<-rounds
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if outboxLen(t, s.Client(t), "rm") == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Logf("Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return")
	}
	t.Logf("raw %v fenced %d", st.raw, st.fenced.Load())
	assert.Empty(t, st.raw)
	l := levels(t, r, "rm")
	rem, err := store.Remaining(ctx, "rm")
	require.NoError(t, err)
	assert.Equal(t, l.Available, rem, "store remaining = redis available")
	assert.LessOrEqual(t, store.MaxApplications(), 1, "each event applied at most once")
	assert.Equal(t, int64(0), outboxLen(t, s.Client(t), "rm"))
	// Restores count back.
	st.mu.Lock()
	acked := int64(len(st.acked))
	st.mu.Unlock()
	assert.Equal(t, acked-int64(restored), l.Sold)
}

// TestAttack24OOMReplay: scripts.go (refusedFcall) says an FCALL refused for OOM falls back to the
// script because "a script runs and is refused at its first write (replays and refusals still
// answer)". A replay of an acknowledged deduct (Retry set, after an unknown outcome) on an item
// that still has stock, under OOM: does it answer Replayed?
func TestAttack24OOMReplay(t *testing.T) {
	a24Real(t)
	s := redistest.StartServer(t)
	admin := s.Client(t)
	ctx := context.Background()
	r := newReserver(t, s.Client(t))
	require.NoError(t, r.Load(ctx, "p", 10))
	_, err := r.Deduct(ctx, stock.Request{SKU: "p", ID: "o1", Qty: 1})
	require.NoError(t, err)
	require.NoError(t, a24Do(t, admin, "SET", "ballast", strings.Repeat("x", 4<<20)).Error())
	require.NoError(t, a24Do(t, admin, "CONFIG", "SET", "maxmemory-policy", "noeviction").Error())
	require.NoError(t, a24Do(t, admin, "CONFIG", "SET", "maxmemory", "1mb").Error())
	defer a24Do(t, admin, "CONFIG", "SET", "maxmemory", "0")
	rc, err := r.Deduct(ctx, stock.Request{SKU: "p", ID: "o1", Qty: 1, Retry: true})
	require.NoError(t, err, "replay of an acknowledged deduct under OOM")
	assert.True(t, rc.Replayed)
}

// TestAttack24MixedOpsFlush: holds, confirms, cancels, restores and carts under a FUNCTION FLUSH /
// SCRIPT FLUSH loop, on a standalone server and a cluster: every acknowledged operation holds,
// the invariant and the ledger agree, retries are replays.
func TestAttack24MixedOpsFlush(t *testing.T) {
	a24Real(t)
	for _, kind := range []string{"standalone", "cluster"} {
		t.Run(kind, func(t *testing.T) {
			var client rueidis.Client
			var admins []rueidis.Client
			if kind == "standalone" {
				s := redistest.StartServer(t)
				client = s.Client(t)
				admins = []rueidis.Client{s.Client(t)}
			} else {
				c := redistest.StartCluster(t, 3)
				client = c.Client(t)
				for _, s := range c.Servers() {
					admins = append(admins, s.Client(t))
				}
			}
			r := newReserver(t, client, stock.WithTimeout(3*time.Second))
			ctx := context.Background()
			skus := []string{"m1", "m2", "m3", "m4"}
			for _, sku := range skus {
				require.NoError(t, r.Load(ctx, sku, 150))
			}
			stop := make(chan struct{})
			rounds := a24Chaos(stop, func(i int) {
				a := admins[i%len(admins)]
				if i%3 == 2 {
					a24Do(t, a, "SCRIPT", "FLUSH")
				} else {
					a24Do(t, a, "FUNCTION", "FLUSH", []string{"SYNC", "ASYNC"}[i%2])
				}
			})
			var mu sync.Mutex
			var bad []string
			fail := func(format string, args ...any) {
				mu.Lock()
				bad = append(bad, fmt.Sprintf(format, args...))
				mu.Unlock()
			}
			ok := func(err error) bool {
				return err == nil || errors.Is(err, stock.ErrSoldOut) || errors.Is(err, stock.ErrInsufficient)
			}
			var wg sync.WaitGroup
			for w := 0; w < 6; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 40; i++ {
						sku := skus[(w+i)%len(skus)]
						id := fmt.Sprintf("x-%d-%d", w, i)
						switch i % 4 {
						case 0:
							if _, err := r.Hold(ctx, stock.Request{SKU: sku, ID: id, Qty: 1}, time.Minute); err == nil {
								if _, err := r.Confirm(ctx, sku, id); err != nil {
									fail("confirm %s: %v", id, err)
								}
								if rc, err := r.Hold(ctx, stock.Request{SKU: sku, ID: id, Qty: 1, Retry: true}, time.Minute); err != nil || !rc.Replayed {
									fail("hold replay %s: %+v %v", id, rc, err)
								}
							} else if !ok(err) {
								fail("hold %s: %v", id, err)
							}
						case 1:
							if _, err := r.Hold(ctx, stock.Request{SKU: sku, ID: id, Qty: 2}, time.Minute); err == nil {
								if _, err := r.Cancel(ctx, sku, id); err != nil {
									fail("cancel %s: %v", id, err)
								}
							} else if !ok(err) {
								fail("hold %s: %v", id, err)
							}
						case 2:
							if _, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: 1}); err == nil {
								if _, err := r.Restore(ctx, sku, id); err != nil {
									fail("restore %s: %v", id, err)
								}
								if _, err := r.Restore(ctx, sku, id); err != nil {
									fail("restore replay %s: %v", id, err)
								}
							} else if !ok(err) {
								fail("deduct %s: %v", id, err)
							}
						case 3:
							other := skus[(w+i+1)%len(skus)]
							cart := stock.Cart{ID: "cart-" + id, Lines: []stock.Line{{SKU: sku, Qty: 1}, {SKU: other, Qty: 1}}}
							if _, err := r.DeductMany(ctx, cart); err == nil {
								if cr, err := r.DeductMany(ctx, cart); err != nil {
									fail("cart replay %s: %+v %v", id, cr, err)
								}
							} else if !ok(err) {
								fail("cart %s: %v", id, err)
							}
						}
					}
				}()
			}
			wg.Wait()
			close(stop)
			n := <-rounds
			t.Logf("%d chaos rounds", n)
			assert.Empty(t, bad)
			for _, sku := range skus {
				checkLedger(t, r, sku, 150)
			}
		})
	}
}
