package engine

// Fuzz targets for the input checks and the decoders of this package. Each runs its seed corpus
// (f.Add and testdata/fuzz/<Name>/) as a plain test under `go test`; run one with
//
//	go test -run '^$' -fuzz '^FuzzParseEntry$' -fuzztime 30s .
//
// and commit the small inputs it finds under testdata/fuzz/<Name>/.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/redis/rueidis"
	"github.com/redis/rueidis/mock"
	"github.com/stretchr/testify/require"
)

// fzValidName is the documented rule for SKUs, ids, users and prefixes, written from the README
// ("empty or >128-byte names, braces, |, whitespace, control characters, Unicode format
// characters, invalid UTF-8"), not from checkName.
func fzValidName(s string) bool {
	if len(s) < 1 || len(s) > 128 || !utf8.ValidString(s) {
		return false
	}
	for _, c := range s {
		switch {
		case c == '{', c == '}', c == '|':
			return false
		case unicode.IsSpace(c), unicode.IsControl(c), unicode.In(c, unicode.White_Space), unicode.In(c, unicode.Cf):
			return false
		}
	}
	return true
}

// fzBytesClean double-checks an accepted name byte by byte: no ASCII whitespace or control
// byte, no brace or '|' (in UTF-8 those bytes only ever encode those characters).
func fzBytesClean(s string) error {
	for i := 0; i < len(s); i++ {
		b := s[i]
		if b < 0x20 || b == 0x7f || b == ' ' || b == '{' || b == '}' || b == '|' {
			return fmt.Errorf("byte %d is %#x", i, b)
		}
	}
	return nil
}

// FuzzValidation: Request.check accepts exactly the requests the documentation allows and
// refuses the rest with ErrInvalid; an accepted SKU makes keys whose only hash tag is {sku}.
func FuzzValidation(f *testing.F) {
	seeds := []struct {
		sku, id, user string
		qty           int64
	}{
		{"sneaker-42", "order-1", "alice", 1},
		{"sneaker-42", "order-1", "", MaxQty},
		{"sneaker-42", "order-1", "", MaxQty + 1},
		{"sneaker-42", "order-1", "", 0},
		{"sneaker-42", "order-1", "", -1},
		{"sneaker-42", "order-1", "", math.MinInt64},
		{"sneaker-42", "order-1", "", math.MaxInt64},
		{"", "order-1", "", 1},
		{"a", "", "", 1},
		{strings.Repeat("s", 128), strings.Repeat("i", 128), strings.Repeat("u", 128), 1},
		{strings.Repeat("s", 129), "i", "", 1},
		{strings.Repeat("é", 64), "i", "", 1}, // 128 bytes
		{strings.Repeat("é", 65), "i", "", 1}, // 130 bytes, 65 runes
		{"a{b", "i", "", 1},
		{"a}b", "i", "", 1},
		{"}{", "i", "", 1},
		{"a|b", "i", "", 1},
		{"a b", "i", "", 1},
		{"a\tb", "i", "", 1},
		{"a\x00b", "i", "", 1},
		{"a\x7fb", "i", "", 1},
		{"a\u0085b", "i", "", 1}, // NEL
		{"a\u00a0b", "i", "", 1}, // no-break space
		{"a\u2028b", "i", "", 1}, // line separator
		{"a\u3000b", "i", "", 1}, // ideographic space
		{"a\xffb", "i", "", 1},
		{"a\xc3", "i", "", 1},
		{"\xed\xa0\x80", "i", "", 1}, // UTF-16 surrogate in UTF-8
		{"商品", "注文", "ユーザー", 2},
		{"a,b:1", "i", "u", 1},
		{"~carts", "i", "u", 1},
		{"sku", "i", "bad user", 1},
		{"sku", "i", "{u}", 1},
	}
	for _, s := range seeds {
		f.Add(s.sku, s.id, s.user, s.qty)
	}
	f.Fuzz(func(t *testing.T, sku, id, user string, qty int64) {
		req := Request{SKU: sku, ID: id, User: user, Qty: qty}
		err := checkRequest(req)
		want := fzValidName(sku) && fzValidName(id) && (user == "" || fzValidName(user)) && qty >= 1 && qty <= MaxQty
		if want && err != nil {
			t.Fatalf("check(%#v) = %v, want nil: the request follows every documented rule", req, err)
		}
		if !want {
			require.Error(t, err, "check(%#v) = nil, want ErrInvalid: the request breaks a documented rule", req)
			require.ErrorIs(t, err, ErrInvalid, "check(%#v) = %v, does not wrap ErrInvalid", req, err)
		}
		// checkName alone, for every field, agrees with the rule.
		for _, s := range []string{sku, id, user} {
			if err := checkName("name", s); (err == nil) != fzValidName(s) || (err != nil && !errors.Is(err, ErrInvalid)) {
				t.Fatalf("checkName(%#v) = %v, rule says valid=%v", s, err, fzValidName(s))
			}
		}
		if err := checkName("sku", sku); err != nil {
			return
		}
		require.NoError(t, fzBytesClean(sku), "accepted sku %#v", sku)
		// The keys of an accepted SKU, under the default prefix and under the user as a prefix
		// (a prefix follows the same rule, WithPrefix).
		prefixes := []string{"stock"}
		if checkName("prefix", user) == nil {
			prefixes = append(prefixes, user)
		}
		for _, p := range prefixes {
			o := defaultOptions()
			if err := WithPrefix(p)(&o); err != nil {
				t.Fatalf("WithPrefix(%#v) = %v after checkName accepted it", p, err)
			}
			r := &Reserver{opts: o}
			keys := r.item(sku).All()
			seen := map[string]bool{}
			for _, k := range keys {
				if tag := fzHashTag(k); tag != sku {
					t.Fatalf("prefix %#v: key %#v has hash tag %#v, want the sku %#v", p, k, tag, sku)
				}
				if strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 {
					t.Fatalf("prefix %#v: key %#v has more than one brace pair", p, k)
				}
				seen[k] = true
			}
			require.Len(t, seen, len(keys), "prefix %#v sku %#v: %d distinct keys of %d suffixes: %q", p, sku, len(seen), len(keys), keys)
		}
	})
}

