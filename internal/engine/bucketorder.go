package engine

import (
	"context"
	"fmt"
	"strconv"

	"github.com/stockres/stock/internal/protocol"
)

// Cross-bucket order. The relay delivers each item's events in sequence; the buckets of a split
// item are items of their own, drained independently. A transfer is the only link between
// them: units a bucket's events gave back (a restock, a restore, a cancel, an expired hold) may
// move to a sibling and be sold there. xin.lua records each transfer in the target as a barrier
// (protocol.Keys.Barriers): the target's events after it may depend on the donor's events up to
// the donor's sequence when the units left it. The relay delivers a bucket's events past a
// barrier only once the barrier is met: the donor has no undelivered event up to that sequence
// left in its outbox, and the donor's own barriers up to it are met (units can move on through
// a bucket that writes no event of its own). "Delivered" is what the relay did: applied by the
// Store, or, without a Store, handed to the Publisher (the event left the outbox for the
// published set); on the queue path, Consume applies what a queue hands it in each bucket's
// order only (see Consume). A barrier met is removed. Barriers cannot wait on one another in a
// circle: a barrier waits only on events and barriers written before the transfer that set it.

// maxBarriers bounds the barriers of one bucket read at a time.
const maxBarriers = 64

// maxBarrierDepth bounds how far a check follows barriers from bucket to bucket.
const maxBarrierDepth = 256

// barrierCut returns the last sequence of bucket sku's events up to last that may be delivered
// now: last when sku is not a bucket or no barrier below last is unmet, else the score of the
// lowest unmet barrier. applied: an event counts as delivered once applied by the store
// (Consume: it left the outbox and the published set), else once it left the outbox (the
// relay: applied by its Store or handed to its Publisher). A barrier is removed once settled:
// every event it waits for applied, whichever mode looked.
func (r *Reserver) barrierCut(ctx context.Context, sku string, last int64, applied bool) (int64, error) {
	parent, b := splitBucket(sku)
	if b < 0 || r.bucketsOf(parent) == 0 {
		return last, nil
	}
	k := r.item(sku)
	c := r.client
	// Page by page: barriers met but not settled (on the queue path, until consumers apply the
	// donor's events) stay, and may be many; the settled ones are removed after the walk, so
	// that the pages do not shift under it.
	var settled []string
	defer func() {
		if len(settled) > 0 {
			_ = c.Do(ctx, c.B().Zrem().Key(k.Barriers).Member(settled...).Build()).Error() // a later look removes what is left
		}
	}()
	seen := map[string]barrierState{}
	for page := int64(0); ; page++ {
		vs, err := c.Do(ctx, c.B().Zrange().Key(k.Barriers).Min("-inf").Max("("+strconv.FormatInt(last, 10)).Byscore().Limit(page*maxBarriers, maxBarriers).Withscores().Build()).AsZScores()
		if err != nil {
			return 0, fmt.Errorf("stock: %s: transfer barriers: %w", sku, err)
		}
		for _, z := range vs {
			bs, err := r.barrierMet(ctx, parent, b, z.Member, applied, seen, 0)
			if err != nil {
				return 0, err
			}
			if bs.settled {
				settled = append(settled, z.Member)
			}
			if !bs.met {
				return int64(z.Score), nil
			}
		}
		if len(vs) < maxBarriers {
			return last, nil
		}
		if page+1 >= maxBarrierDepth {
			// More barriers than a look reads: the events up to the last one read are clear.
			return int64(vs[len(vs)-1].Score), nil
		}
	}
}

// barrierState is what a check found of a barrier: met (for the mode of the check: the events
// it waits for are delivered) and settled (they are applied: the barrier can go).
type barrierState struct{ met, settled bool }

// barrierMet checks the barrier member of bucket b of item parent: its donor has no
// undelivered (unapplied) event up to the barrier's sequence, and its own barriers up to it
// are met (settled); those it finds settled, it removes. seen remembers the answers of this
// check; applied: see barrierCut.
func (r *Reserver) barrierMet(ctx context.Context, parent string, b int, member string, applied bool, seen map[string]barrierState, depth int) (barrierState, error) {
	bar, err := protocol.ParseBarrier(member)
	if err != nil || bar.Donor == b || bar.Donor >= maxBuckets {
		return barrierState{}, fmt.Errorf("%w: %s: transfer barrier %q of bucket %d: %v", ErrInvalid, parent, member, b, err)
	}
	key := strconv.Itoa(bar.Donor) + "|" + strconv.FormatInt(bar.Seq, 10)
	if bs, ok := seen[key]; ok {
		return bs, nil
	}
	if depth >= maxBarrierDepth {
		return barrierState{}, nil // checked again later, once the barriers nearer have been removed
	}
	seen[key] = barrierState{}
	dk := r.item(bucketName(parent, bar.Donor))
	c := r.client
	seq := strconv.FormatInt(bar.Seq, 10)
	res := c.DoMulti(ctx, c.B().Zcount().Key(dk.Outbox).Min("-inf").Max(seq).Build(),
		c.B().Zcount().Key(dk.Published).Min("-inf").Max(seq).Build())
	var n [2]int64
	for i := range n {
		if n[i], err = res[i].AsInt64(); err != nil {
			return barrierState{}, fmt.Errorf("stock: %s: transfer barrier of bucket %d: %w", parent, b, err)
		}
	}
	bs := barrierState{met: n[0] == 0 && (!applied || n[1] == 0), settled: n[0] == 0 && n[1] == 0}
	if !bs.met {
		return barrierState{}, nil
	}
	// The donor's own barriers up to seq, page by page (a donor whose barriers are met but not
	// settled, as on the queue path until consumers apply its events, may have many); the
	// settled ones are removed after the walk, so that the pages do not shift under it.
	var settled []string
	defer func() {
		if len(settled) > 0 {
			_ = c.Do(ctx, c.B().Zrem().Key(dk.Barriers).Member(settled...).Build()).Error() // a later look removes what is left
		}
	}()
	for page := int64(0); ; page++ {
		if page >= maxBarrierDepth {
			return barrierState{}, nil // checked again later, once fewer are left
		}
		vs, err := c.Do(ctx, c.B().Zrange().Key(dk.Barriers).Min("-inf").Max(seq).Byscore().Limit(page*maxBarriers, maxBarriers).Build()).AsStrSlice()
		if err != nil {
			return barrierState{}, fmt.Errorf("stock: %s: transfer barriers of bucket %d: %w", parent, bar.Donor, err)
		}
		for _, m := range vs {
			sub, err := r.barrierMet(ctx, parent, bar.Donor, m, applied, seen, depth+1)
			if err != nil {
				return barrierState{}, err
			}
			if sub.settled {
				settled = append(settled, m)
			}
			if !sub.met {
				return barrierState{}, nil
			}
			bs.settled = bs.settled && sub.settled
		}
		if len(vs) < maxBarriers {
			break
		}
	}
	seen[key] = bs
	return bs, nil
}
