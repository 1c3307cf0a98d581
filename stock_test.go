package stock_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/engine"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/stockops"
)

func TestLoadAvailableLevels(t *testing.T) {
	eachReserver(t, nil, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		assert.ErrorIs(t, testkit.Err(available(r.Levels(ctx, "ghost"))), stock.ErrNotLoaded)
		assert.ErrorIs(t, testkit.Err(r.Levels(ctx, "ghost")), stock.ErrNotLoaded)

		require.NoError(t, r.Load(ctx, "sku-1", 100))
		n, err := available(r.Levels(ctx, "sku-1"))
		require.NoError(t, err)
		assert.Equal(t, int64(100), n)

		must(t)(r.Deduct(ctx, stock.Request{SKU: "sku-1", ID: "o1", Qty: 30}))
		// A re-run preheat never clobbers a live sale.
		assert.ErrorIs(t, r.Load(ctx, "sku-1", 100), stock.ErrLoaded)
		assert.Equal(t, stock.Levels{Available: 70, Sold: 30, Loaded: 100}, levels(t, r, "sku-1"))

		// Zero stock is a listed item with nothing to sell, not a missing one.
		require.NoError(t, r.Load(ctx, "empty", 0))
		mustFail(t, stock.ErrSoldOut)(r.Deduct(ctx, stock.Request{SKU: "empty", ID: "o1", Qty: 1}))

		var items []string
		for sku, err := range stockops.Items(ctx, r) {
			require.NoError(t, err)
			items = append(items, sku)
		}
		assert.ElementsMatch(t, []string{"sku-1", "empty"}, items)
	})
}

func TestDeductOutcomes(t *testing.T) {
	eachReserver(t, nil, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		require.NoError(t, r.Load(ctx, "A", 10))

		rc := must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", User: "u1", Qty: 3}))
		assert.Equal(t, stock.Receipt{SKU: "A", ID: "o1", Qty: 3, Remaining: 7}, rc)

		must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", Qty: 5}))

		// A replay repeats the original receipt, even though the stock moved since.
		rc = must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", User: "u1", Qty: 3}))
		assert.Equal(t, stock.Receipt{SKU: "A", ID: "o1", Qty: 3, Remaining: 7, Replayed: true}, rc)

		// The same id with other parameters is a conflict, and changes nothing.
		for _, req := range []stock.Request{
			{SKU: "A", ID: "o1", User: "u1", Qty: 2},
			{SKU: "A", ID: "o1", User: "u2", Qty: 3},
			{SKU: "A", ID: "o1", Qty: 3},
		} {
			rc = mustFail(t, stock.ErrConflict, "%+v", req)(r.Deduct(ctx, req))
			assert.Equal(t, int64(3), rc.Qty, "conflict reports the original quantity")
		}

		rc = mustFail(t, stock.ErrInsufficient)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o3", Qty: 3}))
		assert.Equal(t, int64(2), rc.Remaining)

		must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o4", Qty: 2}))
		rc = mustFail(t, stock.ErrSoldOut)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o5", Qty: 1}))
		assert.Equal(t, int64(0), rc.Remaining)

		mustFail(t, stock.ErrNotLoaded)(r.Deduct(ctx, stock.Request{SKU: "B", ID: "o1", Qty: 1}))

		l, entries := checkLedger(t, r, "A", 10)
		assert.Equal(t, stock.Levels{Available: 0, Sold: 10, Loaded: 10}, l)
		require.Len(t, entries, 3, "refused requests leave no entry")
		e := entries["o1"]
		assert.Equal(t, stock.Entry{ID: "o1", SKU: "A", User: "u1", Kind: stock.KindDeduct, State: stock.StateReserved,
			Qty: 3, Before: 10, After: 7, At: e.At}, e)
		assert.False(t, e.At.IsZero())
		e2 := entry(t, r, "A", "o1")
		assert.Equal(t, e, e2)
		assert.ErrorIs(t, testkit.Err(r.Ledger(ctx, "A", "o5")), stock.ErrUnknownID)
	})
}

