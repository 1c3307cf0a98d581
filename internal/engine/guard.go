package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"
	"github.com/stockres/stock/internal/errs"
	"github.com/stockres/stock/internal/protocol"
)

// ErrFailover is stock.ErrFailover, documented there: the answer of the calls that take stock
// while isFenced, from a guard's sight of new primaries until a reconcile pass.
var ErrFailover = errs.ErrFailover

// FailoverGuard is stockops.FailoverGuard, documented there; Reserver.Run runs one.
type FailoverGuard struct {
	r    *Reserver
	mu   sync.Mutex
	seen string // the primaries this guard saw at its last check ("" before the first)
}

// newFailoverGuard is stockops.NewFailoverGuard.
func (r *Reserver) newFailoverGuard() *FailoverGuard {
	r.guarded.Store(true)
	g := &FailoverGuard{r: r}
	r.guard.Store(g)
	return g
}

// Check is stockops.FailoverGuard.Check.
func (g *FailoverGuard) Check(ctx context.Context) (fenced bool, err error) {
	// One check at a time: a check that read the epoch before a pass recorded it must not fence
	// after a later check lifted the fence.
	g.mu.Lock()
	defer g.mu.Unlock()
	id, err := g.r.topology(ctx)
	if err != nil {
		return g.r.fenced.Load(), err
	}
	before := g.seen
	g.seen = id
	key := protocol.Epoch(g.r.opts.prefix)
	c := g.r.client
	epoch, err := c.Do(ctx, c.B().Get().Key(key).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		// Nothing recorded: a new deployment, or the key itself was lost with the data. In both
		// cases nothing tells us which writes were lost, so record a baseline only when no item
		// exists yet; otherwise fence until a pass.
		n, serr := c.Do(ctx, c.B().Scard().Key(g.r.registryKey()).Build()).AsInt64()
		if serr != nil {
			return g.r.fenced.Load(), fmt.Errorf("stock: failover guard: %w", serr)
		}
		// A guard that fenced (the primaries changed under it, or the epoch went missing) stays
		// fenced here even once it has seen the new primaries twice: only a pass lifts it.
		if n == 0 && !g.r.fenced.Load() && (before == "" || before == id) {
			if err := c.Do(ctx, c.B().Set().Key(key).Value(id).Nx().Build()).Error(); err != nil && !rueidis.IsRedisNil(err) {
				return g.r.fenced.Load(), fmt.Errorf("stock: failover guard: %w", err)
			}
			g.r.fenced.Store(false)
			return false, nil
		}
		if n == 0 {
			g.fence(ctx, "the primaries changed and the recorded epoch is gone: was "+before+", now "+id)
		} else {
			g.fence(ctx, "no epoch recorded for existing items")
		}
		return true, nil
	}
	if err != nil {
		return g.r.fenced.Load(), fmt.Errorf("stock: failover guard: %w", err)
	}
	if epoch != id {
		g.fence(ctx, "primaries changed: was "+epoch+", now "+id)
		return true, nil
	}
	if g.r.fenced.Swap(false) {
		g.r.opts.logger.InfoContext(ctx, "stock: failover fence lifted: the current primaries were reconciled")
	}
	return false, nil
}

func (g *FailoverGuard) fence(ctx context.Context, why string) {
	if !g.r.fenced.Swap(true) {
		g.r.opts.logger.WarnContext(ctx, "stock: failover fence: deducts and holds refused until a reconcile pass", "why", why)
	}
}

