package systest_test

// Attack 25: Reserver.Run's bounded return and its drain (stuck Store and Publisher calls that
// ignore their context, Drain negative, zero and tiny, ctx cancelled before Run, two Runs of one
// Reserver at once), and the reconciler while restores are settled concurrently (the queue path
// with out-of-order consumers, and the Store path with Run's own passes).
//
// Every test runs on a stocktest miniredis, and also on a private redis-server when
// STOCK_REDIS_SERVER names one. Time bounds are generous (several seconds): the machine is
// shared.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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
	"github.com/stockres/stock/stockops"
	"github.com/stockres/stock/stocktest"
)

// a25Env is a Reserver on one backend, with a way to let time pass for that backend's Redis
// (miniredis: its clock stands still until Advance; a real server: sleep).
type a25Env struct {
	name    string
	real    bool
	r       *stock.Reserver
	c       rueidis.Client
	advance func(d time.Duration)
	// another makes a second Reserver on the same data (another process).
	another func(opts ...stock.Option) *stock.Reserver
}

// a25Each runs f on a stocktest miniredis and, with STOCK_REDIS_SERVER set, on a private
// redis-server.
func a25Each(t *testing.T, opts []stock.Option, f func(t *testing.T, e *a25Env)) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) {
		t.Parallel() // its own miniredis, beside the private server
		env := stocktest.New(t, opts...)
		f(t, &a25Env{
			name: "miniredis", r: env.Reserver, c: env.Client, advance: env.Advance,
			another: func(o ...stock.Option) *stock.Reserver {
				r, err := stock.New(env.Client, append([]stock.Option{stock.WithClock(env.Now)}, o...)...)
				require.NoError(t, err)
				return r
			},
		})
	})
	if redistest.ServerBinary(t) == "" {
		return
	}
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		srv := redistest.StartServer(t)
		c := srv.Client(t)
		// A new deployment: record the primaries before any item is loaded, so that the failover
		// guard of a Run (which fences a Redis with items and no recorded epoch, as for a guard
		// added to a live deployment) does not refuse the tests' deducts.
		r0, err := stock.New(c)
		require.NoError(t, err)
		fenced, err := stockops.NewFailoverGuard(r0).Check(context.Background())
		require.NoError(t, err)
		require.False(t, fenced)
		r, err := stock.New(c, opts...)
		require.NoError(t, err)
		f(t, &a25Env{
			name: "redis", real: true, r: r, c: c, advance: time.Sleep,
			another: func(o ...stock.Option) *stock.Reserver {
				r, err := stock.New(c, o...)
				require.NoError(t, err)
				return r
			},
		})
	})
}

// a25Run runs r.Run in a goroutine and returns a channel with its result and when it returned.
type a25Result struct {
	err error
	at  time.Time
}

func a25Run(ctx context.Context, r *stock.Reserver, opts stock.RunOptions) <-chan a25Result {
	ch := make(chan a25Result, 1)
	go func() {
		err := r.Run(ctx, opts)
		ch <- a25Result{err: err, at: time.Now()}
	}()
	return ch
}

// a25Wait waits for Run's result, failing t if it has not come within bound of ended.
func a25Wait(t *testing.T, ch <-chan a25Result, ended time.Time, bound time.Duration) a25Result {
	t.Helper()
	select {
	case res := <-ch:
		assert.LessOrEqual(t, res.at.Sub(ended), bound, "Run returned %v after ctx ended", res.at.Sub(ended))
		return res
	case <-time.After(time.Until(ended.Add(bound + 30*time.Second))):
		t.Fatalf("Run did not return within %v (and 30s more) after ctx ended", bound)
		return a25Result{}
	}
}

// a25Sale is the acknowledged outcome of the sales of a test.
type a25Sale struct {
	mu       sync.Mutex
	deducted map[[2]string]int64 // acknowledged deducts: (sku, id) -> qty
	restored map[[2]string]int64 // acknowledged restores of acknowledged deducts
}

func newA25Sale() *a25Sale {
	return &a25Sale{deducted: map[[2]string]int64{}, restored: map[[2]string]int64{}}
}

func (s *a25Sale) deduct(t *testing.T, ctx context.Context, r *stock.Reserver, sku, id string, qty int64) bool {
	rc, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: qty})
	switch {
	case err == nil:
		s.mu.Lock()
		defer s.mu.Unlock()
		if old, ok := s.deducted[[2]string{sku, id}]; ok && !rc.Replayed {
			t.Errorf("deduct %s/%s answered not replayed a second time (first qty %d)", sku, id, old)
		}
		s.deducted[[2]string{sku, id}] = qty
		return true
	case errors.Is(err, stock.ErrSoldOut), errors.Is(err, stock.ErrInsufficient), errors.Is(err, stock.ErrRestored):
		return false
	default:
		t.Errorf("deduct %s/%s: unexpected error %v", sku, id, err)
		return false
	}
}

func (s *a25Sale) restore(t *testing.T, ctx context.Context, r *stock.Reserver, sku, id string) {
	rc, err := r.Restore(ctx, sku, id)
	switch {
	case err == nil && !rc.Replayed:
		s.mu.Lock()
		defer s.mu.Unlock()
		q, ok := s.deducted[[2]string{sku, id}]
		if !ok {
			t.Errorf("restore %s/%s gave back %d units of an id with no acknowledged deduct", sku, id, rc.Qty)
			return
		}
		if q != rc.Qty {
			t.Errorf("restore %s/%s gave back %d units, the deduct took %d", sku, id, rc.Qty, q)
		}
		if _, dup := s.restored[[2]string{sku, id}]; dup {
			t.Errorf("restore %s/%s gave back twice", sku, id)
		}
		s.restored[[2]string{sku, id}] = rc.Qty
	case err == nil, errors.Is(err, stock.ErrUnknownID):
	default:
		t.Errorf("restore %s/%s: unexpected error %v", sku, id, err)
	}
}

// sold returns the units the acknowledged answers imply are sold of sku.
func (s *a25Sale) sold(sku string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for k, q := range s.deducted {
		if k[0] == sku {
			n += q
		}
	}
	for k, q := range s.restored {
		if k[0] == sku {
			n -= q
		}
	}
	return n
}

