package engine

// Delisting and retiring an item split over buckets (WithBuckets).
//
// Delist closes every bucket, then stamps each as delisted: a Delist cut after the buckets are
// closed leaves the item closed whole (one cut while closing them may leave some open), and a
// second Delist finishes it. While any bucket is delisted, ReopenItem
// refuses the item whole (ErrClosed), and so does Load (ErrLoaded).
//
// A reconcile pass retires the item once every bucket is delisted, the retention has passed,
// and the buckets as a whole agree with the Store with nothing pending, no live hold and no
// transfer in flight: it retires the buckets one by one, the last bucket first and bucket 0
// last, each in bounded steps of retire.lua (which checks, at every step, that its bucket is
// closed, delisted and idle, and removes its keys, the bucket's transfers, in-flight set and
// claims included), and takes each out of the registry. A pass cut between buckets leaves the
// item partly retired: the next pass finds a bucket retired and only finishes the retirement
// (it compares nothing and rebuilds nothing), and until then Load refuses the item with
// ErrLoaded, since its remaining buckets are delisted. Since the last bucket to go is bucket 0,
// a retired bucket 0 means a retired item.

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/rueidis"
	"github.com/stockres/stock/internal/protocol"
)

// bucketLife is what a bucket's hash says of its lifecycle.
type bucketLife struct {
	loaded   bool  // the hash has its counters
	retired  bool  // retired: the hash keeps only x and d
	delisted int64 // when it was delisted (ms), 0 for never
}

// bucketLives reads the lifecycle of each of the n buckets of sku.
func (r *Reserver) bucketLives(ctx context.Context, sku string, n int) ([]bucketLife, error) {
	cmds := make(rueidis.Commands, 0, n)
	for i := range n {
		cmds = append(cmds, r.client.B().Hmget().Key(r.item(bucketName(sku, i)).Item).Field("a", "x", "d").Build())
	}
	out := make([]bucketLife, n)
	for i, res := range r.client.DoMulti(ctx, cmds...) {
		vs, err := res.ToArray()
		if err != nil {
			return nil, fmt.Errorf("bucket %d: %w", i, err)
		}
		if len(vs) != 3 {
			return nil, fmt.Errorf("%w: bucket %d: %d fields", ErrInvalid, i, len(vs))
		}
		x, _ := vs[1].ToString()
		d, _ := vs[2].AsInt64()
		out[i] = bucketLife{loaded: !vs[0].IsNil(), retired: x == "1", delisted: d}
	}
	return out, nil
}

// delistBucketed is Delist of an item of n buckets: every bucket not retired yet is closed, and
// then delisted.
func (r *Reserver) delistBucketed(ctx context.Context, sku string, n int) error {
	st, err := r.bucketLives(ctx, sku, n)
	if err != nil {
		return fmt.Errorf("stock: delist %s: %w", sku, err)
	}
	live := 0
	for _, s := range st {
		if !s.retired {
			live++
		}
	}
	if live == 0 {
		return fmt.Errorf("%w: %s", ErrNotLoaded, sku)
	}
	// Closed whole first: a Delist cut half way never leaves a bucket on sale beside a
	// delisted one (a cut while closing may leave some buckets open and none delisted; the
	// caller's Delist again finishes it).
	for i, s := range st {
		if !s.retired {
			if err := r.setClosedIn(ctx, sku, bucketName(sku, i), "1"); err != nil {
				return err
			}
		}
	}
	for i, s := range st {
		if s.retired {
			continue
		}
		code, _, err := decodePair(protocol.Delist.Exec(ctx, r.client, r.item(bucketName(sku, i)).ForMarks(), nil))
		if err != nil {
			return fmt.Errorf("stock: delist %s: bucket %d: %w", sku, i, err)
		}
		if code == protocol.NotLoaded {
			return fmt.Errorf("%w: %s", ErrNotLoaded, sku)
		}
		if err := codeErr(code); err != nil {
			return err
		}
	}
	return nil
}

