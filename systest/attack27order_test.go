package systest_test

// Attack 27 (order): the relay's order across the buckets of a split item. A give-back in one
// bucket (a restock, a restore, a cancel, an expired hold) whose units a transfer moved to a
// sibling and sold there must reach the Store before that sale: the Store (memstore, which
// refuses a sale it is short for) then never refuses a sale Redis acknowledged. Tried with
// small relay batches, several relays at once, a relay limited to the item, a relay restarted
// half way, the queue path with a shuffled queue, and a bounded number of passes once activity
// stops (barriers never block delivery forever).

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// a27oSales runs rounds of give-backs and sell-outs on sku (split over several buckets), so
// that units given back in one bucket are moved by transfers and sold in others. It returns
// the ids whose sale Redis acknowledged and that were not given back since (id → units).
// between, when not nil, runs after each round (a relay pass, say).
func a27oSales(t *testing.T, e *a26Env, sku string, seed uint64, rounds int, between func(round int)) map[string]int64 {
	t.Helper()
	return a27oSalesQ(t, e, sku, seed, rounds, 2, between)
}

// a27oSalesQ is a27oSales with sales of 1 to maxQty units (a large one is often refused after
// its bucket pulled units from its siblings: units then pass through a bucket with no event).
func a27oSalesQ(t *testing.T, e *a26Env, sku string, seed uint64, rounds int, maxQty int, between func(round int)) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e37))
	sold := map[string]int64{}
	var n int
	buy := func() {
		// Buyers of random buckets until the item is sold out.
		for range 200 {
			n++
			id := fmt.Sprintf("d%d", n)
			q := int64(1 + rng.IntN(maxQty))
			_, err := e.r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: fmt.Sprintf("u%d", rng.IntN(50)), Qty: q})
			if err == nil {
				sold[id] = q
				continue
			}
			if errors.Is(err, stock.ErrInsufficient) {
				continue
			}
			require.ErrorIs(t, err, stock.ErrSoldOut)
			return
		}
		t.Fatalf("never sold out")
	}
	buy()
	for round := range rounds {
		// Give-backs: restores of earlier sales, a restock, holds cancelled, holds left to expire.
		ids := make([]string, 0, len(sold))
		for id := range sold {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		for _, id := range ids[:min(len(ids), 1+rng.IntN(3))] {
			_, err := e.r.Restore(ctx, sku, id)
			require.NoError(t, err)
			delete(sold, id)
		}
		_, err := e.r.Restock(ctx, sku, fmt.Sprintf("rs%d", round), int64(1+rng.IntN(3)))
		require.NoError(t, err)
		buy()
		// Holds: taken from what a restock brings, half cancelled, half left to expire.
		_, err = e.r.Restock(ctx, sku, fmt.Sprintf("rh%d", round), 4)
		require.NoError(t, err)
		for k := range 4 {
			id := fmt.Sprintf("h%d-%d", round, k)
			_, err := e.r.Hold(ctx, stock.Request{SKU: sku, ID: id, User: fmt.Sprintf("u%d", rng.IntN(50)), Qty: 1}, 2*time.Second)
			if err != nil {
				require.True(t, errors.Is(err, stock.ErrSoldOut) || errors.Is(err, stock.ErrInsufficient), "%v", err)
				continue
			}
			if k%2 == 0 {
				_, err = e.r.Cancel(ctx, sku, id)
				require.NoError(t, err)
			}
		}
		e.advance(3 * time.Second)
		buy()
		if between != nil {
			between(round)
		}
	}
	return sold
}