// fzHashTag is Redis Cluster's rule: the part between the first '{' and the first '}' after it,
// when that part is not empty; otherwise the whole key is hashed (returned as "\x00whole").
func fzHashTag(key string) string {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return "\x00whole"
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return "\x00whole"
	}
	return key[i+1 : i+1+j]
}

// fzEncodeEntry writes an Entry as lua/lib.lua's entry() does:
// "KS|qty|after|at|user[|deadline]", the deadline only when there is one.
func fzEncodeEntry(t *testing.T, e Entry) string {
	t.Helper()
	code := func(m any, v string) byte {
		switch m := m.(type) {
		case map[byte]Kind:
			for c, k := range m {
				if string(k) == v {
					return c
				}
			}
		case map[byte]State:
			for c, s := range m {
				if string(s) == v {
					return c
				}
			}
		}
		t.Fatalf("no code for %q", v)
		return 0
	}
	var b strings.Builder
	b.WriteByte(code(kindCodes, string(e.Kind)))
	b.WriteByte(code(stateCodes, string(e.State)))
	for _, n := range []int64{e.Qty, e.After, e.At.UnixMilli()} {
		b.WriteByte('|')
		b.WriteString(strconv.FormatInt(n, 10))
	}
	b.WriteByte('|')
	b.WriteString(e.User)
	for _, last := range []time.Time{e.Deadline, e.GivenBack} { // a hold's deadline, or when a sale was given back
		if !last.IsZero() {
			b.WriteByte('|')
			b.WriteString(strconv.FormatInt(last.UnixMilli(), 10))
		}
	}
	return b.String()
}

