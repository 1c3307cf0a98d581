package protocol

import (
	"errors"
	"strconv"
	"strings"
)

// MaxQty is the largest quantity a script handles exactly: 2^53-1, the largest integer a Lua
// number (a double) holds.
const MaxQty = 1<<53 - 1

// Kinds of ledger entries: the first byte of an entry.
const (
	KindDeduct    = 'D'
	KindHold      = 'H'
	KindRestock   = 'L'
	KindTombstone = 'T' // a restore or cancel of an id that had taken nothing
)

// States of ledger entries: the second byte of an entry.
const (
	StateHeld      = 'h' // a live hold
	StateReserved  = 'r' // taken, not yet in the store
	StateApplied   = 'a' // taken and in the store
	StateRestored  = 'x'
	StateRefused   = 'f' // refused by the store, given back
	StateCancelled = 'c'
	StateExpired   = 'e'
)

// Entry is a ledger entry as lua/lib.lua writes it: "KS|qty|after|at|user[|deadline]". at and
// deadline are milliseconds since the epoch (Redis TIME). The last field is a hold's deadline;
// restore.lua writes it on a sale it gives back too, as when it settled (the later of the
// deadline and the give-back for a confirmed hold): the retention counts from it (trim.lua).
type Entry struct {
	Kind, State    byte
	Qty, After, At int64
	User           string
	Deadline       int64
	HasDeadline    bool // the entry carries a deadline field (holds)
}

// Before is the stock available before the operation, which follows from the kind: after + qty
// for deducts and holds, after − qty for restocks, after for tombstones.
func (e Entry) Before() int64 {
	switch e.Kind {
	case KindDeduct, KindHold:
		return e.After + e.Qty
	case KindRestock:
		return e.After - e.Qty
	}
	return e.After
}

// Encode writes e as lua/lib.lua's entry() does.
func (e Entry) Encode() string {
	b := make([]byte, 0, 48+len(e.User))
	b = append(b, e.Kind, e.State, '|')
	b = strconv.AppendInt(b, e.Qty, 10)
	b = append(b, '|')
	b = strconv.AppendInt(b, e.After, 10)
	b = append(b, '|')
	b = strconv.AppendInt(b, e.At, 10)
	b = append(b, '|')
	b = append(b, e.User...)
	if e.HasDeadline {
		b = append(b, '|')
		b = strconv.AppendInt(b, e.Deadline, 10)
	}
	return string(b)
}

func knownKind(k byte) bool {
	return k == KindDeduct || k == KindHold || k == KindRestock || k == KindTombstone
}

func knownState(s byte) bool {
	return strings.IndexByte("hraxfce", s) >= 0
}

// ParseEntry reads a ledger entry. The error says what is wrong, without the entry.
func ParseEntry(s string) (Entry, error) {
	if len(s) < 3 || s[2] != '|' {
		return Entry{}, errors.New("no header")
	}
	e := Entry{Kind: s[0], State: s[1]}
	if !knownKind(e.Kind) || !knownState(e.State) {
		return Entry{}, errors.New("unknown kind or state")
	}
	f := strings.Split(s[3:], "|")
	if len(f) != 4 && len(f) != 5 {
		return Entry{}, errors.New("wrong number of fields")
	}
	var n [3]int64
	for i := range n {
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil || v < 0 {
			return Entry{}, errors.New("bad number")
		}
		n[i] = v
	}
	e.Qty, e.After, e.At, e.User = n[0], n[1], n[2], f[3]
	switch e.Kind {
	case KindDeduct, KindHold:
		if e.Qty > MaxQty || e.After > MaxQty {
			return Entry{}, errors.New("quantity out of range")
		}
	case KindRestock:
		if e.After < e.Qty {
			return Entry{}, errors.New("restock of more than is available after it")
		}
	}
	if len(f) == 5 {
		d, err := strconv.ParseInt(f[4], 10, 64)
		if err != nil || d < 0 {
			return Entry{}, errors.New("bad deadline")
		}
		e.Deadline, e.HasDeadline = d, true
	}
	return e, nil
}

// Outbox events: the letter of an outbox member.
const (
	EventDeducted  = 'D' // a deduct, or a confirmed hold
	EventRestored  = 'R' // a restore, or a refusal by the store
	EventRestocked = 'L'
	EventHeld      = 'H'
	EventCancelled = 'X'
	EventExpired   = 'E'
)