// a27oCheck checks that the Store applied every acknowledged sale (none refused, in the
// ledger or in the store), and that it equals Redis.
func a27oCheck(t *testing.T, e *a26Env, store *memstore.Store, sku string, sold map[string]int64) {
	t.Helper()
	ctx := context.Background()
	ids := make([]string, 0, len(sold))
	for id := range sold {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	recs, err := store.Records(ctx, sku, ids)
	require.NoError(t, err)
	var refused []string
	for _, id := range ids {
		ent, err := e.r.Ledger(ctx, sku, id)
		require.NoError(t, err)
		if ent.State == stock.StateRefused || recs[id].Status != stock.StateApplied {
			refused = append(refused, fmt.Sprintf("%s(ledger %v, store %v)", id, ent.State, recs[id].Status))
		}
	}
	assert.Empty(t, refused, "acknowledged sales the Store refused or did not apply")
	l := a26Levels(t, e.r, sku)
	rem, err := store.Remaining(ctx, sku)
	require.NoError(t, err)
	assert.Equal(t, l.Available+l.Held, rem, "store remaining vs Redis available+held (%+v)", l)
	assert.LessOrEqual(t, store.MaxApplications(), 1, "an event applied twice")
}

// a27oPending reports whether sku has nothing left to deliver.
func a27oDrained(t *testing.T, e *a26Env, sku string) bool {
	t.Helper()
	p, d, err := stockops.Pending(context.Background(), e.r, sku)
	require.NoError(t, err)
	require.Zero(t, d, "dead letters")
	return p == 0
}

// a27oDrain runs rl.Once until sku is drained and returns the number of passes; it fails after
// limit passes (liveness: barriers never hold delivery back forever).
func a27oDrain(t *testing.T, e *a26Env, sku string, limit int, rls ...*stockops.Relay) (passes, refused int) {
	t.Helper()
	for passes < limit {
		if a27oDrained(t, e, sku) {
			return passes, refused
		}
		passes++
		var wg sync.WaitGroup
		var ref atomic.Int64
		for _, rl := range rls {
			wg.Go(func() {
				st, err := rl.Once(context.Background())
				assert.NoError(t, err)
				ref.Add(int64(st.Refused))
			})
		}
		wg.Wait()
		refused += int(ref.Load())
	}
	t.Fatalf("%s not drained after %d passes", sku, passes)
	return
}

func a27oRelay(t *testing.T, e *a26Env, store stock.Store, o *stock.RelayOptions) *stockops.Relay {
	t.Helper()
	rl, err := stockops.NewRelay(e.r, store, nil, o)
	require.NoError(t, err)
	return rl
}

// TestA27oRelayOrderAcrossBuckets: give-backs in one bucket moved and sold in others; the
// relay (several shapes) delivers everything after the activity; the Store refuses nothing,
// and the item drains within a bounded number of passes.
func TestA27oRelayOrderAcrossBuckets(t *testing.T) {
	shapes := []struct {
		name   string
		relays int
		opts   func(sku string) *stock.RelayOptions
	}{
		{"batch1", 1, func(string) *stock.RelayOptions { return &stock.RelayOptions{Batch: 1} }},
		{"batch2", 1, func(string) *stock.RelayOptions { return &stock.RelayOptions{Batch: 2} }},
		{"three-relays-batch2", 3, func(string) *stock.RelayOptions { return &stock.RelayOptions{Batch: 2} }},
		{"items", 1, func(sku string) *stock.RelayOptions { return &stock.RelayOptions{Batch: 1, Items: []string{sku}} }},
		{"default", 1, func(string) *stock.RelayOptions { return nil }},
	}
	for _, buckets := range []int{3, 5} {
		for _, sh := range shapes {
			t.Run(fmt.Sprintf("b%d-%s", buckets, sh.name), func(t *testing.T) {
				a27oEach(t, []stock.Option{a26Split(buckets)}, func(t *testing.T, e *a26Env) {
					ctx := context.Background()
					for seed := range uint64(3) {
						sku := fmt.Sprintf("ord-%d-%s-%d", buckets, sh.name, seed)
						store := memstore.New()
						require.NoError(t, store.Load(ctx, sku, 6))
						require.NoError(t, e.r.Load(ctx, sku, 6))
						sold := a27oSales(t, e, sku, seed, 4, nil)
						var rls []*stockops.Relay
						for range sh.relays {
							rls = append(rls, a27oRelay(t, e, store, sh.opts(sku)))
						}
						passes, refused := a27oDrain(t, e, sku, 400, rls...)
						t.Logf("%s: %d passes, %d refused", sku, passes, refused)
						assert.Zero(t, refused, "the relay counted refusals")
						a27oCheck(t, e, store, sku, sold)
					}
				})
			})
		}
	}
}

// TestA27oRelayInterleaved: a relay pass (Batch 1) after every round of activity, and a new
// relay (a restart) every other round; then drained.
func TestA27oRelayInterleaved(t *testing.T) {
	a27oEach(t, []stock.Option{a26Split(4)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		for seed := range uint64(3) {
			sku := fmt.Sprintf("inter-%d", seed)
			store := memstore.New()
			require.NoError(t, store.Load(ctx, sku, 5))
			require.NoError(t, e.r.Load(ctx, sku, 5))
			rl := a27oRelay(t, e, store, &stock.RelayOptions{Batch: 1, Lease: time.Second})
			refused := 0
			sold := a27oSales(t, e, sku, seed+10, 5, func(round int) {
				if round%2 == 1 {
					rl = a27oRelay(t, e, store, &stock.RelayOptions{Batch: 1, Lease: time.Second})
				}
				for range 1 + round {
					st, err := rl.Once(ctx)
					require.NoError(t, err)
					refused += st.Refused
				}
			})
			_, r2 := a27oDrain(t, e, sku, 400, rl)
			assert.Zero(t, refused+r2, "the relay counted refusals")
			a27oCheck(t, e, store, sku, sold)
		}
	})
}

// TestA27oQueueShuffled: the queue path. A relay with no Store publishes; the events are
// consumed through Consume in a shuffled order, redelivered while held back: never refused.
func TestA27oQueueShuffled(t *testing.T) {
	a27oEach(t, []stock.Option{a26Split(3)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		for seed := range uint64(4) {
			sku := fmt.Sprintf("q-%d", seed)
			store := memstore.New()
			require.NoError(t, store.Load(ctx, sku, 6))
			require.NoError(t, e.r.Load(ctx, sku, 6))
			sold := a27oSales(t, e, sku, seed+20, 4, nil)
			var mu sync.Mutex
			var evs []stock.Event
			pub := stock.PublisherFunc(func(_ context.Context, ev stock.Event) error {
				mu.Lock()
				evs = append(evs, ev)
				mu.Unlock()
				return nil
			})
			rl, err := stockops.NewRelay(e.r, nil, pub, &stock.RelayOptions{Batch: 2})
			require.NoError(t, err)
			passes, _ := a27oDrain(t, e, sku, 400, rl)
			queue := slices.Clone(evs)
			rand.New(rand.NewPCG(seed, 3)).Shuffle(len(queue), func(i, j int) { queue[i], queue[j] = queue[j], queue[i] })
			rounds := 0
			held := 0
			for len(queue) > 0 && rounds < 200 {
				rounds++
				var again []stock.Event
				for _, ev := range queue {
					err := stock.Consume(ctx, e.r, store, ev)
					if errors.Is(err, stock.ErrHeldBack) {
						held++
						again = append(again, ev)
						continue
					}
					require.NoError(t, err, "%+v", ev)
				}
				queue = again
			}
			require.Empty(t, queue, "events held back for ever")
			t.Logf("%s: %d events, %d relay passes, %d consume rounds, %d held back", sku, len(evs), passes, rounds, held)
			a27oCheck(t, e, store, sku, sold)
		}
	})
}

// a27oDrainAdv is a27oDrain that lets time pass between passes (backoffs), and tolerates
// dead letters when dead is true.
func a27oDrainAdv(t *testing.T, e *a26Env, sku string, limit int, dead bool, rl *stockops.Relay) (passes, refused int) {
	t.Helper()
	for passes < limit {
		p, d, err := stockops.Pending(context.Background(), e.r, sku)
		require.NoError(t, err)
		if !dead {
			require.Zero(t, d, "dead letters")
		}
		if p == 0 {
			return passes, refused
		}
		passes++
		st, err := rl.Once(context.Background())
		if err != nil && !errors.Is(err, stock.ErrInvalid) {
			require.NoError(t, err)
		}
		refused += st.Refused
		e.advance(30 * time.Millisecond)
	}
	t.Fatalf("%s not drained after %d passes", sku, passes)
	return
}

// TestA27oDonorRetryable: the Store fails the give-backs (restocks, restores) with a temporary
// error for a while. The sales that spend their units in other buckets must wait (not be
// refused), and go on once the Store is back.
func TestA27oDonorRetryable(t *testing.T) {
	a26Each(t, []stock.Option{a26Split(3)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		for seed := range uint64(3) {
			sku := fmt.Sprintf("retry-%d", seed)
			store := memstore.New()
			require.NoError(t, store.Load(ctx, sku, 6))
			require.NoError(t, e.r.Load(ctx, sku, 6))
			var down atomic.Bool
			down.Store(true)
			var failed atomic.Int64
			store.FailWith(func(ev stock.Event) error {
				if down.Load() && (ev.Type == stock.EventRestocked || ev.Type == stock.EventRestored) {
					failed.Add(1)
					return memstore.ErrDown
				}
				return nil
			})
			sold := a27oSales(t, e, sku, seed+30, 3, nil)
			rl := a27oRelay(t, e, store, &stock.RelayOptions{Batch: 2, MinBackoff: 5 * time.Millisecond, MaxBackoff: 10 * time.Millisecond})
			refused := 0
			for range 20 {
				st, err := rl.Once(ctx)
				if err != nil {
					require.ErrorIs(t, err, memstore.ErrDown)
				}
				refused += st.Refused
				e.advance(30 * time.Millisecond)
			}
			require.Positive(t, failed.Load(), "the store failed some give-backs")
			assert.Zero(t, refused, "a sale refused while a give-back was failing")
			down.Store(false)
			passes, r2 := a27oDrainAdv(t, e, sku, 400, false, rl)
			t.Logf("%s: %d give-backs failed, drained in %d passes after", sku, failed.Load(), passes)
			assert.Zero(t, r2, "the relay counted refusals")
			a27oCheck(t, e, store, sku, sold)
		}
	})
}

// TestA27oDonorInvalid: the Store rejects every restock as invalid (ErrInvalid): it is
// dead-lettered, for an operator (documented). The relay must not be blocked by it: every
// other event is delivered within a bounded number of passes, and the dead letter is
// reported by Pending.
func TestA27oDonorInvalid(t *testing.T) {
	a27oEach(t, []stock.Option{a26Split(3)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		sku := "invalid"
		store := memstore.New()
		require.NoError(t, store.Load(ctx, sku, 6))
		require.NoError(t, e.r.Load(ctx, sku, 6))
		store.FailWith(func(ev stock.Event) error {
			if ev.Type == stock.EventRestocked {
				return fmt.Errorf("bad restock: %w", stock.ErrInvalid)
			}
			return nil
		})
		sold := a27oSales(t, e, sku, 40, 3, nil)
		rl := a27oRelay(t, e, store, &stock.RelayOptions{Batch: 2, MinBackoff: 5 * time.Millisecond, MaxBackoff: 10 * time.Millisecond})
		passes, refused := a27oDrainAdv(t, e, sku, 400, true, rl)
		_, d, err := stockops.Pending(ctx, e.r, sku)
		require.NoError(t, err)
		assert.Positive(t, d, "the rejected restocks are dead letters")
		nref := 0
		for id := range sold {
			ent, err := e.r.Ledger(ctx, sku, id)
			require.NoError(t, err)
			if ent.State == stock.StateRefused {
				nref++
			}
		}
		t.Logf("%d passes, %d dead letters, %d sales refused by the relay (%d in the ledger)", passes, d, refused, nref)
	})
}

// TestA27oCutTransfers: buyers whose context ends at random moments (some inside a
// rebalance, cutting a transfer half way); then the sweeper completes the cut transfers and
// the relay delivers everything: no acknowledged sale (by Redis's ledger) refused.
func TestA27oCutTransfers(t *testing.T) {
	a27oEach(t, []stock.Option{a26Split(4)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		sku := "cut"
		store := memstore.New()
		require.NoError(t, store.Load(ctx, sku, 8))
		require.NoError(t, e.r.Load(ctx, sku, 8))
		rng := rand.New(rand.NewPCG(5, 5))
		var ids []string
		n := 0
		for round := range 30 {
			_, err := e.r.Restock(ctx, sku, fmt.Sprintf("rs%d", round), int64(1+rng.IntN(3)))
			require.NoError(t, err)
			for range 6 {
				n++
				id := fmt.Sprintf("c%d", n)
				ids = append(ids, id)
				cctx, cancel := context.WithTimeout(ctx, time.Duration(rng.IntN(400))*time.Microsecond)
				_, _ = e.r.Deduct(cctx, stock.Request{SKU: sku, ID: id, User: fmt.Sprintf("u%d", rng.IntN(40)), Qty: 1})
				cancel()
			}
			if round%5 == 4 {
				// Restores of a few sold ids: give-backs in their buckets.
				for _, id := range ids[len(ids)-3:] {
					_, err := e.r.Restore(ctx, sku, id)
					if !errors.Is(err, stock.ErrUnknownID) { // a deduct cut before it ran
						require.NoError(t, err)
					}
				}
			}
		}
		// Cut transfers complete once 5 s old.
		inFlight := 0
		e7 := &a27Env{name: e.name, real: e.real, c: e.c, r: e.r, advance: e.advance, another: e.another}
		for _, k := range a27oKeysOf(t, e7, sku) {
			if strings.HasSuffix(k, ":xf") {
				n, err := e.c.Do(ctx, e.c.B().Zcard().Key(k).Build()).AsInt64()
				require.NoError(t, err)
				inFlight += int(n)
			}
		}
		t.Logf("transfers in flight before the sweep: %d", inFlight)
		e.advance(6 * time.Second)
		_, err := stockops.Sweep(ctx, e.r, sku)
		require.NoError(t, err)
		// Sell out whatever is left, through every bucket.
		for k := range 60 {
			id := fmt.Sprintf("z%d", k)
			ids = append(ids, id)
			_, err := e.r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: fmt.Sprintf("u%d", k), Qty: 1})
			if errors.Is(err, stock.ErrSoldOut) {
				break
			}
		}
		sold := map[string]int64{}
		for _, id := range ids {
			ent, err := e.r.Ledger(ctx, sku, id)
			if errors.Is(err, stock.ErrUnknownID) {
				continue
			}
			require.NoError(t, err)
			if ent.Taken() {
				sold[id] = ent.Qty
			}
		}
		rl := a27oRelay(t, e, store, &stock.RelayOptions{Batch: 1})
		passes, refused := a27oDrain(t, e, sku, 400, rl)
		t.Logf("%d sold, drained in %d passes", len(sold), passes)
		assert.Zero(t, refused, "the relay counted refusals")
		a27oCheck(t, e, store, sku, sold)
		a26Reconcile(t, e.r, store, sku)
	})
}