// checkStore asserts that every acknowledged deduct (and restore) of the sale was applied to the
// store exactly once, and that the store, Redis's levels and the outboxes agree with the answers.
func (s *a25Sale) checkStore(t *testing.T, r *stock.Reserver, store *memstore.Store, loaded map[string]int64) {
	t.Helper()
	ctx := context.Background()
	s.mu.Lock()
	for k := range s.deducted {
		assert.Equal(t, 1, store.Applications(k[0], k[1], stock.EventDeducted), "deduct %s/%s applied once", k[0], k[1])
	}
	for k := range s.restored {
		assert.Equal(t, 1, store.Applications(k[0], k[1], stock.EventRestored), "restore %s/%s applied once", k[0], k[1])
	}
	s.mu.Unlock()
	assert.LessOrEqual(t, store.MaxApplications(), 1, "no event applied twice")
	for sku, l := range loaded {
		sold := s.sold(sku)
		rem, err := store.Remaining(ctx, sku)
		require.NoError(t, err)
		assert.Equal(t, l-sold, rem, "%s: store remaining = loaded - net sold", sku)
		lv, err := r.Levels(ctx, sku)
		require.NoError(t, err)
		assert.Equal(t, sold, lv.Sold, "%s: Redis sold", sku)
		assert.Equal(t, l-sold, lv.Available, "%s: Redis available", sku)
		assert.Equal(t, lv.Loaded, lv.Available+lv.Held+lv.Sold, "%s: loaded = available + held + sold", sku)
		pending, dead, err := stockops.Pending(ctx, r, sku)
		require.NoError(t, err)
		assert.Zero(t, pending, "%s: outbox empty", sku)
		assert.Zero(t, dead, "%s: no dead letters", sku)
	}
}

// a25Gate blocks the calls that enter it, ignoring their context, until it is opened.
type a25Gate struct {
	once    sync.Once
	open    chan struct{}
	entered chan struct{}
	n       atomic.Int64
}

func newA25Gate() *a25Gate {
	return &a25Gate{open: make(chan struct{}), entered: make(chan struct{}, 1000)}
}

func (g *a25Gate) wait() {
	g.n.Add(1)
	select {
	case g.entered <- struct{}{}:
	default:
	}
	<-g.open
}

func (g *a25Gate) release() { g.once.Do(func() { close(g.open) }) }

// a25Pub is a Publisher (and, with batch, a BatchPublisher) that records what it accepted, and
// that blocks, ignoring its context, while stuck says so for the call's context.
type a25Pub struct {
	mu    sync.Mutex
	got   map[string]int // "sku/id/type" -> times accepted
	stuck func(ctx context.Context) bool
	gate  *a25Gate
	after error // what a blocked call answers once released (nil: the queue took it)
	push  func(stock.Event)
}

func (p *a25Pub) accept(ev stock.Event) {
	p.mu.Lock()
	if p.got == nil {
		p.got = map[string]int{}
	}
	p.got[ev.SKU+"/"+ev.ID+"/"+string(ev.Type)]++
	p.mu.Unlock()
	if p.push != nil {
		p.push(ev)
	}
}

func (p *a25Pub) count(sku, id string, t stock.EventType) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.got[sku+"/"+id+"/"+string(t)]
}

func (p *a25Pub) Publish(ctx context.Context, ev stock.Event) error {
	if p.stuck != nil && p.stuck(ctx) {
		p.gate.wait()
		if p.after != nil {
			return p.after
		}
	}
	p.accept(ev)
	return nil
}

type a25BatchPub struct{ *a25Pub }

func (p a25BatchPub) PublishBatch(ctx context.Context, evs []stock.Event) []error {
	errs := make([]error, len(evs))
	if p.stuck != nil && p.stuck(ctx) {
		p.gate.wait()
		if p.after != nil {
			for i := range errs {
				errs[i] = p.after
			}
			return errs
		}
	}
	for _, ev := range evs {
		p.accept(ev)
	}
	return errs
}

// a25Store wraps a memstore: its Apply blocks, ignoring its context, while stuck says so for
// the call's context; once released the blocked call applies the event (a slow database).
// It is not a BatchStore unless wrapped in a25BatchStore.
type a25Store struct {
	a25Base // the memstore, without its ApplyBatch: a plain Store unless wrapped
	stuck   func(ctx context.Context, ev stock.Event) bool
	gate    *a25Gate
	delay   func() time.Duration
}

// a25Base is what a25Store passes through to its memstore.
type a25Base interface {
	stock.Store
	stock.RecordLister
	stock.ItemLister
}

func (s *a25Store) Apply(ctx context.Context, ev stock.Event) error {
	if s.stuck != nil && s.stuck(ctx, ev) {
		s.gate.wait()
	}
	if s.delay != nil {
		time.Sleep(s.delay())
	}
	return s.a25Base.Apply(ctx, ev)
}

type a25BatchStore struct{ *a25Store }

func (s a25BatchStore) ApplyBatch(ctx context.Context, evs []stock.Event) []error {
	if s.stuck != nil && len(evs) > 0 && s.stuck(ctx, evs[0]) {
		s.gate.wait()
	}
	if s.delay != nil {
		time.Sleep(s.delay())
	}
	return s.a25Base.(*memstore.Store).ApplyBatch(ctx, evs)
}

// hasDeadline says whether a call runs under Run's drain (whose context has a deadline) rather
// than the main loop (whose ctx, in these tests, has none).
func hasDeadline(ctx context.Context) bool { _, ok := ctx.Deadline(); return ok }

// a25Relay is the relay configuration of the drain tests: a lease and backoffs short enough
// for a real server, which a miniredis test passes by advancing its clock.
func a25Relay() *stock.RelayOptions {
	return &stock.RelayOptions{Lease: 2 * time.Second, MinBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond, Poll: 10 * time.Millisecond}
}

// a25Settle lets the leases and backoffs of a25Relay run out.
func (e *a25Env) settle() { e.advance(3 * time.Second) }

// a25Finish runs a second Run with a store that never blocks until every item's outbox is empty
// (or 60s pass), then stops it and checks that it returned in bounds.
func a25Finish(t *testing.T, e *a25Env, r *stock.Reserver, opts stock.RunOptions, skus []string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := a25Run(ctx, r, opts)
	deadline := time.Now().Add(60 * time.Second)
	for {
		left := int64(0)
		for _, sku := range skus {
			p, _, err := stockops.Pending(context.Background(), r, sku)
			require.NoError(t, err)
			left += p
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the second Run left %d events in the outboxes after 60s", left)
			break
		}
		time.Sleep(20 * time.Millisecond)
		if !e.real {
			e.advance(20 * time.Millisecond) // let leases and backoffs run out as on a real server
		}
	}
	cancel()
	res := a25Wait(t, ch, time.Now(), opts.Drain+5*time.Second+3*time.Second)
	assert.ErrorIs(t, res.err, context.Canceled)
}

func a25Load(t *testing.T, r *stock.Reserver, store *memstore.Store, loaded map[string]int64) {
	t.Helper()
	for sku, n := range loaded {
		require.NoError(t, r.Load(context.Background(), sku, n))
		if store != nil {
			require.NoError(t, store.Load(context.Background(), sku, n))
		}
	}
}

