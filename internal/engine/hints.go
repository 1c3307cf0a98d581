package engine

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"
	"github.com/stockres/stock/internal/protocol"
)

// Due-work hints: the background loops of Run find the items with work without visiting the
// others. After a script call that may queue events (or take a hold), the Reserver records the
// item in the prefix's hint sets (protocol.RelayDue, protocol.HoldsDue) from a goroutine of its
// own, a moment after the call returned. The relay and the sweeper take the hints that are due,
// and walk the registry slowly besides (relayScan, sweepScan items per round), which finds what
// a lost hint (a crash before the write, a failover, a user without the keys in the ACL) left:
// the hints decide how soon the work is done, never whether.

// writeHints writes relay hints (scored at), and hold hints with their deadlines (the earliest
// one kept). A relay hint already there keeps its score: a later one that the relay chose
// (the end of a backoff) must not be pulled earlier.
func (r *Reserver) writeHints(ctx context.Context, relay map[string]struct{}, holds map[string]int64, at int64) error {
	c := r.client
	var cmds rueidis.Commands
	if len(relay) > 0 {
		var shards [protocol.DueShards][]string
		for sku := range relay {
			n := protocol.DueShard(sku)
			shards[n] = append(shards[n], sku)
		}
		score := float64(at)
		for n, skus := range shards {
			if len(skus) == 0 {
				continue
			}
			z := c.B().Zadd().Key(protocol.RelayDue(r.opts.prefix, n)).Nx().ScoreMember()
			for _, sku := range skus {
				z = z.ScoreMember(score, sku)
			}
			cmds = append(cmds, z.Build())
		}
	}
	if len(holds) > 0 {
		var shards [protocol.DueShards]map[string]int64
		for sku, ms := range holds {
			n := protocol.DueShard(sku)
			if shards[n] == nil {
				shards[n] = map[string]int64{}
			}
			shards[n][sku] = ms
		}
		for n, m := range shards {
			if len(m) == 0 {
				continue
			}
			z := c.B().Zadd().Key(protocol.HoldsDue(r.opts.prefix, n)).Lt().ScoreMember()
			for sku, ms := range m {
				z = z.ScoreMember(float64(ms), sku)
			}
			cmds = append(cmds, z.Build())
		}
	}
	for _, res := range c.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			return err
		}
	}
	return nil
}

// retryAt sets sku's relay hint to at (ms): the relay looks at the item again then, not before.
func (r *Reserver) retryAt(ctx context.Context, sku string, at time.Time) {
	c := r.client
	score := float64(0) // the zero time: now
	if !at.IsZero() {
		score = float64(at.UnixMilli())
	}
	cmd := c.B().Zadd().Key(protocol.RelayDue(r.opts.prefix, protocol.DueShard(sku))).ScoreMember().
		ScoreMember(score, sku).Build()
	if err := c.Do(ctx, cmd).Error(); err != nil && ctx.Err() == nil {
		r.opts.logger.WarnContext(ctx, "stock: due-work hint not written", "sku", sku, "err", err)
	}
}

