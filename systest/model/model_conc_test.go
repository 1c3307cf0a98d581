package model_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/stockops"
)

const concN = 200

// eachPair runs f in parallel on every backend with two Reservers on two clients of one empty
// Redis, and a sleep that lets time pass for that Redis (on miniredis it moves its clock).
func eachPair(t *testing.T, f func(t *testing.T, rs [2]*stock.Reserver, sleep func(time.Duration))) {
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		c1, c2 := b.Pair(t)
		rs := [2]*stock.Reserver{testkit.NewReserver(t, c1), testkit.NewReserver(t, c2)}
		f(t, rs, func(d time.Duration) { redistest.Sleep(c1, d) })
	})
}

// soldOrNone checks that the deduct of each id prefix+i that succeeded is sold in the ledger and
// each one refused left no entry, and returns how many succeeded.
func soldOrNone(t *testing.T, r *stock.Reserver, sku, prefix string, errs []error) int64 {
	t.Helper()
	ok := acked(t, "deduct", errs)
	for i, err := range errs {
		if err == nil {
			wantEntry(t, r, sku, fmt.Sprint(prefix, i), stock.KindDeduct, stock.StateReserved, stock.StateApplied)
		} else {
			wantEntry(t, r, sku, fmt.Sprint(prefix, i), stock.KindDeduct)
		}
	}
	return int64(len(ok))
}

// firsts fails t on any error and returns how many of the copies were not replays.
func firsts(t *testing.T, what string, rcs []stock.Receipt, errs []error) int {
	t.Helper()
	n := 0
	for i, err := range errs {
		require.NoError(t, err, "%s copy %d", what, i)
		if !rcs[i].Replayed {
			n++
		}
	}
	return n
}