// FuzzParseEntry: parseEntry never panics, refuses with ErrInvalid, and what it accepts survives
// a round trip through the Lua format.
func FuzzParseEntry(f *testing.F) {
	for _, s := range []string{
		"Dr|3|7|1700000000000|alice",
		"Dr|3|7|1700000000000|",
		"Hh|1|4|1700000000000|bob|1700000600000",
		"Hc|1|4|1700000000000||1700000600000",
		"Tx|0|0|1700000000000|",
		"Tf|2|1|1700000000000|u",
		"La|100|100|1700000000000|",
		"La|100|99|1700000000000|",
		"Da|9007199254740991|9007199254740991|0|u",
		"Da|9007199254740992|0|0|u",
		"Df|1|0|9223372036854775807|u",
		"De|1|0|9223372036854775808|u",
		"Dr|-1|0|0|u",
		"Dr|+1|0|0|u",
		"Dr|1|0|0|u|-5",
		"Dr|1|0|0|u|",
		"Dr|1|0|0|u|1|2",
		"Dr|1|1|0|0|u",
		"Dr|1|0|0",
		"Dr|1|0|0|a:b,c",
		"Dr",
		"Dr|",
		"Qr|1|0|0|u",
		"Dq|1|0|0|u",
		"",
		"|||||||",
		"Dr|0x1|0|0|u",
		"Dr|1_0|0|0|u",
		"Dr|١|0|0|u",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e, err := parseEntry("sku", "id", s)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalid, "parseEntry(%q) = %v, does not wrap ErrInvalid", s, err)
			if e != (Entry{}) {
				t.Fatalf("parseEntry(%q) failed but returned %+v", s, e)
			}
			return
		}
		if e.SKU != "sku" || e.ID != "id" {
			t.Fatalf("parseEntry(%q): sku/id %q/%q", s, e.SKU, e.ID)
		}
		if !slices.Contains([]Kind{KindDeduct, KindHold, KindRestock, KindTombstone}, e.Kind) {
			t.Fatalf("parseEntry(%q): kind %q", s, e.Kind)
		}
		if e.Qty < 0 || e.Before < 0 || e.After < 0 || e.At.UnixMilli() < 0 || (!e.Deadline.IsZero() && e.Deadline.UnixMilli() < 0) {
			t.Fatalf("parseEntry(%q) = %+v: a negative number", s, e)
		}
		require.NotContains(t, e.User, "|", "parseEntry(%q): user %q holds a separator", s, e.User)
		enc := fzEncodeEntry(t, e)
		e2, err := parseEntry("sku", "id", enc)
		require.NoError(t, err, "parseEntry(%q) = %+v, re-encoded as %q, which does not parse", s, e, enc)
		if e2 != e {
			t.Fatalf("parseEntry(%q) = %+v; re-encoded %q parses as %+v", s, e, enc, e2)
		}
		if enc2 := fzEncodeEntry(t, e2); enc2 != enc {
			t.Fatalf("encoding is not stable: %q then %q", enc, enc2)
		}
	})
}

// A reply shape, built from fuzz bytes: the tree of RESP messages a script could answer with.
type fzReply struct {
	transport error                // the command failed before a reply (the result's error)
	msg       rueidis.RedisMessage // otherwise the reply
	shape     fzShape
}

// fzShape is what the decoders should make of a message.
type fzShape struct {
	kind  byte    // 'i' integer, 's' string, 'f' double, 'n' nil, 'e' error, 'b' bool, 'a' array, 'm' map
	ints  []int64 // for an array: the elements' values, when every element is an integer
	whole bool    // for an array: every element holds an integer exactly (int, decimal string)
	loose bool    // for an array: every element is an integer or a double with an integral text
	n     int     // for an array: its length
}

// fzMessage builds a message from data; depth bounds nesting. It returns the unread rest.
func fzMessage(data []byte, depth int) (rueidis.RedisMessage, byte, []byte) {
	next := func() byte {
		if len(data) == 0 {
			return 0
		}
		b := data[0]
		data = data[1:]
		return b
	}
	str := func() string {
		n := int(next()) % 24
		n = min(n, len(data))
		s := string(data[:n])
		data = data[n:]
		return s
	}
	op := next() % 12
	if depth <= 0 && (op == 8 || op == 9) {
		op = 0
	}
	switch op {
	case 0, 1: // an integer, small or from 8 bytes
		if op == 0 {
			return mock.RedisInt64(int64(int8(next()))), 'i', data
		}
		var b [8]byte
		copy(b[:], data)
		data = data[min(8, len(data)):]
		return mock.RedisInt64(int64(binary.BigEndian.Uint64(b[:]))), 'i', data
	case 2: // a decimal string, as a script's tostring would send
		return mock.RedisBlobString(strconv.Itoa(int(int16(binary.BigEndian.Uint16([]byte{next(), next()}))))), 's', data
	case 3:
		return mock.RedisBlobString(str()), 's', data
	case 4:
		return mock.RedisString(str()), 's', data
	case 5:
		return mock.RedisNil(), 'n', data
	case 6:
		return mock.RedisError(str()), 'e', data
	case 7:
		return mock.RedisBool(next()&1 == 1), 'b', data
	case 8, 9:
		n := int(next()) % 8
		vs := make([]rueidis.RedisMessage, 0, n)
		for range n {
			var m rueidis.RedisMessage
			m, _, data = fzMessage(data, depth-1)
			vs = append(vs, m)
		}
		if op == 9 && len(vs)%2 == 0 {
			kv := map[string]rueidis.RedisMessage{}
			for i := 0; i < len(vs); i += 2 {
				kv[strconv.Itoa(i)] = vs[i+1]
			}
			return mock.RedisMap(kv), 'm', data
		}
		return mock.RedisArray(vs...), 'a', data
	case 10:
		return mock.RedisFloat64(float64(int8(next())) / 2), 'f', data
	default:
		return mock.RedisString(strconv.FormatInt(int64(binary.BigEndian.Uint32([]byte{next(), next(), next(), next()})), 10) + str()), 's', data
	}
}

