package protocol

import (
	"slices"
	"strings"
	"testing"
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
			if err == nil || err.Error() != tc.err || got != (Entry{}) {
				t.Errorf("ParseEntry(%q) = %+v, %v; want error %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseEntry(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			continue
		}
		if enc := got.Encode(); enc != tc.in {
			t.Errorf("ParseEntry(%q).Encode() = %q", tc.in, enc)
		}
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
		if got := tc.e.Before(); got != tc.want {
			t.Errorf("%+v.Before() = %d, want %d", tc.e, got, tc.want)
		}
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
	if m := Member(EventRestored, "o-1"); m != "R:o-1" {
		t.Fatalf("Member = %q", m)
	}
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
		if ev != tc.event || id != tc.id || ok != tc.ok {
			t.Errorf("ParseMember(%q) = %q, %q, %v", tc.in, ev, id, ok)
		}
		if ok && Member(ev, id) != tc.in {
			t.Errorf("Member(ParseMember(%q)) = %q", tc.in, Member(ev, id))
		}
	}
}

func TestCartRecord(t *testing.T) {
	lines := []CartLine{{"cap", 4}, {"shirt:m", 6}}
	enc := EncodeCart("D", "alice", lines)
	if enc != "D{alice}|cap:4|shirt:m:6" {
		t.Fatalf("EncodeCart = %q", enc)
	}
	for _, rec := range []string{"p|1700000000000|" + enc, "u|1700000000000|" + enc + "|{2:cap}"} {
		kind, user, got, err := ParseCartRecord(rec)
		if err != nil || kind != "D" || user != "alice" || !slices.Equal(got, lines) {
			t.Errorf("ParseCartRecord(%q) = %q, %q, %v, %v", rec, kind, user, got, err)
		}
	}
	if kind, user, got, err := ParseCartRecord("d|1|H|a:1"); err != nil || kind != "H" || user != "" || len(got) != 1 {
		t.Errorf("a record without its user: %q, %q, %v, %v", kind, user, got, err)
	}
	for _, bad := range []string{"", "p|1", "p|1|D{u}", "p|1|X{u}|a:1", "p|1|D{u|a:1", "p|1|D{u}|a:0", "p|1|D{u}|a", "p|1|D{u}|:1", "p|1|D{u}|{2:a}", "p|1|D{u}|a:x"} {
		if _, _, _, err := ParseCartRecord(bad); err == nil {
			t.Errorf("ParseCartRecord(%q) accepted", bad)
		}
	}
}

func TestIsMark(t *testing.T) {
	for field, want := range map[string]bool{"{closed}": true, "{delisted}": true, "o-1": false, "": false} {
		if IsMark(field) != want {
			t.Errorf("IsMark(%q) = %v", field, !want)
		}
	}
}

func TestCause(t *testing.T) {
	why := EncodeCause(SoldOut, "cap")
	if why != "2:cap" {
		t.Fatalf("EncodeCause = %q", why)
	}
	if code, sku, ok := ParseCause(why); !ok || code != SoldOut || sku != "cap" {
		t.Fatalf("ParseCause(%q) = %d, %q, %v", why, code, sku, ok)
	}
	for _, bad := range []string{"", "cap", "x:cap"} {
		if _, _, ok := ParseCause(bad); ok {
			t.Errorf("ParseCause(%q) accepted", bad)
		}
	}
}
