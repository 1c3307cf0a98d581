package stock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/rueidis"
	"github.com/stockres/stock/internal/protocol"
)

// DefaultTimeout bounds every Redis command and script call a Reserver (and its relays,
// reconcilers and failover guards) sends, unless WithTimeout says otherwise. It covers the
// whole call, rueidis's own resends of a retryable script after a broken connection and its
// dials included (rueidis dials for up to 5 s by default), and is long enough to ride out a
// restart of Redis or a quick failover.
const DefaultTimeout = 10 * time.Second

// boundedClient is a rueidis.Client whose commands end after timeout at the latest, and whose
// errors other than Redis's own replies wrap ErrUnknownOutcome.
type boundedClient struct {
	rueidis.Client
	timeout time.Duration
	fn      *protocol.Functions // whether the scripts run as Redis functions (protocol.Script.Exec)
	gate    *gate               // the commands in flight; shut by Reserver.Close
}

// StockFunctions makes the scripts this client runs Redis functions where the server has them.
func (c boundedClient) StockFunctions() *protocol.Functions { return c.fn }

// bounded returns c with its commands bounded by timeout, and refused once g is shut.
func bounded(c rueidis.Client, timeout time.Duration, g *gate) rueidis.Client {
	if b, ok := c.(boundedClient); ok {
		c = b.Client
	}
	return boundedClient{Client: c, timeout: timeout, fn: protocol.NewFunctions(), gate: g}
}

// closedResults is the answer to n commands refused by a closed Reserver: none was sent.
func closedResults(n int) []rueidis.RedisResult {
	out := make([]rueidis.RedisResult, n)
	for i := range out {
		out[i] = rueidis.NewErrorResult(ErrReserverClosed)
	}
	return out
}

func (c boundedClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if !c.gate.enter() {
		return rueidis.NewErrorResult(ErrReserverClosed)
	}
	defer c.gate.leave()
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return unknownResult(ctx, c.Client.Do(ctx, cmd))
}

func (c boundedClient) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	if !c.gate.enter() {
		return closedResults(len(cmds))
	}
	defer c.gate.leave()
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return unknownResults(ctx, c.Client.DoMulti(ctx, cmds...))
}

func (c boundedClient) DoCache(ctx context.Context, cmd rueidis.Cacheable, ttl time.Duration) rueidis.RedisResult {
	if !c.gate.enter() {
		return rueidis.NewErrorResult(ErrReserverClosed)
	}
	defer c.gate.leave()
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return unknownResult(ctx, c.Client.DoCache(ctx, cmd, ttl))
}

func (c boundedClient) DoMultiCache(ctx context.Context, cmds ...rueidis.CacheableTTL) []rueidis.RedisResult {
	if !c.gate.enter() {
		return closedResults(len(cmds))
	}
	defer c.gate.leave()
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return unknownResults(ctx, c.Client.DoMultiCache(ctx, cmds...))
}

func (c boundedClient) Dedicated(fn func(rueidis.DedicatedClient) error) error {
	if !c.gate.enter() {
		return ErrReserverClosed
	}
	defer c.gate.leave()
	return c.Client.Dedicated(func(d rueidis.DedicatedClient) error {
		return fn(boundedDedicated{DedicatedClient: d, timeout: c.timeout, gate: c.gate})
	})
}

func (c boundedClient) Dedicate() (rueidis.DedicatedClient, func()) {
	d, cancel := c.Client.Dedicate()
	return boundedDedicated{DedicatedClient: d, timeout: c.timeout, gate: c.gate}, cancel
}

func (c boundedClient) Nodes() map[string]rueidis.Client {
	nodes := c.Client.Nodes()
	out := make(map[string]rueidis.Client, len(nodes))
	for addr, n := range nodes {
		out[addr] = boundedClient{Client: n, timeout: c.timeout, fn: c.fn, gate: c.gate} // one functions state per Reserver
	}
	return out
}

// boundedDedicated is boundedClient's dedicated connection.
type boundedDedicated struct {
	rueidis.DedicatedClient
	timeout time.Duration
	gate    *gate
}

func (c boundedDedicated) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if !c.gate.enter() {
		return rueidis.NewErrorResult(ErrReserverClosed)
	}
	defer c.gate.leave()
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return unknownResult(ctx, c.DedicatedClient.Do(ctx, cmd))
}

func (c boundedDedicated) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	if !c.gate.enter() {
		return closedResults(len(cmds))
	}
	defer c.gate.leave()
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return unknownResults(ctx, c.DedicatedClient.DoMulti(ctx, cmds...))
}

// unknownResult turns a result whose error is not a reply of Redis (a dial error, a broken
// connection, the end of ctx) into one whose error wraps ErrUnknownOutcome, that error and,
// once ctx is done, ctx's error.
func unknownResult(ctx context.Context, res rueidis.RedisResult) rueidis.RedisResult {
	if err := res.NonRedisError(); err != nil {
		return rueidis.NewErrorResult(unknownOutcome(ctx, err))
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

// unknownOutcome wraps err, which left a call's outcome unknown, with ErrUnknownOutcome, and
// with context.DeadlineExceeded (or ctx's error) when ctx is done or its deadline is so close
// that rueidis gave up resending because of it.
func unknownOutcome(ctx context.Context, err error) error {
	if errors.Is(err, ErrUnknownOutcome) {
		return err
	}
	cerr := ctx.Err()
	if dl, ok := ctx.Deadline(); ok && cerr == nil && time.Until(dl) < retryGiveUp {
		cerr = context.DeadlineExceeded
	}
	if cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w: %w (%w)", ErrUnknownOutcome, err, cerr)
	}
	return fmt.Errorf("%w: %w", ErrUnknownOutcome, err)
}