// fzIntOf says whether one element holds an integer the decoders must accept: a RESP integer
// or a string of decimal digits within int64. A double with an integral text may go either way.
func fzIntOf(m rueidis.RedisMessage, kind byte) (v int64, ok, soft bool) {
	switch kind {
	case 'i':
		v, _ := m.AsInt64()
		return v, true, false
	case 's':
		s, _ := m.ToString()
		v, err := strconv.ParseInt(s, 10, 64)
		return v, err == nil, false
	case 'f':
		s, _ := m.ToString()
		v, err := strconv.ParseInt(s, 10, 64)
		return v, false, err == nil
	}
	return 0, false, false
}

func fzBuildReply(data []byte) fzReply {
	if len(data) > 0 && data[0] == 0xff {
		return fzReply{transport: errFzTransport}
	}
	m, kind, _ := fzMessage(data, 2)
	sh := fzShape{kind: kind}
	if kind == 'a' {
		vs, _ := m.ToArray()
		sh.n, sh.whole, sh.loose = len(vs), true, true
		for _, v := range vs {
			n, ok, soft := fzIntOf(v, fzKind(v))
			sh.whole = sh.whole && ok
			sh.loose = sh.loose && (ok || soft)
			sh.ints = append(sh.ints, n)
		}
	}
	return fzReply{msg: m, shape: sh}
}

// fzKind classifies a message through rueidis's public predicates.
func fzKind(m rueidis.RedisMessage) byte {
	switch {
	case m.IsInt64():
		return 'i'
	case m.IsString():
		return 's'
	case m.IsFloat64():
		return 'f'
	case m.IsNil():
		return 'n'
	case m.IsBool():
		return 'b'
	case m.IsArray():
		return 'a'
	case m.IsMap():
		return 'm'
	case m.Error() != nil:
		return 'e'
	}
	return '?'
}

var errFzTransport = errors.New("fuzz: connection reset")

func (r fzReply) result() rueidis.RedisResult {
	if r.transport != nil {
		return mock.ErrorResult(r.transport)
	}
	return mock.Result(r.msg)
}

// fzCheckErr checks a decoder's error against the reply's shape when the shape is wrong:
// a transport error or a Redis error reply comes back as itself (the outcome is unknown), any
// other shape the package does not understand is ErrUnknownOutcome (the script may have run),
// never ErrInvalid (which says nothing changed).
func fzCheckErr(t *testing.T, what string, r fzReply, err error) {
	t.Helper()
	require.Error(t, err, "%s: reply %s accepted, want an error", what, fzDescribe(r))
	switch {
	case r.transport != nil:
		if !errors.Is(err, r.transport) || errors.Is(err, ErrInvalid) {
			t.Fatalf("%s: transport error came back as %v", what, err)
		}
	case r.shape.kind == 'e':
		var re *rueidis.RedisError
		if !errors.As(err, &re) || errors.Is(err, rueidis.Nil) {
			t.Fatalf("%s: Redis error reply came back as %v, errors.As finds no *rueidis.RedisError", what, err)
		}
	case r.shape.kind == 'n':
		// A nil reply: rueidis reports it as the error rueidis.Nil. Either ErrUnknownOutcome or
		// Nil is an answer a caller can act on.
		if errors.Is(err, ErrInvalid) || (!errors.Is(err, ErrUnknownOutcome) && !errors.Is(err, rueidis.Nil)) {
			t.Fatalf("%s: nil reply came back as %v", what, err)
		}
	default:
		if !errors.Is(err, ErrUnknownOutcome) || errors.Is(err, ErrInvalid) {
			t.Fatalf("%s: reply %s refused with %v, which does not wrap ErrUnknownOutcome alone: the script may have run", what, fzDescribe(r), err)
		}
	}
}

