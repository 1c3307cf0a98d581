package stock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
)

// TestNamesRefuseFormatCharacters: a name (item, request id, user, prefix) holding an invisible
// Unicode format character (category Cf), at its start, in its middle or at its end, is
// refused with ErrInvalid before anything is sent, and the error names the character's code
// point and byte offset; nothing changes, and the look-alike plain name stays the only item.
// Names with ordinary non-ASCII letters, marks and symbols are still accepted.
func TestNamesRefuseFormatCharacters(t *testing.T) {
	format := map[string]rune{
		"zero width space":          '\u200b',
		"zero width non-joiner":     '\u200c',
		"zero width joiner":         '\u200d',
		"word joiner":               '\u2060',
		"byte order mark":           '\ufeff',
		"soft hyphen":               '\u00ad',
		"left-to-right mark":        '\u200e',
		"right-to-left override":    '\u202e',
		"left-to-right embedding":   '\u202a',
		"right-to-left isolate":     '\u2067',
		"pop directional isolate":   '\u2069',
		"arabic letter mark":        '\u061c',
		"mongolian vowel separator": '\u180e',
		"tag latin small letter a":  '\U000E0061',
	}
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := newReserver(t, c)
		require.NoError(t, r.Load(ctx, "shoe", 10))
		_, err := r.Deduct(ctx, stock.Request{SKU: "shoe", ID: "o1", User: "ann", Qty: 1})
		require.NoError(t, err)
		before := ledger(t, r, "shoe")

		for what, ch := range format {
			code := fmt.Sprintf("U+%04X", ch)
			for _, n := range []struct {
				name string
				at   int // byte offset of ch
			}{
				{string(ch) + "shoe", 0},
				{"sh" + string(ch) + "oe", 2},
				{"shoe" + string(ch), 4},
			} {
				check := func(op string, err error) {
					t.Helper()
					require.ErrorIs(t, err, stock.ErrInvalid, "%s: %s of %q", what, op, n.name)
					assert.ErrorContains(t, err, code, "%s: %s names the code point", what, op)
					assert.ErrorContains(t, err, fmt.Sprintf("at byte %d", n.at), "%s: %s names the position", what, op)
				}
				check("load", r.Load(ctx, n.name, 5))
				_, err := r.Deduct(ctx, stock.Request{SKU: n.name, ID: "o2", Qty: 1})
				check("deduct of the item", err)
				_, err = r.Deduct(ctx, stock.Request{SKU: "shoe", ID: n.name, Qty: 1})
				check("deduct with the id", err)
				_, err = r.Deduct(ctx, stock.Request{SKU: "shoe", ID: "o3", User: n.name, Qty: 1})
				check("deduct by the user", err)
				_, err = r.Restore(ctx, "shoe", n.name)
				check("restore of the id", err)
				_, err = r.Restock(ctx, "shoe", n.name, 1)
				check("restock with the id", err)
				_, err = r.Levels(ctx, n.name)
				check("levels of the item", err)
				_, err = r.Hold(ctx, stock.Request{SKU: "shoe", ID: n.name, Qty: 1}, time.Minute)
				check("hold with the id", err)
				_, err = r.DeductMany(ctx, stock.Cart{ID: n.name, Lines: []stock.Line{{SKU: "shoe", Qty: 1}}})
				check("cart with the id", err)
				_, err = r.DeductMany(ctx, stock.Cart{ID: "c1", Lines: []stock.Line{{SKU: n.name, Qty: 1}}})
				check("cart line of the item", err)
				_, err = stock.New(c, stock.WithPrefix(n.name))
				check("prefix", err)
			}
		}
		assert.Equal(t, before, ledger(t, r, "shoe"), "no ledger entry, no tombstone")
		assert.Equal(t, stock.Levels{Available: 9, Sold: 1, Loaded: 10}, levels(t, r, "shoe"))

		// Letters, marks and symbols of any script are names.
		for i, name := range []string{"é", "日本", "caf\u00e9", "cafe\u0301", "スニーカー", "ünïcødé-42", "\U0001F45F", "ß:~"} {
			require.NoError(t, r.Load(ctx, name, 3), "load %q", name)
			id, user := name+"-order", "ユーザー"+name
			rc := must(t, "deduct %q", name)(r.Deduct(ctx, stock.Request{SKU: name, ID: id, User: user, Qty: 1}))
			assert.Equal(t, int64(2), rc.Remaining, "%q", name)
			must(t, "restore %q", name)(r.Restore(ctx, name, id))
			assert.Equal(t, stock.Levels{Available: 3, Loaded: 3}, levels(t, r, name), "%q", name)
			_, err = stock.New(c, stock.WithPrefix(fmt.Sprintf("p%d%s", i, name)))
			assert.NoError(t, err, "prefix %q", name)
		}
		// "café" precomposed and "cafe" + combining accent are two names: compared byte for byte.
		assert.NotEqual(t, "caf\u00e9", "cafe\u0301")
	})
}