func a25Keys(m map[string]int64) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestAttack25DrainStuckPublisher: ctx ends before Run starts, so every event is delivered by
// the drain, and the Publisher blocks in the drain ignoring its context (PublishBatch, or Publish
// for a plain Publisher). Run must return within Drain (+ slack) with an error that says a call
// is still running; the events stay for a later Run, which delivers each one, and the store
// applies each acknowledged deduct exactly once. Variants: the blocked call ends with an error,
// or with success after Run returned (during the second Run).
func TestAttack25DrainStuckPublisher(t *testing.T) {
	for _, v := range []struct {
		name  string
		batch bool
		after error
	}{
		{"batch/fails-late", true, errors.New("a25: queue timed out")},
		{"batch/succeeds-late", true, nil},
		{"single/fails-late", false, errors.New("a25: queue timed out")},
		{"single/succeeds-late", false, nil},
	} {
		t.Run(v.name, func(t *testing.T) {
			a25Each(t, nil, func(t *testing.T, e *a25Env) {
				ctx := context.Background()
				loaded := map[string]int64{"drain:pub~1": 50, "drain:pub~2": 50}
				store := memstore.New()
				a25Load(t, e.r, store, loaded)
				sale := newA25Sale()
				for i := range 30 {
					for sku := range loaded {
						sale.deduct(t, ctx, e.r, sku, fmt.Sprintf("o:%d~x", i), 1)
					}
				}
				gate := newA25Gate()
				defer gate.release()
				p := &a25Pub{stuck: func(context.Context) bool { return true }, gate: gate, after: v.after}
				var pub stock.Publisher = p
				if v.batch {
					pub = a25BatchPub{p}
				}
				runCtx, cancel := context.WithCancel(ctx)
				cancel()
				ended := time.Now()
				drain := 800 * time.Millisecond
				ch := a25Run(runCtx, e.r, stock.RunOptions{Store: store, Publisher: pub, Drain: drain, Relay: a25Relay(), Reconcile: &stock.ReconcileOptions{Interval: -1}})
				res := a25Wait(t, ch, ended, drain+3*time.Second)
				require.Error(t, res.err)
				assert.ErrorIs(t, res.err, context.Canceled)
				assert.NotEqual(t, context.Canceled.Error(), res.err.Error(), "the error must say a call is still running")
				assert.Positive(t, gate.n.Load(), "the drain called the publisher")

				// The second Run; the blocked call ends while it runs.
				e.settle()
				p2 := &a25Pub{}
				var pub2 stock.Publisher = p2
				if v.batch {
					pub2 = a25BatchPub{p2}
				}
				go func() { time.Sleep(200 * time.Millisecond); gate.release() }()
				a25Finish(t, e, e.r, stock.RunOptions{Store: store, Publisher: pub2, Drain: time.Second, Relay: a25Relay(), Reconcile: &stock.ReconcileOptions{Interval: -1}}, a25Keys(loaded))
				sale.checkStore(t, e.r, store, loaded)
				for k := range sale.deducted {
					assert.GreaterOrEqual(t, p.count(k[0], k[1], stock.EventDeducted)+p2.count(k[0], k[1], stock.EventDeducted), 1, "deduct %s/%s published", k[0], k[1])
				}
			})
		})
	}
}

// TestAttack25DrainStuckPublisherQueuePath: the queue path (Run with only a Publisher). The
// publisher blocks in the drain; a second Run publishes; consumers apply through Consume. Every
// acknowledged deduct reaches the store once and the published sets empty.
func TestAttack25DrainStuckPublisherQueuePath(t *testing.T) {
	a25Each(t, nil, func(t *testing.T, e *a25Env) {
		ctx := context.Background()
		loaded := map[string]int64{"q:drain~a": 40}
		store := memstore.New()
		a25Load(t, e.r, store, loaded)
		sale := newA25Sale()
		for i := range 25 {
			sale.deduct(t, ctx, e.r, "q:drain~a", fmt.Sprintf("id:%d", i), 1)
		}
		gate := newA25Gate()
		defer gate.release()
		p := &a25Pub{stuck: hasDeadline, gate: gate, after: errors.New("a25: queue timed out")}
		runCtx, cancel := context.WithCancel(ctx)
		cancel()
		ended := time.Now()
		ch := a25Run(runCtx, e.r, stock.RunOptions{Publisher: a25BatchPub{p}, Drain: 500 * time.Millisecond, Relay: a25Relay()})
		res := a25Wait(t, ch, ended, 500*time.Millisecond+3*time.Second)
		assert.Error(t, res.err)
		gate.release()
		time.Sleep(300 * time.Millisecond) // the released call backs the item off
		e.settle()

		var mu sync.Mutex
		var queue []stock.Event
		p2 := &a25Pub{push: func(ev stock.Event) { mu.Lock(); queue = append(queue, ev); mu.Unlock() }}
		a25Finish(t, e, e.r, stock.RunOptions{Publisher: a25BatchPub{p2}, Drain: time.Second, Relay: a25Relay()}, a25Keys(loaded))
		// Consume in reverse order (the queue redelivers out of order), each twice.
		mu.Lock()
		evs := append([]stock.Event{}, queue...)
		mu.Unlock()
		for round := 0; round < 2; round++ {
			for i := len(evs) - 1; i >= 0; i-- {
				assert.NoError(t, stock.Consume(ctx, e.r, store, evs[i]))
			}
		}
		sale.checkStore(t, e.r, store, loaded)
		rc, err := stockops.NewReconciler(e.r, store, nil)
		require.NoError(t, err)
		rep, err := rc.Item(ctx, "q:drain~a")
		require.NoError(t, err)
		assert.Zero(t, rep.Drift)
		assert.Zero(t, rep.Published, "published set empty after every event was consumed")
	})
}