func TestRestore(t *testing.T) {
	eachReserver(t, []stock.Option{stock.WithUserLimit(2)}, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		require.NoError(t, r.Load(ctx, "A", 5))

		must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", User: "u1", Qty: 2}))
		mustFail(t, stock.ErrUserLimit)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", User: "u1", Qty: 1}))

		rc := must(t)(r.Restore(ctx, "A", "o1"))
		assert.Equal(t, stock.Receipt{SKU: "A", ID: "o1", Qty: 2, Remaining: 5}, rc)
		// Once: the second restore is a replay and gives nothing.
		rc = must(t)(r.Restore(ctx, "A", "o1"))
		assert.True(t, rc.Replayed)
		assert.Equal(t, int64(2), rc.Qty)
		assert.Equal(t, stock.Levels{Available: 5, Loaded: 5}, levels(t, r, "A"))

		// The user's units came back with the stock.
		must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", User: "u1", Qty: 2}))

		// A restored id cannot take stock again.
		mustFail(t, stock.ErrRestored)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", User: "u1", Qty: 2}))

		// Restore of an unknown id takes nothing (no blind INCRBY) and leaves a tombstone:
		// the late deduct it overtook is refused.
		mustFail(t, stock.ErrUnknownID)(r.Restore(ctx, "A", "late"))
		mustFail(t, stock.ErrUnknownID)(r.Restore(ctx, "A", "late"))
		assert.Equal(t, stock.Levels{Available: 3, Sold: 2, Loaded: 5}, levels(t, r, "A"))
		mustFail(t, stock.ErrRestored)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "late", Qty: 1}))
		e := entry(t, r, "A", "late")
		assert.Equal(t, stock.KindTombstone, e.Kind)

		l, entries := checkLedger(t, r, "A", 5)
		assert.Equal(t, stock.Levels{Available: 3, Sold: 2, Loaded: 5}, l)
		assert.Equal(t, stock.StateRestored, entries["o1"].State)
	})
}

func TestRestock(t *testing.T) {
	eachReserver(t, nil, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		mustFail(t, stock.ErrNotLoaded)(r.Restock(ctx, "A", "r1", 5))
		require.NoError(t, r.Load(ctx, "A", 1))
		must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1}))

		rc := must(t)(r.Restock(ctx, "A", "r1", 5))
		assert.Equal(t, stock.Receipt{SKU: "A", ID: "r1", Qty: 5, Remaining: 5}, rc)
		rc = must(t)(r.Restock(ctx, "A", "r1", 5))
		assert.True(t, rc.Replayed)
		mustFail(t, stock.ErrConflict)(r.Restock(ctx, "A", "r1", 6))
		mustFail(t, stock.ErrConflict, "a restock is not a deduct")(r.Restore(ctx, "A", "r1"))
		_, err := r.Restock(ctx, "A", "r2", stock.MaxQty)
		assert.ErrorIs(t, err, stock.ErrInvalid, "over MaxQty in all")
		assert.ErrorContains(t, err, "A/r2", "the error names the item and the id")
		assert.ErrorContains(t, err, "MaxQty", "and says why")

		l, _ := checkLedger(t, r, "A", 1)
		assert.Equal(t, stock.Levels{Available: 5, Sold: 1, Loaded: 6}, l)
	})
}

