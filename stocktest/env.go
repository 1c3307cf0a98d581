// Package stocktest helps test code that uses package stock.
//
// [New] gives a test a [stock.Reserver] on an in-process miniredis whose one
// clock moves everything the Reserver depends on: hold deadlines (the scripts
// read the Redis TIME command), key TTLs (relay leases, retry backoff) and the
// Reserver's own cutoffs (the age of carts cart recovery undoes, the
// reconciler's retention; see [stock.WithClock]) move together with
// [Env.Advance], and stand still otherwise, so tests of deadlines do not
// depend on how fast the machine is. The loops of [stock.Reserver.Run] (the
// sweeper, cart recovery, reconcile passes) run once their interval has
// passed on that clock, within about 50 ms of real time after an Advance.
//
// [TestStore] is a conformance suite for implementations of [stock.Store]:
// run it from a test of your Store, as memstore and sqlstore do.
//
// [TestPublisher] is a conformance suite for a [stock.Publisher] and its
// consumer side (a [Consumer] that receives [Delivery] values and can be
// killed mid-stream): run it from a test of your queue adapter, as natspub
// and the other adapters do.
package stocktest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"

	"github.com/stockres/stock"
)

// Env is a Reserver on an in-process miniredis with a clock moved only by
// Advance. Everything in it is closed when the test ends.
type Env struct {
	// Reserver runs its scripts on Client.
	Reserver *stock.Reserver
	// Client is a rueidis client of Redis, with client-side caching off
	// (miniredis has no CLIENT TRACKING). Use it to build relays,
	// reconcilers or other Reservers on the same data.
	Client rueidis.Client
	// Redis is the miniredis server, for inspecting or altering keys. Move
	// its clock with Advance, not with its SetTime or FastForward: Advance
	// moves both the TIME command and TTLs together.
	Redis *miniredis.Miniredis

	mu  sync.Mutex
	now time.Time
}

// New starts a miniredis, a client and a Reserver made with opts, and closes
// them when t ends. The Redis clock starts at the current wall-clock time,
// truncated to the microsecond, and moves only with Advance. It fails t if
// stock.New refuses opts; opts must not hold stock.WithClock, as the Env
// gives the Reserver its own clock (a second clock is refused).
func New(t testing.TB, opts ...stock.Option) *Env {
	t.Helper()
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		t.Fatalf("stocktest: start miniredis: %v", err)
	}
	t.Cleanup(m.Close)
	now := time.Now().Truncate(time.Microsecond)
	m.SetTime(now)
	// With ClockTTL, TTLs run on the clock set by SetTime: one clock for
	// TIME, PEXPIREAT and TTLs.
	m.ClockTTL(true)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{m.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatalf("stocktest: rueidis client: %v", err)
	}
	t.Cleanup(c.Close)
	e := &Env{Client: c, Redis: m, now: now}
	// The Reserver's own cutoffs (cart age, retention) run on the same clock.
	r, err := stock.New(c, append([]stock.Option{stock.WithClock(e.Now)}, opts...)...)
	if err != nil {
		t.Fatalf("stocktest: stock.New: %v", err)
	}
	e.Reserver = r
	// Before the client closes (clean-ups run last first): the Reserver's background writes
	// end, and nothing is written after the test.
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	return e
}

// Now returns the current time of the Redis clock.
func (e *Env) Now() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.now
}

// Advance moves the Redis clock forward by d at once, without sleeping: the
// TIME command the scripts read (hold deadlines), every key's TTL (relay
// leases, backoff) and the Reserver's clock (cart age, retention) move by d. Keys whose TTL runs out expire. A negative d
// is a test bug and panics.
func (e *Env) Advance(d time.Duration) {
	if d < 0 {
		panic("stocktest: Advance with a negative duration")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.now = e.now.Add(d)
	e.Redis.SetTime(e.now)
}
