package protocol

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

func TestKeysLayout(t *testing.T) {
	k := NewKeys(Base("stock", "", "A"))
	want := Keys{Item: "stock:{A}", Ledger: "stock:{A}:l", Users: "stock:{A}:u", Outbox: "stock:{A}:o",
		Holds: "stock:{A}:h", Filter: "stock:{A}:b", Tries: "stock:{A}:r", Lease: "stock:{A}:rl",
		Dead: "stock:{A}:dl", Published: "stock:{A}:p", Transfers: "stock:{A}:x", InFlight: "stock:{A}:xf",
		Claims: "stock:{A}:i", Barriers: "stock:{A}:xb"}
	want.item = k.item
	if *k != want {
		t.Fatalf("keys %+v, want %+v", *k, want)
	}
	if g := NewKeys(Base("p", "g", "A")); g.Ledger != "p:{g}:{A}:l" {
		t.Fatalf("grouped ledger %q", g.Ledger)
	}
	item := k.ForItem()
	if strings.Join(item, " ") != "stock:{A} stock:{A}:l stock:{A}:u stock:{A}:o stock:{A}:h stock:{A}:b" {
		t.Fatalf("ForItem %q", item)
	}
	// An append to ForItem copies: it never writes into the shared array.
	_ = append(item, "x")
	if k.ForItem()[5] != k.Filter {
		t.Fatal("an append wrote into the cached KEYS")
	}
	seen := map[string]bool{}
	for _, key := range k.All() {
		if seen[key] {
			t.Fatalf("key %q twice", key)
		}
		seen[key] = true
	}
	for name, keys := range map[string][]string{
		"snapshot": k.ForSnapshot(), "rebuild": k.ForRebuild(), "retire": k.ForRetire(), "trim": k.ForTrim(),
		"rerecord": k.ForRerecord(), "claim": k.ForClaim(), "ack": k.ForAck(), "turn": k.ForTurn(),
		"load": k.ForLoad(), "marks": k.ForMarks(), "adjust": k.ForAdjust(), "lease": k.ForLease(),
		"deadletter": k.ForDeadLetter(k.Outbox),
	} {
		for _, key := range keys {
			if !seen[key] {
				t.Errorf("%s: %q is not a key of the item", name, key)
			}
		}
	}
}

func TestKeyCacheBounded(t *testing.T) {
	built := 0
	c := NewKeyCache(64, func(sku string) string { built++; return Base("s", "", sku) })
	for i := range 1000 {
		sku := fmt.Sprint("sku-", i)
		if k := c.Get(sku); k.Item != "s:{"+sku+"}" {
			t.Fatalf("Get(%q).Item = %q", sku, k.Item)
		}
		if n := c.Len(); n > 64 {
			t.Fatalf("%d items cached, capacity 64", n)
		}
	}
	// An item in use stays cached while others come and go.
	hot := c.Get("hot")
	for i := range 1000 {
		c.Get(fmt.Sprint("cold-", i))
		if c.Get("hot") != hot {
			t.Fatalf("the hot item was evicted at %d", i)
		}
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
	if n := c.Len(); n > 128 {
		t.Fatalf("%d items cached, capacity 128", n)
	}
}

func TestKeyCacheHitDoesNotAllocate(t *testing.T) {
	c := NewKeyCache(1024, func(sku string) string { return Base("s", "", sku) })
	sku := strings.Repeat("x", 20)
	c.Get(sku)
	if n := testing.AllocsPerRun(1000, func() { _ = c.Get(sku).ForItem() }); n != 0 {
		t.Fatalf("a cached lookup allocates %v times", n)
	}
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
	if c := crc16("123456789"); c != 0x31C3 {
		t.Fatalf("crc16(123456789) = %#x, want 0x31c3", c)
	}
	for key, want := range map[string]int{
		"foo": 12182, "bar": 5061, "{user1000}.following": 3443, "{user1000}.followers": 3443,
		"foo{}{bar}": 8363, "foo{{bar}}zap": 4015, "foo{bar}{zap}": 5061, "": 0,
	} {
		if got := Slot(key); got != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
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
				if s := Slot("p:{" + tag + "}:l"); s < lo || s >= hi {
					t.Fatalf("bucket %d of %d of %s: tag %q in slot %d, not in [%d, %d)", i, n, sku, tag, s, lo, hi)
				}
				if n == 64 || n == 3 {
					if seen[tag] {
						t.Fatalf("tag %q twice", tag)
					}
					seen[tag] = true
				}
				if tag != BucketTag(sku, i, n) {
					t.Fatalf("BucketTag(%q, %d, %d) not deterministic", sku, i, n)
				}
			}
		}
	}
	if lo, hi := BucketSlots(2, 3); lo != 10922 || hi != 16384 {
		t.Fatalf("BucketSlots(2, 3) = [%d, %d)", lo, hi)
	}
}
