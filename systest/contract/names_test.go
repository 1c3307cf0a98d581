package contract_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/stockops"
)

// names are valid names drawn to collide with the keys and encodings of the package: key
// suffixes, the registry, the cart log, the epoch, and the separators of ledger entries and
// outbox members.
var names = []string{
	"x", "x:u", "x:l", "x:o", "x:h", "x:b", "x:r", "x:rl", "x:dl", "x:p",
	"carts", "~carts", "~", "carts:p", "items", "epoch", "stock", "stock:items",
	":", "deducted:x", "x:deducted", "a,b", "a;b", "a=1", "%d", "nil", "0",
}

// Promise (package doc, Keys): "two items never share a key, and no item reaches the keys that
// are not an item's": an operation on one item never changes another, whatever the names, and
// Items lists exactly the loaded items.
func TestKeyNamesDoNotCollide(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		r := testkit.NewReserver(t, b.Client(t), stock.WithUserLimit(1000))
		initial := map[string]int64{}
		for i, n := range names {
			initial[n] = int64(100 + i)
			require.NoError(t, r.Load(ctx, n, initial[n]), n)
		}
		snapshot := func() map[string]stock.Levels {
			m := map[string]stock.Levels{}
			for _, n := range names {
				m[n] = check(t, r, n, initial[n])
			}
			return m
		}
		before := snapshot()
		for i, n := range names {
			user := names[(i+7)%len(names)]
			id := names[(i+3)%len(names)]
			assert.False(t, must(r.Deduct(ctx, req(n, id, user, 2)))(t, n).Replayed)
			require.NoError(t, testkit.Err(r.Hold(ctx, req(n, id+":h", user, 1), time.Hour)), n)
			require.NoError(t, testkit.Err(r.Restock(ctx, n, id+":rs", 3)), n)
			after := snapshot()
			for _, m := range names {
				if m == n {
					want := before[n]
					// +3 restocked, -2 deducted, -1 held
					want.Sold += 2
					want.Held++
					want.Loaded += 3
					assert.Equal(t, want, after[n], "item %s", n)
					continue
				}
				assert.Equal(t, before[m], after[m], "an operation on %q changed %q", n, m)
			}
			before = after
			e := must(r.Ledger(ctx, n, id))(t)
			assert.Equal(t, user, e.User, "%s/%s", n, id)
			assert.Equal(t, int64(2), e.Qty)
			assert.Equal(t, stock.KindDeduct, e.Kind)
			h := must(r.Ledger(ctx, n, id+":h"))(t)
			assert.Equal(t, user, h.User)
			assert.Equal(t, stock.StateHeld, h.State)
			assert.False(t, h.Deadline.IsZero())
		}
		// A cart over every name, as a saga: then its retry, then Restore of each line.
		var lines []stock.Line
		for _, n := range names {
			lines = append(lines, stock.Line{SKU: n, Qty: 1})
		}
		for _, user := range []string{"x:1", "~", ":"} {
			id := "cart:" + user
			require.NoError(t, testkit.Err(r.DeductMany(ctx, stock.Cart{ID: id, User: user, Lines: lines})))
			assert.True(t, must(r.DeductMany(ctx, stock.Cart{ID: id, User: user, Lines: lines}))(t).Replayed)
		}
		assert.ElementsMatch(t, names, itemsOf(t, r))
		for _, n := range names {
			assert.Equal(t, int64(2+3), check(t, r, n, initial[n]).Sold, n)
		}
	})
}