// TestA27oRetireAfterTransfers: after many transfers (and barriers), the item drains, is
// delisted and retired: no key of it is left, barriers included.
func TestA27oRetireAfterTransfers(t *testing.T) {
	a26Each(t, []stock.Option{a26Split(4)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		sku := "retire-ord"
		store := memstore.New()
		require.NoError(t, store.Load(ctx, sku, 6))
		require.NoError(t, e.r.Load(ctx, sku, 6))
		sold := a27oSales(t, e, sku, 60, 4, nil)
		rl := a27oRelay(t, e, store, &stock.RelayOptions{Batch: 2})
		_, refused := a27oDrain(t, e, sku, 400, rl)
		assert.Zero(t, refused)
		a27oCheck(t, e, store, sku, sold)
		e7 := &a27Env{name: e.name, real: e.real, c: e.c, r: e.r, advance: e.advance, another: e.another}
		a27Retire(t, e7, store, sku)
		// What is left: each bucket's item hash, with only its retired mark and delist time (as
		// TestA27RetireLeavesNoKeys pins); no barrier, transfer or claim key.
		left := a27oKeysOf(t, e7, sku)
		assert.Len(t, left, 4, "%v", left)
		for _, k := range left {
			require.True(t, strings.HasSuffix(k, "}"), "key left behind: %s", k)
			m, err := e.c.Do(ctx, e.c.B().Hgetall().Key(k).Build()).AsStrMap()
			require.NoError(t, err)
			assert.Len(t, m, 2, "%s: %v", k, m)
			assert.Equal(t, "1", m["x"], "%s: %v", k, m)
		}
		_, err := e.r.Levels(ctx, sku)
		assert.ErrorIs(t, err, stock.ErrNotLoaded)
	})
}