// Member is the outbox member of an event: "<letter>:<id>".
func Member(event byte, id string) string {
	return string(event) + ":" + id
}

// ParseMember splits an outbox member into its event letter and request id; ok is false when
// it is not "<letter>:<id>" with an id.
func ParseMember(m string) (event byte, id string, ok bool) {
	if len(m) < 3 || m[1] != ':' {
		return 0, "", false
	}
	return m[0], m[2:], true
}

// Kinds of take: deduct.lua's and deductmany.lua's kind argument, restore.lua's kind check and
// the cart record's kind. They are the ledger kinds of the entries the takes write.
const (
	TakeDeduct = string(rune(KindDeduct))
	TakeHold   = string(rune(KindHold))
)

// Reasons of a give-back, restore.lua's reason argument: the state the entry ends in.
const (
	ReasonRestore = string(rune(StateRestored)) // Restore, and the reconciler's resyncs
	ReasonRefuse  = string(rune(StateRefused))  // the store refused the sale
	ReasonCancel  = string(rune(StateCancelled))
)

// IsMark reports whether a field of the ledger hash is one of the item's marks ("{closed}",
// "{delisted}", kept there by close.lua and delist.lua) rather than a request id: no request id
// contains a brace.
func IsMark(field string) bool {
	return strings.HasPrefix(field, "{")
}

// Transfer is an entry of a bucket's transfers hash (see xout.lua): "O|target|units|at_ms|seq"
// for a transfer out of the bucket ("O|target|units|at_ms" when written before transfers recorded
// seq), "I|donor|units|at_ms" for one into it.
type Transfer struct {
	Dir   byte  // 'O' out of this bucket, 'I' into it
	Other int   // the other bucket's index
	Units int64 // the units moved
	AtMs  int64 // when this half ran, by Redis's clock
	// Seq is, for a transfer out, the donor's outbox sequence when it took the units: the last
	// event the donor had written then (0: none, or an entry from before it was recorded).
	Seq int64
}

// ParseTransfer reads a transfers hash entry.
func ParseTransfer(s string) (Transfer, error) {
	parts := strings.Split(s, "|")
	if (len(parts) != 4 && len(parts) != 5) || len(parts[0]) != 1 || (parts[0][0] != 'O' && parts[0][0] != 'I') {
		return Transfer{}, errors.New("not a transfer entry")
	}
	if len(parts) == 5 && parts[0][0] != 'O' {
		return Transfer{}, errors.New("not a transfer entry: a sequence on a transfer in")
	}
	other, err1 := strconv.Atoi(parts[1])
	units, err2 := strconv.ParseInt(parts[2], 10, 64)
	at, err3 := strconv.ParseInt(parts[3], 10, 64)
	var seq int64
	var err4 error
	if len(parts) == 5 {
		seq, err4 = strconv.ParseInt(parts[4], 10, 64)
	}
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || other < 0 || units < 1 || at < 0 || seq < 0 {
		return Transfer{}, errors.New("a field of the transfer entry is not a number in range")
	}
	return Transfer{Dir: parts[0][0], Other: other, Units: units, AtMs: at, Seq: seq}, nil
}

// Barrier is a member of a bucket's barriers (Keys.Barriers): "<donor>|<donor seq>|<tid>".
type Barrier struct {
	Donor int    // the donor bucket's index
	Seq   int64  // the donor's outbox sequence when the transfer took the units
	TID   string // the transfer id
}

// BarrierMember is the member of a bucket's barriers for b (xin.lua writes it).
func BarrierMember(b Barrier) string {
	return strconv.Itoa(b.Donor) + "|" + strconv.FormatInt(b.Seq, 10) + "|" + b.TID
}

// ParseBarrier reads a member of a bucket's barriers.
func ParseBarrier(s string) (Barrier, error) {
	parts := strings.SplitN(s, "|", 3)
	if len(parts) != 3 || parts[2] == "" {
		return Barrier{}, errors.New("not a transfer barrier")
	}
	d, err1 := strconv.Atoi(parts[0])
	seq, err2 := strconv.ParseInt(parts[1], 10, 64)
	if err1 != nil || err2 != nil || d < 0 || seq < 1 {
		return Barrier{}, errors.New("a field of the transfer barrier is not a number in range")
	}
	return Barrier{Donor: d, Seq: seq, TID: parts[2]}, nil
}
