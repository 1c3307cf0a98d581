package protocol

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseEntry(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Entry
		err  string
	}{
		{in: "Dr|3|7|1700000000000|alice", want: Entry{Kind: 'D', State: 'r', Qty: 3, After: 7, At: 1700000000000, User: "alice"}},
		{in: "Hh|1|4|1700000000000|bob|1700000600000", want: Entry{Kind: 'H', State: 'h', Qty: 1, After: 4, At: 1700000000000, User: "bob", Deadline: 1700000600000, HasDeadline: true}},
		{in: "La|100|100|5|", want: Entry{Kind: 'L', State: 'a', Qty: 100, After: 100, At: 5}},
		{in: "Tx|0|0|1|", want: Entry{Kind: 'T', State: 'x', At: 1}},
		{in: "Dr|1|0|0|u|0", want: Entry{Kind: 'D', State: 'r', Qty: 1, User: "u", HasDeadline: true}},
		{in: "Dr", err: "no header"},
		{in: "Qr|1|0|0|u", err: "unknown kind or state"},
		{in: "Dq|1|0|0|u", err: "unknown kind or state"},
		{in: "Dr|1|0|0", err: "wrong number of fields"},
		{in: "Dr|1|0|0|u|1|2", err: "wrong number of fields"},
		{in: "Dr|-1|0|0|u", err: "bad number"},
		{in: "Dr|0x1|0|0|u", err: "bad number"},
		{in: "Da|9007199254740992|0|0|u", err: "quantity out of range"},
		{in: "La|100|99|0|", err: "restock of more than is available after it"},
		{in: "Dr|1|0|0|u|-5", err: "bad deadline"},
		{in: "Dr|1|0|0|u|", err: "bad deadline"},
	} {
		got, err := ParseEntry(tc.in)
		if tc.err != "" {
			assert.EqualError(t, err, tc.err, tc.in)
		} else if assert.NoError(t, err, tc.in) {
			assert.Equal(t, tc.in, got.Encode(), "ParseEntry(%q).Encode()", tc.in)
		}
		assert.Equal(t, tc.want, got, "ParseEntry(%q)", tc.in)
	}
}

func TestEntryBefore(t *testing.T) {
	for _, tc := range []struct {
		e    Entry
		want int64
	}{
		{Entry{Kind: KindDeduct, Qty: 3, After: 7}, 10},
		{Entry{Kind: KindHold, Qty: 1, After: 0}, 1},
		{Entry{Kind: KindRestock, Qty: 5, After: 9}, 4},
		{Entry{Kind: KindTombstone, After: 9}, 9},
	} {
		assert.Equal(t, tc.want, tc.e.Before(), "%+v.Before()", tc.e)
	}
}

// FuzzParseEntry: ParseEntry never panics, and what it accepts encodes back to the same text.
func FuzzParseEntry(f *testing.F) {
	for _, s := range []string{"Dr|3|7|1700000000000|alice", "Hh|1|4|1|b|2", "Tf|2|1|1|u", "Dr|1|0|0|u|0", "", "|||", "Dr|١|0|0|u"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e, err := ParseEntry(s)
		if err != nil {
			return
		}
		if e.Qty < 0 || e.After < 0 || e.At < 0 || e.Deadline < 0 || e.Before() < 0 || strings.Contains(e.User, "|") {
			t.Fatalf("ParseEntry(%q) = %+v", s, e)
		}
		enc := e.Encode()
		e2, err := ParseEntry(enc)
		if err != nil || e2 != e {
			t.Fatalf("ParseEntry(%q) = %+v, encoded %q, parsed back %+v, %v", s, e, enc, e2, err)
		}
	})
}

func TestMember(t *testing.T) {
	require.Equal(t, "R:o-1", Member(EventRestored, "o-1"))
	for _, tc := range []struct {
		in    string
		event byte
		id    string
		ok    bool
	}{
		{"D:o-1", 'D', "o-1", true},
		{"X:a:b", 'X', "a:b", true},
		{"D:", 0, "", false},
		{"Do-1", 0, "", false},
		{"", 0, "", false},
	} {
		ev, id, ok := ParseMember(tc.in)
		assert.Equal(t, []any{tc.event, tc.id, tc.ok}, []any{ev, id, ok}, "ParseMember(%q)", tc.in)
		if ok {
			assert.Equal(t, tc.in, Member(ev, id), "Member(ParseMember(%q))", tc.in)
		}
	}
}

func TestCartRecord(t *testing.T) {
	lines := []CartLine{{"cap", 4}, {"shirt:m", 6}}
	enc := EncodeCart("D", "alice", lines)
	require.Equal(t, "D{alice}|cap:4|shirt:m:6", enc)
	for rec, want := range map[string][]any{
		"p|1700000000000|" + enc:              {"D", "alice", lines},
		"u|1700000000000|" + enc + "|{2:cap}": {"D", "alice", lines},
		"d|1|H|a:1":                           {"H", "", []CartLine{{"a", 1}}}, // a record without its user
	} {
		kind, user, got, err := ParseCartRecord(rec)
		require.NoError(t, err, rec)
		assert.Equal(t, want, []any{kind, user, got}, "ParseCartRecord(%q)", rec)
	}
	for _, bad := range []string{"", "p|1", "p|1|D{u}", "p|1|X{u}|a:1", "p|1|D{u|a:1", "p|1|D{u}|a:0", "p|1|D{u}|a", "p|1|D{u}|:1", "p|1|D{u}|{2:a}", "p|1|D{u}|a:x"} {
		_, _, _, err := ParseCartRecord(bad)
		assert.Error(t, err, "ParseCartRecord(%q) accepted", bad)
	}
}