// TestModelConcurrency runs many concurrent calls on two Reservers of two clients and checks
// that every answer, the ledger and the levels agree with one order of the calls.
func TestModelConcurrency(t *testing.T) {
	ctx := context.Background()
	eachPair(t, func(t *testing.T, rs [2]*stock.Reserver, sleep func(time.Duration)) {
		r := func(i int) *stock.Reserver { return rs[i%2] }
		sold := []stock.State{stock.StateReserved, stock.StateApplied}

		t.Run("Deduct", func(t *testing.T) {
			const S = 57
			require.NoError(t, rs[0].Load(ctx, "d", S))
			errs := par(concN, func(i int) error {
				_, err := r(i).Deduct(ctx, stock.Request{SKU: "d", ID: fmt.Sprint("d", i), User: fmt.Sprint("u", i%7), Qty: 1})
				return err
			})
			if ok := soldOrNone(t, rs[1], "d", "d", errs); ok != S {
				t.Fatalf("%d deducts acknowledged over %d units", ok, S)
			}
			wantLevels(t, rs[0], "d", stock.Levels{Sold: S, Loaded: S})
		})

		t.Run("SameIDCopies", func(t *testing.T) {
			require.NoError(t, rs[0].Load(ctx, "s", 3))
			for _, op := range []string{"deduct", "hold"} {
				id := "same-" + op
				rcs := make([]stock.Receipt, concN)
				errs := par(concN, func(i int) (err error) {
					req := stock.Request{SKU: "s", ID: id, User: "alice", Qty: 1}
					if op == "hold" {
						rcs[i], err = r(i).Hold(ctx, req, time.Hour)
					} else {
						rcs[i], err = r(i).Deduct(ctx, req)
					}
					return err
				})
				n := firsts(t, op, rcs, errs)
				require.EqualValues(t, 1, n, "%s: %d copies not replayed, want 1", op, n)
				for i, rc := range rcs {
					if rc.Remaining != rcs[0].Remaining || rc.Qty != 1 {
						t.Fatalf("%s copy %d: %+v, copy 0: %+v", op, i, rc, rcs[0])
					}
				}
			}
			wantLevels(t, rs[0], "s", stock.Levels{Available: 1, Held: 1, Sold: 1, Loaded: 3})
			// Copies of a restore, and of a restore racing a deduct of an unknown id.
			rcs := make([]stock.Receipt, concN)
			errs := par(concN, func(i int) (err error) {
				rcs[i], err = r(i).Restore(ctx, "s", "same-deduct")
				return err
			})
			n := firsts(t, "restore", rcs, errs)
			require.EqualValues(t, 1, n, "restore: %d copies not replayed, want 1", n)
			wantLevels(t, rs[0], "s", stock.Levels{Available: 2, Held: 1, Loaded: 3})
		})

		t.Run("RestoreRacesDeduct", func(t *testing.T) {
			const S = 1000
			require.NoError(t, rs[0].Load(ctx, "rr", S))
			errs := par(2*concN, func(i int) (err error) {
				if id := fmt.Sprint("rr", i/2); i%2 == 0 {
					_, err = r(i).Deduct(ctx, stock.Request{SKU: "rr", ID: id, Qty: 1})
				} else {
					_, err = r(i).Restore(ctx, "rr", id)
				}
				return err
			})
			for i := range concN {
				id, derr, rerr := fmt.Sprint("rr", i), errs[2*i], errs[2*i+1]
				switch {
				case derr == nil && rerr == nil: // deduct first, then given back
					wantEntry(t, rs[1], "rr", id, stock.KindDeduct, stock.StateRestored)
				case errors.Is(rerr, stock.ErrUnknownID) && errors.Is(derr, stock.ErrRestored): // the restore overtook
					wantEntry(t, rs[1], "rr", id, stock.KindTombstone, stock.StateRestored)
				default:
					t.Fatalf("pair %d: deduct %v, restore %v", i, derr, rerr)
				}
			}
			wantLevels(t, rs[0], "rr", stock.Levels{Available: S, Loaded: S})
		})

		t.Run("HoldConfirmCancel", func(t *testing.T) {
			const S = 60
			require.NoError(t, rs[0].Load(ctx, "h", S))
			ok := acked(t, "hold", par(concN, func(i int) error {
				_, err := r(i).Hold(ctx, stock.Request{SKU: "h", ID: fmt.Sprint("h", i), Qty: 1}, time.Hour)
				return err
			}))
			require.Len(t, ok, S, "%d holds acknowledged over %d units", len(ok), S)
			wantLevels(t, rs[0], "h", stock.Levels{Held: S, Loaded: S})
			// Each held id gets four concurrent calls: two confirms and two cancels. Per id,
			// either the confirms won (both confirms OK, cancels ErrConfirmed) or a cancel
			// won (cancels OK, confirms ErrRestored).
			cerr := par(4*len(ok), func(i int) (err error) {
				if id := fmt.Sprint("h", ok[i/4]); i%4 < 2 {
					_, err = r(i).Confirm(ctx, "h", id)
				} else {
					_, err = r(i).Cancel(ctx, "h", id)
				}
				return err
			})
			confirmed := int64(0)
			for k, i := range ok {
				id, c := fmt.Sprint("h", i), cerr[4*k:4*k+4]
				switch {
				case c[0] == nil && c[1] == nil && errors.Is(c[2], stock.ErrConfirmed) && errors.Is(c[3], stock.ErrConfirmed):
					confirmed++
					wantEntry(t, rs[1], "h", id, stock.KindHold, sold...)
				case c[2] == nil && c[3] == nil && errors.Is(c[0], stock.ErrRestored) && errors.Is(c[1], stock.ErrRestored):
					wantEntry(t, rs[1], "h", id, stock.KindHold, stock.StateCancelled)
				default:
					t.Fatalf("hold %s: confirms %v, %v; cancels %v, %v", id, c[0], c[1], c[2], c[3])
				}
			}
			wantLevels(t, rs[0], "h", stock.Levels{Available: S - confirmed, Sold: confirmed, Loaded: S})
		})

		t.Run("DeductsRaceExpiry", func(t *testing.T) {
			// 100 holds due at once (more than one call releases), then 200 deducts: every
			// deduct releases due holds first, so exactly the 100 units are sold.
			const H = 100
			require.NoError(t, rs[0].Load(ctx, "x", H))
			for i := range H {
				_, err := r(i).Hold(ctx, stock.Request{SKU: "x", ID: fmt.Sprint("xh", i), Qty: 1}, 30*time.Millisecond)
				require.NoError(t, err)
			}
			sleep(100 * time.Millisecond)
			ok := acked(t, "deduct", par(concN, func(i int) error {
				_, err := r(i).Deduct(ctx, stock.Request{SKU: "x", ID: fmt.Sprint("xd", i), Qty: 1})
				return err
			}))
			require.Len(t, ok, H, "%d deducts acknowledged; %d units came back from expired holds", len(ok), H)
			wantLevels(t, rs[0], "x", stock.Levels{Sold: H, Loaded: H})
			for i := range H {
				wantEntry(t, rs[1], "x", fmt.Sprint("xh", i), stock.KindHold, stock.StateExpired)
			}
		})

		t.Run("RestockDuringSellOut", func(t *testing.T) {
			// A sold-out item (the fast path answers in-process on a caching client) is
			// restocked while 200 deducts run: what was acknowledged is what was sold.
			require.NoError(t, rs[0].Load(ctx, "ro", 1))
			_, err := rs[0].Deduct(ctx, stock.Request{SKU: "ro", ID: "first", Qty: 1})
			require.NoError(t, err)
			for i := range 4 { // refusals that make both Reservers take the fast path
				_, _ = r(i).Deduct(ctx, stock.Request{SKU: "ro", ID: fmt.Sprint("warm", i), Qty: 1})
			}
			errs := par(concN+1, func(i int) (err error) {
				if i == concN {
					assert.NoError(t, testkit.Err(rs[1].Restock(ctx, "ro", "more", 20)))
					return nil
				}
				_, err = r(i).Deduct(ctx, stock.Request{SKU: "ro", ID: fmt.Sprint("ro", i), Qty: 1})
				return err
			})
			ok := soldOrNone(t, rs[1], "ro", "ro", errs[:concN])
			lv, err := rs[0].Levels(ctx, "ro")
			if err != nil || lv.Sold != ok+1 || lv.Available != 21-lv.Sold || lv.Loaded != 21 {
				t.Fatalf("Levels %+v, %v; %d deducts acknowledged after the first", lv, err, ok)
			}
			// The same Reserver that restocked must not answer "sold out" from before its
			// own write while stock is left.
			if lv.Available > 0 {
				if _, err := rs[1].Deduct(ctx, stock.Request{SKU: "ro", ID: "after", Qty: 1}); err != nil {
					t.Fatalf("deduct after the restock, %d available: %v", lv.Available, err)
				}
			}
		})

		// Carts of two items, the second short: as many carts are taken as it has units,
		// whole; a refused cart takes nothing.
		const A, B = 80, 33
		cartOf := func(prefix string, i int, a, b string) stock.Cart {
			return stock.Cart{ID: fmt.Sprint(prefix, i), User: fmt.Sprint("u", i), Lines: []stock.Line{{SKU: a, Qty: 1}, {SKU: b, Qty: 1}}}
		}
		t.Run("Carts", func(t *testing.T) {
			require.NoError(t, rs[0].Load(ctx, "ca", A))
			require.NoError(t, rs[0].Load(ctx, "cb", B))
			errs := par(concN, func(i int) error {
				_, err := r(i).DeductMany(ctx, cartOf("cart", i, "ca", "cb"))
				return err
			})
			ok := acked(t, "cart", errs)
			for i, err := range errs {
				for _, sku := range []string{"ca", "cb"} {
					id := fmt.Sprint("cart", i)
					if err == nil {
						wantEntry(t, rs[1], sku, id, stock.KindDeduct, sold...)
					} else if e, err := rs[1].Ledger(ctx, sku, id); err == nil && e.Taken() {
						t.Fatalf("refused cart %s holds %s: %+v", id, sku, e)
					}
				}
				var ce *stock.CartError
				if err != nil && !errors.As(err, &ce) {
					t.Fatalf("cart %d: %v, want a *CartError", i, err)
				}
			}
			require.Len(t, ok, B, "%d carts acknowledged, want %d (the short item's stock)", len(ok), B)
			wantLevels(t, rs[0], "ca", stock.Levels{Available: A - B, Sold: B, Loaded: A})
			wantLevels(t, rs[0], "cb", stock.Levels{Sold: B, Loaded: B})
		})

		t.Run("HoldManyConfirmManyCancelMany", func(t *testing.T) {
			require.NoError(t, rs[0].Load(ctx, "ha", A))
			require.NoError(t, rs[0].Load(ctx, "hb", B))
			ok := acked(t, "hold cart", par(concN, func(i int) error {
				_, err := r(i).HoldMany(ctx, cartOf("hc", i, "ha", "hb"), time.Hour)
				return err
			}))
			require.Len(t, ok, B, "%d held carts acknowledged, want %d", len(ok), B)
			wantLevels(t, rs[0], "hb", stock.Levels{Held: B, Loaded: B})
			// Per cart, 5 ConfirmMany and 2 CancelMany at once: the cart ends confirmed
			// whole or given back whole, and a ConfirmMany that answered nil saw it confirmed.
			const per = 7
			cerr := par(per*len(ok), func(i int) (err error) {
				if id := fmt.Sprint("hc", ok[i/per]); i%per < 5 {
					_, err = r(i).ConfirmMany(ctx, id, "ha", "hb")
				} else {
					_, err = r(i).CancelMany(ctx, id, "ha", "hb")
				}
				return err
			})
			confirmed := int64(0)
			for k, i := range ok {
				id := fmt.Sprint("hc", i)
				ea, err1 := rs[1].Ledger(ctx, "ha", id)
				eb, err2 := rs[1].Ledger(ctx, "hb", id)
				if err1 != nil || err2 != nil {
					t.Fatalf("cart %s: ledger %v, %v", id, err1, err2)
				}
				if ea.Taken() != eb.Taken() || ea.State == stock.StateHeld || eb.State == stock.StateHeld {
					t.Fatalf("cart %s ends half confirmed: %s %s / %s %s; calls %v", id, ea.Kind, ea.State, eb.Kind, eb.State, cerr[per*k:per*k+per])
				}
				for j := 0; j < 5; j++ {
					if cerr[per*k+j] == nil && !ea.Taken() {
						t.Fatalf("cart %s: a ConfirmMany answered nil, the cart ended given back (%s)", id, ea.State)
					}
				}
				if ea.Taken() {
					confirmed++
				}
			}
			wantLevels(t, rs[0], "ha", stock.Levels{Available: A - confirmed, Sold: confirmed, Loaded: A})
			wantLevels(t, rs[0], "hb", stock.Levels{Available: B - confirmed, Sold: confirmed, Loaded: B})
		})

		// Copies of one cart id: one outcome per cart id, every caller gets it, the stock
		// matches it: with stock, one copy takes the cart and the others replay it; with an
		// item short, none takes it; with the short item's one unit taken by concurrent
		// single deducts, all copies take it or none does.
		for _, v := range []struct {
			name    string
			qy      int64
			singles int
		}{{"SameCartCopies", 1, 0}, {"SameCartCopiesOneItemShort", 0, 0}, {"SameCartCopiesRacingShortage", 1, 20}} {
			t.Run(v.name, func(t *testing.T) {
				x, y := v.name+"-x", v.name+"-y"
				require.NoError(t, rs[0].Load(ctx, x, 5))
				require.NoError(t, rs[0].Load(ctx, y, v.qy))
				cart := stock.Cart{ID: "order-" + v.name, User: "alice", Lines: []stock.Line{{SKU: x, Qty: 1}, {SKU: y, Qty: 1}}}
				rcs := make([]stock.CartReceipt, concN)
				errs := par(concN+v.singles, func(i int) (err error) {
					if i >= concN {
						_, _ = r(i).Deduct(ctx, stock.Request{SKU: y, ID: fmt.Sprint("single", i), Qty: 1})
						return nil
					}
					rcs[i], err = r(i).DeductMany(ctx, cart)
					return err
				})[:concN]
				okN, first := 0, 0
				for i, err := range errs {
					if err == nil {
						okN++
						if !rcs[i].Replayed {
							first++
						}
					} else if !errors.Is(err, stock.ErrSoldOut) && !errors.Is(err, stock.ErrRestored) {
						t.Fatalf("copy %d: %v", i, err)
					}
				}
				lx, err := rs[0].Levels(ctx, x)
				require.NoError(t, err)
				switch {
				case v.singles > 0 && okN != 0 && okN != concN:
					t.Fatalf("%d of %d copies were told the cart was taken, the others were refused: %v", okN, concN, errs)
				case v.singles > 0 && lx.Sold != int64(okN/concN):
					t.Fatalf("%d of %d copies took the cart, but %s sold %d", okN, concN, x, lx.Sold)
				case v.singles > 0:
				case v.qy == 0 && okN != 0:
					t.Fatalf("%d of %d copies were told the cart was taken; item %s has no stock", okN, concN, y)
				case v.qy == 0:
					wantLevels(t, rs[0], x, stock.Levels{Available: 5, Loaded: 5})
					wantLevels(t, rs[0], y, stock.Levels{Loaded: 0})
				case okN != concN:
					t.Fatalf("%d of %d copies took the cart; want all", okN, concN)
				default:
					wantLevels(t, rs[0], x, stock.Levels{Available: 4, Sold: 1, Loaded: 5})
					wantLevels(t, rs[0], y, stock.Levels{Sold: 1, Loaded: 1})
					if first != 1 { // like the copies of one Deduct: one took it, the others are replays
						t.Fatalf("%d of %d copies were told they took the cart (Replayed false); want 1", first, concN)
					}
				}
			})
		}
	})
}

