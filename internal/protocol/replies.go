package protocol

import (
	"fmt"
	"strconv"
)

// OutboxEvent is an event as a script returns it: its outbox member, its ledger entry ("" when
// the entry is gone) and, where the script says, its delivery attempts and sequence.
type OutboxEvent struct {
	Member, Entry string
	Tries, Seq    int64
}

// SnapshotReply is snapshot.lua's reply: an item's counters and its undelivered events, read
// at one instant.
type SnapshotReply struct {
	Exists                        bool
	Available, Held, Sold, Loaded int64
	Pending, Dead, Published      int   // the sizes of the outbox, dead-letter and published sets
	Transferred                   int64 // a bucket's net units transferred in (t)
	// Events are the pending events, then the dead letters, then the published ones, at most
	// the script's limit of each (Member and Entry only).
	Events []OutboxEvent
}

// ParseSnapshotReply reads snapshot.lua's flat reply: exists, a, h, s, l, the three set sizes,
// t, then member and entry per event.
func ParseSnapshotReply(vs []string) (SnapshotReply, error) {
	if len(vs) < 9 || (len(vs)-9)%2 != 0 {
		return SnapshotReply{}, fmt.Errorf("snapshot of %d values", len(vs))
	}
	r := SnapshotReply{Exists: vs[0] == "1"}
	r.Available, _ = strconv.ParseInt(vs[1], 10, 64)
	r.Held, _ = strconv.ParseInt(vs[2], 10, 64)
	r.Sold, _ = strconv.ParseInt(vs[3], 10, 64)
	r.Loaded, _ = strconv.ParseInt(vs[4], 10, 64)
	r.Pending, _ = strconv.Atoi(vs[5])
	r.Dead, _ = strconv.Atoi(vs[6])
	r.Published, _ = strconv.Atoi(vs[7])
	r.Transferred, _ = strconv.ParseInt(vs[8], 10, 64)
	r.Events = make([]OutboxEvent, 0, (len(vs)-9)/2)
	for i := 9; i < len(vs); i += 2 {
		r.Events = append(r.Events, OutboxEvent{Member: vs[i], Entry: vs[i+1]})
	}
	return r, nil
}

// ClaimBusy is claim.lua's reply when another holder has the item's lease while its outbox
// has events: the holder's kind ('b' a backoff, 'l' another relay or a reconcile pass) and the
// lease's remaining time in ms.
type ClaimBusy struct {
	Backoff bool
	TTL     int64
}

// ParseClaimBusy reads claim.lua's busy reply (two values: kind and TTL); ok is false for a
// reply of events.
func ParseClaimBusy(vs []string) (b ClaimBusy, ok bool) {
	if len(vs) != 2 || (vs[0] != "b" && vs[0] != "l") {
		return ClaimBusy{}, false
	}
	ttl, err := strconv.ParseInt(vs[1], 10, 64)
	if err != nil {
		return ClaimBusy{}, false
	}
	return ClaimBusy{Backoff: vs[0] == "b", TTL: ttl}, true
}

// ParseClaimReply reads claim.lua's flat reply: member, entry, attempts and sequence per
// event, oldest first (see ParseClaimBusy for the reply of a busy item).
func ParseClaimReply(vs []string) ([]OutboxEvent, error) {
	if len(vs)%4 != 0 {
		return nil, fmt.Errorf("%d values", len(vs))
	}
	out := make([]OutboxEvent, 0, len(vs)/4)
	for i := 0; i < len(vs); i += 4 {
		ev := OutboxEvent{Member: vs[i], Entry: vs[i+1]}
		ev.Tries, _ = strconv.ParseInt(vs[i+2], 10, 64)
		ev.Seq, _ = strconv.ParseInt(vs[i+3], 10, 64)
		out = append(out, ev)
	}
	return out, nil
}

// TurnReply is turn.lua's reply: what a consumer must apply before an event.
type TurnReply struct {
	Reconciling bool          // a reconcile pass holds the item: apply nothing now
	More        bool          // a set had more earlier events than the script returns
	Earlier     []OutboxEvent // earlier events not applied yet (Member, Entry, Seq), in no order
}

// ParseTurnReply reads turn.lua's flat reply: a status ('0', '1' more, '2' reconciling), then
// member, entry and sequence per earlier event.
func ParseTurnReply(vs []string) (TurnReply, error) {
	if len(vs) == 0 || (len(vs)-1)%3 != 0 {
		return TurnReply{}, fmt.Errorf("%d values", len(vs))
	}
	r := TurnReply{Reconciling: vs[0] == "2", More: vs[0] == "1"}
	for i := 1; i < len(vs); i += 3 {
		ev := OutboxEvent{Member: vs[i], Entry: vs[i+1]}
		ev.Seq, _ = strconv.ParseInt(vs[i+2], 10, 64)
		r.Earlier = append(r.Earlier, ev)
	}
	return r, nil
}
