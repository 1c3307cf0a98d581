package protocol

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock/lua"
)

func TestKeysLayout(t *testing.T) {
	k := NewKeys(Base("stock", "", "A"))
	want := Keys{Item: "stock:{A}", Ledger: "stock:{A}:l", Users: "stock:{A}:u", Outbox: "stock:{A}:o",
		Holds: "stock:{A}:h", Filter: "stock:{A}:b", Tries: "stock:{A}:r", Lease: "stock:{A}:rl",
		Dead: "stock:{A}:dl", Published: "stock:{A}:p", Transfers: "stock:{A}:x", InFlight: "stock:{A}:xf",
		Claims: "stock:{A}:i", Barriers: "stock:{A}:xb"}
	want.item = k.item
	require.Equal(t, want, *k)
	require.Equal(t, "p:{g}:{A}:l", NewKeys(Base("p", "g", "A")).Ledger, "grouped ledger")
	item := k.ForItem()
	require.Equal(t, []string{"stock:{A}", "stock:{A}:l", "stock:{A}:u", "stock:{A}:o", "stock:{A}:h", "stock:{A}:b"}, item)
	// An append to ForItem copies: it never writes into the shared array.
	_ = append(item, "x")
	require.Equal(t, k.Filter, k.ForItem()[5], "an append wrote into the cached KEYS")
	seen := map[string]bool{}
	for _, key := range k.All() {
		require.False(t, seen[key], "key %q twice", key)
		seen[key] = true
	}
	for name, keys := range map[string][]string{
		"snapshot": k.ForSnapshot(), "rebuild": k.ForRebuild(), "retire": k.ForRetire(), "trim": k.ForTrim(),
		"rerecord": k.ForRerecord(), "claim": k.ForClaim(), "ack": k.ForAck(), "turn": k.ForTurn(),
		"load": k.ForLoad(), "marks": k.ForMarks(), "adjust": k.ForAdjust(), "lease": k.ForLease(),
		"deadletter": k.ForDeadLetter(k.Outbox),
	} {
		for _, key := range keys {
			assert.True(t, seen[key], "%s: %q is not a key of the item", name, key)
		}
	}
}

func TestKeyCacheBounded(t *testing.T) {
	built := 0
	c := NewKeyCache(64, func(sku string) string { built++; return Base("s", "", sku) })
	for i := range 1000 {
		sku := fmt.Sprint("sku-", i)
		require.Equal(t, "s:{"+sku+"}", c.Get(sku).Item)
		require.LessOrEqual(t, c.Len(), 64, "items cached, capacity 64")
	}
	// An item in use stays cached while others come and go.
	hot := c.Get("hot")
	for i := range 1000 {
		c.Get(fmt.Sprint("cold-", i))
		require.Same(t, hot, c.Get("hot"), "the hot item was evicted at %d", i)
	}
}

func TestKeyCacheConcurrent(t *testing.T) {
	c := NewKeyCache(128, func(sku string) string { return Base("s", "", sku) })
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				sku := fmt.Sprint("sku-", (i*7+g)%300)
				if k := c.Get(sku); k.Ledger != "s:{"+sku+"}:l" {
					t.Errorf("Get(%q).Ledger = %q", sku, k.Ledger)
					return
				}
			}
		})
	}
	wg.Wait()
	require.LessOrEqual(t, c.Len(), 128, "items cached, capacity 128")
}

func TestKeyCacheHitDoesNotAllocate(t *testing.T) {
	c := NewKeyCache(1024, func(sku string) string { return Base("s", "", sku) })
	sku := strings.Repeat("x", 20)
	c.Get(sku)
	require.Zero(t, testing.AllocsPerRun(1000, func() { _ = c.Get(sku).ForItem() }), "allocations of a cached lookup")
}

func BenchmarkKeyCacheHit(b *testing.B) {
	c := NewKeyCache(1024, func(sku string) string { return Base("stock", "", sku) })
	c.Get("sku-1")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = c.Get("sku-1").ForItem()
		}
	})
}

func BenchmarkKeysBuild(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = NewKeys(Base("stock", "", "sku-1")).ForItem()
	}
}

// Slot agrees with Redis's own answers (CLUSTER KEYSLOT, and the CRC16 check value of the
// Redis Cluster specification).
func TestSlotLikeRedis(t *testing.T) {
	require.EqualValues(t, 0x31C3, crc16("123456789"))
	for key, want := range map[string]int{
		"foo": 12182, "bar": 5061, "{user1000}.following": 3443, "{user1000}.followers": 3443,
		"foo{}{bar}": 8363, "foo{{bar}}zap": 4015, "foo{bar}{zap}": 5061, "": 0,
	} {
		assert.Equal(t, want, Slot(key), "Slot(%q)", key)
	}
}