// Run is stockops.FailoverGuard.Run.
func (g *FailoverGuard) Run(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return invalid("guard interval %v", interval)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if g.r.isClosed() {
			return fmt.Errorf("stock: failover guard: %w", ErrReserverClosed)
		}
		if _, err := g.Check(ctx); err != nil && ctx.Err() == nil {
			g.r.opts.logger.WarnContext(ctx, "stock: failover guard", "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// topology identifies the current primaries: each one's run id and replication id, sorted.
func (r *Reserver) topology(ctx context.Context) (string, error) {
	var ids []string
	for addr, node := range r.client.Nodes() {
		info, err := node.Do(ctx, node.B().Info().Section("everything").Build()).ToString()
		if err != nil && ctx.Err() == nil { // a connection broken by the restart: once more
			info, err = node.Do(ctx, node.B().Info().Section("everything").Build()).ToString()
		}
		if err != nil {
			return "", fmt.Errorf("stock: failover guard: INFO %s: %w", addr, err)
		}
		f := infoFields(info, "role", "run_id", "master_replid")
		if f["role"] != "master" {
			continue
		}
		ids = append(ids, f["run_id"]+"/"+f["master_replid"])
	}
	if len(ids) == 0 {
		return "", fmt.Errorf("stock: failover guard: no primary answered")
	}
	slices.Sort(ids)
	return strings.Join(ids, ","), nil
}

func infoFields(info string, names ...string) map[string]string {
	m := map[string]string{}
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && slices.Contains(names, k) {
			m[k] = v
		}
	}
	return m
}

// markReconciled records, after a complete reconcile pass, that the current primaries are
// reconciled, which lifts the fence of every guard at its next check. It reports whether it
// recorded them: not when they changed since the pass began (before).
func (r *Reserver) markReconciled(ctx context.Context, before string) (bool, error) {
	after, err := r.topology(ctx)
	if err != nil {
		return false, err
	}
	if after != before {
		return false, fmt.Errorf("the primaries changed during the pass: was %s, now %s", before, after)
	}
	if err := r.client.Do(ctx, r.client.B().Set().Key(protocol.Epoch(r.opts.prefix)).Value(after).Build()).Error(); err != nil {
		return false, err
	}
	return true, nil
}

// recordBaseline records the current primaries as reconciled (the epoch) when Redis has no
// epoch and no item yet: the first Load of a new deployment, before its item exists, so that
// a failover guard started after it does not take the new deployment for a live one whose
// epoch was lost (which it fences until a reconcile pass). It is the guard's own baseline
// (see failoverGuard.Check), taken earlier. It does nothing when an epoch is recorded, when
// items exist (a live deployment without an epoch: a guard fences it), or when Redis does not
// answer INFO (no guard can run); its errors are dropped, as Load does not depend on it: a
// guard then decides as it did before.
func (r *Reserver) recordBaseline(ctx context.Context) {
	c := r.client
	key := protocol.Epoch(r.opts.prefix)
	if err := c.Do(ctx, c.B().Get().Key(key).Build()).Error(); !rueidis.IsRedisNil(err) {
		return // recorded, or unreadable
	}
	if n, err := c.Do(ctx, c.B().Scard().Key(r.registryKey()).Build()).AsInt64(); err != nil || n > 0 {
		return
	}
	id, err := r.topology(ctx)
	if err != nil {
		return
	}
	_ = c.Do(ctx, c.B().Set().Key(key).Value(id).Nx().Build()).Error()
}

// readyPoll is how often Ready looks again while sales are fenced.
const readyPoll = 50 * time.Millisecond

// Ready is stock.Reserver.Ready.
func (r *Reserver) Ready(ctx context.Context) error {
	for {
		if r.isClosed() { // its commands are refused: waiting would last until ctx ends
			return fmt.Errorf("stock: not ready: %w", ErrReserverClosed)
		}
		why, err := r.notReady(ctx)
		if err == nil && why == "" {
			return nil
		}
		if err != nil {
			why = err.Error()
		}
		t := time.NewTimer(readyPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("stock: not ready: %s: %w", why, ctx.Err())
		case <-t.C:
		}
	}
}

// notReady says why sales are fenced ("" when they are not).
func (r *Reserver) notReady(ctx context.Context) (string, error) {
	if r.fenced.Load() {
		if g := r.guard.Load(); g != nil {
			if fenced, err := g.Check(ctx); err != nil || fenced {
				return "the failover guard fences sales until a reconcile pass", err
			}
		}
	}
	id, err := r.topology(ctx)
	if isRedisErr(err) {
		return "", nil // no INFO: no guard can run
	}
	if err != nil {
		return "", err
	}
	c := r.client
	epoch, err := c.Do(ctx, c.B().Get().Key(protocol.Epoch(r.opts.prefix)).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		n, err := c.Do(ctx, c.B().Scard().Key(r.registryKey()).Build()).AsInt64()
		if err != nil {
			return "", err
		}
		if n == 0 {
			return "", nil // a new deployment: its first Load or check records the epoch
		}
		return "no epoch recorded for existing items", nil
	}
	if err != nil {
		return "", err
	}
	if epoch != id {
		return "the primaries changed since the last reconcile pass", nil
	}
	return "", nil
}
