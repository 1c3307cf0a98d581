package protocol

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				sku := fmt.Sprint("sku-", (i*7+g)%300)
				if k := c.Get(sku); k.Ledger != "s:{"+sku+"}:l" {
					t.Errorf("Get(%q).Ledger = %q", sku, k.Ledger)
					return
				}
			}
		}()
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