// TestAttack25StoreApplyBlocksForever: the store blocks in Apply (and ApplyBatch) from the first
// call, in the main loop, ignoring its context. Run must still return within Drain after ctx
// ended; the blocked call applies its event late, after a second Run with a working store has
// run: nothing is lost or doubled.
func TestAttack25StoreApplyBlocksForever(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			a25Each(t, nil, func(t *testing.T, e *a25Env) {
				ctx := context.Background()
				loaded := map[string]int64{"blk:1": 30, "blk:2": 30, "blk~3": 30}
				mem := memstore.New()
				a25Load(t, e.r, mem, loaded)
				gate := newA25Gate()
				defer gate.release()
				st := &a25Store{a25Base: mem, stuck: func(context.Context, stock.Event) bool { return true }, gate: gate}
				var store stock.Store = st
				if batch {
					store = a25BatchStore{st}
				}
				sale := newA25Sale()
				runCtx, cancel := context.WithCancel(ctx)
				drain := 700 * time.Millisecond
				ch := a25Run(runCtx, e.r, stock.RunOptions{Store: store, Drain: drain, Relay: a25Relay(), Reconcile: &stock.ReconcileOptions{Interval: -1}})
				for i := range 20 {
					for sku := range loaded {
						sale.deduct(t, ctx, e.r, sku, fmt.Sprintf("o%d", i), 1)
					}
				}
				select {
				case <-gate.entered:
				case <-time.After(20 * time.Second):
					for sku := range loaded {
						p, d, err := stockops.Pending(ctx, e.r, sku)
						lease, lerr := e.c.Do(ctx, e.c.B().Pttl().Key("stock:{"+sku+"}:rl").Build()).AsInt64()
						holder, _ := e.c.Do(ctx, e.c.B().Get().Key("stock:{"+sku+"}:rl").Build()).ToString()
						t.Logf("%s: pending %d dead %d err %v lease pttl %d %v holder %q", sku, p, d, err, lease, lerr, holder)
					}
					t.Fatal("the relay never called the store")
				}
				cancel()
				ended := time.Now()
				res := a25Wait(t, ch, ended, drain+3*time.Second)
				require.Error(t, res.err)
				assert.NotEqual(t, context.Canceled.Error(), res.err.Error(), "the error must say a call is still running")

				e.settle()
				st2 := &a25Store{a25Base: mem}
				var store2 stock.Store = st2
				if batch {
					store2 = a25BatchStore{st2}
				}
				a25Finish(t, e, e.r, stock.RunOptions{Store: store2, Drain: time.Second, Relay: a25Relay(), Reconcile: &stock.ReconcileOptions{Interval: -1}}, a25Keys(loaded))
				gate.release() // the stuck calls apply their events now: repeats
				time.Sleep(300 * time.Millisecond)
				sale.checkStore(t, e.r, mem, loaded)
			})
		})
	}
}

// TestAttack25StoreBlocksOnlyInDrain: deducts run from several goroutines while Run delivers
// them; ctx ends in the middle; the store blocks only for calls made under the drain (their
// context has a deadline). Run returns within Drain; a second Run delivers the rest; every
// acknowledged deduct and restore is applied exactly once.
func TestAttack25StoreBlocksOnlyInDrain(t *testing.T) {
	a25Each(t, nil, func(t *testing.T, e *a25Env) {
		ctx := context.Background()
		loaded := map[string]int64{"dr:a": 200, "dr:b~": 200, "dr::c": 200}
		mem := memstore.New()
		a25Load(t, e.r, mem, loaded)
		gate := newA25Gate()
		defer gate.release()
		st := &a25Store{a25Base: mem, gate: gate,
			stuck: func(ctx context.Context, _ stock.Event) bool { return hasDeadline(ctx) },
			delay: func() time.Duration { return time.Duration(rand.IntN(2)) * time.Millisecond }}
		sale := newA25Sale()
		runCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		drain := time.Second
		ch := a25Run(runCtx, e.r, stock.RunOptions{Store: st, Drain: drain, Relay: a25Relay(), Reconcile: &stock.ReconcileOptions{Interval: -1}})
		var wg sync.WaitGroup
		var ended atomic.Int64
		for w := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 40 {
					sku := a25Keys(loaded)[(w+i)%len(loaded)]
					id := fmt.Sprintf("w%d:%d", w, i)
					if sale.deduct(t, ctx, e.r, sku, id, int64(1+i%2)) && i%3 == 0 {
						sale.restore(t, ctx, e.r, sku, id)
					}
					if w == 0 && i == 20 {
						cancel()
						ended.Store(time.Now().UnixNano())
					}
				}
			}()
		}
		wg.Wait()
		res := a25Wait(t, ch, time.Unix(0, ended.Load()), drain+3*time.Second)
		assert.ErrorIs(t, res.err, context.Canceled)

		e.settle()
		a25Finish(t, e, e.r, stock.RunOptions{Store: &a25Store{a25Base: mem}, Drain: time.Second, Relay: a25Relay(), Reconcile: &stock.ReconcileOptions{Interval: -1}}, a25Keys(loaded))
		gate.release()
		time.Sleep(300 * time.Millisecond)
		sale.checkStore(t, e.r, mem, loaded)
	})
}