// Bucket i of n lands in the i-th of n equal slot ranges, for every bucket count a Reserver
// allows, and its tag never meets another bucket's or an item's.
func TestBucketTagInRange(t *testing.T) {
	for _, sku := range []string{"A", "sku-1", "héllo", "x"} {
		seen := map[string]bool{sku: true}
		for n := 1; n <= 64; n++ {
			for i := range n {
				tag := BucketTag(sku, i, n)
				lo, hi := BucketSlots(i, n)
				s := Slot("p:{" + tag + "}:l")
				require.True(t, lo <= s && s < hi, "bucket %d of %d of %s: tag %q in slot %d, not in [%d, %d)", i, n, sku, tag, s, lo, hi)
				if n == 64 || n == 3 {
					require.False(t, seen[tag], "tag %q twice", tag)
					seen[tag] = true
				}
				require.Equal(t, tag, BucketTag(sku, i, n), "BucketTag(%q, %d, %d) not deterministic", sku, i, n)
			}
		}
	}
	lo, hi := BucketSlots(2, 3)
	require.Equal(t, [2]int{10922, 16384}, [2]int{lo, hi}, "BucketSlots(2, 3)")
}

// luaConst matches a Lua statement declaring upper-case locals with integer values:
// "local OK, REPLAY = 0, 1" (across lines too).
var luaConst = regexp.MustCompile(`(?m)^local\s+([A-Z][A-Z0-9_]*(?:\s*,\s*[A-Z][A-Z0-9_]*)*)\s*=\s*(-?\d+(?:\s*,\s*-?\d+)*)`)

// notCodes are upper-case integer constants of the scripts that are not reply codes.
var notCodes = []string{"MAX_EXPIRY"}

// codeMismatches compares the reply codes declared by the scripts (name -> text) with want: a
// code missing on either side, declared twice, or with another value.
func codeMismatches(scripts map[string]string, want map[string]int64) []string {
	var bad []string
	declared := map[string]string{} // name -> file
	for _, file := range slices.Sorted(maps.Keys(scripts)) {
		for _, m := range luaConst.FindAllStringSubmatch(scripts[file], -1) {
			names, values := split(m[1]), split(m[2])
			if len(names) != len(values) {
				bad = append(bad, fmt.Sprintf("%s: %d names, %d values in %q", file, len(names), len(values), m[0]))
				continue
			}
			for i, name := range names {
				if slices.Contains(notCodes, name) {
					continue
				}
				v, _ := strconv.ParseInt(values[i], 10, 64)
				if prev, dup := declared[name]; dup {
					bad = append(bad, fmt.Sprintf("%s: %s declared again (first in %s)", file, name, prev))
				}
				declared[name] = file
				w, ok := want[name]
				switch {
				case !ok:
					bad = append(bad, fmt.Sprintf("%s: %s = %d has no Go constant", file, name, v))
				case w != v:
					bad = append(bad, fmt.Sprintf("%s: %s = %d, Go says %d", file, name, v, w))
				case file != "lib.lua":
					bad = append(bad, fmt.Sprintf("%s: %s is declared outside lib.lua", file, name))
				}
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if _, ok := declared[name]; !ok {
			bad = append(bad, fmt.Sprintf("%s = %d is not declared in lua/lib.lua", name, want[name]))
		}
	}
	return bad
}

func split(s string) []string {
	f := strings.Split(s, ",")
	for i := range f {
		f[i] = strings.TrimSpace(f[i])
	}
	return f
}

func luaSources() map[string]string {
	out := map[string]string{}
	for _, name := range lua.Names() {
		out[name] = lua.Source(name)
	}
	return out
}

// TestReplyCodesMatchLua: every reply code of this package is declared in lua/lib.lua with the
// same value, and no script declares a code this package does not know.
func TestReplyCodesMatchLua(t *testing.T) {
	for _, m := range codeMismatches(luaSources(), LuaCodes) {
		t.Error(m)
	}
}

// TestReplyCodesCheckBites: the check above fails on a script whose codes drifted.
func TestReplyCodesCheckBites(t *testing.T) {
	for name, mutate := range map[string]func(map[string]string){
		"value changed in lib.lua": func(s map[string]string) {
			s["lib.lua"] = strings.Replace(s["lib.lua"], "10,      11,        12", "10,      11,        13", 1)
		},
		"code added in lib.lua only": func(s map[string]string) { s["lib.lua"] += "\nlocal BUSY = 13\n" },
		"code declared in a script":  func(s map[string]string) { s["deduct.lua"] = "local SOLDOUT = 2\n" + s["deduct.lua"] },
		"code removed from lib.lua": func(s map[string]string) {
			s["lib.lua"] = strings.Replace(s["lib.lua"], "local UNTAKEN = -1", "", 1)
		},
	} {
		s := luaSources()
		mutate(s)
		if got := codeMismatches(s, LuaCodes); len(got) == 0 {
			t.Errorf("%s: no mismatch found", name)
		}
	}
	if got := codeMismatches(luaSources(), map[string]int64{"OK": 0}); len(got) == 0 {
		t.Error("a Go side with codes missing: no mismatch found")
	}
}