func TestUserLimit(t *testing.T) {
	opts := []stock.Option{stock.WithUserLimit(1)}
	eachReserver(t, opts, func(t *testing.T, c rueidis.Client, r *stock.Reserver) { // one unit per user
		require.NoError(t, r.Load(ctx, "A", 10))
		mustFail(t, stock.ErrUserLimit)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", User: "u1", Qty: 2}))
		must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", User: "u1", Qty: 1}))
		rc := mustFail(t, stock.ErrUserLimit)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", User: "u1", Qty: 1}))
		assert.Equal(t, int64(1), rc.Qty, "units the user has")
		// The replay of the admitted request is not a second unit.
		rc = must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", User: "u1", Qty: 1}))
		assert.True(t, rc.Replayed)
		must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o3", User: "u2", Qty: 1}))
		must(t, "requests without a user are not limited")(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o4", Qty: 5}))
		assert.Equal(t, int64(3), levels(t, r, "A").Available)
	})
}

// TestUserRequiredRefusesTakesWithoutUser: with WithUserRequired and a per-user limit, a
// deduct, a hold and a cart (one-slot and saga, plain and split items) without a user are
// ErrInvalid naming the field, and change nothing; without a limit the option changes nothing.
func TestUserRequiredRefusesTakesWithoutUser(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		r := newReserver(t, c, append(splitSAndGroupG, stock.WithUserLimit(2), stock.WithUserRequired())...)
		loadItems(t, r, map[string]int64{"A": 10, "B": 10, "G1": 10, "G2": 10, "S": 10})
		refused := func(what string, err error, field string) {
			t.Helper()
			assert.ErrorIs(t, err, stock.ErrInvalid, what)
			assert.ErrorContains(t, err, field, what)
			assert.ErrorContains(t, err, "WithUserRequired", what)
		}
		for _, sku := range []string{"A", "S"} {
			_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: "o1", Qty: 1})
			refused("deduct "+sku, err, "has no User")
			_, err = r.Hold(ctx, stock.Request{SKU: sku, ID: "h1", Qty: 1}, time.Minute)
			refused("hold "+sku, err, "has no User")
		}
		for name, lines := range map[string][]stock.Line{
			"saga":     {{SKU: "A", Qty: 1}, {SKU: "B", Qty: 1}},
			"one slot": {{SKU: "G1", Qty: 1}, {SKU: "G2", Qty: 1}},
			"split":    {{SKU: "A", Qty: 1}, {SKU: "S", Qty: 1}},
		} {
			_, err := r.DeductMany(ctx, stock.Cart{ID: "c1", Lines: lines})
			refused("deduct many "+name, err, "cart c1 has no User")
			_, err = r.HoldMany(ctx, stock.Cart{ID: "c2", Lines: lines}, time.Minute)
			refused("hold many "+name, err, "cart c2 has no User")
		}
		for _, sku := range []string{"A", "B", "G1", "G2", "S"} {
			l, entries := checkLedger(t, r, sku, 10)
			assert.Equal(t, stock.Levels{Available: 10, Loaded: 10}, l, sku)
			assert.Empty(t, entries, "%s: nothing recorded", sku)
		}
		// With a user, the same requests are taken.
		must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", User: "u1", Qty: 1}))
		mustCart(t)(r.DeductMany(ctx, stock.Cart{ID: "c1", User: "u1", Lines: []stock.Line{{SKU: "G1", Qty: 1}, {SKU: "G2", Qty: 1}}}))

		// Without a limit, the option refuses nothing.
		free := newReserver(t, c, stock.WithUserRequired(), stock.WithPrefix("free"))
		require.NoError(t, free.Load(ctx, "A", 10))
		must(t)(free.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1}))
	})
}