// TestAttack25DrainValues: Drain negative delivers nothing more and returns within WithTimeout's
// bound even with a store that blocks; Drain zero is the default (5s): the drain delivers what
// is due; a tiny Drain returns at once. ctx ends before Run starts in each case, so only the
// drain can deliver.
func TestAttack25DrainValues(t *testing.T) {
	t.Run("negative", func(t *testing.T) {
		a25Each(t, []stock.Option{stock.WithTimeout(2 * time.Second)}, func(t *testing.T, e *a25Env) {
			ctx := context.Background()
			loaded := map[string]int64{"neg:1": 10}
			mem := memstore.New()
			a25Load(t, e.r, mem, loaded)
			sale := newA25Sale()
			for i := range 5 {
				sale.deduct(t, ctx, e.r, "neg:1", fmt.Sprint("n", i), 1)
			}
			runCtx, cancel := context.WithCancel(ctx)
			cancel()
			ended := time.Now()
			ch := a25Run(runCtx, e.r, stock.RunOptions{Store: mem, Drain: -1, Relay: a25Relay()})
			res := a25Wait(t, ch, ended, 2*time.Second+3*time.Second)
			assert.ErrorIs(t, res.err, context.Canceled)
			pending, _, err := stockops.Pending(ctx, e.r, "neg:1")
			require.NoError(t, err)
			assert.EqualValues(t, 5, pending, "a negative Drain delivers nothing more")
			assert.Zero(t, mem.MaxApplications())
			e.settle()
			a25Finish(t, e, e.r, stock.RunOptions{Store: mem, Drain: time.Second, Relay: a25Relay(), Reconcile: &stock.ReconcileOptions{Interval: -1}}, a25Keys(loaded))
			sale.checkStore(t, e.r, mem, loaded)
		})
	})
	t.Run("negative-stuck-main-loop", func(t *testing.T) {
		a25Each(t, []stock.Option{stock.WithTimeout(2 * time.Second)}, func(t *testing.T, e *a25Env) {
			ctx := context.Background()
			loaded := map[string]int64{"neg:2": 10}
			mem := memstore.New()
			a25Load(t, e.r, mem, loaded)
			gate := newA25Gate()
			defer gate.release()
			st := &a25Store{a25Base: mem, gate: gate, stuck: func(context.Context, stock.Event) bool { return true }}
			runCtx, cancel := context.WithCancel(ctx)
			ch := a25Run(runCtx, e.r, stock.RunOptions{Store: st, Drain: -time.Second, Relay: a25Relay(), Reconcile: &stock.ReconcileOptions{Interval: -1}})
			sale := newA25Sale()
			sale.deduct(t, ctx, e.r, "neg:2", "only", 2)
			select {
			case <-gate.entered:
			case <-time.After(20 * time.Second):
				t.Fatal("the relay never called the store")
			}
			cancel()
			ended := time.Now()
			res := a25Wait(t, ch, ended, 2*time.Second+3*time.Second)
			require.Error(t, res.err)
			assert.NotEqual(t, context.Canceled.Error(), res.err.Error(), "the error must say a call is still running")
			gate.release()
			time.Sleep(300 * time.Millisecond)
			e.settle()
			a25Finish(t, e, e.r, stock.RunOptions{Store: mem, Drain: time.Second, Relay: a25Relay(), Reconcile: &stock.ReconcileOptions{Interval: -1}}, a25Keys(loaded))
			sale.checkStore(t, e.r, mem, loaded)
		})
	})
	t.Run("zero-is-default", func(t *testing.T) {
		a25Each(t, nil, func(t *testing.T, e *a25Env) {
			ctx := context.Background()
			loaded := map[string]int64{"zero:1": 100}
			mem := memstore.New()
			a25Load(t, e.r, mem, loaded)
			sale := newA25Sale()
			for i := range 40 {
				sale.deduct(t, ctx, e.r, "zero:1", fmt.Sprint("z", i), 1)
			}
			st := &a25Store{a25Base: mem, delay: func() time.Duration { return 5 * time.Millisecond }}
			runCtx, cancel := context.WithCancel(ctx)
			cancel()
			ended := time.Now()
			ch := a25Run(runCtx, e.r, stock.RunOptions{Store: st, Relay: &stock.RelayOptions{Batch: 4}})
			res := a25Wait(t, ch, ended, 5*time.Second+3*time.Second)
			assert.ErrorIs(t, res.err, context.Canceled)
			// 40 events of 5ms each fit well in the default 5s drain.
			sale.checkStore(t, e.r, mem, loaded)
		})
	})
	t.Run("zero-stuck-waits-default", func(t *testing.T) {
		a25Each(t, nil, func(t *testing.T, e *a25Env) {
			ctx := context.Background()
			loaded := map[string]int64{"zero:2": 10}
			mem := memstore.New()
			a25Load(t, e.r, mem, loaded)
			sale := newA25Sale()
			sale.deduct(t, ctx, e.r, "zero:2", "z", 1)
			gate := newA25Gate()
			defer gate.release()
			st := &a25Store{a25Base: mem, gate: gate, stuck: func(context.Context, stock.Event) bool { return true }}
			runCtx, cancel := context.WithCancel(ctx)
			cancel()
			ended := time.Now()
			ch := a25Run(runCtx, e.r, stock.RunOptions{Store: st, Relay: a25Relay()})
			res := a25Wait(t, ch, ended, 5*time.Second+3*time.Second)
			require.Error(t, res.err)
			assert.NotEqual(t, context.Canceled.Error(), res.err.Error(), "the error must say a call is still running")
			assert.GreaterOrEqual(t, res.at.Sub(ended), 3*time.Second, "Drain 0 is the default 5s, not no drain")
		})
	})
	for _, d := range []time.Duration{time.Nanosecond, time.Millisecond} {
		t.Run(fmt.Sprintf("tiny-%v", d), func(t *testing.T) {
			a25Each(t, nil, func(t *testing.T, e *a25Env) {
				ctx := context.Background()
				loaded := map[string]int64{"tiny:1": 10}
				mem := memstore.New()
				a25Load(t, e.r, mem, loaded)
				sale := newA25Sale()
				for i := range 5 {
					sale.deduct(t, ctx, e.r, "tiny:1", fmt.Sprint("t", i), 1)
				}
				gate := newA25Gate()
				defer gate.release()
				st := &a25Store{a25Base: mem, gate: gate, stuck: func(context.Context, stock.Event) bool { return true }}
				runCtx, cancel := context.WithCancel(ctx)
				cancel()
				ended := time.Now()
				ch := a25Run(runCtx, e.r, stock.RunOptions{Store: st, Drain: d, Relay: a25Relay()})
				a25Wait(t, ch, ended, 3*time.Second)
				gate.release()
				time.Sleep(200 * time.Millisecond)
				e.settle()
				a25Finish(t, e, e.r, stock.RunOptions{Store: mem, Drain: time.Second, Relay: a25Relay(), Reconcile: &stock.ReconcileOptions{Interval: -1}}, a25Keys(loaded))
				sale.checkStore(t, e.r, mem, loaded)
			})
		})
	}
}

// TestAttack25RunTwiceConcurrently: two Runs of one Reserver at once (the docs allow one at a
// time; a mistake a user can make), with deducts and restores under way; then both stop.
// One of them is refused with ErrRunning, the other runs; both return in bounds, and nothing
// is lost or doubled (-race finds shared-state races).
func TestAttack25RunTwiceConcurrently(t *testing.T) {
	a25Each(t, nil, func(t *testing.T, e *a25Env) {
		ctx := context.Background()
		loaded := map[string]int64{"two:a": 300, "two:b~b": 300}
		mem := memstore.New()
		a25Load(t, e.r, mem, loaded)
		sale := newA25Sale()
		runCtx, cancel := context.WithCancel(ctx)
		opts := stock.RunOptions{Store: mem, Drain: time.Second, Relay: a25Relay(), Reconcile: &stock.ReconcileOptions{Interval: 30 * time.Millisecond}}
		ch1 := a25Run(runCtx, e.r, opts)
		ch2 := a25Run(runCtx, e.r, opts)
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 50 {
					sku := "two:a"
					if i%2 == 1 {
						sku = "two:b~b"
					}
					id := fmt.Sprintf("w%d-%d", w, i)
					if sale.deduct(t, ctx, e.r, sku, id, 1) && i%4 == 0 {
						sale.restore(t, ctx, e.r, sku, id)
					}
				}
			}()
		}
		wg.Wait()
		time.Sleep(300 * time.Millisecond)
		cancel()
		ended := time.Now()
		r1 := a25Wait(t, ch1, ended, time.Second+3*time.Second)
		r2 := a25Wait(t, ch2, ended, time.Second+3*time.Second)
		if errors.Is(r1.err, stock.ErrRunning) {
			r1, r2 = r2, r1
		}
		assert.ErrorIs(t, r1.err, context.Canceled, "the Run that ran")
		assert.ErrorIs(t, r2.err, stock.ErrRunning, "the other was refused")
		e.settle()
		a25Finish(t, e, e.r, stock.RunOptions{Store: mem, Drain: time.Second, Relay: a25Relay(), Reconcile: &stock.ReconcileOptions{Interval: -1}}, a25Keys(loaded))
		sale.checkStore(t, e.r, mem, loaded)
	})
}

// a25Drift collects the reconcile observations that report drift.
type a25Drift struct {
	mu    sync.Mutex
	seen  []string
	count atomic.Int64
}

func (d *a25Drift) Observe(_ context.Context, o stock.Observation) {
	if o.Op != "reconcile" {
		return
	}
	d.count.Add(1)
	if o.Units != 0 {
		d.mu.Lock()
		d.seen = append(d.seen, fmt.Sprintf("%s drift %d (%s)", o.SKU, o.Units, o.Outcome))
		d.mu.Unlock()
	}
}

