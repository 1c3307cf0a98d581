// Package bounded bounds package stock's Redis commands: each gets a deadline (WithTimeout), an
// error that leaves its outcome unknown wraps errs.ErrUnknownOutcome, and a Gate counts the
// commands in flight so that Reserver.Close can wait for them and refuse the rest.
package bounded

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	"github.com/stockres/stock/internal/errs"
	"github.com/stockres/stock/internal/protocol"
)

// Client is a rueidis.Client whose commands end after timeout at the latest, and whose
// errors other than Redis's own replies wrap errs.ErrUnknownOutcome.
type Client struct {
	rueidis.Client
	timeout *deadlines
	fn      *protocol.Functions // whether the scripts run as Redis functions (protocol.Script.Exec)
	gate    *Gate               // the commands in flight; shut by Reserver.Close
}

// StockFunctions makes the scripts this client runs Redis functions where the server has them.
func (c Client) StockFunctions() *protocol.Functions { return c.fn }

// New returns c with its commands bounded by timeout, and refused once g is shut.
func New(c rueidis.Client, timeout time.Duration, g *Gate) rueidis.Client {
	if b, ok := c.(Client); ok {
		c = b.Client
	}
	return Client{Client: c, timeout: newDeadlines(timeout), fn: protocol.NewFunctions(), gate: g}
}

// closedResults is the answer to n commands refused by a closed Reserver: none was sent.
func closedResults(n int) []rueidis.RedisResult {
	out := make([]rueidis.RedisResult, n)
	for i := range out {
		out[i] = rueidis.NewErrorResult(errs.ErrReserverClosed)
	}
	return out
}

func (c Client) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if !c.gate.Enter() {
		return rueidis.NewErrorResult(errs.ErrReserverClosed)
	}
	defer c.gate.Leave()
	ctx, cancel := c.timeout.bound(ctx)
	defer cancel()
	return unknownResult(ctx, c.Client.Do(ctx, cmd))
}

func (c Client) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	if !c.gate.Enter() {
		return closedResults(len(cmds))
	}
	defer c.gate.Leave()
	ctx, cancel := c.timeout.bound(ctx)
	defer cancel()
	return unknownResults(ctx, c.Client.DoMulti(ctx, cmds...))
}

func (c Client) DoCache(ctx context.Context, cmd rueidis.Cacheable, ttl time.Duration) rueidis.RedisResult {
	if !c.gate.Enter() {
		return rueidis.NewErrorResult(errs.ErrReserverClosed)
	}
	defer c.gate.Leave()
	ctx, cancel := c.timeout.bound(ctx)
	defer cancel()
	return unknownResult(ctx, c.Client.DoCache(ctx, cmd, ttl))
}

func (c Client) DoMultiCache(ctx context.Context, cmds ...rueidis.CacheableTTL) []rueidis.RedisResult {
	if !c.gate.Enter() {
		return closedResults(len(cmds))
	}
	defer c.gate.Leave()
	ctx, cancel := c.timeout.bound(ctx)
	defer cancel()
	return unknownResults(ctx, c.Client.DoMultiCache(ctx, cmds...))
}

func (c Client) Dedicated(fn func(rueidis.DedicatedClient) error) error {
	if !c.gate.Enter() {
		return errs.ErrReserverClosed
	}
	defer c.gate.Leave()
	return c.Client.Dedicated(func(d rueidis.DedicatedClient) error {
		return fn(dedicated{DedicatedClient: d, timeout: c.timeout, gate: c.gate})
	})
}

func (c Client) Dedicate() (rueidis.DedicatedClient, func()) {
	d, cancel := c.Client.Dedicate()
	return dedicated{DedicatedClient: d, timeout: c.timeout, gate: c.gate}, cancel
}

func (c Client) Nodes() map[string]rueidis.Client {
	nodes := c.Client.Nodes()
	out := make(map[string]rueidis.Client, len(nodes))
	for addr, n := range nodes {
		out[addr] = Client{Client: n, timeout: c.timeout, fn: c.fn, gate: c.gate} // one functions state per Reserver
	}
	return out
}

// dedicated is Client's dedicated connection.
type dedicated struct {
	rueidis.DedicatedClient
	timeout *deadlines
	gate    *Gate
}

func (c dedicated) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if !c.gate.Enter() {
		return rueidis.NewErrorResult(errs.ErrReserverClosed)
	}
	defer c.gate.Leave()
	ctx, cancel := c.timeout.bound(ctx)
	defer cancel()
	return unknownResult(ctx, c.DedicatedClient.Do(ctx, cmd))
}

func (c dedicated) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	if !c.gate.Enter() {
		return closedResults(len(cmds))
	}
	defer c.gate.Leave()
	ctx, cancel := c.timeout.bound(ctx)
	defer cancel()
	return unknownResults(ctx, c.DedicatedClient.DoMulti(ctx, cmds...))
}

// deadlines bounds commands by a timeout. A command whose context has no deadline and is never
// cancelled (context.Background, or a context without cancel carrying values) shares, with the
// commands sent within the same 1/64 of the timeout, one context whose deadline is at most the
// timeout away and at least 63/64 of it: a context of its own would cost a timer and four
// allocations per command.
type deadlines struct {
	d     time.Duration
	grain time.Duration // d/64: how much sooner than d a shared deadline may come
	cur   atomic.Pointer[sharedDeadline]
	mu    sync.Mutex // makes the next shared deadline
}

