package model_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/stockops"
)

const concN = 200

// concPair returns two Reservers on two clients of one empty Redis, and a sleep that lets time
// pass for that Redis (on miniredis it moves its clock).
func concPair(t *testing.T, b redistest.Backend) ([2]*stock.Reserver, func(time.Duration)) {
	c1, c2 := b.Pair(t)
	var rs [2]*stock.Reserver
	for i, cl := range []rueidis.Client{c1, c2} {
		r, err := stock.New(cl)
		if err != nil {
			t.Fatal(err)
		}
		rs[i] = r
	}
	return rs, func(d time.Duration) { redistest.Sleep(c1, d) }
}

// par runs f(i) for i in [0, n) on n goroutines started together.
func par(n int, f func(i int)) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			f(i)
		}()
	}
	close(start)
	wg.Wait()
}

func wantLevels(t *testing.T, r *stock.Reserver, sku string, want stock.Levels) {
	t.Helper()
	lv, err := r.Levels(context.Background(), sku)
	if err != nil || lv != want {
		t.Fatalf("Levels(%s) = %+v, %v; want %+v", sku, lv, err, want)
	}
}

// wantEntry checks the ledger entry of id: taken (held or sold) or absent/given back.
func wantEntry(t *testing.T, r *stock.Reserver, sku, id string, kind stock.Kind, state ...stock.State) {
	t.Helper()
	e, err := r.Ledger(context.Background(), sku, id)
	if len(state) == 0 {
		if !errors.Is(err, stock.ErrUnknownID) {
			t.Fatalf("Ledger(%s, %s) = %+v, %v; want none", sku, id, e, err)
		}
		return
	}
	if err != nil {
		t.Fatalf("Ledger(%s, %s): %v", sku, id, err)
	}
	for _, s := range state {
		if e.Kind == kind && e.State == s {
			return
		}
	}
	t.Fatalf("Ledger(%s, %s) = %s %s, want %s %v", sku, id, e.Kind, e.State, kind, state)
}