func (d *a25Drift) check(t *testing.T) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	assert.Empty(t, d.seen, "reconcile passes reported drift")
}

// checkReports fails t on a report that found drift or repaired anything while the sale was
// consistent. Settled (a consumer's acknowledgement taken for it) and Busy are allowed.
func a25CheckReports(t *testing.T, res stockops.PassResult, err error) {
	t.Helper()
	a25CheckReportsExcept(t, res, err, false)
}

// a25CheckReportsExcept is a25CheckReports; with rerecords, rewritten ledger entries are let
// through (see TestAttack25TrimThenRerecord).
func a25CheckReportsExcept(t *testing.T, res stockops.PassResult, err error, rerecords bool) {
	t.Helper()
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("reconcile pass: %v", err)
	}
	for _, rp := range res.Reports {
		if rp.Busy {
			continue
		}
		if rp.Drift != 0 || rp.Adjusted != 0 || rp.NeedsHuman != "" || rp.Requeued != 0 || rp.Resynced != 0 || (rp.Rerecorded != 0 && !rerecords) || rp.Rebuilt {
			t.Errorf("reconcile pass touched a consistent item: %+v", rp)
		}
	}
}

// a25Queue is an in-memory queue with several consumers that take messages in random order,
// redeliver some twice, and retry held-back ones later.
type a25Queue struct {
	mu       sync.Mutex
	msgs     []stock.Event
	busy     int
	consumed atomic.Int64
	heldBack atomic.Int64
}

func (q *a25Queue) push(ev stock.Event) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.msgs = append(q.msgs, ev)
	if rand.IntN(4) == 0 { // the queue delivers this one twice
		q.msgs = append(q.msgs, ev)
	}
}

func (q *a25Queue) take() (stock.Event, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.msgs) == 0 {
		return stock.Event{}, false
	}
	i := rand.IntN(len(q.msgs))
	if rand.IntN(2) == 0 {
		i = len(q.msgs) - 1 // newest first: later events before earlier ones
	}
	ev := q.msgs[i]
	q.msgs[i] = q.msgs[len(q.msgs)-1]
	q.msgs = q.msgs[:len(q.msgs)-1]
	q.busy++
	return ev, true
}

func (q *a25Queue) done(ev stock.Event, again bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.busy--
	if again {
		q.msgs = append(q.msgs, ev)
	}
}

func (q *a25Queue) idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.msgs) == 0 && q.busy == 0
}

func (q *a25Queue) consumers(ctx context.Context, t *testing.T, n int, r *stock.Reserver, store stock.Store) *sync.WaitGroup {
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				ev, ok := q.take()
				if !ok {
					time.Sleep(time.Millisecond)
					continue
				}
				if rand.IntN(3) == 0 {
					time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
				}
				err := stock.Consume(ctx, r, store, ev)
				switch {
				case err == nil:
					q.consumed.Add(1)
					q.done(ev, false)
				case errors.Is(err, stock.ErrHeldBack):
					q.heldBack.Add(1)
					time.Sleep(time.Duration(1+rand.IntN(5)) * time.Millisecond)
					q.done(ev, true)
				case errors.Is(err, stock.ErrInvalid):
					t.Errorf("Consume refused a genuine event as invalid: %+v: %v", ev, err)
					q.done(ev, false)
				default:
					if ctx.Err() == nil {
						t.Logf("Consume: temporary error: %v", err)
					}
					q.done(ev, true)
				}
			}
		}()
	}
	return &wg
}

// a25Traffic runs deducts then restores of the same ids on the items from several goroutines:
// ids are reused across items, some restores come first (tombstones), and the small item sells
// out so that restores free the units later deducts take.
func a25Traffic(t *testing.T, r *stock.Reserver, sale *a25Sale, skus []string, workers, per int) {
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				id := fmt.Sprintf("ord:%d~%d", w, i) // the same id on several items
				a := skus[(w+i)%len(skus)]
				b := skus[(w+i+1)%len(skus)]
				switch i % 5 {
				case 0, 1, 2:
					okA := sale.deduct(t, ctx, r, a, id, int64(1+rand.IntN(3)))
					okB := sale.deduct(t, ctx, r, b, id, 1)
					if okA && rand.IntN(2) == 0 {
						sale.restore(t, ctx, r, a, id)
					}
					if okB && rand.IntN(3) == 0 {
						sale.restore(t, ctx, r, b, id)
					}
				case 3: // a restore that overtakes its deduct
					sale.restore(t, ctx, r, a, id)
					sale.deduct(t, ctx, r, a, id, 1)
				case 4: // deduct, restore, and a retry of both
					if sale.deduct(t, ctx, r, a, id, 2) {
						sale.restore(t, ctx, r, a, id)
						sale.restore(t, ctx, r, a, id)
					}
					sale.deduct(t, ctx, r, a, id, 2)
				}
			}
		}()
	}
	wg.Wait()
}

// a25Reconciling runs passes of rc back to back until ctx ends, checking each.
func a25Reconciling(ctx context.Context, t *testing.T, rc *stockops.Reconciler, passes *atomic.Int64) *sync.WaitGroup {
	return a25ReconcilingExcept(ctx, t, rc, passes, false)
}

func a25ReconcilingExcept(ctx context.Context, t *testing.T, rc *stockops.Reconciler, passes *atomic.Int64, rerecords bool) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			res, err := rc.Pass(ctx)
			if ctx.Err() != nil {
				return
			}
			passes.Add(1)
			a25CheckReportsExcept(t, res, err, rerecords)
			time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
		}
	}()
	return &wg
}

var a25Items = map[string]int64{"q:1": 400, "sku:with:colons": 400, "tilde~sku": 400, "x:~:y": 400, "small~1": 12}

// TestAttack25ReconcileQueuePathConcurrentRestores: the queue path. Run publishes only; several
// consumers apply the events through Consume, out of order and some twice, while deducts and
// restores of the same ids run and a reconciler runs passes back to back. No pass may report
// drift or repair anything; at the end (every event consumed, the relay drained) a pass finds no
// drift, and the levels and the store match the acknowledged answers.
//
// Variants: a store that takes a few milliseconds (a consumer's Apply and its acknowledgement in
// Redis far apart) with two reconcilers of two processes; a short retention, so that passes trim
// settled entries while late copies of their events are still consumed.
func TestAttack25ReconcileQueuePathConcurrentRestores(t *testing.T) {
	for _, v := range []struct {
		name        string
		slow        bool
		reconcilers int
		retention   time.Duration
	}{
		{"plain", false, 1, 0},
		{"slow-store-two-reconcilers", true, 2, 0},
		{"short-retention", false, 1, 200 * time.Millisecond},
	} {
		t.Run(v.name, func(t *testing.T) {
			a25Each(t, nil, func(t *testing.T, e *a25Env) {
				a25QueuePath(t, e, v.slow, v.reconcilers, v.retention)
			})
		})
	}
}