// Promise (WithGroups doc and the Keys section): grouped keys stay injective when group names
// equal item names or key suffixes; an operation on one item never changes another.
func TestGroupNamesDoNotCollide(t *testing.T) {
	group := func(sku string) string {
		switch sku {
		case "tee":
			return "tee" // a group named as its own item
		case "x:u", "x:l":
			return "x" // group = another item's name
		case "x":
			return "" // ungrouped
		case "items", "carts":
			return "~" // group named like the cart log's tag
		case "u":
			return "x:u" // group named like a suffixed key of item x
		case "g:{":
			return "g"
		}
		return "x:" + sku
	}
	names := []string{"tee", "x", "x:u", "x:l", "items", "carts", "u", "~carts", "l", "o", "h", "b"}
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		r := testkit.NewReserver(t, b.Client(t), stock.WithGroups(group), stock.WithUserLimit(1000))
		initial := map[string]int64{}
		for i, n := range names {
			initial[n] = int64(50 + i)
			require.NoError(t, r.Load(ctx, n, initial[n]), n)
		}
		before := map[string]stock.Levels{}
		for _, n := range names {
			before[n] = check(t, r, n, initial[n])
		}
		for i, n := range names {
			user := names[(i+1)%len(names)]
			id := names[(i+2)%len(names)]
			require.NoError(t, testkit.Err(r.Deduct(ctx, req(n, id, user, 1))), n)
			require.NoError(t, testkit.Err(r.Hold(ctx, req(n, user, id, 1), time.Hour)), n)
			for _, m := range names {
				l := check(t, r, m, initial[m])
				if m == n {
					assert.Equal(t, before[m].Sold+1, l.Sold, m)
					assert.Equal(t, before[m].Held+1, l.Held, m)
				} else {
					assert.Equal(t, before[m], l, "an operation on %q changed %q", n, m)
				}
				before[m] = l
			}
		}
		// Carts within one group, and across groups.
		for i, c := range []stock.Cart{
			{ID: "c1", User: "x", Lines: []stock.Line{{SKU: "x:u", Qty: 1}, {SKU: "x:l", Qty: 1}}},
			{ID: "c2", User: "x:u", Lines: []stock.Line{{SKU: "items", Qty: 1}, {SKU: "carts", Qty: 1}}},
			{ID: "c3", User: "tee", Lines: []stock.Line{{SKU: "tee", Qty: 1}, {SKU: "x", Qty: 1}, {SKU: "u", Qty: 1}}},
		} {
			require.NoError(t, testkit.Err(r.DeductMany(ctx, c)), i)
			assert.True(t, must(r.DeductMany(ctx, c))(t, i).Replayed, i)
			for _, ln := range c.Lines {
				before[ln.SKU] = stock.Levels{Available: before[ln.SKU].Available - 1, Held: before[ln.SKU].Held, Sold: before[ln.SKU].Sold + 1, Loaded: before[ln.SKU].Loaded}
			}
			for _, m := range names {
				assert.Equal(t, before[m], check(t, r, m, initial[m]), "after cart %d: %s", i, m)
			}
		}
	})
}

// Promise (WithPrefix and the Keys section): two Reservers with prefixes "a" and "a:b" (and
// "a:items", "a:carts") on one Redis never touch each other's items, registry or cart log.
func TestPrefixesDoNotCollide(t *testing.T) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		c := b.Client(t)
		prefixes := []string{"a", "a:b", "a:items", "a:carts", "a:b:c", "a:"}
		rs := map[string]*stock.Reserver{}
		for i, p := range prefixes {
			rs[p] = testkit.NewReserver(t, c, stock.WithPrefix(p))
			for _, n := range []string{"x", "b", "c", "items", "carts", "b:x"} {
				require.NoError(t, rs[p].Load(ctx, n, int64(10+i)), "%s %s", p, n)
			}
		}
		for i, p := range prefixes {
			r := rs[p]
			require.NoError(t, testkit.Err(r.Deduct(ctx, req("x", "o1", "u", int64(i+1)))))
			_, err := r.DeductMany(ctx, stock.Cart{ID: "k1", User: "u", Lines: []stock.Line{{SKU: "b", Qty: 1}, {SKU: "c", Qty: 1}}})
			require.NoError(t, err)
		}
		require.NoError(t, testkit.Err(stockops.RecoverCarts(ctx, rs["a:b"], -time.Second)))
		for i, p := range prefixes {
			r := rs[p]
			assert.Equal(t, int64(i+1), check(t, r, "x", int64(10+i)).Sold, "%s x", p)
			for _, n := range []string{"b", "c"} {
				assert.Equal(t, int64(1), check(t, r, n, int64(10+i)).Sold, "%s %s", p, n)
			}
			assert.ElementsMatch(t, []string{"x", "b", "c", "items", "carts", "b:x"}, itemsOf(t, r), p)
		}
	})
}