func TestBadInputChangesNothing(t *testing.T) {
	eachReserver(t, nil, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		require.NoError(t, r.Load(ctx, "A", 10))
		must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1}))
		before := ledger(t, r, "A")

		long := strings.Repeat("x", stock.MaxNameLen+1)
		bad := map[string]stock.Request{
			"empty sku":       {ID: "o", Qty: 1},
			"empty id":        {SKU: "A", Qty: 1},
			"zero qty":        {SKU: "A", ID: "o", Qty: 0},
			"negative qty":    {SKU: "A", ID: "o", Qty: -1},
			"qty over 2^53":   {SKU: "A", ID: "o", Qty: stock.MaxQty + 1},
			"long sku":        {SKU: long, ID: "o", Qty: 1},
			"long id":         {SKU: "A", ID: long, Qty: 1},
			"long user":       {SKU: "A", ID: "o", User: long, Qty: 1},
			"brace in sku":    {SKU: "A}x", ID: "o", Qty: 1},
			"brace in id":     {SKU: "A", ID: "{o}", Qty: 1},
			"space in id":     {SKU: "A", ID: "o 1", Qty: 1},
			"newline in id":   {SKU: "A", ID: "o\n", Qty: 1},
			"control in user": {SKU: "A", ID: "o", User: "u\x00", Qty: 1},
			"pipe in user":    {SKU: "A", ID: "o", User: "u|1", Qty: 1},
			"tab in sku":      {SKU: "A\t", ID: "o", Qty: 1},
			"invalid utf8":    {SKU: "A", ID: "o\xff", Qty: 1},
		}
		for name, req := range bad {
			mustFail(t, stock.ErrInvalid, name)(r.Deduct(ctx, req))
			if req.SKU != "" && req.ID != "" {
				_, err := r.Restore(ctx, req.SKU, req.ID)
				if name != "zero qty" && name != "negative qty" && name != "qty over 2^53" && !strings.Contains(name, "user") {
					assert.ErrorIs(t, err, stock.ErrInvalid, "restore: "+name)
				}
			}
		}
		assert.ErrorIs(t, r.Load(ctx, "B", -1), stock.ErrInvalid)
		assert.ErrorIs(t, r.Load(ctx, "B", stock.MaxQty+1), stock.ErrInvalid)
		assert.ErrorIs(t, r.Load(ctx, "B{x}", 1), stock.ErrInvalid)
		mustFail(t, stock.ErrInvalid)(r.Restock(ctx, "A", "r1", 0))
		assert.ErrorIs(t, testkit.Err(r.Ledger(ctx, "A", "")), stock.ErrInvalid)
		assert.ErrorIs(t, testkit.Err(stock.New(c, stock.WithPrefix("a{b"))), stock.ErrInvalid)
		assert.ErrorIs(t, testkit.Err(stock.New(c, stock.WithUserLimit(-1))), stock.ErrInvalid)
		assert.ErrorIs(t, testkit.Err(stock.New(nil)), stock.ErrInvalid)
		_, err := stock.New(c, stock.WithClock(time.Now), stock.WithClock(time.Now))
		assert.ErrorIs(t, err, stock.ErrInvalid, "two clocks: one would be ignored")

		// The zero-qty restores above were valid restores of unknown ids ("o"): they left a
		// tombstone, which is the documented behaviour. Apart from that, nothing changed.
		after := ledger(t, r, "A")
		delete(after, "o")
		assert.Equal(t, before, after)
		assert.Equal(t, stock.Levels{Available: 9, Sold: 1, Loaded: 10}, levels(t, r, "A"))
		assert.ErrorIs(t, testkit.Err(available(r.Levels(ctx, "B"))), stock.ErrNotLoaded)
	})
}

// TestLargeNumbers checks amounts near 2^53 on a real Lua: real Redis prints such numbers in
// exponent form with tostring, miniredis does not.
func TestLargeNumbers(t *testing.T) {
	eachReserver(t, nil, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		require.NoError(t, r.Load(ctx, "big", stock.MaxQty))
		rc := must(t)(r.Deduct(ctx, stock.Request{SKU: "big", ID: "o1", Qty: 123456789012345}))
		assert.Equal(t, int64(stock.MaxQty-123456789012345), rc.Remaining)
		e := entry(t, r, "big", "o1")
		assert.Equal(t, int64(stock.MaxQty), e.Before)
		assert.Equal(t, int64(stock.MaxQty-123456789012345), e.After)
		assert.Equal(t, int64(123456789012345), e.Qty)
		rc = must(t)(r.Deduct(ctx, stock.Request{SKU: "big", ID: "o1", Qty: 123456789012345}))
		assert.True(t, rc.Replayed, "the replay check compares big quantities exactly")
		rc = must(t)(r.Restore(ctx, "big", "o1"))
		assert.Equal(t, int64(stock.MaxQty), rc.Remaining)
		checkLedger(t, r, "big", stock.MaxQty)
	})
}