func TestIsMark(t *testing.T) {
	for field, want := range map[string]bool{"{closed}": true, "{delisted}": true, "o-1": false, "": false} {
		assert.Equal(t, want, IsMark(field), "IsMark(%q)", field)
	}
}

func TestCause(t *testing.T) {
	why := EncodeCause(SoldOut, "cap")
	require.Equal(t, "2:cap", why)
	code, sku, ok := ParseCause(why)
	require.True(t, ok)
	require.Equal(t, SoldOut, code)
	require.Equal(t, "cap", sku)
	for _, bad := range []string{"", "cap", "x:cap"} {
		_, _, ok := ParseCause(bad)
		assert.False(t, ok, "ParseCause(%q) accepted", bad)
	}
}

func TestParseTransfer(t *testing.T) {
	for s, want := range map[string]Transfer{
		"O|2|5|1700|42": {Dir: 'O', Other: 2, Units: 5, AtMs: 1700, Seq: 42},
		"O|2|5|1700":    {Dir: 'O', Other: 2, Units: 5, AtMs: 1700}, // written before seq was recorded
		"I|0|3|1800":    {Dir: 'I', Other: 0, Units: 3, AtMs: 1800},
	} {
		got, err := ParseTransfer(s)
		require.NoError(t, err, s)
		assert.Equal(t, want, got, s)
	}
	for _, s := range []string{"", "O|2|5", "I|0|3|1800|4", "O|2|0|1700|1", "O|2|5|1700|-1", "O|2|5|1700|x", "X|2|5|1700", "O|2|5|1700|1|2"} {
		_, err := ParseTransfer(s)
		assert.Error(t, err, s)
	}
}

func TestBarrierMember(t *testing.T) {
	b := Barrier{Donor: 3, Seq: 17, TID: "00ff"}
	got, err := ParseBarrier(BarrierMember(b))
	require.NoError(t, err)
	assert.Equal(t, b, got)
	for _, s := range []string{"", "3|17", "3|17|", "x|17|t", "3|0|t", "-1|2|t"} {
		_, err := ParseBarrier(s)
		assert.Error(t, err, s)
	}
}

// TestParseReplies: each reply parser reads its script's reply into what the reply says, and
// refuses a reply with a wrong number of values.
func TestParseReplies(t *testing.T) {
	for _, tc := range []struct {
		name  string
		parse func([]string) (any, error)
		in    []string
		want  any
		bad   []int // numbers of values refused
	}{
		{"snapshot", anyReply(ParseSnapshotReply),
			[]string{"1", "5", "2", "3", "10", "1", "0", "1", "-4", "D:a", "Dr|1|5|1|", "D:b", ""},
			SnapshotReply{Exists: true, Available: 5, Held: 2, Sold: 3, Loaded: 10, Pending: 1, Published: 1, Transferred: -4,
				Events: []OutboxEvent{{Member: "D:a", Entry: "Dr|1|5|1|"}, {Member: "D:b"}}},
			[]int{0, 8, 10}},
		{"snapshot of a missing item", anyReply(ParseSnapshotReply),
			[]string{"0", "0", "0", "0", "0", "0", "0", "0", "0"}, SnapshotReply{Events: []OutboxEvent{}}, nil},
		{"claim", anyReply(ParseClaimReply),
			[]string{"D:a", "Dr|1|5|1|", "2", "7", "R:b", "", "0", "8"},
			[]OutboxEvent{{Member: "D:a", Entry: "Dr|1|5|1|", Tries: 2, Seq: 7}, {Member: "R:b", Seq: 8}},
			[]int{3}},
		{"turn", anyReply(ParseTurnReply),
			[]string{"1", "D:a", "Dr|1|5|1|", "7"},
			TurnReply{More: true, Earlier: []OutboxEvent{{Member: "D:a", Entry: "Dr|1|5|1|", Seq: 7}}},
			[]int{0, 2, 3}},
		{"turn while reconciling", anyReply(ParseTurnReply), []string{"2"}, TurnReply{Reconciling: true}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.parse(tc.in)
			assert.NoError(t, err)
			assert.Equal(t, tc.want, got)
			for _, n := range tc.bad {
				_, err := tc.parse(make([]string, n))
				assert.Error(t, err, "%d values accepted", n)
			}
		})
	}
}

// anyReply is parse with its reply as an any.
func anyReply[T any](parse func([]string) (T, error)) func([]string) (any, error) {
	return func(in []string) (any, error) { return parse(in) }
}