// sharedDeadline is a context that ends at at, shared by the commands that may end then.
type sharedDeadline struct {
	ctx    context.Context
	at     time.Time
	cancel context.CancelFunc // never called: the context ends at its deadline
}

func newDeadlines(d time.Duration) *deadlines {
	return &deadlines{d: d, grain: d / 64}
}

// noCancel is the cancel of a context bound needs no cancel for.
func noCancel() {}

// bound returns ctx bounded by the timeout, and the cancel to call once the command returned.
func (b *deadlines) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	now := time.Now()
	want := now.Add(b.d)
	if dl, ok := ctx.Deadline(); ok && !dl.After(want) {
		return ctx, noCancel // the caller's deadline comes first
	}
	if ctx.Done() != nil {
		return context.WithDeadline(ctx, want) // cancelled by the caller or at the timeout
	}
	sh := b.shared(want)
	if ctx == context.Background() || ctx == context.TODO() {
		return sh, noCancel
	}
	return withValues{Context: sh, values: ctx}, noCancel
}

// shared returns a context ending after want-grain and not after want.
func (b *deadlines) shared(want time.Time) context.Context {
	early := want.Add(-b.grain)
	if s := b.cur.Load(); s != nil && s.at.After(early) && !s.at.After(want) {
		return s.ctx
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.cur.Load(); s != nil && s.at.After(early) && !s.at.After(want) {
		return s.ctx
	}
	ctx, cancel := context.WithDeadline(context.Background(), want)
	b.cur.Store(&sharedDeadline{ctx: ctx, at: want, cancel: cancel})
	return ctx
}

// withValues is a shared deadline's context with the values of the caller's.
type withValues struct {
	context.Context
	values context.Context
}

func (c withValues) Value(key any) any { return c.values.Value(key) }

// unknownResult turns a result whose error is not a reply of Redis (a dial error, a broken
// connection, the end of ctx) into one whose error wraps errs.ErrUnknownOutcome, that error and,
// once ctx is done, ctx's error.
func unknownResult(ctx context.Context, res rueidis.RedisResult) rueidis.RedisResult {
	if err := res.NonRedisError(); err != nil {
		return rueidis.NewErrorResult(UnknownOutcome(ctx, err))
	}
	return res
}

func unknownResults(ctx context.Context, rs []rueidis.RedisResult) []rueidis.RedisResult {
	for i, res := range rs {
		rs[i] = unknownResult(ctx, res)
	}
	return rs
}

// retryGiveUp is rueidis's longest wait between two resends of a retryable command (its
// default RetryDelayFn): rueidis gives up resending when less than the next wait is left
// before the deadline, and returns its last error, which does not say that the time ran out.
const retryGiveUp = time.Second

// UnknownOutcome wraps err, which left a call's outcome unknown, with errs.ErrUnknownOutcome, and
// with context.DeadlineExceeded (or ctx's error) when ctx is done or its deadline is so close
// that rueidis gave up resending because of it.
func UnknownOutcome(ctx context.Context, err error) error {
	if errors.Is(err, errs.ErrUnknownOutcome) {
		return err
	}
	cerr := ctx.Err()
	if dl, ok := ctx.Deadline(); ok && cerr == nil && time.Until(dl) < retryGiveUp {
		cerr = context.DeadlineExceeded
	}
	if cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w: %w (%w)", errs.ErrUnknownOutcome, err, cerr)
	}
	return fmt.Errorf("%w: %w", errs.ErrUnknownOutcome, err)
}

// Gate counts the calls (or commands) in flight and, once shut, refuses new ones. The zero
// value is open. Safe for concurrent use; a nil *Gate admits everything.
type Gate struct {
	n    atomic.Int64 // calls in flight, plus shut once shut
	mu   sync.Mutex
	zero chan struct{} // made by shut; closed when shut with no call in flight
	done bool          // zero is closed
}

const shut = 1 << 62

// InFlight returns the number of calls in flight.
func (g *Gate) InFlight() int64 { return g.n.Load() &^ shut }

// Enter admits a call unless g is shut.
func (g *Gate) Enter() bool {
	if g == nil {
		return true
	}
	if g.n.Add(1)&shut != 0 {
		g.Leave()
		return false
	}
	return true
}

// Leave ends a call that enter admitted (or undoes a refused one).
func (g *Gate) Leave() {
	if g == nil {
		return
	}
	if g.n.Add(-1) == shut {
		g.mu.Lock()
		g.closeZero()
		g.mu.Unlock()
	}
}

// closeZero closes g.zero if it exists and is open. g.mu is held.
func (g *Gate) closeZero() {
	if g.zero != nil && !g.done {
		g.done = true
		close(g.zero)
	}
}

// Shut refuses new calls and returns a channel closed once no call is in flight.
func (g *Gate) Shut() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	for {
		s := g.n.Load()
		if s&shut != 0 || g.n.CompareAndSwap(s, s|shut) {
			break
		}
	}
	if g.zero == nil {
		g.zero = make(chan struct{})
	}
	if g.n.Load() == shut {
		g.closeZero()
	}
	return g.zero
}