// TestNames: names with ':' '~', unicode, and the longest SKU and id (MaxNameLen bytes)
// work on a split item as on a plain one.
func TestNames(t *testing.T) {
	each(t, []stock.Option{split(64)}, func(t *testing.T, e *requestEnv) {
		long := strings.Repeat("é", stock.MaxNameLen/2) // 128 bytes
		for _, sku := range []string{"a:b:c", "x~1~2", "商品-ü-🙂", "s:~0", long} {
			t.Run(fmt.Sprintf("%.12s", sku), func(t *testing.T) {
				require.NoError(t, e.r.Load(ctx, sku, 70), "Load of %d-byte sku", len(sku))
				for i, user := range []string{"u:1", "u~2", "ユーザー", long, ""} {
					id := fmt.Sprintf("id:%d~ü", i)
					if i == 3 {
						id = strings.Repeat("i", stock.MaxNameLen)
					}
					assert.Equal(t, sku, must(e.r.Deduct(ctx, req(sku, id, user, 2)))(t).SKU)
					ent := must(e.r.Ledger(ctx, sku, id))(t)
					assert.Equal(t, sku, ent.SKU)
					assert.Equal(t, user, ent.User)
				}
				require.NoError(t, testkit.Err(e.r.Restore(ctx, sku, "id:0~ü")))
				assert.Equal(t, stock.Levels{Available: 62, Sold: 8, Loaded: 70}, levels(t, e.r, sku))
				require.NoError(t, e.r.CloseItem(ctx, sku))
				require.NoError(t, e.r.ReopenItem(ctx, sku))
				require.NoError(t, testkit.Err(e.r.Deduct(ctx, req(sku, "all", "", 62))))
			})
		}
	})
}

// TestOddIDs: request ids and users with separators, braces, spaces, unicode and the maximum
// length answer on a split item as on a plain one (taken, replayed, refused as invalid alike).
func TestOddIDs(t *testing.T) {
	lifecycleEach(t, []stock.Option{lifecycleSplit(3)}, func(t *testing.T, e *env) {
		plain, split := sku("plain-odd"), sku("odd")
		ids := []string{"a|1", "a|1|2", "{x}", "}", "a:b~c", "sp ace", "ünï", "r", strings.Repeat("i", stock.MaxNameLen),
			strings.Repeat("j", stock.MaxNameLen+1), "", "nul\x00x", "\n"}
		for _, sku := range []string{plain, split} {
			require.NoError(t, e.r.Load(ctx, sku, 100))
		}
		for _, id := range ids {
			for _, user := range []string{"", "u|0", id} {
				var got [2]string
				for j, sku := range []string{plain, split} {
					rc, err := e.r.Deduct(ctx, req(sku, id, user, 1))
					got[j] = fmt.Sprintf("%s replayed=%v", class(err), rc.Replayed)
				}
				assert.Equal(t, got[0], got[1], "id %q user %q", id, user)
				var gr [2]string
				for j, sku := range []string{plain, split} {
					_, err := e.r.Ledger(ctx, sku, id)
					gr[j] = class(err)
				}
				assert.Equal(t, gr[0], gr[1], "ledger of id %q", id)
			}
		}
		lp, ls := testkit.Levels(t, e.r, plain), testkit.Levels(t, e.r, split)
		assert.Equal(t, lp.Sold, ls.Sold)
	})
}

// every rune of Unicode category Cf that Go knows.
func outsideCfRunes() []rune {
	var out []rune
	for _, rg := range unicode.Cf.R16 {
		for r := rune(rg.Lo); r <= rune(rg.Hi); r += rune(rg.Stride) {
			out = append(out, r)
		}
	}
	for _, rg := range unicode.Cf.R32 {
		for r := rune(rg.Lo); r <= rune(rg.Hi); r += rune(rg.Stride) {
			out = append(out, r)
		}
	}
	return out
}