func TestModelConcurrency(t *testing.T) {
	ctx := context.Background()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			rs, sleep := concPair(t, b)
			r := func(i int) *stock.Reserver { return rs[i%2] }
			sold := []stock.State{stock.StateReserved, stock.StateApplied}

			t.Run("Deduct", func(t *testing.T) {
				const S = 57
				if err := rs[0].Load(ctx, "d", S); err != nil {
					t.Fatal(err)
				}
				errs := make([]error, concN)
				par(concN, func(i int) {
					_, errs[i] = r(i).Deduct(ctx, stock.Request{SKU: "d", ID: fmt.Sprint("d", i), User: fmt.Sprint("u", i%7), Qty: 1})
				})
				ok := 0
				for i, err := range errs {
					switch {
					case err == nil:
						ok++
						wantEntry(t, rs[1], "d", fmt.Sprint("d", i), stock.KindDeduct, sold...)
					case errors.Is(err, stock.ErrSoldOut):
						wantEntry(t, rs[1], "d", fmt.Sprint("d", i), stock.KindDeduct)
					default:
						t.Fatalf("deduct %d: %v", i, err)
					}
				}
				if ok != S {
					t.Fatalf("%d deducts acknowledged over %d units", ok, S)
				}
				wantLevels(t, rs[0], "d", stock.Levels{Sold: S, Loaded: S})
			})

			t.Run("SameIDCopies", func(t *testing.T) {
				if err := rs[0].Load(ctx, "s", 3); err != nil {
					t.Fatal(err)
				}
				for _, op := range []string{"deduct", "hold"} {
					id := "same-" + op
					rcs := make([]stock.Receipt, concN)
					errs := make([]error, concN)
					par(concN, func(i int) {
						req := stock.Request{SKU: "s", ID: id, User: "alice", Qty: 1}
						if op == "hold" {
							rcs[i], errs[i] = r(i).Hold(ctx, req, time.Hour)
						} else {
							rcs[i], errs[i] = r(i).Deduct(ctx, req)
						}
					})
					first := 0
					for i, err := range errs {
						if err != nil {
							t.Fatalf("%s copy %d: %v", op, i, err)
						}
						if !rcs[i].Replayed {
							first++
						}
						if rcs[i].Remaining != rcs[0].Remaining || rcs[i].Qty != 1 {
							t.Fatalf("%s copy %d: %+v, copy 0: %+v", op, i, rcs[i], rcs[0])
						}
					}
					if first != 1 {
						t.Fatalf("%s: %d copies not replayed, want 1", op, first)
					}
				}
				wantLevels(t, rs[0], "s", stock.Levels{Available: 1, Held: 1, Sold: 1, Loaded: 3})
				// Copies of a restore, and of a restore racing a deduct of an unknown id.
				rcs := make([]stock.Receipt, concN)
				errs := make([]error, concN)
				par(concN, func(i int) { rcs[i], errs[i] = r(i).Restore(ctx, "s", "same-deduct") })
				first := 0
				for i, err := range errs {
					if err != nil {
						t.Fatalf("restore copy %d: %v", i, err)
					}
					if !rcs[i].Replayed {
						first++
					}
				}
				if first != 1 {
					t.Fatalf("restore: %d copies not replayed, want 1", first)
				}
				wantLevels(t, rs[0], "s", stock.Levels{Available: 2, Held: 1, Loaded: 3})
			})

			t.Run("RestoreRacesDeduct", func(t *testing.T) {
				const S = 1000
				if err := rs[0].Load(ctx, "rr", S); err != nil {
					t.Fatal(err)
				}
				const pairs = concN
				derr := make([]error, pairs)
				rerr := make([]error, pairs)
				par(2*pairs, func(i int) {
					id := fmt.Sprint("rr", i/2)
					if i%2 == 0 {
						_, derr[i/2] = r(i).Deduct(ctx, stock.Request{SKU: "rr", ID: id, Qty: 1})
					} else {
						_, rerr[i/2] = r(i).Restore(ctx, "rr", id)
					}
				})
				for i := range pairs {
					id := fmt.Sprint("rr", i)
					switch {
					case derr[i] == nil && rerr[i] == nil: // deduct first, then given back
						wantEntry(t, rs[1], "rr", id, stock.KindDeduct, stock.StateRestored)
					case errors.Is(rerr[i], stock.ErrUnknownID) && errors.Is(derr[i], stock.ErrRestored): // the restore overtook
						wantEntry(t, rs[1], "rr", id, stock.KindTombstone, stock.StateRestored)
					default:
						t.Fatalf("pair %d: deduct %v, restore %v", i, derr[i], rerr[i])
					}
				}
				wantLevels(t, rs[0], "rr", stock.Levels{Available: S, Loaded: S})
			})

			t.Run("HoldConfirmCancel", func(t *testing.T) {
				const S = 60
				if err := rs[0].Load(ctx, "h", S); err != nil {
					t.Fatal(err)
				}
				errs := make([]error, concN)
				par(concN, func(i int) {
					_, errs[i] = r(i).Hold(ctx, stock.Request{SKU: "h", ID: fmt.Sprint("h", i), Qty: 1}, time.Hour)
				})
				var held []string
				for i, err := range errs {
					switch {
					case err == nil:
						held = append(held, fmt.Sprint("h", i))
					case !errors.Is(err, stock.ErrSoldOut):
						t.Fatalf("hold %d: %v", i, err)
					}
				}
				if len(held) != S {
					t.Fatalf("%d holds acknowledged over %d units", len(held), S)
				}
				wantLevels(t, rs[0], "h", stock.Levels{Held: S, Loaded: S})
				// Each held id gets four concurrent calls: two confirms and two cancels. Per id,
				// either the confirms won (both confirms OK, cancels ErrConfirmed) or a cancel
				// won (cancels OK, confirms ErrRestored).
				n := 4 * len(held)
				cerr := make([]error, n)
				par(n, func(i int) {
					id := held[i/4]
					if i%4 < 2 {
						_, cerr[i] = r(i).Confirm(ctx, "h", id)
					} else {
						_, cerr[i] = r(i).Cancel(ctx, "h", id)
					}
				})
				confirmed := int64(0)
				for k, id := range held {
					c := cerr[4*k : 4*k+4]
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
				if err := rs[0].Load(ctx, "x", H); err != nil {
					t.Fatal(err)
				}
				for i := range H {
					if _, err := r(i).Hold(ctx, stock.Request{SKU: "x", ID: fmt.Sprint("xh", i), Qty: 1}, 30*time.Millisecond); err != nil {
						t.Fatal(err)
					}
				}
				sleep(100 * time.Millisecond)
				errs := make([]error, concN)
				par(concN, func(i int) {
					_, errs[i] = r(i).Deduct(ctx, stock.Request{SKU: "x", ID: fmt.Sprint("xd", i), Qty: 1})
				})
				ok := int64(0)
				for i, err := range errs {
					switch {
					case err == nil:
						ok++
					case !errors.Is(err, stock.ErrSoldOut):
						t.Fatalf("deduct %d: %v", i, err)
					}
				}
				if ok != H {
					t.Fatalf("%d deducts acknowledged; %d units came back from expired holds", ok, H)
				}
				wantLevels(t, rs[0], "x", stock.Levels{Sold: H, Loaded: H})
				for i := range H {
					wantEntry(t, rs[1], "x", fmt.Sprint("xh", i), stock.KindHold, stock.StateExpired)
				}
			})

			t.Run("RestockDuringSellOut", func(t *testing.T) {
				// A sold-out item (the fast path answers in-process on a caching client) is
				// restocked while 200 deducts run: what was acknowledged is what was sold.
				if err := rs[0].Load(ctx, "ro", 1); err != nil {
					t.Fatal(err)
				}
				if _, err := rs[0].Deduct(ctx, stock.Request{SKU: "ro", ID: "first", Qty: 1}); err != nil {
					t.Fatal(err)
				}
				for i := range 4 { // refusals that make both Reservers take the fast path
					_, _ = r(i).Deduct(ctx, stock.Request{SKU: "ro", ID: fmt.Sprint("warm", i), Qty: 1})
				}
				errs := make([]error, concN)
				par(concN+1, func(i int) {
					if i == concN {
						if _, err := rs[1].Restock(ctx, "ro", "more", 20); err != nil {
							t.Error(err)
						}
						return
					}
					_, errs[i] = r(i).Deduct(ctx, stock.Request{SKU: "ro", ID: fmt.Sprint("ro", i), Qty: 1})
				})
				ok := int64(0)
				for i, err := range errs {
					id := fmt.Sprint("ro", i)
					switch {
					case err == nil:
						ok++
						wantEntry(t, rs[1], "ro", id, stock.KindDeduct, sold...)
					case errors.Is(err, stock.ErrSoldOut):
						wantEntry(t, rs[1], "ro", id, stock.KindDeduct)
					default:
						t.Fatalf("deduct %d: %v", i, err)
					}
				}
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

			t.Run("Carts", func(t *testing.T) {
				const A, B = 80, 33
				if err := rs[0].Load(ctx, "ca", A); err != nil {
					t.Fatal(err)
				}
				if err := rs[0].Load(ctx, "cb", B); err != nil {
					t.Fatal(err)
				}
				errs := make([]error, concN)
				par(concN, func(i int) {
					_, errs[i] = r(i).DeductMany(ctx, stock.Cart{ID: fmt.Sprint("cart", i), User: fmt.Sprint("u", i),
						Lines: []stock.Line{{SKU: "ca", Qty: 1}, {SKU: "cb", Qty: 1}}})
				})
				ok := int64(0)
				for i, err := range errs {
					id := fmt.Sprint("cart", i)
					var ce *stock.CartError
					switch {
					case err == nil:
						ok++
						wantEntry(t, rs[1], "ca", id, stock.KindDeduct, sold...)
						wantEntry(t, rs[1], "cb", id, stock.KindDeduct, sold...)
					case errors.As(err, &ce) && errors.Is(err, stock.ErrSoldOut):
						for _, sku := range []string{"ca", "cb"} {
							if e, err := rs[1].Ledger(ctx, sku, id); err == nil && e.Taken() {
								t.Fatalf("refused cart %s holds %s: %+v", id, sku, e)
							}
						}
					default:
						t.Fatalf("cart %d: %v", i, err)
					}
				}
				if ok != B {
					t.Fatalf("%d carts acknowledged, want %d (the short item's stock)", ok, B)
				}
				wantLevels(t, rs[0], "ca", stock.Levels{Available: A - B, Sold: B, Loaded: A})
				wantLevels(t, rs[0], "cb", stock.Levels{Sold: B, Loaded: B})
			})

			t.Run("HoldManyConfirmManyCancelMany", func(t *testing.T) {
				const A, B = 80, 33
				if err := rs[0].Load(ctx, "ha", A); err != nil {
					t.Fatal(err)
				}
				if err := rs[0].Load(ctx, "hb", B); err != nil {
					t.Fatal(err)
				}
				errs := make([]error, concN)
				par(concN, func(i int) {
					_, errs[i] = r(i).HoldMany(ctx, stock.Cart{ID: fmt.Sprint("hc", i), Lines: []stock.Line{{SKU: "ha", Qty: 1}, {SKU: "hb", Qty: 1}}}, time.Hour)
				})
				var carts []string
				for i, err := range errs {
					switch {
					case err == nil:
						carts = append(carts, fmt.Sprint("hc", i))
					case !errors.Is(err, stock.ErrSoldOut):
						t.Fatalf("hold cart %d: %v", i, err)
					}
				}
				if len(carts) != B {
					t.Fatalf("%d held carts acknowledged, want %d", len(carts), B)
				}
				wantLevels(t, rs[0], "hb", stock.Levels{Held: B, Loaded: B})
				// Per cart, 5 ConfirmMany and 2 CancelMany at once: the cart ends confirmed
				// whole or given back whole, and a ConfirmMany that answered nil saw it confirmed.
				const per = 7
				cerr := make([]error, per*len(carts))
				par(len(cerr), func(i int) {
					id := carts[i/per]
					if i%per < 5 {
						_, cerr[i] = r(i).ConfirmMany(ctx, id, "ha", "hb")
					} else {
						_, cerr[i] = r(i).CancelMany(ctx, id, "ha", "hb")
					}
				})
				confirmed := int64(0)
				for k, id := range carts {
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

			// Copies of one cart id: one outcome per cart id, every caller gets
			// it, the stock matches it.
			for _, v := range []struct {
				name  string
				short bool
			}{{"SameCartCopies", false}, {"SameCartCopiesOneItemShort", true}} {
				t.Run(v.name, func(t *testing.T) {
					x, y := v.name+"-x", v.name+"-y"
					if err := rs[0].Load(ctx, x, 5); err != nil {
						t.Fatal(err)
					}
					qy := int64(1)
					if v.short {
						qy = 0
					}
					if err := rs[0].Load(ctx, y, qy); err != nil {
						t.Fatal(err)
					}
					cart := stock.Cart{ID: "order-" + v.name, User: "alice", Lines: []stock.Line{{SKU: x, Qty: 1}, {SKU: y, Qty: 1}}}
					errs := make([]error, concN)
					rcs := make([]stock.CartReceipt, concN)
					par(concN, func(i int) { rcs[i], errs[i] = r(i).DeductMany(ctx, cart) })
					okN, firsts := 0, 0
					for i, err := range errs {
						if err == nil {
							okN++
							if !rcs[i].Replayed {
								firsts++
							}
						} else if !errors.Is(err, stock.ErrSoldOut) && !errors.Is(err, stock.ErrRestored) {
							t.Fatalf("copy %d: %v", i, err)
						}
					}
					if v.short {
						if okN != 0 {
							t.Fatalf("%d of %d copies were told the cart was taken; item %s has no stock", okN, concN, y)
						}
						wantLevels(t, rs[0], x, stock.Levels{Available: 5, Loaded: 5})
						wantLevels(t, rs[0], y, stock.Levels{Loaded: 0})
						return
					}
					if okN != concN {
						t.Fatalf("%d of %d copies took the cart; want all", okN, concN)
					}
					wantLevels(t, rs[0], x, stock.Levels{Available: 4, Sold: 1, Loaded: 5})
					wantLevels(t, rs[0], y, stock.Levels{Sold: 1, Loaded: 1})
					if firsts != 1 { // like the copies of one Deduct: one took it, the others are replays
						t.Fatalf("%d of %d copies were told they took the cart (Replayed false); want 1", firsts, concN)
					}
				})
			}

			t.Run("SameCartCopiesRacingShortage", func(t *testing.T) {
				// The short item has one unit, taken concurrently by single deducts: every copy
				// of the cart still gets one outcome, and the stock matches it.
				x, y := "race-x", "race-y"
				if err := rs[0].Load(ctx, x, 5); err != nil {
					t.Fatal(err)
				}
				if err := rs[0].Load(ctx, y, 1); err != nil {
					t.Fatal(err)
				}
				cart := stock.Cart{ID: "order-8", User: "alice", Lines: []stock.Line{{SKU: x, Qty: 1}, {SKU: y, Qty: 1}}}
				errs := make([]error, concN)
				par(concN+20, func(i int) {
					if i >= concN {
						_, _ = r(i).Deduct(ctx, stock.Request{SKU: y, ID: fmt.Sprint("single", i), Qty: 1})
						return
					}
					_, errs[i] = r(i).DeductMany(ctx, cart)
				})
				okN := 0
				for _, err := range errs {
					if err == nil {
						okN++
					}
				}
				lx, _ := rs[0].Levels(ctx, x)
				if okN != 0 && okN != concN {
					t.Fatalf("%d of %d copies were told the cart was taken, the others were refused: %v", okN, concN, errs)
				}
				if want := int64(0); okN == concN {
					want = 1
					if lx.Sold != want {
						t.Fatalf("cart taken, but %s sold %d", x, lx.Sold)
					}
				} else if lx.Sold != want {
					t.Fatalf("cart refused, but %s sold %d", x, lx.Sold)
				}
			})
		})
	}
}

// TestModelSoldOutOwnWrites: on a sold-out item, with the fast path on (a caching client), a
// Reserver answers the ids it has just written as the ledger says, with no pause in between:
// a tombstone left by its Restore is ErrRestored, an id it took is a replay; never "sold out".
func TestModelSoldOutOwnWrites(t *testing.T) {
	ctx := context.Background()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			rs, _ := concPair(t, b)
			r := rs[0]
			if err := r.Load(ctx, "so", 1); err != nil {
				t.Fatal(err)
			}
			if _, err := r.Deduct(ctx, stock.Request{SKU: "so", ID: "taken", Qty: 1}); err != nil {
				t.Fatal(err)
			}
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
			t.Logf("%s: fast path answered %d requests in-process", b.Name, stockops.SoldOutAnswers(r))
		})
	}
}
