package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/redis/rueidis"
	"github.com/stockres/stock/internal/errs"
)

// ErrRegistryLost is stock.ErrRegistryLost, documented there: Pass's error when it found items
// of the Store missing from the registry ("<prefix>:items").
var ErrRegistryLost = errs.ErrRegistryLost

// storePage is how many of the Store's SKUs a pass reads at a time.
const storePage = 500

// Pass is stockops.Reconciler.Pass.
func (rc *Reconciler) Pass(ctx context.Context) (passResult, error) {
	var res passResult
	every := rc.items == nil
	var epoch string
	var epochErr error
	if every && !rc.dry {
		if epoch, epochErr = rc.r.topology(ctx); epochErr != nil && rc.r.guarded.Load() {
			return res, epochErr
		}
	}
	skus := rc.items
	split := map[string]bool{} // items the registry has as buckets
	if every {
		registered := map[string]bool{}
		for sku, err := range rc.r.items(ctx) {
			if err != nil {
				return res, err
			}
			// A bucket stands for its item, which is passed once, whole.
			if p := parentOf(sku); p != sku {
				split[p] = true
				sku = p
			}
			if !registered[sku] {
				registered[sku] = true
				skus = append(skus, sku)
			}
		}
		slices.Sort(skus)
		lost, storeOnly, err := rc.unregistered(ctx, registered)
		if err != nil {
			return res, err
		}
		skus = append(skus, lost...)
		res.StoreOnly = storeOnly
	}
	var first error
	complete := true
	for _, sku := range skus {
		if split[sku] && rc.r.bucketsOf(sku) == 0 {
			// Passed as a plain item, its missing hash would be rebuilt from the store's stock,
			// which its buckets hold already.
			res.Reports = append(res.Reports, report{SKU: sku, NeedsHuman: "Redis has the item split over buckets, and this Reserver does not split it: not compared"})
			res.Errors = append(res.Errors, nil)
			complete = false
			continue
		}
		rp, err := rc.Item(ctx, sku)
		res.Reports = append(res.Reports, rp)
		res.Errors = append(res.Errors, err)
		if err != nil && first == nil {
			first = err
		}
		if rp.Unregistered {
			res.Unregistered = append(res.Unregistered, sku)
		}
		complete = complete && !rp.Busy && err == nil
	}
	res.Complete = every && complete
	res.NeedsHuman = rc.evictionReport(ctx)
	errs := []error{first}
	if n := len(res.Unregistered); n > 0 {
		what := "registered again"
		if rc.dry {
			what = "dry run: not registered"
		}
		errs = append(errs, fmt.Errorf("%w: %d items of the store were not in the registry (%s): %s",
			ErrRegistryLost, n, what, strings.Join(head(res.Unregistered, 20), ", ")))
	}
	if res.Complete && !rc.dry {
		if epochErr == nil {
			res.EpochRecorded, epochErr = rc.r.markReconciled(ctx, epoch)
		}
		if g := rc.r.guard.Load(); res.EpochRecorded && g != nil {
			// Lift this Reserver's fence now, not at its guard's next check (which may never
			// come: a Run that ended).
			if _, err := g.Check(ctx); err != nil {
				errs = append(errs, err)
			}
		}
		if epochErr != nil {
			res.EpochErr = fmt.Errorf("stock: reconcile: the primaries were not recorded as reconciled: %w", epochErr)
			if rc.r.guarded.Load() {
				errs = append(errs, res.EpochErr)
			}
		}
	}
	return res, errors.Join(errs...)
}

// head returns the first n elements of s, and "…" when there are more.
func head(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(slices.Clip(s[:n]), "…")
}

// unregistered lists the Store's items that are not in registered: those Redis has or had
// (its item hash is live, or the Store holds records of events that came through Redis), in
// SKU order, and those Redis never had. Items retired in Redis are neither. Without an
// ItemLister, it finds nothing.
func (rc *Reconciler) unregistered(ctx context.Context, registered map[string]bool) (lost, storeOnly []string, err error) {
	il, ok := rc.store.(ItemLister)
	if !ok {
		return nil, nil, nil
	}
	rl, _ := rc.store.(RecordLister)
	c := rc.r.client
	after := ""
	for {
		page, err := il.ListItems(ctx, after, storePage)
		if err != nil {
			return nil, nil, fmt.Errorf("stock: reconcile: store items: %w", err)
		}
		var skus []string
		for _, sku := range page {
			if !registered[sku] && checkName("sku", sku) == nil {
				skus = append(skus, sku)
			}
		}
		if len(skus) > 0 {
			cmds := make([]rueidis.Completed, len(skus))
			for i, sku := range skus {
				name := sku
				if rc.r.bucketsOf(sku) > 0 {
					// A split item: its bucket 0, retired last of its buckets (bucketretire.go).
					name = bucketName(sku, 0)
				}
				cmds[i] = c.B().Hmget().Key(rc.r.item(name).Item).Field("a", "x").Build()
			}
			for i, res := range c.DoMulti(ctx, cmds...) {
				vs, err := res.ToArray()
				if err != nil || len(vs) != 2 {
					return nil, nil, fmt.Errorf("stock: reconcile %s: %w", skus[i], err)
				}
				if x, _ := vs[1].ToString(); x == "1" {
					continue // retired: the registry no longer lists it, on purpose
				}
				if !vs[0].IsNil() {
					lost = append(lost, skus[i]) // live keys, lost registry entry
					continue
				}
				had := false
				if rl != nil {
					recs, err := rl.List(ctx, skus[i], "", 1)
					if err != nil {
						return nil, nil, fmt.Errorf("stock: reconcile %s: store records: %w", skus[i], err)
					}
					had = len(recs) > 0
				}
				if had {
					lost = append(lost, skus[i]) // events came through Redis: it lost the item
				} else {
					storeOnly = append(storeOnly, skus[i])
				}
			}
		}
		if len(page) < storePage {
			return lost, storeOnly, nil
		}
		after = page[len(page)-1]
	}
}

// register makes sure an item the pass found in the Store, and that Redis has (or has again
// after a rebuild), is in Redis's registry; a dry run only looks. It sets rp.Unregistered when
// the item was missing from it, and says so to a human when Redis lost the item's keys too.
func (rc *Reconciler) register(ctx context.Context, rp *report) error {
	c := rc.r.client
	var missing bool
	if rc.dry || (rp.Missing && !rp.Rebuilt) {
		in, err := c.Do(ctx, c.B().Sismember().Key(rc.r.registryKey()).Member(rp.SKU).Build()).AsBool()
		if err != nil {
			return fmt.Errorf("stock: reconcile %s: registry: %w", rp.SKU, err)
		}
		missing = !in
	} else {
		n, err := c.Do(ctx, c.B().Sadd().Key(rc.r.registryKey()).Member(rp.SKU).Build()).AsInt64()
		if err != nil {
			return fmt.Errorf("stock: reconcile %s: registry: %w", rp.SKU, err)
		}
		missing = n == 1
	}
	if !missing {
		return nil
	}
	rp.Unregistered = true
	if rp.Missing {
		why := "Redis lost the item and its registry entry (a restart without persistence, FLUSHALL?): " +
			"sales it had not delivered to the store are lost"
		if rp.Rebuilt {
			why += "; rebuilt from the store, on sale again (delist it again if it was delisted)"
		}
		if rp.NeedsHuman != "" {
			why = rp.NeedsHuman + "; " + why
		}
		rp.NeedsHuman = why
	}
	return nil
}

type passResult = PassResult