// a27oKeysOf lists the item's keys (its buckets' included, "{sku|..."), not other items'.
func a27oKeysOf(t *testing.T, e *a27Env, sku string) []string {
	t.Helper()
	var mine []string
	for _, k := range a27Keys(t, e, sku) {
		if strings.Contains(k, "{"+sku+"}") || strings.Contains(k, "{"+sku+"|") {
			mine = append(mine, k)
		}
	}
	return mine
}

// TestA27oCutAtEachCall: a buyer's process whose n-th Redis call is cut (never sent), for n in
// turn, while its buyers need stock a restock and a restore gave back in other buckets: some
// cuts leave a transfer half way. The sweeper completes them; the item is sold out; the relay
// then delivers everything with no acknowledged sale (by Redis's ledger) refused.
func TestA27oCutAtEachCall(t *testing.T) {
	a27oEach(t, []stock.Option{a26Split(4)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		e7 := &a27Env{name: e.name, real: e.real, c: e.c, r: e.r, advance: e.advance, another: e.another}
		cuts, inFlightTotal := 0, 0
		for n := 1; n <= 40; n++ {
			sku := fmt.Sprintf("cutcall-%d", n)
			store := memstore.New()
			require.NoError(t, store.Load(ctx, sku, 4))
			require.NoError(t, e.r.Load(ctx, sku, 4))
			var ids []string
			buy := func(r *stock.Reserver, prefix string, k int) {
				for i := range k {
					id := fmt.Sprintf("%s%d", prefix, i)
					ids = append(ids, id)
					_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: id, Qty: 1})
					if r == e.r && errors.Is(err, stock.ErrSoldOut) {
						return
					}
				}
			}
			buy(e.r, "a", 50)
			_, err := e.r.Restock(ctx, sku, "rs", 3)
			require.NoError(t, err)
			_, err = e.r.Restore(ctx, sku, "a0")
			require.NoError(t, err)
			cc := &a27Cut{Client: e.c, n: n}
			cr, err := stock.New(cc, a26Split(4))
			require.NoError(t, err)
			buy(cr, "x", 6)
			if cut, _ := cc.state(); cut {
				cuts++
			}
			for _, k := range a27oKeysOf(t, e7, sku) {
				if strings.HasSuffix(k, ":xf") {
					m, err := e.c.Do(ctx, e.c.B().Zcard().Key(k).Build()).AsInt64()
					require.NoError(t, err)
					inFlightTotal += int(m)
				}
			}
			e.advance(6 * time.Second)
			_, err = stockops.Sweep(ctx, e.r, sku)
			require.NoError(t, err)
			buy(e.r, "b", 50)
			sold := map[string]int64{}
			for _, id := range ids {
				ent, err := e.r.Ledger(ctx, sku, id)
				if errors.Is(err, stock.ErrUnknownID) {
					continue
				}
				require.NoError(t, err)
				if ent.Taken() {
					sold[id] = ent.Qty
				}
			}
			l := a26Levels(t, e.r, sku)
			assert.Zero(t, l.Available, "cut %d: units stranded: %+v", n, l)
			rl := a27oRelay(t, e, store, &stock.RelayOptions{Batch: 1})
			_, refused := a27oDrain(t, e, sku, 200, rl)
			assert.Zero(t, refused, "cut %d: the relay counted refusals", n)
			a27oCheck(t, e, store, sku, sold)
		}
		t.Logf("%d cuts, %d transfers left in flight by them", cuts, inFlightTotal)
	})
}