// takeDue removes and returns the items whose hints in the sets of keys(n) are due at now (ms),
// at most limit per shard. Two loops taking the same hint both look at the item, which is
// harmless (the item's lease serializes them).
func (r *Reserver) takeDue(ctx context.Context, keys func(prefix string, n int) string, now int64, limit int64) ([]string, error) {
	c := r.client
	cmds := make(rueidis.Commands, protocol.DueShards)
	for n := range cmds {
		cmds[n] = c.B().Zrangebyscore().Key(keys(r.opts.prefix, n)).Min("-inf").Max(strconv.FormatInt(now, 10)).
			Limit(0, limit).Build()
	}
	var out []string
	var rems rueidis.Commands
	for n, res := range c.DoMulti(ctx, cmds...) {
		skus, err := res.AsStrSlice()
		if err != nil {
			return nil, err
		}
		if len(skus) > 0 {
			out = append(out, skus...)
			rems = append(rems, c.B().Zrem().Key(keys(r.opts.prefix, n)).Member(skus...).Build())
		}
	}
	for _, res := range c.DoMulti(ctx, rems...) {
		if err := res.Error(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// registryWalk walks the registry a few items at a time, for the slow walk of the background
// loops. Not safe for concurrent use.
type registryWalk struct {
	cursor uint64
	buf    []string
	last   bool      // buf is the last part of the registry: the walk starts again after it
	at     time.Time // the last step (process time: it paces work, it decides no deadline)
}

// The slow walk looks at walkRate items a second, and at least walkMin at a step, so that a
// catalogue of up to walkMin items is looked at whole at every step, as if there were no hints.
const (
	walkRate = 256
	walkMin  = 32
	walkMax  = 1000
)

// step returns the items of the next step of the walk: as many as walkRate allows for the
// time since the last step (between walkMin and walkMax).
func (w *registryWalk) step(ctx context.Context, r *Reserver) ([]string, error) {
	now := time.Now()
	n := walkMin
	if !w.at.IsZero() {
		n = int(min(max(now.Sub(w.at).Seconds()*walkRate, walkMin), walkMax))
	}
	w.at = now
	return w.next(ctx, r, n)
}

// next returns up to n items, going on where the last call stopped; at the end of the
// registry it returns what it has, and the next call starts from the beginning.
func (w *registryWalk) next(ctx context.Context, r *Reserver, n int) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	for len(out) < n {
		if len(w.buf) == 0 {
			if w.last {
				w.last = false
				return out, nil
			}
			se, err := r.client.Do(ctx, r.client.B().Sscan().Key(r.registryKey()).Cursor(w.cursor).
				Count(int64(min(n, 1000))).Build()).AsScanEntry()
			if err != nil {
				return out, err
			}
			w.buf, w.cursor, w.last = se.Elements, se.Cursor, se.Cursor == 0
			continue
		}
		sku := w.buf[0]
		w.buf = w.buf[1:]
		if !seen[sku] { // SSCAN may return an element twice
			seen[sku] = true
			out = append(out, sku)
		}
	}
	return out, nil
}

// noteEvents records that skus may have queued events (nothing when the outbox is off).
func (r *Reserver) noteEvents(skus ...string) {
	if r.opts.outbox {
		r.hints.Events(skus...)
	}
}

// noteHold records that sku has a new hold, and perhaps events (see hints.hold).
func (r *Reserver) noteHold(sku string) {
	r.hints.Hold(sku, r.opts.outbox)
}

// serverClock is Redis's clock as read by TIME at the start of a pass, moved on by the process
// clock since; the process clock alone (or WithClock's) when TIME fails. Safe for concurrent use.
type serverClock struct {
	mu   sync.Mutex
	base time.Time // Redis's time at the last read
	at   time.Time // the process time of the last read
}

// read reads Redis's clock and returns it.
func (c *serverClock) read(ctx context.Context, r *Reserver) time.Time {
	now, err := r.serverNow(ctx)
	if err != nil {
		now = r.opts.now()
	}
	c.mu.Lock()
	c.base, c.at = now, time.Now()
	c.mu.Unlock()
	return now
}

// now is Redis's time: the last read, plus the time since.
func (c *serverClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.base.IsZero() {
		return time.Now()
	}
	return c.base.Add(time.Since(c.at))
}

// serverNow returns Redis's clock (TIME).
func (r *Reserver) serverNow(ctx context.Context) (time.Time, error) {
	vs, err := r.client.Do(ctx, r.client.B().Time().Build()).AsStrSlice()
	if err != nil {
		return time.Time{}, err
	}
	if len(vs) != 2 {
		return time.Time{}, fmt.Errorf("TIME answered %d values", len(vs))
	}
	s, err1 := strconv.ParseInt(vs[0], 10, 64)
	us, err2 := strconv.ParseInt(vs[1], 10, 64)
	if err1 != nil || err2 != nil {
		return time.Time{}, fmt.Errorf("TIME answered %q", vs)
	}
	return time.Unix(s, us*1000), nil
}
