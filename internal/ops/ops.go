// Package ops carries the data of the operator surface between package stock, which does the
// work, and package stockops, which documents it: RelayStats, Report and PassResult are
// converted to stockops's types of the same fields, and Of hands stockops a Reserver's
// operations without exporting them from package stock.
package ops

import (
	"context"
	"fmt"
	"iter"
	"strings"
	"time"
)

// RelayStats mirrors stockops.RelayStats.
type RelayStats struct {
	Claimed      int
	Delivered    int
	Refused      int
	Retried      int
	Orphaned     int
	Redelive     int
	DeadLettered int
	NotLoaded    int
}

// Add adds o to s.
func (s *RelayStats) Add(o RelayStats) {
	s.Claimed += o.Claimed
	s.Delivered += o.Delivered
	s.Refused += o.Refused
	s.Retried += o.Retried
	s.Orphaned += o.Orphaned
	s.Redelive += o.Redelive
	s.DeadLettered += o.DeadLettered
	s.NotLoaded += o.NotLoaded
}

// Report mirrors stockops.Report.
type Report struct {
	SKU             string
	Busy            bool
	Missing         bool
	Available, Held int64
	StoreRemaining  int64
	Pending         int
	Published       int
	InFlight        int64
	Orphaned        int
	DeadLetters     int
	Drift           int64
	Rebuilt         bool
	Adjusted        int64
	Requeued        int
	Rerecorded      int
	Resynced        int
	Settled         int
	Trimmed         int
	Retired         bool
	Unregistered    bool
	NeedsHuman      string
}

// String is one readable line.
func (rp Report) String() string {
	if rp.Busy {
		return fmt.Sprintf("%s: busy (a relay held it), not compared", rp.SKU)
	}
	if rp.Retired && rp.Trimmed == 0 {
		return fmt.Sprintf("%s: retired", rp.SKU)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: redis %d+%d held, store %d, in flight %d (%d pending", rp.SKU, rp.Available, rp.Held, rp.StoreRemaining, rp.InFlight, rp.Pending)
	if rp.Published > 0 {
		fmt.Fprintf(&b, ", %d published", rp.Published)
	}
	if rp.DeadLetters > 0 {
		fmt.Fprintf(&b, ", %d dead letters", rp.DeadLetters)
	}
	fmt.Fprintf(&b, "), drift %d", rp.Drift)
	if rp.Missing {
		b.WriteString(", key missing")
	}
	if rp.Unregistered {
		b.WriteString(", NOT IN THE REGISTRY (Redis lost it)")
	}
	var fixes []string
	if rp.Rebuilt {
		fixes = append(fixes, "rebuilt")
	}
	if rp.Adjusted != 0 {
		fixes = append(fixes, fmt.Sprintf("adjusted %+d", rp.Adjusted))
	}
	if rp.Requeued > 0 {
		fixes = append(fixes, fmt.Sprintf("requeued %d", rp.Requeued))
	}
	if rp.Rerecorded > 0 {
		fixes = append(fixes, fmt.Sprintf("rerecorded %d", rp.Rerecorded))
	}
	if rp.Resynced > 0 {
		fixes = append(fixes, fmt.Sprintf("resynced %d", rp.Resynced))
	}
	if rp.Settled > 0 {
		fixes = append(fixes, fmt.Sprintf("settled %d published", rp.Settled))
	}
	if rp.Trimmed > 0 {
		fixes = append(fixes, fmt.Sprintf("trimmed %d", rp.Trimmed))
	}
	if rp.Retired {
		fixes = append(fixes, "retired")
	}
	if len(fixes) > 0 {
		b.WriteString("; repaired: " + strings.Join(fixes, ", "))
	}
	if rp.NeedsHuman != "" {
		b.WriteString("; NEEDS A HUMAN: " + rp.NeedsHuman)
	}
	return b.String()
}

// PassResult mirrors stockops.PassResult.
type PassResult struct {
	Reports       []Report
	Errors        []error
	Unregistered  []string
	StoreOnly     []string
	Complete      bool
	EpochRecorded bool
	EpochErr      error
	NeedsHuman    string
}

// Relay is a relay made by package stock.
type Relay interface {
	Once(ctx context.Context) (RelayStats, error)
	Run(ctx context.Context) error
}

// Reconciler is a reconciler made by package stock.
type Reconciler interface {
	Item(ctx context.Context, sku string) (Report, error)
	Once(ctx context.Context) ([]Report, error)
	Pass(ctx context.Context) (PassResult, error)
	Run(ctx context.Context) error
}

// Guard is a failover guard made by package stock.
type Guard interface {
	Check(ctx context.Context) (fenced bool, err error)
	Run(ctx context.Context, interval time.Duration) error
}

// Ops is what package stock does for stockops. Arguments typed any are package stock's types
// (a Store, a Publisher, options); results typed any are too (a Receipt, an iterator of
// Entry).
type Ops interface {
	NewRelay(store, pub, opts any) (Relay, error)
	NewReconciler(store, opts any) (Reconciler, error)
	NewFailoverGuard() Guard
	Pending(ctx context.Context, sku string) (pending, dead int64, err error)
	Items(ctx context.Context) iter.Seq2[string, error]
	Entries(ctx context.Context, sku string) any
	Sweep(ctx context.Context, skus ...string) (int64, error)
	RecoverCarts(ctx context.Context, olderThan time.Duration) (int, error)
	Refuse(ctx context.Context, sku, id string) (any, error)
	SoldOutAnswers() int64
}

// Of returns the operations of a *stock.Reserver; package stock sets it.
var Of func(r any) Ops