// TestA27oPassThrough: large sales, often refused after their bucket pulled units from its
// siblings, so units pass on through buckets that write no event of their own; several relays
// with Batch 1. No acknowledged sale refused.
func TestA27oPassThrough(t *testing.T) {
	a27oEach(t, []stock.Option{a26Split(5)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		for seed := range uint64(6) {
			sku := fmt.Sprintf("pass-%d", seed)
			store := memstore.New()
			require.NoError(t, store.Load(ctx, sku, 10))
			require.NoError(t, e.r.Load(ctx, sku, 10))
			sold := a27oSalesQ(t, e, sku, seed+70, 5, 6, nil)
			rls := []*stockops.Relay{
				a27oRelay(t, e, store, &stock.RelayOptions{Batch: 1}),
				a27oRelay(t, e, store, &stock.RelayOptions{Batch: 1, Items: []string{sku}}),
			}
			passes, refused := a27oDrain(t, e, sku, 400, rls...)
			t.Logf("%s: %d sales, %d passes", sku, len(sold), passes)
			assert.Zero(t, refused, "the relay counted refusals")
			a27oCheck(t, e, store, sku, sold)
		}
	})
}

// TestA27oRunConcurrent: Run relays into the store while buyers, restores, restocks and holds
// run concurrently on several items; once activity stops, everything is delivered within a
// bounded time and no acknowledged sale is refused.
func TestA27oRunConcurrent(t *testing.T) {
	a27oEach(t, []stock.Option{a26Split(4)}, func(t *testing.T, e *a26Env) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		store := memstore.New()
		skus := []string{"run-a", "run-b"}
		for _, sku := range skus {
			require.NoError(t, store.Load(ctx, sku, 5))
			require.NoError(t, e.r.Load(ctx, sku, 5))
		}
		done := make(chan error, 1)
		go func() {
			done <- e.r.Run(ctx, stock.RunOptions{Store: store, Relay: &stock.RelayOptions{Batch: 2, Poll: 10 * time.Millisecond}})
		}()
		solds := make([]map[string]int64, len(skus))
		var wg sync.WaitGroup
		for i, sku := range skus {
			wg.Go(func() { solds[i] = a27oSalesQ(t, e, sku, uint64(80+i), 6, 3, nil) })
		}
		wg.Wait()
		start := time.Now()
		require.Eventually(t, func() bool {
			for _, sku := range skus {
				p, d, err := stockops.Pending(context.Background(), e.r, sku)
				if err != nil || p != 0 || d != 0 {
					return false
				}
			}
			return true
		}, 30*time.Second, 20*time.Millisecond)
		t.Logf("drained %v after activity stopped", time.Since(start))
		cancel()
		<-done
		for i, sku := range skus {
			a27oCheck(t, e, store, sku, solds[i])
		}
	})
}

// TestA27oQueueConcurrentConsumers: the queue path with the relay publishing while four
// consumers apply a shuffled, duplicated queue concurrently; held-back events are redelivered.
func TestA27oQueueConcurrentConsumers(t *testing.T) {
	a27oEach(t, []stock.Option{a26Split(4)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		for seed := range uint64(3) {
			sku := fmt.Sprintf("qc-%d", seed)
			store := memstore.New()
			require.NoError(t, store.Load(ctx, sku, 8))
			require.NoError(t, e.r.Load(ctx, sku, 8))
			sold := a27oSalesQ(t, e, sku, seed+90, 4, 4, nil)
			var mu sync.Mutex
			var evs []stock.Event
			pub := stock.PublisherFunc(func(_ context.Context, ev stock.Event) error {
				mu.Lock()
				evs = append(evs, ev)
				mu.Unlock()
				return nil
			})
			rl, err := stockops.NewRelay(e.r, nil, pub, &stock.RelayOptions{Batch: 1})
			require.NoError(t, err)
			a27oDrain(t, e, sku, 400, rl)
			queue := append(slices.Clone(evs), evs...)
			rand.New(rand.NewPCG(seed, 9)).Shuffle(len(queue), func(i, j int) { queue[i], queue[j] = queue[j], queue[i] })
			for round := 0; len(queue) > 0; round++ {
				require.Less(t, round, 200, "events held back for ever: %d", len(queue))
				var qi atomic.Int64
				var amu sync.Mutex
				var again []stock.Event
				var wg sync.WaitGroup
				for range 4 {
					wg.Go(func() {
						for {
							i := int(qi.Add(1)) - 1
							if i >= len(queue) {
								return
							}
							err := stock.Consume(ctx, e.r, store, queue[i])
							if errors.Is(err, stock.ErrHeldBack) {
								amu.Lock()
								again = append(again, queue[i])
								amu.Unlock()
								continue
							}
							assert.NoError(t, err, "%+v", queue[i])
						}
					})
				}
				wg.Wait()
				queue = again
			}
			a27oCheck(t, e, store, sku, sold)
		}
	})
}