func fzDescribe(r fzReply) string {
	if r.transport != nil {
		return "transport error " + r.transport.Error()
	}
	return fzString(r.msg)
}

func fzString(m rueidis.RedisMessage) string {
	k := fzKind(m)
	switch k {
	case 'i':
		v, _ := m.AsInt64()
		return strconv.FormatInt(v, 10)
	case 's':
		s, _ := m.ToString()
		return strconv.Quote(s)
	case 'f':
		s, _ := m.ToString()
		return "double(" + s + ")"
	case 'n':
		return "nil"
	case 'b':
		v, _ := m.AsBool()
		return fmt.Sprintf("bool(%v)", v)
	case 'e':
		return "error(" + m.Error().Error() + ")"
	case 'a', 'm':
		vs, _ := m.ToArray()
		if k == 'm' {
			mm, _ := m.ToMap()
			vs = vs[:0]
			for _, v := range mm {
				vs = append(vs, v)
			}
		}
		parts := make([]string, len(vs))
		for i, v := range vs {
			parts[i] = fzString(v)
		}
		return string(k) + "[" + strings.Join(parts, " ") + "]"
	}
	return "?"
}

// FuzzDecodeOutcomes: the script reply decoders never panic, decode exactly the replies of the
// right shape (n triples of integers; a pair of integers) and refuse every other shape with
// ErrUnknownOutcome, except transport and Redis errors, which come back as themselves.
func FuzzDecodeOutcomes(f *testing.F) {
	arr := func(ops ...byte) []byte { return append([]byte{8, byte(len(ops))}, ops...) } // array of small ints
	f.Add(uint8(1), arr(0, 0, 0, 5, 0, 1))                                               // {0, 5, 1}
	f.Add(uint8(2), arr(0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6))                             // two triples
	f.Add(uint8(0), []byte{8, 0})                                                        // {} for no request
	f.Add(uint8(1), []byte{8, 3, 2, 0, 7, 2, 0, 9, 2, 0, 1})                             // decimal strings
	f.Add(uint8(1), []byte{8, 2, 0, 1, 0, 2})                                            // two values, not three
	f.Add(uint8(1), []byte{8, 3, 0, 1, 5, 0, 1})                                         // a nil element
	f.Add(uint8(1), []byte{8, 3, 0, 1, 6, 3, 'E', 'R', 'R', 0, 1})                       // an error element
	f.Add(uint8(1), []byte{8, 3, 0, 1, 7, 1, 0, 1})                                      // a bool element
	f.Add(uint8(1), []byte{8, 3, 0, 1, 10, 3, 0, 1})                                     // a double element
	f.Add(uint8(1), []byte{8, 3, 0, 1, 8, 2, 0, 1, 0, 2, 0, 1})                          // an array element
	f.Add(uint8(1), []byte{8, 3, 0, 1, 3, 2, '1', 'x', 0, 1})                            // a non-numeric string
	f.Add(uint8(1), []byte{8, 3, 0, 1, 3, 20, '9', '9', '9', '9', '9', '9', '9', '9', '9', '9', '9', '9', '9', '9', '9', '9', '9', '9', '9', '9', 0, 1})
	f.Add(uint8(1), []byte{0, 5})                                              // an integer, not an array
	f.Add(uint8(1), []byte{3, 2, 'o', 'k'})                                    // a string, not an array
	f.Add(uint8(1), []byte{5})                                                 // nil
	f.Add(uint8(1), []byte{6, 9, 'E', 'R', 'R', ' ', 'b', 'o', 'o', 'm', '!'}) // a Redis error
	f.Add(uint8(1), []byte{0xff})                                              // a transport error
	f.Add(uint8(1), []byte{9, 2, 0, 1, 0, 2})                                  // a map
	f.Add(uint8(1), []byte{7, 1})                                              // a bool
	f.Add(uint8(1), []byte{10, 4})                                             // a double
	f.Add(uint8(2), []byte{8, 2, 5, 5})                                        // {nil, nil}: a pair of zeros?
	f.Add(uint8(2), []byte{8, 2, 8, 2, 0, 0, 0, 0, 8, 0})                      // {{0,0}, {}}
	f.Add(uint8(2), []byte{8, 2, 7, 1, 7, 0})                                  // {true, false}
	f.Add(uint8(2), []byte{8, 2, 6, 3, 'E', 'R', 'R', 0, 1})                   // {error, 1}
	f.Add(uint8(2), []byte{8, 2, 10, 3, 0, 1})                                 // {1.5, 1}
	f.Fuzz(func(t *testing.T, n uint8, data []byte) {
		r := fzBuildReply(data)
		want := int(n % 4)

		dst := make([]outcome, want)
		err := decodeOutcomes(r.result(), dst)
		fzCheckDecoded(t, fmt.Sprintf("decodeOutcomes(n=%d)", want), r, 3*want, err, func() []int64 {
			var got []int64
			for _, o := range dst {
				got = append(got, o.code, o.remaining, o.qty)
			}
			return got
		})

		o, err := decodeOne(r.result())
		fzCheckDecoded(t, "decodeOne", r, 3, err, func() []int64 { return []int64{o.code, o.remaining, o.qty} })

		code, value, err := decodePair(r.result())
		fzCheckDecoded(t, "decodePair", r, 2, err, func() []int64 { return []int64{code, value} })
	})
}