// TestModelSoldOutOwnWrites: on a sold-out item, with the fast path on (a caching client), a
// Reserver answers the ids it has just written as the ledger says, with no pause in between:
// a tombstone left by its Restore is ErrRestored, an id it took is a replay; never "sold out".
func TestModelSoldOutOwnWrites(t *testing.T) {
	ctx := context.Background()
	eachPair(t, func(t *testing.T, rs [2]*stock.Reserver, _ func(time.Duration)) {
		r := rs[0]
		require.NoError(t, r.Load(ctx, "so", 1))
		_, err := r.Deduct(ctx, stock.Request{SKU: "so", ID: "taken", Qty: 1})
		require.NoError(t, err)
		bad := 0
		for i := range 500 {
			id := fmt.Sprint("late", i)
			if _, err := r.Deduct(ctx, stock.Request{SKU: "so", ID: fmt.Sprint("new", i), Qty: 1}); !errors.Is(err, stock.ErrSoldOut) {
				t.Fatalf("deduct of a new id on a sold-out item: %v", err)
			}
			if _, err := r.Restore(ctx, "so", id); !errors.Is(err, stock.ErrUnknownID) {
				t.Fatalf("restore of unknown id %s: %v", id, err)
			}
			if _, err := r.Deduct(ctx, stock.Request{SKU: "so", ID: id, Qty: 1}); !errors.Is(err, stock.ErrRestored) {
				bad++
				t.Errorf("deduct of %s after its restore on the same Reserver: %v, want ErrRestored", id, err)
			}
			if rc, err := r.Deduct(ctx, stock.Request{SKU: "so", ID: "taken", Qty: 1}); err != nil || !rc.Replayed {
				bad++
				t.Errorf("repeat of the taken id: %+v, %v; want a replay", rc, err)
			}
			if bad > 5 {
				t.Fatalf("%d wrong answers in %d rounds (fast path answered %d in-process)", bad, i+1, stockops.SoldOutAnswers(r))
			}
		}
		t.Logf("%s: fast path answered %d requests in-process", t.Name(), stockops.SoldOutAnswers(r))
	})
}