// a27oDie is a rueidis client of a process that dies right after its first script call
// (EVAL*, FCALL*) that touches a bucket's in-flight transfers set (xout: the first half of a
// transfer): every later command fails as on a dead connection, never sent.
type a27oDie struct {
	rueidis.Client
	mu   sync.Mutex
	dead bool
}

func (c *a27oDie) check(cmds ...rueidis.Completed) (dead, dieAfter bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return true, false
	}
	for _, cmd := range cmds {
		cs := cmd.Commands()
		if len(cs) == 0 || !strings.HasPrefix(strings.ToUpper(cs[0]), "EVAL") && !strings.HasPrefix(strings.ToUpper(cs[0]), "FCALL") {
			continue
		}
		for _, a := range cs {
			if strings.HasSuffix(a, ":xf") {
				c.dead = true
				return false, true
			}
		}
	}
	return false, false
}

func (c *a27oDie) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if dead, _ := c.check(cmd); dead {
		return c.Client.Do(a27Dead(), cmd)
	}
	return c.Client.Do(ctx, cmd)
}

func (c *a27oDie) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	if dead, _ := c.check(cmds...); dead {
		return c.Client.DoMulti(a27Dead(), cmds...)
	}
	return c.Client.DoMulti(ctx, cmds...)
}

func (c *a27oDie) died() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dead
}

// TestA27oHalfTransferRecovered: a restore gives a unit back in one bucket; a buyer of another
// bucket pulls it over and its process dies right after the transfer's first half. The sweeper
// completes the transfer (5 s later); another buyer of that bucket buys the unit; the relay
// must still deliver the restore before that sale (the recovered transfer keeps its barrier).
func TestA27oHalfTransferRecovered(t *testing.T) {
	a27oEach(t, []stock.Option{a26Split(4)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		e7 := &a27Env{name: e.name, real: e.real, c: e.c, r: e.r, advance: e.advance, another: e.another}
		halves := 0
		for v := range 24 {
			sku := fmt.Sprintf("half-%d", v)
			store := memstore.New()
			require.NoError(t, store.Load(ctx, sku, 4))
			require.NoError(t, e.r.Load(ctx, sku, 4))
			var ids []string
			for i := range 50 {
				id := fmt.Sprintf("a%d-%d", v, i)
				_, err := e.r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: id, Qty: 1})
				if errors.Is(err, stock.ErrSoldOut) {
					break
				}
				require.NoError(t, err)
				ids = append(ids, id)
			}
			_, err := e.r.Restore(ctx, sku, ids[0])
			require.NoError(t, err)
			ids = ids[1:]
			dc := &a27oDie{Client: e.c}
			dr, err := stock.New(dc, a26Split(4))
			require.NoError(t, err)
			xid := fmt.Sprintf("x%d", v)
			_, xerr := dr.Deduct(ctx, stock.Request{SKU: sku, ID: xid, User: xid, Qty: 1})
			ids = append(ids, xid)
			if !dc.died() {
				require.NoError(t, xerr) // the buyer was in the restore's bucket: no transfer
			} else {
				inFlight := 0
				for _, k := range a27oKeysOf(t, e7, sku) {
					if strings.HasSuffix(k, ":xf") {
						m, err := e.c.Do(ctx, e.c.B().Zcard().Key(k).Build()).AsInt64()
						require.NoError(t, err)
						inFlight += int(m)
					}
				}
				// (a script of the dying call may touch the in-flight set without moving units)
				halves += inFlight
				e.advance(6 * time.Second)
				_, err = stockops.Sweep(ctx, e.r, sku)
				require.NoError(t, err)
				// Buyers of every bucket, until the recovered unit is sold.
				for i := range 50 {
					id := fmt.Sprintf("b%d-%d", v, i)
					_, err := e.r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: id, Qty: 1})
					if errors.Is(err, stock.ErrSoldOut) {
						break
					}
					require.NoError(t, err)
					ids = append(ids, id)
				}
			}
			sold := map[string]int64{}
			for _, id := range ids {
				ent, err := e.r.Ledger(ctx, sku, id)
				if errors.Is(err, stock.ErrUnknownID) {
					continue
				}
				require.NoError(t, err)
				if ent.Taken() {
					sold[id] = ent.Qty
				}
			}
			assert.Zero(t, a26Levels(t, e.r, sku).Available, "v%d: units stranded", v)
			rl := a27oRelay(t, e, store, &stock.RelayOptions{Batch: 1})
			_, refused := a27oDrain(t, e, sku, 200, rl)
			assert.Zero(t, refused, "v%d: the relay counted refusals", v)
			a27oCheck(t, e, store, sku, sold)
		}
		t.Logf("%d transfers cut after their first half", halves)
		require.Positive(t, halves)
	})
}