// delistedBucket returns the index of a bucket of sku (of n) that is delisted and not retired,
// or -1: the item is delisted, or partly so (a Delist cut half way, or a retirement under way).
func (r *Reserver) delistedBucket(ctx context.Context, sku string, n int) (int, error) {
	st, err := r.bucketLives(ctx, sku, n)
	if err != nil {
		return 0, err
	}
	for i, s := range st {
		if s.delisted > 0 && !s.retired {
			return i, nil
		}
	}
	return -1, nil
}

// refuseReopen answers ErrClosed, before any bucket is reopened, for an item of n buckets of
// which one is delisted: a delisting is for good, and the item opens or closes whole.
func (r *Reserver) refuseReopen(ctx context.Context, sku string, n int) error {
	b, err := r.delistedBucket(ctx, sku, n)
	if err != nil {
		return fmt.Errorf("stock: close %s: %w", sku, err)
	}
	if b >= 0 {
		return fmt.Errorf("%w: %s is delisted and cannot be reopened", ErrClosed, sku)
	}
	return nil
}

// refuseLoad answers ErrLoaded, before any bucket is loaded, for an item of n buckets of which
// one is delisted and not retired: a reconcile pass retires it first (finishing a retirement
// under way), then it may be loaded again.
func (r *Reserver) refuseLoad(ctx context.Context, sku string, n int) error {
	b, err := r.delistedBucket(ctx, sku, n)
	if err != nil {
		return fmt.Errorf("stock: load %s: %w", sku, err)
	}
	if b >= 0 {
		return fmt.Errorf("%w: %s is delisted and not yet retired (bucket %d): a reconcile pass retires it, then it may be loaded again", ErrLoaded, sku, b)
	}
	return nil
}

// bucketLifecycle reads the lifecycle of the n buckets of sku at the start of a pass, under
// their leases. done: the pass is over, rp says why: the item is retired (rp.Retired), or
// partly retired, and this call went on with the retirement, or partly loaded again after it.
func (rc *Reconciler) bucketLifecycle(ctx context.Context, sku string, n int, rp *report) (st []bucketLife, done bool, err error) {
	st, err = rc.r.bucketLives(ctx, sku, n)
	if err != nil {
		return nil, false, fmt.Errorf("stock: reconcile %s: %w", sku, err)
	}
	var retired, live []string
	for i, s := range st {
		switch {
		case s.retired:
			retired = append(retired, bucketName(sku, i))
		case s.delisted == 0:
			live = append(live, bucketName(sku, i))
		}
	}
	switch {
	case len(retired) == 0:
		return st, false, nil
	case len(retired) == n:
		rp.Retired = true
		if !rc.dry { // a registry entry left by a pass cut after a bucket's last step
			if err := rc.unregister(ctx, retired...); err != nil {
				return nil, true, fmt.Errorf("stock: reconcile %s: %w", sku, err)
			}
		}
		return st, true, nil
	case len(live) > 0:
		// Buckets on sale beside retired ones: a Load after the retirement, cut half way.
		rp.NeedsHuman = fmt.Sprintf("the item is partly loaded again after its retirement (%s retired): Load it again to finish", strings.Join(retired, ", "))
		return st, true, nil
	}
	// Partly retired: every other bucket is delisted. They were found idle and in agreement
	// with the store when the retirement began, and are closed since; retire.lua checks again
	// that each is idle. Nothing is compared or rebuilt.
	if rc.dry || rc.retention <= 0 {
		return st, true, nil
	}
	return st, true, rc.retireBuckets(ctx, sku, n, rp)
}