func fzCheckDecoded(t *testing.T, what string, r fzReply, n int, err error, got func() []int64) {
	t.Helper()
	right := r.transport == nil && r.shape.kind == 'a' && r.shape.n == n
	switch {
	case right && r.shape.whole && err != nil:
		t.Fatalf("%s: reply %s is well formed, refused: %v", what, fzDescribe(r), err)
	case right && r.shape.loose && err == nil:
		// Well formed, or with doubles of integral text, which may be taken for their value.
		if g := got(); !slices.Equal(g, r.shape.ints) && !(n == 0 && len(g) == 0) {
			t.Fatalf("%s: reply %s decoded as %v", what, fzDescribe(r), g)
		}
	default:
		fzCheckErr(t, what, r, err)
	}
}

// fzLines decodes a cart's lines from fuzz bytes: for each line, a length byte and the SKU's
// bytes, then a quantity selector (small, next to MaxQty, or 8 raw bytes).
func fzLines(data []byte) []Line {
	var lines []Line
	for len(data) > 0 && len(lines) < 120 {
		n := int(data[0]) % 40
		data = data[1:]
		n = min(n, len(data))
		sku := string(data[:n])
		data = data[n:]
		var q int64
		sel := byte(0)
		if len(data) > 0 {
			sel, data = data[0], data[1:]
		}
		switch {
		case sel < 200:
			q = int64(sel) - 2
		case sel < 240:
			q = MaxQty - int64(sel-200) + 3
		default:
			var b [8]byte
			copy(b[:], data)
			data = data[min(8, len(data)):]
			q = int64(binary.BigEndian.Uint64(b[:]))
		}
		lines = append(lines, Line{SKU: sku, Qty: q})
	}
	return lines
}

// fzParseCartRecord parses a cart record with the parser RecoverCarts uses.
func fzParseCartRecord(rec string) (string, string, []Line, error) { return parseCartRecord(rec) }