// a27oDyingStore is a Store whose relay dies on its k-th Apply: the call's context is
// cancelled (the relay's Run stops) and the event is not applied.
type a27oDyingStore struct {
	*memstore.Store
	n      atomic.Int64
	k      int64
	cancel context.CancelFunc
}

func (s *a27oDyingStore) Apply(ctx context.Context, ev stock.Event) error {
	if s.n.Add(1) == s.k {
		s.cancel()
		return context.Canceled
	}
	return s.Store.Apply(ctx, ev)
}

// TestA27oRelayDiesMidway: a relay (Run) dies on its k-th Store call, for k in turn, leaving
// its lease; a new relay takes over after the lease: everything is delivered, nothing refused.
func TestA27oRelayDiesMidway(t *testing.T) {
	a27oEach(t, []stock.Option{a26Split(3)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		for k := int64(1); k <= 12; k++ {
			sku := fmt.Sprintf("dies-%d", k)
			mem := memstore.New()
			require.NoError(t, mem.Load(ctx, sku, 6))
			require.NoError(t, e.r.Load(ctx, sku, 6))
			sold := a27oSales(t, e, sku, uint64(100+k), 3, nil)
			rctx, cancel := context.WithCancel(ctx)
			ds := &a27oDyingStore{Store: mem, k: k, cancel: cancel}
			rl, err := stockops.NewRelay(e.r, ds, nil, &stock.RelayOptions{Batch: 2, Lease: 200 * time.Millisecond, Items: []string{sku}})
			require.NoError(t, err)
			for rctx.Err() == nil {
				if a27oDrained(t, e, sku) {
					break
				}
				_, _ = rl.Once(rctx)
			}
			cancel()
			e.advance(300 * time.Millisecond)
			rl2 := a27oRelay(t, e, mem, &stock.RelayOptions{Batch: 2, Lease: 200 * time.Millisecond})
			passes := 0
			for ; passes < 200 && !a27oDrained(t, e, sku); passes++ {
				st, err := rl2.Once(ctx)
				require.NoError(t, err)
				assert.Zero(t, st.Refused, "k=%d: the relay counted refusals", k)
				e.advance(50 * time.Millisecond)
			}
			require.True(t, a27oDrained(t, e, sku), "k=%d: not drained", k)
			a27oCheck(t, e, mem, sku, sold)
		}
	})
}

// TestA27oQueueDonorDown: the queue path where the Store is down for the give-backs for a
// while: Consume answers them with a temporary error; the sales that spend their units in
// other buckets are held back (never refused) and go through once the Store is back.
func TestA27oQueueDonorDown(t *testing.T) {
	a27oEach(t, []stock.Option{a26Split(3)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		for seed := range uint64(3) {
			sku := fmt.Sprintf("qdown-%d", seed)
			store := memstore.New()
			require.NoError(t, store.Load(ctx, sku, 6))
			require.NoError(t, e.r.Load(ctx, sku, 6))
			sold := a27oSales(t, e, sku, seed+110, 3, nil)
			var mu sync.Mutex
			var evs []stock.Event
			pub := stock.PublisherFunc(func(_ context.Context, ev stock.Event) error {
				mu.Lock()
				evs = append(evs, ev)
				mu.Unlock()
				return nil
			})
			rl, err := stockops.NewRelay(e.r, nil, pub, &stock.RelayOptions{Batch: 2})
			require.NoError(t, err)
			a27oDrain(t, e, sku, 400, rl)
			var down atomic.Bool
			down.Store(true)
			store.FailWith(func(ev stock.Event) error {
				if down.Load() && (ev.Type == stock.EventRestocked || ev.Type == stock.EventRestored) {
					return memstore.ErrDown
				}
				return nil
			})
			queue := slices.Clone(evs)
			rand.New(rand.NewPCG(seed, 11)).Shuffle(len(queue), func(i, j int) { queue[i], queue[j] = queue[j], queue[i] })
			for round := 0; len(queue) > 0; round++ {
				require.Less(t, round, 200, "events never applied: %d", len(queue))
				if round == 5 {
					down.Store(false)
				}
				var again []stock.Event
				for _, ev := range queue {
					err := stock.Consume(ctx, e.r, store, ev)
					if err != nil {
						if !errors.Is(err, stock.ErrHeldBack) {
							require.ErrorIs(t, err, memstore.ErrDown, "%+v", ev)
						}
						again = append(again, ev)
					}
				}
				queue = again
			}
			a27oCheck(t, e, store, sku, sold)
		}
	})
}

// a27oBucketOf returns the bucket id's claim names (from the claims hashes of sku's buckets).
func a27oBucketOf(t *testing.T, e *a26Env, sku, id string) int {
	t.Helper()
	ctx := context.Background()
	e7 := &a27Env{name: e.name, real: e.real, c: e.c, r: e.r, advance: e.advance, another: e.another}
	for _, k := range a27oKeysOf(t, e7, sku) {
		if !strings.HasSuffix(k, ":i") {
			continue
		}
		v, err := e.c.Do(ctx, e.c.B().Hget().Key(k).Field(id).Build()).ToString()
		if rueidis.IsRedisNil(err) {
			continue
		}
		require.NoError(t, err)
		var b int
		_, err = fmt.Sscanf(v, "%d", &b)
		require.NoError(t, err, "claim %q", v)
		return b
	}
	t.Fatalf("no claim for %s", id)
	return -1
}