// retireBuckets retires the buckets of sku (of n), the last first, as far as retire.lua lets
// it: rp.Retired when every bucket is.
func (rc *Reconciler) retireBuckets(ctx context.Context, sku string, n int, rp *report) error {
	cutoff := rc.r.opts.now().Add(-rc.retention).UnixMilli()
	for i := n - 1; i >= 0; i-- {
		name := bucketName(sku, i)
		k := rc.r.item(name)
		keys := append(k.ForRetire(), k.Published, k.Transfers, k.InFlight, k.Claims, k.Barriers)
		code, err := rc.retireSteps(ctx, rp, name, keys, cutoff)
		if err != nil {
			return err
		}
		switch code {
		case protocol.OK:
			continue
		case protocol.Closed: // delisted but open for sale: retire.lua never removes a live bucket
			rp.NeedsHuman = fmt.Sprintf("bucket %d of the item is delisted but open for sale: Close the item to let it retire", i)
			return nil
		}
		// Not retirable now: say what waits, for a later pass.
		return rc.retireWaits(ctx, sku, n, rp)
	}
	rp.Retired = true
	return nil
}

// retireWaits reports the events that may keep the buckets of a partly retired item from
// retiring: pending, published or dead.
func (rc *Reconciler) retireWaits(ctx context.Context, sku string, n int, rp *report) error {
	c := rc.r.client
	cmds := make(rueidis.Commands, 0, 3*n)
	for i := range n {
		k := rc.r.item(bucketName(sku, i))
		cmds = append(cmds, c.B().Zcard().Key(k.Outbox).Build(), c.B().Zcard().Key(k.Published).Build(),
			c.B().Zcard().Key(k.Dead).Build())
	}
	var counts [3]int64
	for i, res := range c.DoMulti(ctx, cmds...) {
		v, err := res.AsInt64()
		if err != nil {
			return fmt.Errorf("stock: reconcile %s: %w", sku, err)
		}
		counts[i%3] += v
	}
	rp.Pending, rp.Published, rp.DeadLetters = int(counts[0]), int(counts[1]), int(counts[2])
	if rp.DeadLetters > 0 && rp.NeedsHuman == "" {
		rp.NeedsHuman = fmt.Sprintf("%d events the store rejected as invalid wait in the dead-letter set of the partly retired item", rp.DeadLetters)
	}
	return nil
}

// concludeBucketed ends a full pass of an item of n buckets whose lifecycle st was read at its
// start: an item delisted in every bucket is retired once its retention has passed, when the
// pass found the buckets as a whole in agreement with the store and nothing pending, no live
// hold and no transfer in flight.
func (rc *Reconciler) concludeBucketed(ctx context.Context, sku string, n int, rp *report, st []bucketLife) error {
	var latest int64
	delisted := 0
	for _, s := range st {
		if s.delisted > 0 {
			delisted++
			latest = max(latest, s.delisted)
		}
	}
	if delisted == 0 {
		return nil
	}
	if delisted < n {
		if rp.NeedsHuman == "" {
			rp.NeedsHuman = "the item is delisted in some of its buckets only (a Delist cut half way): Delist it again"
		}
		return nil
	}
	if rc.retention <= 0 || rc.dry || rp.NeedsHuman != "" || rp.Drift != 0 || rp.Pending != 0 || rp.Published != 0 ||
		rp.DeadLetters != 0 || rp.Orphaned != 0 || rp.Missing || rp.Held != 0 {
		return nil
	}
	if latest > rc.r.opts.now().Add(-rc.retention).UnixMilli() {
		return nil
	}
	// Transfers in flight (and live holds) anywhere stop the retirement before a first bucket
	// goes, so that a pass rarely leaves the item partly retired.
	c := rc.r.client
	cmds := make(rueidis.Commands, 0, 2*n)
	for i := range n {
		k := rc.r.item(bucketName(sku, i))
		cmds = append(cmds, c.B().Zcard().Key(k.InFlight).Build(), c.B().Zcard().Key(k.Holds).Build())
	}
	for _, res := range c.DoMulti(ctx, cmds...) {
		v, err := res.AsInt64()
		if err != nil {
			return fmt.Errorf("stock: reconcile %s: %w", sku, err)
		}
		if v > 0 {
			return nil
		}
	}
	return rc.retireBuckets(ctx, sku, n, rp)
}