// FuzzCartLines: sumLines accepts exactly the carts the rules allow, sums lines per item in SKU
// order, and the cart record written from its lines (encodeCart, the "p|started|" header of
// lua/cart.lua, and the cause an undone record ends with) parses back, as RecoverCarts parses
// it, to the same kind, user and lines.
func FuzzCartLines(f *testing.F) {
	line := func(sku string, sel byte) []byte { return append(append([]byte{byte(len(sku))}, sku...), sel) }
	cat := func(bs ...[]byte) []byte { return slices.Concat(bs...) }
	f.Add("cart-1", "alice", cat(line("shirt-m", 3), line("cap", 4), line("shirt-m", 3)))
	f.Add("cart-1", "", cat(line("a", 3)))
	f.Add("cart-1", "", []byte{})
	f.Add("cart-1", "", cat(line("a", 2)))                                 // qty 0
	f.Add("cart-1", "", cat(line("a", 1)))                                 // qty -1
	f.Add("cart-1", "", cat(line("a", 203)))                               // MaxQty exactly
	f.Add("cart-1", "", cat(line("a", 204)))                               // MaxQty + 1
	f.Add("cart-1", "", cat(line("a", 210), line("a", 210)))               // the sum passes MaxQty
	f.Add("cart-1", "", cat(line("a", 210), line("b", 210)))               // two big items
	f.Add("cart 1", "", cat(line("a", 3)))                                 // bad id
	f.Add("cart-1", "a|b", cat(line("a", 3)))                              // bad user
	f.Add("cart-1", "", cat(line("", 3)))                                  // empty sku
	f.Add("cart-1", "", cat(line("a{b}", 3)))                              // braces
	f.Add("cart-1", "", cat(line("x:1", 3), line("x", 4)))                 // ':' in a sku
	f.Add("cart-1", "", cat(line("a,b", 3)))                               // ',' in a sku
	f.Add("cart-1", "", cat(line("x:1,y", 4)))                             // a sku that reads as two lines
	f.Add("cart-1", "", slices.Repeat(line("z", 3), 100))                  // 100 lines
	f.Add("cart-1", "", slices.Repeat(line("z", 3), 101))                  // 101 lines
	f.Add("cart-1", "", cat(line("é", 3), line("e", 3), line("E", 3)))     // byte order
	f.Add("cart-1", "", append(line("a", 240), 0, 0, 0, 0, 0, 0, 0, 1))    // raw qty 1
	f.Add("cart-1", "", append(line("a", 240), 0x80, 0, 0, 0, 0, 0, 0, 0)) // raw MinInt64
	f.Fuzz(func(t *testing.T, id, user string, data []byte) {
		c := Cart{ID: id, User: user, Lines: fzLines(data)}
		got, err := sumLines(c)

		// The rules, independently.
		want := fzValidName(id) && (user == "" || fzValidName(user)) && len(c.Lines) >= 1 && len(c.Lines) <= 100
		sums := map[string]int64{}
		for _, l := range c.Lines {
			if !want {
				break
			}
			if !fzValidName(l.SKU) || l.Qty < 1 || l.Qty > MaxQty || sums[l.SKU] > MaxQty-l.Qty {
				want = false
				break
			}
			sums[l.SKU] += l.Qty
		}
		if !want {
			require.Error(t, err, "sumLines(%#v) = %v, want ErrInvalid", c, got)
			require.ErrorIs(t, err, ErrInvalid, "sumLines(%#v) = %v, does not wrap ErrInvalid", c, err)
			return
		}
		require.NoError(t, err, "sumLines(%#v) = %v, want the lines summed", c, err)
		require.Len(t, got, len(sums), "sumLines(%#v) = %v: %d lines, want %d items", c, got, len(got), len(sums))
		for i, l := range got {
			if i > 0 && got[i-1].SKU >= l.SKU {
				t.Fatalf("sumLines(%#v) = %v: not strictly in SKU order at %d", c, got, i)
			}
			if l.Qty != sums[l.SKU] || l.Qty < 1 || l.Qty > MaxQty {
				t.Fatalf("sumLines(%#v) = %v: %s has %d, want %d", c, got, l.SKU, l.Qty, sums[l.SKU])
			}
		}
		// The saga log's record, and RecoverCarts's reading of it.
		for _, kind := range []string{"D", "H"} {
			for _, rec := range []string{
				"p|1700000000000|" + encodeCart(kind, user, got),
				"u|1700000000000|" + encodeCart(kind, user, got) + "|{" + cause(got[0].SKU, ErrSoldOut) + "}",
			} {
				k, u, back, err := fzParseCartRecord(rec)
				require.NoError(t, err, "cart %#v: lines %#v, record %q: RecoverCarts cannot parse it (%v): the cart can never be recovered and blocks RecoverCarts", c.ID, got, rec, err)
				if k != kind || u != user || !slices.Equal(back, got) {
					t.Fatalf("cart %#v: lines %#v, record %q: RecoverCarts reads kind %q user %q lines %#v: it would undo other items than the cart took", c.ID, got, rec, k, u, back)
				}
			}
		}
	})
}