// TestA27oQueueManyBarriersInDonor: the queue path (a relay with no Store) with no consumer
// running. Bucket 0 receives 70 transfers from bucket 1 (70 barriers), then gives units to
// bucket 1, whose buyer buys them. The README says that with no Store "delivered means left
// the outbox: handed to the Publisher", so the relay must publish every event within a bounded
// number of passes without waiting for a consumer to apply anything.
func TestA27oQueueManyBarriersInDonor(t *testing.T) {
	for _, transfers := range []int{60, 70} {
		t.Run(fmt.Sprint(transfers), func(t *testing.T) { a27oManyBarriers(t, transfers) })
	}
}

func a27oManyBarriers(t *testing.T, transfers int) {
	if transfers > 64 {
	}
	a26Each(t, []stock.Option{a26Split(2)}, func(t *testing.T, e *a26Env) {
		ctx := context.Background()
		sku := fmt.Sprintf("many-%d", transfers)
		require.NoError(t, e.r.Load(ctx, sku, 400))
		// Buyers of each bucket.
		var users [2]string
		for i := 0; users[0] == "" || users[1] == ""; i++ {
			require.Less(t, i, 50)
			u := fmt.Sprintf("p%d", i)
			_, err := e.r.Deduct(ctx, stock.Request{SKU: sku, ID: u, User: u, Qty: 1})
			require.NoError(t, err)
			if b := a27oBucketOf(t, e, sku, u); users[b] == "" {
				users[b] = u
			}
		}
		n := 0
		buy := func(b int, q int64) (stock.Receipt, error) {
			n++
			return e.r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("%s-%d", users[b], n), User: users[b], Qty: q})
		}
		// Bucket 1's stock, sold one unit at a time (to be given back one at a time).
		var ones []string
		for {
			rc, err := buy(1, 1)
			if err != nil {
				t.Fatalf("%v", err)
			}
			ones = append(ones, rc.ID)
			if rc.Remaining == 0 {
				break
			}
		}
		// Bucket 0 empty too.
		rc, err := buy(0, 1)
		require.NoError(t, err)
		if rc.Remaining > 0 {
			_, err = buy(0, rc.Remaining)
			require.NoError(t, err)
		}
		require.Zero(t, a26Levels(t, e.r, sku).Available)
		require.Greater(t, len(ones), transfers)
		// transfers 1 → 0: a unit given back in bucket 1, bought by bucket 0's buyer.
		var zeros []string
		for i := range transfers {
			_, err := e.r.Restore(ctx, sku, ones[i])
			require.NoError(t, err)
			rc, err := buy(0, 1)
			require.NoError(t, err, "transfer %d", i)
			zeros = append(zeros, rc.ID)
		}
		// Then bucket 0 gives units back, and bucket 1's buyer takes them (a transfer 0 → 1).
		for _, id := range zeros[:3] {
			_, err := e.r.Restore(ctx, sku, id)
			require.NoError(t, err)
		}
		_, err = buy(1, 3)
		require.NoError(t, err)
		require.Zero(t, a26Levels(t, e.r, sku).Available)
		var mu sync.Mutex
		var evs []stock.Event
		pub := stock.PublisherFunc(func(_ context.Context, ev stock.Event) error {
			mu.Lock()
			evs = append(evs, ev)
			mu.Unlock()
			return nil
		})
		rl, err := stockops.NewRelay(e.r, nil, pub, nil)
		require.NoError(t, err)
		passes := 0
		for ; passes < 50 && !a27oDrained(t, e, sku); passes++ {
			_, err := rl.Once(ctx)
			require.NoError(t, err)
			e.advance(200 * time.Millisecond)
		}
		p, _, err := stockops.Pending(ctx, e.r, sku)
		require.NoError(t, err)
		t.Logf("%d published in %d passes, %d pending", len(evs), passes, p)
		assert.Zero(t, p, "events never handed to the Publisher while no consumer runs")
		// Consumers then apply what was published (and the relay goes on): everything is
		// applied in the end, nothing refused.
		store := memstore.New()
		require.NoError(t, store.Load(ctx, sku, 400))
		taken := 0
		var queue []stock.Event
		for round := 0; ; round++ {
			require.Less(t, round, 100, "never drained")
			mu.Lock()
			queue = append(queue, evs[taken:]...)
			taken = len(evs)
			mu.Unlock()
			var again []stock.Event
			for _, ev := range queue {
				err := stock.Consume(ctx, e.r, store, ev)
				if errors.Is(err, stock.ErrHeldBack) {
					again = append(again, ev)
					continue
				}
				require.NoError(t, err)
			}
			queue = again
			_, err := rl.Once(ctx)
			require.NoError(t, err)
			mu.Lock()
			fresh := len(evs) - taken
			mu.Unlock()
			if len(queue) == 0 && fresh == 0 && a27oDrained(t, e, sku) {
				t.Logf("drained with consumers after %d rounds", round+1)
				break
			}
		}
		l := a26Levels(t, e.r, sku)
		rem, err := store.Remaining(ctx, sku)
		require.NoError(t, err)
		assert.Equal(t, l.Available+l.Held, rem, "store vs Redis (%+v)", l)
	})
}

// a27oEach is a26Each with the real servers only when STOCK_TEST_LONG is set: these attacks
// wait on real time there (sweeps after the transfer grace, relay backoffs), minutes each, too
// long for every CI run; on miniredis they run always, with its clock moved on instead.
func a27oEach(t *testing.T, opts []stock.Option, f func(t *testing.T, e *a26Env)) {
	t.Helper()
	if os.Getenv("STOCK_TEST_LONG") == "" {
		a26Mini(t, opts, f)
		if redistest.ServerBinary(t) != "" {
			t.Log("real servers: set STOCK_TEST_LONG=1 to run this attack on them too (minutes)")
		}
		return
	}
	a26Each(t, opts, f)
}