// Every name with a Unicode format character (Cf) is ErrInvalid, naming the code point and
// its offset, and nothing is written.
func TestNamesWithFormatCharactersRefused(t *testing.T) {
	e := outsideMini(t, stock.WithUserLimit(5))
	e.load("ok", 100)
	cfs := outsideCfRunes()
	require.GreaterOrEqual(t, len(cfs), 100, "Cf runes")
	for _, cf := range cfs {
		bad := "x" + string(cf) + "y"
		code := fmt.Sprintf("U+%04X", cf)
		check := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, stock.ErrInvalid) {
				t.Errorf("%s with %s: %v, want ErrInvalid", what, code, err)
				return
			}
			assert.ErrorContains(t, err, code, "%s with %s: the message names the code point", what, code)
			assert.ErrorContains(t, err, "1", "%s with %s: the message names the offset", what, code)
		}
		check("Load sku", e.r.Load(e.ctx, bad, 1))
		check("Deduct id", testkit.Err(e.r.Deduct(e.ctx, req("ok", bad, "u", 1))))
		check("Deduct user", testkit.Err(e.r.Deduct(e.ctx, req("ok", "i", bad, 1))))
		check("Restore id", testkit.Err(e.r.Restore(e.ctx, "ok", bad)))
		check("Restock id", testkit.Err(e.r.Restock(e.ctx, "ok", bad, 1)))
		check("DeductMany id", testkit.Err(e.r.DeductMany(e.ctx, stock.Cart{ID: bad, User: "u", Lines: []stock.Line{{SKU: "ok", Qty: 1}}})))
		_, err := e.r.HoldMany(e.ctx, stock.Cart{ID: "c", User: bad, Lines: []stock.Line{{SKU: "ok", Qty: 1}}}, time.Minute)
		check("HoldMany user", err)
		check("Ledger id", testkit.Err(e.r.Ledger(e.ctx, "ok", bad)))
		_, err = stock.New(e.c, stock.WithPrefix(bad))
		check("WithPrefix", err)
		check("RunOptions.Reconcile.Items", stock.RunOptions{Store: e.store, Reconcile: &stock.ReconcileOptions{Items: []string{bad}}}.Validate())
		check("RunOptions.Relay.Items", stock.RunOptions{Store: e.store, Relay: &stock.RelayOptions{Items: []string{bad}}}.Validate())
	}
	assert.Equal(t, stock.Levels{Available: 100, Loaded: 100}, e.levels("ok"), "refusals change nothing")
	ks := outsideKeys(t, e.c)
	for _, k := range ks {
		for _, r := range k {
			assert.False(t, unicode.Is(unicode.Cf, r), "key with a format character: %q", k)
		}
	}
}

// The offset named is the byte offset of the character.
func TestNameFormatCharacterOffsetIsByteOffset(t *testing.T) {
	e := outsideMini(t)
	err := e.r.Load(e.ctx, "日本\u200Bx", 1) // 日本 is 6 bytes
	if !errors.Is(err, stock.ErrInvalid) || !strings.Contains(err.Error(), "6") || !strings.Contains(err.Error(), "U+200B") {
		t.Errorf("error %v: want U+200B at byte offset 6", err)
	}
}

// A group name with a format character makes no group: no key holds the character, and the
// items load, sell in a cart and relay as ungrouped items.
func TestGroupNameWithFormatCharacterIsNoGroup(t *testing.T) {
	e := outsideMini(t, stock.WithGroups(func(sku string) string { return "g\u200Dh" }))
	e.load("a", 5)
	e.load("b", 5)
	for _, k := range outsideKeys(t, e.c) {
		assert.NotContains(t, k, "\u200D", "a key holds the group's format character")
	}
	require.NoError(t, testkit.Err(e.r.Levels(e.ctx, "a")))
	require.NoError(t, testkit.Err(e.r.DeductMany(e.ctx, stock.Cart{ID: "c", User: "u", Lines: []stock.Line{{SKU: "a", Qty: 1}, {SKU: "b", Qty: 1}}})))
	e.relay()
	e.want("a", 5, 1, 0)
}

// Look-alike names stay distinct: a name with letters that are not format characters works.
func TestNamesOfOtherScriptsAccepted(t *testing.T) {
	e := outsideMini(t)
	for _, n := range []string{"café", "cafe\u0301", "日本", "😀", "ㅤ", "a\uFE0F"} {
		assert.NoError(t, e.r.Load(e.ctx, n, 1), "Load %q", n)
	}
}