// TestScriptsSurviveAFlush: a SCRIPT FLUSH between calls must not surface (EVALSHA falls back to
// EVAL), nor a FUNCTION FLUSH on a server with Redis functions, where the scripts run as FCALL
// (the library is loaded again on "Function not found"). Where there are no functions
// (miniredis) the scripts run as EVALSHA.
func TestScriptsSurviveAFlush(t *testing.T) {
	for _, flush := range []string{"SCRIPT", "FUNCTION"} {
		t.Run(flush, func(t *testing.T) {
			eachReserver(t, nil, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
				require.NoError(t, r.Load(ctx, "A", 10))
				functions := true
				for i := range 3 {
					for _, cmd := range c.Nodes() {
						err := cmd.Do(ctx, cmd.B().Arbitrary(flush, "FLUSH").Build()).Error()
						if flush == "SCRIPT" {
							require.NoError(t, err)
						} else if err != nil {
							functions = false // miniredis: no functions
						}
					}
					must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o" + strconv.Itoa(i), Qty: 1, User: "u"}))
					must(t)(r.Restore(ctx, "A", "o"+strconv.Itoa(i)))
				}
				assert.Equal(t, int64(10), levels(t, r, "A").Available)
				if flush == "FUNCTION" && functions {
					var calls int64
					for _, n := range c.Nodes() {
						calls += commandCalls(t, n, "fcall")
					}
					assert.Positive(t, calls, "the scripts ran as functions")
				}
			})
		})
	}
}

func TestKeysShareOneSlotPerItem(t *testing.T) {
	eachReserver(t, []stock.Option{stock.WithPrefix("shop")}, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		// Many items, spread over the cluster's slots; every script of an item touches one slot.
		for i := range 20 {
			sku := fmt.Sprintf("item-%d", i)
			require.NoError(t, r.Load(ctx, sku, 2))
			must(t)(r.Deduct(ctx, stock.Request{SKU: sku, ID: "o", Qty: 1}))
			must(t)(r.Restore(ctx, sku, "o"))
		}
		// Every node: the item's keys all carry its tag, and they all live on one node.
		holders := 0
		for _, n := range c.Nodes() {
			keys, err := n.Do(ctx, n.B().Keys().Pattern("shop:*item-1}*").Build()).AsStrSlice()
			require.NoError(t, err)
			for _, k := range keys {
				assert.True(t, strings.HasPrefix(k, "shop:{item-1}"), k)
			}
			if len(keys) > 0 {
				holders++
			}
		}
		assert.Equal(t, 1, holders, "one item's keys are in one slot, on one node")
	})
}

// TestConcurrentSellOut: 1000 goroutines race over 100 units: exactly 100 succeed.
func TestConcurrentSellOut(t *testing.T) {
	eachReserver(t, nil, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		require.NoError(t, r.Load(ctx, "hot", 100))
		var ok, soldOut, other atomic.Int64
		var wg sync.WaitGroup
		for i := range 1000 {
			wg.Go(func() {
				_, err := r.Deduct(ctx, stock.Request{SKU: "hot", ID: fmt.Sprintf("o%d", i), User: fmt.Sprintf("u%d", i%300), Qty: 1})
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, stock.ErrSoldOut):
					soldOut.Add(1)
				default:
					other.Add(1)
					t.Error(err)
				}
			})
		}
		wg.Wait()
		assert.Equal(t, int64(100), ok.Load())
		assert.Equal(t, int64(900), soldOut.Load())
		assert.Zero(t, other.Load())
		l, entries := checkLedger(t, r, "hot", 100)
		assert.Equal(t, stock.Levels{Available: 0, Sold: 100, Loaded: 100}, l)
		assert.Len(t, entries, 100)
	})
}