func a25QueuePath(t *testing.T, e *a25Env, slow bool, reconcilers int, retention time.Duration) {
	{
		drift := &a25Drift{}
		r := e.another(stock.WithObserver(drift))
		mem := memstore.New()
		a25Load(t, r, mem, a25Items)
		q := &a25Queue{}
		pub := &a25Pub{push: q.push}
		ctx, stop := context.WithCancel(context.Background())
		defer stop()
		run := a25Run(ctx, r, stock.RunOptions{Publisher: a25BatchPub{pub}, Drain: 2 * time.Second, Relay: &stock.RelayOptions{Poll: 5 * time.Millisecond, Batch: 8}})
		var consStore stock.Store = mem
		if slow {
			consStore = &a25Store{a25Base: mem, delay: func() time.Duration { return time.Duration(rand.IntN(4)) * time.Millisecond }}
		}
		cons := q.consumers(ctx, t, 6, r, consStore)
		var passes atomic.Int64
		var recs []*sync.WaitGroup
		for i := range reconcilers {
			rr := r
			if i > 0 {
				rr = e.another(stock.WithObserver(drift))
			}
			rc, err := stockops.NewReconciler(rr, mem, &stock.ReconcileOptions{Retention: retention})
			require.NoError(t, err)
			// A short retention trims entries that the store's records then write back:
			// TestAttack25TrimThenRerecord; here only drift and stock repairs count.
			recs = append(recs, a25ReconcilingExcept(ctx, t, rc, &passes, retention > 0))
		}
		recDone := &sync.WaitGroup{}
		recDone.Add(1)
		go func() {
			defer recDone.Done()
			for _, w := range recs {
				w.Wait()
			}
		}()
		if retention > 0 && !e.real {
			// The miniredis clock stands still: move it as a real one would.
			recDone.Add(1)
			go func() {
				defer recDone.Done()
				for ctx.Err() == nil {
					e.advance(10 * time.Millisecond)
					time.Sleep(5 * time.Millisecond)
				}
			}()
		}

		sale := newA25Sale()
		a25Traffic(t, r, sale, a25Keys(a25Items), 8, 60)

		// Wait until every event is published and consumed.
		deadline := time.Now().Add(90 * time.Second)
		for {
			quiet := q.idle()
			for sku := range a25Items {
				p, d, err := stockops.Pending(context.Background(), r, sku)
				require.NoError(t, err)
				quiet = quiet && p == 0 && d == 0
			}
			if quiet {
				dry, err := stockops.NewReconciler(r, mem, &stock.ReconcileOptions{DryRun: true})
				require.NoError(t, err)
				res, err := dry.Pass(context.Background())
				require.NoError(t, err)
				for _, rp := range res.Reports {
					quiet = quiet && rp.Published == 0 && rp.Pending == 0
				}
			}
			if quiet && q.idle() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("events still in flight after 90s")
			}
			time.Sleep(50 * time.Millisecond)
		}
		stop()
		res := a25Wait(t, run, time.Now(), 2*time.Second+3*time.Second)
		assert.ErrorIs(t, res.err, context.Canceled)
		cons.Wait()
		recDone.Wait()
		t.Logf("%s: %d passes, %d consumed, %d held back", e.name, passes.Load(), q.consumed.Load(), q.heldBack.Load())
		assert.Positive(t, passes.Load())

		final, err := stockops.NewReconciler(r, mem, &stock.ReconcileOptions{Retention: retention})
		require.NoError(t, err)
		fres, err := final.Pass(context.Background())
		a25CheckReportsExcept(t, fres, err, retention > 0)
		for _, rp := range fres.Reports {
			assert.False(t, rp.Busy, "%s busy at the end", rp.SKU)
			assert.Zero(t, rp.Published, "%s: published set empty", rp.SKU)
		}
		drift.check(t)
		sale.checkStore(t, r, mem, a25Items)
	}
}

// TestAttack25ReconcileStorePathConcurrentRestores: the Store path. Run applies the events to a
// slowish store and runs its own reconcile passes every few milliseconds, while another process's
// Run relays too and a stockops reconciler runs passes back to back; deducts and restores of the
// same ids run meanwhile. No pass (Run's, observed, or the reconciler's) may find drift; at the
// end the levels and the store match the acknowledged answers.
func TestAttack25ReconcileStorePathConcurrentRestores(t *testing.T) {
	a25Each(t, nil, func(t *testing.T, e *a25Env) {
		drift := &a25Drift{}
		r := e.another(stock.WithObserver(drift))
		r2 := e.another(stock.WithObserver(drift))
		mem := memstore.New()
		a25Load(t, r, mem, a25Items)
		st := &a25Store{a25Base: mem, delay: func() time.Duration {
			if rand.IntN(4) == 0 {
				return time.Duration(rand.IntN(3)) * time.Millisecond
			}
			return 0
		}}
		ctx, stop := context.WithCancel(context.Background())
		defer stop()
		ro := stock.RunOptions{Store: st, Drain: 2 * time.Second, Relay: &stock.RelayOptions{Poll: 5 * time.Millisecond, Batch: 4},
			Reconcile: &stock.ReconcileOptions{Interval: 15 * time.Millisecond}}
		run1 := a25Run(ctx, r, ro)
		run2 := a25Run(ctx, r2, stock.RunOptions{Store: a25BatchStore{st}, Drain: 2 * time.Second, Relay: &stock.RelayOptions{Poll: 5 * time.Millisecond, Batch: 16},
			Reconcile: &stock.ReconcileOptions{Interval: 25 * time.Millisecond}})
		rc, err := stockops.NewReconciler(r, mem, nil)
		require.NoError(t, err)
		var passes atomic.Int64
		recDone := a25Reconciling(ctx, t, rc, &passes)

		sale := newA25Sale()
		a25Traffic(t, r, sale, a25Keys(a25Items), 8, 60)

		deadline := time.Now().Add(90 * time.Second)
		for {
			left := int64(0)
			for sku := range a25Items {
				p, d, err := stockops.Pending(context.Background(), r, sku)
				require.NoError(t, err)
				left += p + d
			}
			if left == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d events still in the outboxes after 90s", left)
			}
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(200 * time.Millisecond) // a few more of Run's passes on the settled items
		stop()
		now := time.Now()
		res1 := a25Wait(t, run1, now, 2*time.Second+3*time.Second)
		res2 := a25Wait(t, run2, now, 2*time.Second+3*time.Second)
		assert.ErrorIs(t, res1.err, context.Canceled)
		assert.ErrorIs(t, res2.err, context.Canceled)
		recDone.Wait()
		t.Logf("%s: %d stockops passes, %d reconcile observations", e.name, passes.Load(), drift.count.Load())
		assert.Positive(t, passes.Load())

		final, err := stockops.NewReconciler(r, mem, nil)
		require.NoError(t, err)
		fres, err := final.Pass(context.Background())
		a25CheckReports(t, fres, err)
		for _, rp := range fres.Reports {
			assert.False(t, rp.Busy, "%s busy at the end", rp.SKU)
		}
		drift.check(t)
		sale.checkStore(t, r, mem, a25Items)
	})
}