// ErrConflict's message names what differs from the id's first use (quantity, user or kind).
func TestConflictMessagesNameWhatDiffers(t *testing.T) {
	for _, split := range []bool{false, true} {
		t.Run(fmt.Sprint("split=", split), func(t *testing.T) {
			var opts []stock.Option
			if split {
				opts = append(opts, stock.WithBuckets(outsideTwoBuckets))
			}
			e := outsideMini(t, opts...)
			e.load("a", 100)
			e.load("b", 100)
			ctx := e.ctx
			require.NoError(t, testkit.Err(e.r.Deduct(ctx, req("a", "d", "alice", 1))))
			require.NoError(t, testkit.Err(e.r.Hold(ctx, req("a", "h", "alice", 2), time.Hour)))
			require.NoError(t, testkit.Err(e.r.Restock(ctx, "a", "r", 5)))
			require.NoError(t, testkit.Err(e.r.DeductMany(ctx, stock.Cart{ID: "c", User: "alice", Lines: []stock.Line{{SKU: "a", Qty: 1}, {SKU: "b", Qty: 2}}})))

			type tc struct {
				name    string
				err     error
				want    []string
				notWant []string
			}
			var cases []tc
			add := func(name string, err error, want []string, notWant ...string) {
				cases = append(cases, tc{name, err, want, notWant})
			}
			add("deduct other qty", testkit.Err(e.r.Deduct(ctx, req("a", "d", "alice", 3))),
				[]string{"with quantity 1, not 3"}, "another user", "hold")
			add("deduct other user", testkit.Err(e.r.Deduct(ctx, req("a", "d", "bob", 1))),
				[]string{"another user"}, "units", "alice", "bob")
			add("hold of a deduct", testkit.Err(e.r.Hold(ctx, req("a", "d", "alice", 1), time.Hour)),
				[]string{"deduct", "not a hold"}, "units", "another user")
			add("deduct of a hold", testkit.Err(e.r.Deduct(ctx, req("a", "h", "alice", 2))),
				[]string{"hold", "not a deduct"}, "units", "another user")
			add("deduct of a hold, other qty", testkit.Err(e.r.Deduct(ctx, req("a", "h", "alice", 1))),
				[]string{"hold", "not a deduct", "with quantity 2, not 1"}, "another user")
			add("deduct of a restock", testkit.Err(e.r.Deduct(ctx, req("a", "r", "alice", 5))),
				[]string{"restock"}, "another user")
			add("restock of a deduct", testkit.Err(e.r.Restock(ctx, "a", "d", 1)), []string{"deduct"}, "another user")
			add("restock other qty", testkit.Err(e.r.Restock(ctx, "a", "r", 6)), []string{"with quantity 5, not 6"})
			add("confirm of a deduct", testkit.Err(e.r.Confirm(ctx, "a", "d")),
				[]string{"used for a deduct", "not a hold"}, "another user", "units")
			add("cancel of a deduct", testkit.Err(e.r.Cancel(ctx, "a", "d")),
				[]string{"used for a deduct", "not a hold"}, "another user", "units")
			add("restore of a restock", testkit.Err(e.r.Restore(ctx, "a", "r")), []string{"restock"})
			add("cart other user", testkit.Err(e.r.DeductMany(ctx, stock.Cart{ID: "c", User: "bob", Lines: []stock.Line{{SKU: "a", Qty: 1}, {SKU: "b", Qty: 2}}})),
				[]string{"another user"}, "alice", "bob")
			add("cart other lines", testkit.Err(e.r.DeductMany(ctx, stock.Cart{ID: "c", User: "alice", Lines: []stock.Line{{SKU: "a", Qty: 1}, {SKU: "b", Qty: 3}}})),
				[]string{"line"}, "another user")
			add("cart other kind", testkit.Err(e.r.HoldMany(ctx, stock.Cart{ID: "c", User: "alice", Lines: []stock.Line{{SKU: "a", Qty: 1}, {SKU: "b", Qty: 2}}}, time.Hour)),
				[]string{"hold"}, "another user")
			for _, c := range cases {
				if !errors.Is(c.err, stock.ErrConflict) {
					t.Errorf("%s: %v, want ErrConflict", c.name, c.err)
					continue
				}
				msg := c.err.Error()
				for _, w := range c.want {
					assert.Contains(t, msg, w, "%s: message lacks it", c.name)
				}
				for _, w := range c.notWant {
					assert.NotContains(t, msg, w, "%s: message says it", c.name)
				}
			}
			lv := e.levels("a")
			assert.Equal(t, [3]int64{2, 2, 105}, [3]int64{lv.Sold, lv.Held, lv.Loaded}, "sold, held, loaded after conflicts")
		})
	}
}