// TestConcurrentMixed: random quantities, retries of the same id and interleaved restores.
// No id is applied twice and the ledger explains the levels.
func TestConcurrentMixed(t *testing.T) {
	eachReserver(t, []stock.Option{stock.WithUserLimit(5)}, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
		const initial = 100
		require.NoError(t, r.Load(ctx, "hot", initial))
		type result struct {
			taken, replays, restored int
		}
		var mu sync.Mutex
		got := map[string]*result{}
		qty := func(id int) int64 { return int64(id%4 + 1) }
		var wg sync.WaitGroup
		for g := range 1000 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(g), 7))
				id := rng.IntN(400)
				req := stock.Request{SKU: "hot", ID: "o" + strconv.Itoa(id), User: "u" + strconv.Itoa(id%50), Qty: qty(id)}
				for range 1 + rng.IntN(3) { // a share of requests is sent more than once
					rc, err := r.Deduct(ctx, req)
					mu.Lock()
					res := got[req.ID]
					if res == nil {
						res = &result{}
						got[req.ID] = res
					}
					switch {
					case err == nil && rc.Replayed:
						res.replays++
					case err == nil:
						res.taken++
					case errors.Is(err, stock.ErrSoldOut), errors.Is(err, stock.ErrInsufficient),
						errors.Is(err, stock.ErrUserLimit), errors.Is(err, stock.ErrRestored):
					default:
						t.Error(err)
					}
					mu.Unlock()
				}
				if rng.IntN(4) == 0 {
					rc, err := r.Restore(ctx, req.SKU, req.ID)
					mu.Lock()
					if err == nil && !rc.Replayed {
						got[req.ID].restored++
					} else if err != nil && !errors.Is(err, stock.ErrUnknownID) {
						t.Error(err)
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		l, entries := checkLedger(t, r, "hot", initial)
		var sold int64
		for id, res := range got {
			assert.LessOrEqual(t, res.taken, 1, "id %s taken twice", id)
			assert.LessOrEqual(t, res.restored, res.taken, "id %s restored without a take", id)
			e, ok := entries[id]
			if res.taken == 1 {
				require.True(t, ok, id)
				assert.Equal(t, qty(mustAtoi(id[1:])), e.Qty)
				if res.restored == 1 {
					assert.Equal(t, stock.StateRestored, e.State)
				} else {
					assert.Equal(t, stock.StateReserved, e.State)
					sold += e.Qty
				}
			}
		}
		assert.Equal(t, sold, l.Sold)
		assert.Equal(t, int64(initial), l.Available+l.Sold)
	})
}

func mustAtoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		panic(err)
	}
	return n
}

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
	eachReserver(t, nil, func(t *testing.T, c rueidis.Client, r *stock.Reserver) {
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
			assert.NoError(t, testkit.Err(stock.New(c, stock.WithPrefix(fmt.Sprintf("p%d%s", i, name)))), "prefix %q", name)
		}
		// "café" precomposed and "cafe" + combining accent are two names: compared byte for byte.
		assert.NotEqual(t, "caf\u00e9", "cafe\u0301")
	})
}

// TestConstantsAreTheEngines: the limits and defaults package stock documents are the ones its
// engine applies.
func TestConstantsAreTheEngines(t *testing.T) {
	for _, c := range []struct {
		name      string
		api, used int64
	}{
		{"MaxQty", stock.MaxQty, engine.MaxQty},
		{"MaxNameLen", stock.MaxNameLen, engine.MaxNameLen},
		{"MaxHoldTTL", int64(stock.MaxHoldTTL), int64(engine.MaxHoldTTL)},
		{"DefaultTimeout", int64(stock.DefaultTimeout), int64(engine.DefaultTimeout)},
	} {
		if c.api != c.used {
			t.Errorf("stock.%s = %d, the engine uses %d", c.name, c.api, c.used)
		}
	}
}