// TestAttack25GuardLatchedByCancelledRun: on a Redis that does not answer INFO (miniredis, or a
// user whose ACL denies INFO), Run's failover guard is off, as RunOptions.GuardInterval says.
// But a Run whose ctx has already ended when it starts (a service shutting down as it starts;
// likewise a transport error on Run's first INFO) takes the failed INFO for a transport error and
// creates a guard anyway, and the Reserver stays "guarded" for good: from then on every reconcile
// pass of that Reserver (Run's own, or stockops.NewReconciler's) fails at once on INFO and
// compares and repairs nothing. Steps: Load an item in Redis and the store; Run with a cancelled
// ctx (returns at once); seed a drift in the store; a reconcile pass must find and repair it,
// without an error, as it does on the same Redis for a Reserver that never ran.
func TestAttack25GuardLatchedByCancelledRun(t *testing.T) {
	check := func(t *testing.T, c rueidis.Client, opts ...stock.Option) {
		ctx := context.Background()
		r, err := stock.New(c, opts...)
		require.NoError(t, err)
		mem := memstore.New()
		sku := "guard:latch~1"
		require.NoError(t, r.Load(ctx, sku, 10))
		require.NoError(t, mem.Load(ctx, sku, 10))
		rc, err := stockops.NewReconciler(r, mem, nil)
		require.NoError(t, err)
		_, err = rc.Pass(ctx)
		require.NoError(t, err, "a pass before the cancelled Run")

		runCtx, cancel := context.WithCancel(ctx)
		cancel()
		ended := time.Now()
		res := a25Wait(t, a25Run(runCtx, r, stock.RunOptions{Store: mem, Reconcile: &stock.ReconcileOptions{Interval: -1}}), ended, 5*time.Second+3*time.Second)
		assert.ErrorIs(t, res.err, context.Canceled)

		mem.Set(sku, 7) // the database of record says 7: Redis would sell 3 units too many
		pres, err := rc.Pass(ctx)
		assert.NoError(t, err, "a pass after the cancelled Run")
		if assert.Len(t, pres.Reports, 1, "the pass compared the item") {
			assert.EqualValues(t, 3, pres.Reports[0].Drift)
		}
		lv, err := r.Levels(ctx, sku)
		require.NoError(t, err)
		assert.EqualValues(t, 7, lv.Available, "the drift is repaired")

		// Run's own passes too.
		mem.Set(sku, 5)
		runCtx2, cancel2 := context.WithCancel(ctx)
		ch := a25Run(runCtx2, r, stock.RunOptions{Store: mem, Drain: time.Second})
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if lv, _ = r.Levels(ctx, sku); lv.Available == 5 {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		cancel2()
		res = a25Wait(t, ch, time.Now(), time.Second+3*time.Second)
		assert.EqualValues(t, 5, lv.Available, "Run's first reconcile pass repairs the drift")
		assert.ErrorIs(t, res.err, context.Canceled, "Run's passes met no error")
	}
	t.Run("miniredis", func(t *testing.T) {
		env := stocktest.New(t)
		check(t, env.Client, stock.WithClock(env.Now))
	})
	if redistest.ServerBinary(t) == "" {
		return
	}
	t.Run("redis-acl-without-info", func(t *testing.T) {
		srv := redistest.StartServer(t)
		admin := srv.Client(t)
		ctx := context.Background()
		require.NoError(t, admin.Do(ctx, admin.B().Arbitrary("ACL", "SETUSER", "a25", "on", ">a25pw", "~*", "&*", "+@all", "-info").Build()).Error())
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, Username: "a25", Password: "a25pw", DisableCache: true})
		require.NoError(t, err)
		t.Cleanup(c.Close)
		require.Error(t, c.Do(ctx, c.B().Info().Build()).Error(), "the user may not INFO")
		check(t, c)
	})
}

// TestAttack25TrimThenRerecord: a reconcile pass with a retention trims a settled ledger entry
// (judged by the Redis time of the entry), and the next pass writes it back from the store's
// record (judged by the store's time of the record, which is later: the relay applied it later),
// reporting it as Rerecorded: "ledger entries the Store has and Redis lost, written back". Redis
// lost nothing, the pass's own trim removed them; an operator is told Redis lost data. Steps:
// deduct 5 units; 2s later the relay applies them to a memstore; 0.5s later two passes with
// Retention 1s, back to back. Expected: the first trims 5, the second rerecords nothing.
func TestAttack25TrimThenRerecord(t *testing.T) {
	a25Each(t, nil, func(t *testing.T, e *a25Env) {
		ctx := context.Background()
		pass := func(d time.Duration) { // let d pass on both clocks: the store's and Redis's
			time.Sleep(d)
			if !e.real {
				e.advance(d)
			}
		}
		mem := memstore.New()
		sku := "trim:re~1"
		require.NoError(t, e.r.Load(ctx, sku, 10))
		require.NoError(t, mem.Load(ctx, sku, 10))
		sale := newA25Sale()
		for i := range 5 {
			sale.deduct(t, ctx, e.r, sku, fmt.Sprint("t:", i), 1)
		}
		pass(2 * time.Second)
		rl, err := stockops.NewRelay(e.r, mem, nil, nil)
		require.NoError(t, err)
		st, err := rl.Once(ctx)
		require.NoError(t, err)
		require.Equal(t, 5, st.Delivered)
		pass(500 * time.Millisecond)
		rc, err := stockops.NewReconciler(e.r, mem, &stock.ReconcileOptions{Retention: time.Second})
		require.NoError(t, err)
		rp, err := rc.Item(ctx, sku)
		require.NoError(t, err)
		t.Logf("%s: first pass: %s", e.name, rp.String())
		assert.Zero(t, rp.Drift)
		assert.Zero(t, rp.Rerecorded)
		// The next pass, at once: Redis lost nothing since.
		rp2, err := rc.Item(ctx, sku)
		require.NoError(t, err)
		t.Logf("%s: second pass: %s", e.name, rp2.String())
		assert.Zero(t, rp2.Drift)
		assert.Zero(t, rp2.Rerecorded, "the next pass rewrote the entries the first had trimmed (%d), reporting them as lost by Redis", rp.Trimmed)
		pass(1500 * time.Millisecond)
		rp3, err := rc.Item(ctx, sku)
		require.NoError(t, err)
		t.Logf("%s: third pass: %s", e.name, rp3.String())
		sale.checkStore(t, e.r, mem, map[string]int64{sku: 10})
	})
}
