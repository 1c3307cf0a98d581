package engine

import (
	"fmt"
	"strings"
)

// What the relays and reconcilers report. Package stockops exports them under the same names.

// RelayStats counts what one pass of a relay did (stockops.RelayStats, documented there).
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

// Report is what one reconcile pass found and did for one item (stockops.Report, documented there).
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

// PassResult is what one reconcile pass over every item found and did (stockops.PassResult,
// documented there).
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
