package systest_test

// The documented contract after faults and at its edges, written from README.md, docs/*.md,
// CHANGELOG.md and go doc alone (without reading the library's tests): repairs after Redis lost
// writes the store has (a promoted replica behind the store, simulated by putting back a copy of
// an item's keys taken earlier: restocks, sales, restores and confirms lost alone or together,
// on plain, grouped and split items and carts), the retention counted from when an entry
// settled, the memory policy check, split items near MaxQty, one Run at a time, Close, names
// with invisible format characters, WithUserRequired and what ErrConflict says.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// outsideEnv is a Reserver on a Redis, with a memstore as the database of record and, on
// miniredis, one clock shared by Redis's TIME and WithClock.
type outsideEnv struct {
	t     *testing.T
	name  string
	c     rueidis.Client
	m     *miniredis.Miniredis // nil on a real server
	r     *stock.Reserver
	store *memstore.Store
	ctx   context.Context

	mu  sync.Mutex
	now time.Time
}

func (e *outsideEnv) clock() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil {
		return time.Now()
	}
	return e.now
}

// advance moves Redis's clock and the Reserver's clock by d (miniredis only).
func (e *outsideEnv) advance(d time.Duration) {
	e.t.Helper()
	if e.m == nil {
		e.t.Fatalf("advance on a real server")
	}
	e.mu.Lock()
	e.now = e.now.Add(d)
	e.m.SetTime(e.now)
	e.mu.Unlock()
	e.m.FastForward(d)
}

// outsideMini makes a Reserver on a private miniredis with a clock the test moves.
func outsideMini(t *testing.T, opts ...stock.Option) *outsideEnv {
	t.Helper()
	m := miniredis.RunT(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{m.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	e := &outsideEnv{t: t, name: "miniredis", c: c, m: m, store: memstore.New(), ctx: context.Background()}
	e.now = time.Now().Truncate(time.Millisecond)
	m.SetTime(e.now)
	opts = append([]stock.Option{stock.WithClock(e.clock)}, opts...)
	r, err := stock.New(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	e.r = r
	return e
}

// outsideEach runs f on miniredis and, with STOCK_REDIS_SERVER, a real standalone server.
func outsideEach(t *testing.T, f func(t *testing.T, e *outsideEnv), opts ...stock.Option) {
	t.Run("miniredis", func(t *testing.T) { f(t, outsideMini(t, opts...)) })
	for _, b := range redistest.Backends(t) {
		if b.Name != "standalone" {
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			c := b.Client(t)
			e := &outsideEnv{t: t, name: b.Name, c: c, store: memstore.New(), ctx: context.Background()}
			r, err := stock.New(c, opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = r.Close(context.Background()) })
			e.r = r
			f(t, e)
		})
	}
}

func (e *outsideEnv) load(sku string, qty int64) {
	e.t.Helper()
	if err := e.r.Load(e.ctx, sku, qty); err != nil {
		e.t.Fatalf("Load %s: %v", sku, err)
	}
	if err := e.store.Load(e.ctx, sku, qty); err != nil {
		e.t.Fatalf("store Load %s: %v", sku, err)
	}
}

// relay delivers every due event to the store.
func (e *outsideEnv) relay() stockops.RelayStats {
	e.t.Helper()
	rl, err := stockops.NewRelay(e.r, e.store, nil, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	st, err := rl.Once(e.ctx)
	if err != nil {
		e.t.Fatalf("relay: %v", err)
	}
	return st
}

func (e *outsideEnv) pass(opts *stock.ReconcileOptions) stockops.PassResult {
	e.t.Helper()
	rec, err := stockops.NewReconciler(e.r, e.store, opts)
	if err != nil {
		e.t.Fatal(err)
	}
	res, err := rec.Pass(e.ctx)
	if err != nil {
		e.t.Logf("pass error: %v", err)
	}
	for i, rep := range res.Reports {
		e.t.Logf("report: %s (err %v)", rep.String(), res.Errors[i])
	}
	return res
}

// levels checks the invariants and returns the counters.
func (e *outsideEnv) levels(sku string) stock.Levels {
	e.t.Helper()
	lv, err := e.r.Levels(e.ctx, sku)
	if err != nil {
		e.t.Fatalf("Levels %s: %v", sku, err)
	}
	if lv.Available < 0 || lv.Held < 0 || lv.Sold < 0 || lv.Loaded < 0 {
		e.t.Errorf("%s: a counter below zero: %+v", sku, lv)
	}
	if lv.Loaded != lv.Available+lv.Held+lv.Sold {
		e.t.Errorf("%s: Loaded != Available+Held+Sold: %+v", sku, lv)
	}
	return lv
}

// want checks Loaded and Sold and that the store agrees with Redis (nothing in flight).
func (e *outsideEnv) want(sku string, loaded, sold, held int64) {
	e.t.Helper()
	lv := e.levels(sku)
	if lv.Loaded != loaded || lv.Sold != sold || lv.Held != held {
		e.t.Errorf("%s: levels %+v, want Loaded %d Sold %d Held %d", sku, lv, loaded, sold, held)
	}
	rem, err := e.store.Remaining(e.ctx, sku)
	if err != nil {
		e.t.Fatalf("store Remaining %s: %v", sku, err)
	}
	if rem != lv.Available+lv.Held {
		e.t.Errorf("%s: store remaining %d, Redis available+held %d (%+v)", sku, rem, lv.Available+lv.Held, lv)
	}
}

// outsideKey is one Redis key's copy.
type outsideKey struct {
	typ   string
	str   string
	hash  map[string]string
	zset  []rueidis.ZScore
	set   []string
	pttl  int64
	found bool
}

// snapshot copies every key matching pattern (a single-node Redis).
func (e *outsideEnv) snapshot(pattern string) map[string]outsideKey {
	e.t.Helper()
	ctx, c := e.ctx, e.c
	out := map[string]outsideKey{}
	var cur uint64
	for {
		se, err := c.Do(ctx, c.B().Scan().Cursor(cur).Match(pattern).Count(1000).Build()).AsScanEntry()
		if err != nil {
			e.t.Fatalf("scan: %v", err)
		}
		for _, k := range se.Elements {
			typ, err := c.Do(ctx, c.B().Type().Key(k).Build()).ToString()
			if err != nil {
				e.t.Fatal(err)
			}
			v := outsideKey{typ: typ, found: true}
			switch typ {
			case "string":
				v.str, err = c.Do(ctx, c.B().Get().Key(k).Build()).ToString()
			case "hash":
				v.hash, err = c.Do(ctx, c.B().Hgetall().Key(k).Build()).AsStrMap()
			case "zset":
				v.zset, err = c.Do(ctx, c.B().Zrange().Key(k).Min("0").Max("-1").Withscores().Build()).AsZScores()
			case "set":
				v.set, err = c.Do(ctx, c.B().Smembers().Key(k).Build()).AsStrSlice()
			case "none":
				continue
			default:
				e.t.Fatalf("key %s of type %s", k, typ)
			}
			if err != nil {
				e.t.Fatalf("read %s: %v", k, err)
			}
			v.pttl, _ = c.Do(ctx, c.B().Pttl().Key(k).Build()).AsInt64()
			out[k] = v
		}
		cur = se.Cursor
		if cur == 0 {
			break
		}
	}
	if len(out) == 0 {
		e.t.Fatalf("snapshot of %s: no keys", pattern)
	}
	return out
}

// rollback makes the keys matching pattern what snap holds: a replica that is behind was
// promoted.
func (e *outsideEnv) rollback(pattern string, snap map[string]outsideKey) {
	e.t.Helper()
	ctx, c := e.ctx, e.c
	var cur uint64
	for {
		se, err := c.Do(ctx, c.B().Scan().Cursor(cur).Match(pattern).Count(1000).Build()).AsScanEntry()
		if err != nil {
			e.t.Fatal(err)
		}
		for _, k := range se.Elements {
			if err := c.Do(ctx, c.B().Del().Key(k).Build()).Error(); err != nil {
				e.t.Fatal(err)
			}
		}
		cur = se.Cursor
		if cur == 0 {
			break
		}
	}
	for k, v := range snap {
		var err error
		switch v.typ {
		case "string":
			err = c.Do(ctx, c.B().Set().Key(k).Value(v.str).Build()).Error()
		case "hash":
			cmd := c.B().Hset().Key(k).FieldValue()
			for f, x := range v.hash {
				cmd = cmd.FieldValue(f, x)
			}
			err = c.Do(ctx, cmd.Build()).Error()
		case "zset":
			cmd := c.B().Zadd().Key(k).ScoreMember()
			for _, z := range v.zset {
				cmd = cmd.ScoreMember(z.Score, z.Member)
			}
			err = c.Do(ctx, cmd.Build()).Error()
		case "set":
			err = c.Do(ctx, c.B().Sadd().Key(k).Member(v.set...).Build()).Error()
		}
		if err != nil {
			e.t.Fatalf("write %s: %v", k, err)
		}
		if v.pttl > 0 {
			if err := c.Do(ctx, c.B().Pexpire().Key(k).Milliseconds(v.pttl).Build()).Error(); err != nil {
				e.t.Fatal(err)
			}
		}
	}
}

func outsideItemKeys(sku string) string { return "stock:{" + sku + "}*" }

// mustRestore, mustCancel, mustConfirm and mustRestock make the call and fail the test on an error.
func (e *outsideEnv) mustRestore(sku, id string) { e.must(e.r.Restore(e.ctx, sku, id)) }
func (e *outsideEnv) mustCancel(sku, id string)  { e.must(e.r.Cancel(e.ctx, sku, id)) }
func (e *outsideEnv) mustConfirm(sku, id string) { e.must(e.r.Confirm(e.ctx, sku, id)) }
func (e *outsideEnv) mustRestock(sku, id string, qty int64) {
	e.must(e.r.Restock(e.ctx, sku, id, qty))
}

func (e *outsideEnv) must(_ stock.Receipt, err error) {
	e.t.Helper()
	if err != nil {
		e.t.Fatal(err)
	}
}

func (e *outsideEnv) deduct(sku, id string, qty int64) stock.Receipt {
	e.t.Helper()
	rc, err := e.r.Deduct(e.ctx, stock.Request{SKU: sku, ID: id, User: "u-" + id, Qty: qty})
	if err != nil {
		e.t.Fatalf("Deduct %s %s: %v", sku, id, err)
	}
	return rc
}

func outsideNoNeedsHuman(t *testing.T, res stockops.PassResult) {
	t.Helper()
	for _, rep := range res.Reports {
		if rep.NeedsHuman != "" {
			t.Errorf("%s needs a human: %s", rep.SKU, rep.NeedsHuman)
		}
	}
}

// ---------------------------------------------------------------------------------------
// 1. Repairs after a promoted replica that is behind the store.

func TestContractRepairAfterLostDeductKeepsLoaded(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 10)
		e.deduct("a", "d1", 2)
		e.relay()
		snap := e.snapshot(outsideItemKeys("a"))
		e.deduct("a", "d2", 3)
		e.relay()
		e.rollback(outsideItemKeys("a"), snap)
		res := e.pass(nil)
		outsideNoNeedsHuman(t, res)
		e.want("a", 10, 5, 0)
		// d2 is a replay now: its entry is written back.
		rc, err := e.r.Deduct(e.ctx, stock.Request{SKU: "a", ID: "d2", User: "u-d2", Qty: 3})
		if err != nil || !rc.Replayed {
			t.Errorf("repeat of d2 after repair: %+v, %v; want a replay", rc, err)
		}
		if _, err := e.r.Restore(e.ctx, "a", "d2"); err != nil {
			t.Fatalf("Restore d2: %v", err)
		}
		if _, err := e.r.Restore(e.ctx, "a", "d1"); err != nil {
			t.Fatalf("Restore d1: %v", err)
		}
		e.relay()
		e.want("a", 10, 0, 0)
		res = e.pass(nil)
		outsideNoNeedsHuman(t, res)
		e.want("a", 10, 0, 0)
	})
}

func TestContractRepairAfterLostFirstDeductThenRestoreKeepsSoldNonNegative(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 10)
		snap := e.snapshot(outsideItemKeys("a"))
		e.deduct("a", "d1", 4)
		e.relay()
		e.rollback(outsideItemKeys("a"), snap)
		e.pass(nil)
		e.want("a", 10, 4, 0)
		if _, err := e.r.Restore(e.ctx, "a", "d1"); err != nil {
			t.Fatalf("Restore d1: %v", err)
		}
		e.relay()
		e.want("a", 10, 0, 0)
		e.pass(nil)
		e.want("a", 10, 0, 0)
	})
}

func TestContractRepairAfterLostRestockKeepsLoaded(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 10)
		e.deduct("a", "d1", 2)
		e.relay()
		snap := e.snapshot(outsideItemKeys("a"))
		e.mustRestock("a", "r1", 5)
		e.relay()
		e.rollback(outsideItemKeys("a"), snap)
		res := e.pass(nil)
		outsideNoNeedsHuman(t, res)
		e.want("a", 15, 2, 0)
		rc, err := e.r.Restock(e.ctx, "a", "r1", 5)
		if err != nil || !rc.Replayed {
			t.Errorf("repeat of restock r1 after repair: %+v, %v; want a replay", rc, err)
		}
		e.want("a", 15, 2, 0)
		e.mustRestore("a", "d1")
		e.relay()
		e.pass(nil)
		e.want("a", 15, 0, 0)
	})
}

func TestContractRepairAfterLostRestockAndDeductKeepsLoaded(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 10)
		snap := e.snapshot(outsideItemKeys("a"))
		e.mustRestock("a", "r1", 5)
		e.deduct("a", "d1", 12)
		e.relay()
		e.rollback(outsideItemKeys("a"), snap)
		res := e.pass(nil)
		outsideNoNeedsHuman(t, res)
		e.want("a", 15, 12, 0)
		e.mustRestore("a", "d1")
		e.relay()
		e.pass(nil)
		e.want("a", 15, 0, 0)
	})
}

func TestContractRepairAfterLostRestoreGivesBack(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 10)
		e.deduct("a", "d1", 3)
		e.relay()
		snap := e.snapshot(outsideItemKeys("a"))
		e.mustRestore("a", "d1")
		e.relay()
		e.rollback(outsideItemKeys("a"), snap)
		res := e.pass(nil)
		outsideNoNeedsHuman(t, res)
		e.want("a", 10, 0, 0)
		if _, err := e.r.Deduct(e.ctx, stock.Request{SKU: "a", ID: "d1", User: "u-d1", Qty: 3}); !errors.Is(err, stock.ErrRestored) {
			t.Errorf("deduct of restored d1 after repair: %v, want ErrRestored", err)
		}
		rc, err := e.r.Restore(e.ctx, "a", "d1")
		if err != nil || !rc.Replayed {
			t.Errorf("second restore of d1: %+v %v, want a replay", rc, err)
		}
		e.relay()
		e.want("a", 10, 0, 0)
	})
}

func TestContractRepairAfterLostConfirmMakesHoldFinal(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 10)
		if _, err := e.r.Hold(e.ctx, stock.Request{SKU: "a", ID: "h1", User: "u", Qty: 2}, time.Hour); err != nil {
			t.Fatal(err)
		}
		e.relay()
		snap := e.snapshot(outsideItemKeys("a"))
		e.mustConfirm("a", "h1")
		e.relay()
		e.rollback(outsideItemKeys("a"), snap)
		res := e.pass(nil)
		outsideNoNeedsHuman(t, res)
		e.want("a", 10, 2, 0)
		rc, err := e.r.Confirm(e.ctx, "a", "h1")
		if err != nil || !rc.Replayed {
			t.Errorf("repeat confirm after repair: %+v %v, want a replay", rc, err)
		}
		if _, err := e.r.Cancel(e.ctx, "a", "h1"); !errors.Is(err, stock.ErrConfirmed) {
			t.Errorf("cancel of a confirmed hold after repair: %v, want ErrConfirmed", err)
		}
		e.mustRestore("a", "h1")
		e.relay()
		e.want("a", 10, 0, 0)
		e.pass(nil)
		e.want("a", 10, 0, 0)
	})
}

func TestContractRepairAfterLostConfirmAndRestoreReleasesHold(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 10)
		if _, err := e.r.Hold(e.ctx, stock.Request{SKU: "a", ID: "h1", User: "u", Qty: 2}, time.Hour); err != nil {
			t.Fatal(err)
		}
		e.relay()
		snap := e.snapshot(outsideItemKeys("a"))
		e.mustConfirm("a", "h1")
		e.mustRestore("a", "h1")
		e.relay()
		e.rollback(outsideItemKeys("a"), snap)
		res := e.pass(nil)
		outsideNoNeedsHuman(t, res)
		e.want("a", 10, 0, 0)
		if _, err := e.r.Confirm(e.ctx, "a", "h1"); !errors.Is(err, stock.ErrRestored) {
			t.Errorf("confirm of a released hold after repair: %v, want ErrRestored", err)
		}
		e.pass(nil)
		e.want("a", 10, 0, 0)
	})
}

// A lost restock, a lost deduct and a lost restore at once.
func TestContractRepairAfterLostMixKeepsBooks(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 5)
		e.deduct("a", "d0", 1)
		e.relay()
		snap := e.snapshot(outsideItemKeys("a"))
		e.mustRestock("a", "r1", 7)
		e.deduct("a", "d1", 6)
		e.deduct("a", "d2", 2)
		e.mustRestore("a", "d0")
		e.mustRestore("a", "d2")
		e.relay()
		e.want("a", 12, 6, 0)
		e.rollback(outsideItemKeys("a"), snap)
		res := e.pass(nil)
		outsideNoNeedsHuman(t, res)
		e.want("a", 12, 6, 0)
		for _, id := range []string{"d0", "d2"} {
			if _, err := e.r.Deduct(e.ctx, stock.Request{SKU: "a", ID: id, User: "u-" + id, Qty: map[string]int64{"d0": 1, "d2": 2}[id]}); !errors.Is(err, stock.ErrRestored) {
				t.Errorf("deduct of restored %s after repair: %v, want ErrRestored", id, err)
			}
		}
		e.mustRestore("a", "d1")
		e.relay()
		e.pass(nil)
		e.want("a", 12, 0, 0)
	})
}

// The item hash itself lost with everything else (a restart without persistence of the
// item's keys) after restocks: the rebuild must count the restocks as loaded.
func TestContractRebuildAfterLostItemKeepsLoadedAndSold(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 10)
		e.mustRestock("a", "r1", 5)
		e.deduct("a", "d1", 4)
		e.relay()
		e.rollback(outsideItemKeys("a"), map[string]outsideKey{})
		res := e.pass(nil)
		outsideNoNeedsHuman(t, res)
		e.want("a", 15, 4, 0)
		if _, err := e.r.Restore(e.ctx, "a", "d1"); err != nil {
			t.Fatalf("Restore d1 after rebuild: %v", err)
		}
		e.relay()
		e.pass(nil)
		e.want("a", 15, 0, 0)
	})
}

// A lost restock and a lost sale of the same size: Redis's available equals the Store's
// remaining (no drift), yet Redis lacks both entries' effects on Loaded and Sold.
func TestContractRepairAfterLostRestockAndEqualSaleKeepsLoaded(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 10)
		snap := e.snapshot(outsideItemKeys("a"))
		e.mustRestock("a", "r1", 5)
		e.deduct("a", "d1", 5)
		e.relay()
		e.rollback(outsideItemKeys("a"), snap)
		e.pass(nil)
		e.want("a", 15, 5, 0)
		e.mustRestore("a", "d1")
		e.relay()
		e.pass(nil)
		e.want("a", 15, 0, 0)
	})
}

// A lost restore of an old sale and a lost new sale.
func TestContractRepairAfterLostRestoreAndLostSaleKeepsBooks(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 10)
		e.deduct("a", "d1", 3)
		e.relay()
		snap := e.snapshot(outsideItemKeys("a"))
		e.mustRestore("a", "d1")
		e.deduct("a", "d2", 4)
		e.relay()
		e.rollback(outsideItemKeys("a"), snap)
		res := e.pass(nil)
		outsideNoNeedsHuman(t, res)
		e.want("a", 10, 4, 0)
		e.mustRestore("a", "d2")
		e.relay()
		e.pass(nil)
		e.want("a", 10, 0, 0)
	})
}

// A lost restock and a lost restore.
func TestContractRepairAfterLostRestockAndLostRestoreKeepsBooks(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 10)
		e.deduct("a", "d1", 3)
		e.relay()
		snap := e.snapshot(outsideItemKeys("a"))
		e.mustRestore("a", "d1")
		e.mustRestock("a", "r1", 5)
		e.relay()
		e.rollback(outsideItemKeys("a"), snap)
		res := e.pass(nil)
		outsideNoNeedsHuman(t, res)
		e.want("a", 15, 0, 0)
	})
}

// A lost restore of an old sale and a lost new sale of the same size (no drift).
func TestContractRepairAfterLostRestoreAndEqualLostSaleKeepsBooks(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 10)
		e.deduct("a", "d1", 3)
		e.relay()
		snap := e.snapshot(outsideItemKeys("a"))
		e.mustRestore("a", "d1")
		e.deduct("a", "d2", 3)
		e.relay()
		e.rollback(outsideItemKeys("a"), snap)
		res := e.pass(nil)
		outsideNoNeedsHuman(t, res)
		e.want("a", 10, 3, 0)
		e.mustRestore("a", "d2")
		e.relay()
		e.pass(nil)
		e.want("a", 10, 0, 0)
	})
}

// A lost confirm of a hold and a lost restock.
func TestContractRepairAfterLostConfirmAndRestockKeepsBooks(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 10)
		if _, err := e.r.Hold(e.ctx, stock.Request{SKU: "a", ID: "h1", User: "u", Qty: 2}, time.Hour); err != nil {
			t.Fatal(err)
		}
		e.relay()
		snap := e.snapshot(outsideItemKeys("a"))
		e.mustConfirm("a", "h1")
		e.mustRestock("a", "r1", 4)
		e.relay()
		e.rollback(outsideItemKeys("a"), snap)
		res := e.pass(nil)
		outsideNoNeedsHuman(t, res)
		e.want("a", 14, 2, 0)
		e.mustRestore("a", "h1")
		e.relay()
		e.pass(nil)
		e.want("a", 14, 0, 0)
	})
}

func outsideTwoBuckets(string) int { return 2 }

func TestContractBucketsRepairAfterLostDeductKeepsLoaded(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 10)
		e.deduct("a", "d1", 2)
		e.relay()
		snap := e.snapshot("stock:{a|*")
		e.deduct("a", "d2", 3)
		e.deduct("a", "d3", 1)
		e.relay()
		e.want("a", 10, 6, 0)
		e.rollback("stock:{a|*", snap)
		res := e.pass(nil)
		outsideNoNeedsHuman(t, res)
		e.want("a", 10, 6, 0)
		for _, id := range []string{"d2", "d3"} {
			q := map[string]int64{"d2": 3, "d3": 1}[id]
			rc, err := e.r.Deduct(e.ctx, stock.Request{SKU: "a", ID: id, User: "u-" + id, Qty: q})
			if err != nil || !rc.Replayed {
				t.Errorf("repeat of %s after repair: %+v, %v; want a replay", id, rc, err)
			}
		}
		for _, id := range []string{"d1", "d2", "d3"} {
			if _, err := e.r.Restore(e.ctx, "a", id); err != nil {
				t.Fatalf("Restore %s: %v", id, err)
			}
		}
		e.relay()
		e.want("a", 10, 0, 0)
		e.pass(nil)
		e.want("a", 10, 0, 0)
	}, stock.WithBuckets(outsideTwoBuckets))
}

func TestContractBucketsRepairAfterLostRestockKeepsLoaded(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 10)
		snap := e.snapshot("stock:{a|*")
		e.mustRestock("a", "r1", 6)
		e.mustRestock("a", "r2", 4)
		e.relay()
		e.rollback("stock:{a|*", snap)
		res := e.pass(nil)
		outsideNoNeedsHuman(t, res)
		e.want("a", 20, 0, 0)
		rc, err := e.r.Restock(e.ctx, "a", "r1", 6)
		if err != nil || !rc.Replayed {
			t.Errorf("repeat of restock r1 after repair: %+v, %v; want a replay", rc, err)
		}
		e.want("a", 20, 0, 0)
	}, stock.WithBuckets(outsideTwoBuckets))
}

func TestContractBucketsRepairAfterLostRestoreGivesBack(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 10)
		e.deduct("a", "d1", 3)
		e.deduct("a", "d2", 2)
		e.relay()
		snap := e.snapshot("stock:{a|*")
		for _, id := range []string{"d1", "d2"} {
			if _, err := e.r.Restore(e.ctx, "a", id); err != nil {
				t.Fatal(err)
			}
		}
		e.relay()
		e.rollback("stock:{a|*", snap)
		res := e.pass(nil)
		outsideNoNeedsHuman(t, res)
		e.want("a", 10, 0, 0)
		if _, err := e.r.Deduct(e.ctx, stock.Request{SKU: "a", ID: "d1", User: "u-d1", Qty: 3}); !errors.Is(err, stock.ErrRestored) {
			t.Errorf("deduct of restored d1: %v, want ErrRestored", err)
		}
	}, stock.WithBuckets(outsideTwoBuckets))
}

// Only one bucket's shard failed over (a cluster with one master behind).
func TestContractBucketsRepairAfterOneBucketLostRestockAndDeductKeepsLoaded(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 10)
		snap := e.snapshot("stock:{a|0|*")
		for i := 0; i < 6; i++ {
			e.deduct("a", fmt.Sprintf("d%d", i), 1)
		}
		e.mustRestock("a", "r1", 3)
		e.relay()
		e.want("a", 13, 6, 0)
		e.rollback("stock:{a|0|*", snap)
		res := e.pass(nil)
		outsideNoNeedsHuman(t, res)
		e.want("a", 13, 6, 0)
		for i := 0; i < 6; i++ {
			if _, err := e.r.Restore(e.ctx, "a", fmt.Sprintf("d%d", i)); err != nil {
				t.Fatalf("restore d%d: %v", i, err)
			}
		}
		e.relay()
		e.pass(nil)
		e.want("a", 13, 0, 0)
	}, stock.WithBuckets(outsideTwoBuckets))
}

func outsideGroup(sku string) string { return "g" }

func TestContractGroupsRepairAfterLostDeductKeepsLoaded(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 10)
		e.load("b", 10)
		e.deduct("a", "d1", 2)
		e.relay()
		snap := e.snapshot("stock:{g}:{a}*")
		e.deduct("a", "d2", 3)
		e.relay()
		e.rollback("stock:{g}:{a}*", snap)
		res := e.pass(nil)
		outsideNoNeedsHuman(t, res)
		e.want("a", 10, 5, 0)
		e.want("b", 10, 0, 0)
		e.mustRestore("a", "d2")
		e.relay()
		e.pass(nil)
		e.want("a", 10, 2, 0)
	}, stock.WithGroups(outsideGroup))
}

func TestContractGroupsRepairAfterLostRestockAndDeductKeepsLoaded(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 10)
		e.load("b", 10)
		e.deduct("a", "d1", 2)
		e.relay()
		snap := e.snapshot("stock:{g}:{a}*")
		e.deduct("a", "d2", 3)
		e.mustRestock("a", "r1", 2)
		e.relay()
		e.rollback("stock:{g}:{a}*", snap)
		res := e.pass(nil)
		outsideNoNeedsHuman(t, res)
		e.want("a", 12, 5, 0)
		e.want("b", 10, 0, 0)
		e.mustRestore("a", "d2")
		e.relay()
		e.pass(nil)
		e.want("a", 12, 2, 0)
	}, stock.WithGroups(outsideGroup))
}

func TestContractGroupCartRepairAfterLostCartKeepsBooks(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 10)
		e.load("b", 10)
		snapA := e.snapshot("stock:{g}:{a}*")
		snapB := e.snapshot("stock:{g}:{b}*")
		cart := stock.Cart{ID: "c1", User: "u", Lines: []stock.Line{{SKU: "a", Qty: 2}, {SKU: "b", Qty: 3}}}
		if _, err := e.r.DeductMany(e.ctx, cart); err != nil {
			t.Fatal(err)
		}
		e.relay()
		e.rollback("stock:{g}:{a}*", snapA)
		e.rollback("stock:{g}:{b}*", snapB)
		res := e.pass(nil)
		outsideNoNeedsHuman(t, res)
		e.want("a", 10, 2, 0)
		e.want("b", 10, 3, 0)
		rc, err := e.r.DeductMany(e.ctx, cart)
		if err != nil || !rc.Replayed {
			t.Errorf("repeat of cart after repair: %+v %v, want a replay", rc, err)
		}
		e.want("a", 10, 2, 0)
		e.want("b", 10, 3, 0)
	}, stock.WithGroups(outsideGroup))
}

func TestContractCartRepairAfterOneLineLostKeepsBooks(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 10)
		e.load("b", 10)
		snapB := e.snapshot(outsideItemKeys("b"))
		cart := stock.Cart{ID: "c1", User: "u", Lines: []stock.Line{{SKU: "a", Qty: 2}, {SKU: "b", Qty: 3}}}
		if _, err := e.r.DeductMany(e.ctx, cart); err != nil {
			t.Fatal(err)
		}
		e.relay()
		e.rollback(outsideItemKeys("b"), snapB)
		res := e.pass(nil)
		outsideNoNeedsHuman(t, res)
		e.want("a", 10, 2, 0)
		e.want("b", 10, 3, 0)
		rc, err := e.r.DeductMany(e.ctx, cart)
		if err != nil || !rc.Replayed {
			t.Errorf("repeat of cart after repair: %+v %v, want a replay", rc, err)
		}
		e.want("b", 10, 3, 0)
		e.mustRestore("b", "c1")
		e.relay()
		e.want("b", 10, 0, 0)
	})
}

func TestContractHoldCartRepairAfterLostConfirmKeepsBooks(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 10)
		e.load("b", 10)
		cart := stock.Cart{ID: "c1", User: "u", Lines: []stock.Line{{SKU: "a", Qty: 2}, {SKU: "b", Qty: 3}}}
		if _, err := e.r.HoldMany(e.ctx, cart, time.Hour); err != nil {
			t.Fatal(err)
		}
		e.relay()
		snapB := e.snapshot(outsideItemKeys("b"))
		if _, err := e.r.ConfirmMany(e.ctx, "c1", "a", "b"); err != nil {
			t.Fatal(err)
		}
		e.relay()
		e.rollback(outsideItemKeys("b"), snapB)
		res := e.pass(nil)
		outsideNoNeedsHuman(t, res)
		e.want("a", 10, 2, 0)
		e.want("b", 10, 3, 0)
		if _, err := e.r.ConfirmMany(e.ctx, "c1", "a", "b"); err != nil {
			t.Errorf("repeat ConfirmMany after repair: %v", err)
		}
		e.want("b", 10, 3, 0)
	})
}

// ---------------------------------------------------------------------------------------
// 2. Retention counts from when an entry settled.

var outsideRet = &stock.ReconcileOptions{Retention: 24 * time.Hour}

func (e *outsideEnv) trimmed(sku, id string) bool {
	e.t.Helper()
	_, err := e.r.Ledger(e.ctx, sku, id)
	if errors.Is(err, stock.ErrUnknownID) {
		return true
	}
	if err != nil {
		e.t.Fatalf("Ledger %s %s: %v", sku, id, err)
	}
	return false
}

func TestContractRetentionKeepsLongHoldCancelledLate(t *testing.T) {
	e := outsideMini(t)
	e.load("a", 10)
	req := stock.Request{SKU: "a", ID: "h1", User: "u", Qty: 1}
	if _, err := e.r.Hold(e.ctx, req, 48*time.Hour); err != nil {
		t.Fatal(err)
	}
	e.advance(30 * time.Hour)
	e.mustCancel("a", "h1")
	e.relay()
	e.advance(41 * time.Hour) // 71 h: 23 h past the deadline
	e.pass(outsideRet)
	if e.trimmed("a", "h1") {
		t.Fatalf("a cancelled 48h hold trimmed 23h after its deadline")
	}
	if _, err := e.r.Hold(e.ctx, req, time.Hour); !errors.Is(err, stock.ErrRestored) {
		t.Errorf("repeat of the cancelled hold: %v, want ErrRestored", err)
	}
	e.advance(2 * time.Hour) // 73 h
	e.pass(outsideRet)
	if !e.trimmed("a", "h1") {
		t.Errorf("a cancelled hold kept 25h after its deadline")
	}
	e.want("a", 10, 0, 0)
}

func TestContractRetentionKeepsExpiredLongHold(t *testing.T) {
	e := outsideMini(t)
	e.load("a", 10)
	req := stock.Request{SKU: "a", ID: "h1", User: "u", Qty: 1}
	if _, err := e.r.Hold(e.ctx, req, 48*time.Hour); err != nil {
		t.Fatal(err)
	}
	e.advance(49 * time.Hour)
	if _, err := stockops.Sweep(e.ctx, e.r); err != nil {
		t.Fatal(err)
	}
	e.relay()
	e.advance(22 * time.Hour) // 71 h
	e.pass(outsideRet)
	if e.trimmed("a", "h1") {
		t.Fatalf("an expired 48h hold trimmed 23h after its deadline")
	}
	if _, err := e.r.Hold(e.ctx, req, time.Hour); !errors.Is(err, stock.ErrExpired) {
		t.Errorf("repeat of the expired hold: %v, want ErrExpired", err)
	}
	if _, err := e.r.Confirm(e.ctx, "a", "h1"); !errors.Is(err, stock.ErrExpired) {
		t.Errorf("confirm of the expired hold: %v, want ErrExpired", err)
	}
	e.advance(2 * time.Hour)
	e.pass(outsideRet)
	if !e.trimmed("a", "h1") {
		t.Errorf("an expired hold kept 25h after its deadline")
	}
	e.want("a", 10, 0, 0)
}

func TestContractRetentionKeepsLateRestore(t *testing.T) {
	e := outsideMini(t)
	e.load("a", 10)
	e.deduct("a", "d1", 2)
	e.relay()
	e.advance(23 * time.Hour)
	e.mustRestore("a", "d1")
	e.relay()
	e.advance(20 * time.Hour) // 43 h; 20 h after the restore
	e.pass(outsideRet)
	if e.trimmed("a", "d1") {
		t.Fatalf("a sale restored 20h ago was trimmed")
	}
	if _, err := e.r.Deduct(e.ctx, stock.Request{SKU: "a", ID: "d1", User: "u-d1", Qty: 2}); !errors.Is(err, stock.ErrRestored) {
		t.Errorf("repeat of a restored deduct: %v, want ErrRestored", err)
	}
	rc, err := e.r.Restore(e.ctx, "a", "d1")
	if err != nil || !rc.Replayed {
		t.Errorf("repeat restore: %+v %v, want a replay", rc, err)
	}
	e.advance(5 * time.Hour)
	e.pass(outsideRet)
	if !e.trimmed("a", "d1") {
		t.Errorf("a sale restored 25h ago is still kept")
	}
	e.want("a", 10, 0, 0)
}

func TestContractRetentionKeepsConfirmedHoldRestoredLate(t *testing.T) {
	e := outsideMini(t)
	e.load("a", 10)
	req := stock.Request{SKU: "a", ID: "h1", User: "u", Qty: 3}
	if _, err := e.r.Hold(e.ctx, req, time.Hour); err != nil {
		t.Fatal(err)
	}
	e.mustConfirm("a", "h1")
	e.relay()
	e.advance(30 * time.Hour)
	e.mustRestore("a", "h1")
	e.relay()
	e.advance(20 * time.Hour)
	e.pass(outsideRet)
	if e.trimmed("a", "h1") {
		t.Fatalf("a confirmed hold restored 20h ago was trimmed")
	}
	if _, err := e.r.Hold(e.ctx, req, time.Hour); !errors.Is(err, stock.ErrRestored) {
		t.Errorf("repeat of the hold: %v, want ErrRestored", err)
	}
	if _, err := e.r.Confirm(e.ctx, "a", "h1"); !errors.Is(err, stock.ErrRestored) {
		t.Errorf("confirm of the restored hold: %v, want ErrRestored", err)
	}
	rc, err := e.r.Restore(e.ctx, "a", "h1")
	if err != nil || !rc.Replayed {
		t.Errorf("repeat restore: %+v %v, want a replay", rc, err)
	}
	e.advance(5 * time.Hour)
	e.pass(outsideRet)
	if !e.trimmed("a", "h1") {
		t.Errorf("kept 25h after its return")
	}
	e.want("a", 10, 0, 0)
}

func TestContractRetentionKeepsStoreRefusalGivenBackLate(t *testing.T) {
	e := outsideMini(t)
	if err := e.r.Load(e.ctx, "a", 10); err != nil {
		t.Fatal(err)
	}
	if err := e.store.Load(e.ctx, "a", 1); err != nil {
		t.Fatal(err)
	}
	e.deduct("a", "d1", 2)
	e.advance(23 * time.Hour)
	st := e.relay() // the store refuses: given back at 23 h
	if st.Refused != 1 {
		t.Fatalf("relay stats %+v, want one refusal", st)
	}
	e.relay()
	e.advance(20 * time.Hour)
	e.pass(&stock.ReconcileOptions{Retention: 24 * time.Hour, RepairLimit: 1000})
	if e.trimmed("a", "d1") {
		t.Fatalf("a sale refused 20h ago was trimmed")
	}
	if _, err := e.r.Deduct(e.ctx, stock.Request{SKU: "a", ID: "d1", User: "u-d1", Qty: 2}); !errors.Is(err, stock.ErrRestored) {
		t.Errorf("repeat of a refused deduct: %v, want ErrRestored", err)
	}
}

func TestContractRetentionKeepsTombstoneAndRetryRefusal(t *testing.T) {
	e := outsideMini(t)
	e.load("a", 1)
	e.deduct("a", "d0", 1)
	if _, err := e.r.Restore(e.ctx, "a", "t1"); !errors.Is(err, stock.ErrUnknownID) {
		t.Fatalf("restore of unknown: %v", err)
	}
	if _, err := e.r.Deduct(e.ctx, stock.Request{SKU: "a", ID: "x1", User: "u", Qty: 1, Retry: true}); !errors.Is(err, stock.ErrSoldOut) {
		t.Fatalf("retry on sold out: %v", err)
	}
	e.relay()
	e.advance(23 * time.Hour)
	e.pass(outsideRet)
	if _, err := e.r.Deduct(e.ctx, stock.Request{SKU: "a", ID: "t1", User: "u", Qty: 1}); !errors.Is(err, stock.ErrRestored) {
		t.Errorf("deduct of tombstoned id within retention: %v, want ErrRestored", err)
	}
	e.mustRestore("a", "d0")
	if _, err := e.r.Deduct(e.ctx, stock.Request{SKU: "a", ID: "x1", User: "u", Qty: 1}); !errors.Is(err, stock.ErrSoldOut) {
		t.Errorf("repeat of a refused retry within retention: %v, want ErrSoldOut", err)
	}
	e.relay()
	e.advance(2 * time.Hour)
	e.pass(outsideRet)
	if !e.trimmed("a", "t1") || !e.trimmed("a", "x1") {
		t.Errorf("tombstone or refusal kept past the retention")
	}
	e.want("a", 1, 0, 0)
}

func TestContractRetentionKeepsExtendedHoldCancelled(t *testing.T) {
	e := outsideMini(t)
	e.load("a", 10)
	req := stock.Request{SKU: "a", ID: "h1", User: "u", Qty: 1}
	if _, err := e.r.Hold(e.ctx, req, time.Hour); err != nil {
		t.Fatal(err)
	}
	e.advance(30 * time.Minute)
	if _, err := e.r.Extend(e.ctx, "a", "h1", 72*time.Hour); err != nil {
		t.Fatal(err)
	}
	e.advance(50 * time.Hour)
	e.mustCancel("a", "h1")
	e.relay()
	e.advance(40 * time.Hour) // 90.5 h: 18 h past the extended deadline
	e.pass(outsideRet)
	if e.trimmed("a", "h1") {
		t.Fatalf("an extended hold trimmed 18h after its deadline")
	}
	if _, err := e.r.Hold(e.ctx, req, time.Hour); !errors.Is(err, stock.ErrRestored) {
		t.Errorf("repeat of the cancelled hold: %v, want ErrRestored", err)
	}
	e.want("a", 10, 0, 0)
}

func TestContractRetentionKeepsLongHoldCartCancelled(t *testing.T) {
	e := outsideMini(t)
	e.load("a", 10)
	e.load("b", 10)
	cart := stock.Cart{ID: "c1", User: "u", Lines: []stock.Line{{SKU: "a", Qty: 1}, {SKU: "b", Qty: 2}}}
	if _, err := e.r.HoldMany(e.ctx, cart, 48*time.Hour); err != nil {
		t.Fatal(err)
	}
	e.advance(30 * time.Hour)
	if _, err := e.r.CancelMany(e.ctx, "c1", "a", "b"); err != nil {
		t.Fatal(err)
	}
	e.relay()
	e.advance(41 * time.Hour)
	e.pass(outsideRet)
	if _, err := stockops.RecoverCarts(e.ctx, e.r, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	_, err := e.r.HoldMany(e.ctx, cart, time.Hour)
	var ce *stock.CartError
	if !errors.As(err, &ce) || !errors.Is(err, stock.ErrRestored) {
		t.Errorf("repeat of a cancelled hold cart within retention: %v, want a *CartError wrapping ErrRestored", err)
	}
	e.want("a", 10, 0, 0)
	e.want("b", 10, 0, 0)
}

// ---------------------------------------------------------------------------------------
// 3. Memory policy.

func outsideKeys(t *testing.T, c rueidis.Client) []string {
	t.Helper()
	ks, err := c.Do(context.Background(), c.B().Keys().Pattern("*").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

func outsideConfigSet(t *testing.T, c rueidis.Client, policy string) {
	t.Helper()
	if err := c.Do(context.Background(), c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory-policy", policy).Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

// every write of the Reserver, with the results wanted.
func outsideAllWrites(ctx context.Context, r *stock.Reserver) map[string]error {
	out := map[string]error{}
	out["Load"] = r.Load(ctx, "a", 10)
	_, out["Deduct"] = r.Deduct(ctx, stock.Request{SKU: "a", ID: "d1", User: "u", Qty: 1})
	_, out["Hold"] = r.Hold(ctx, stock.Request{SKU: "a", ID: "h1", User: "u", Qty: 1}, time.Minute)
	_, out["DeductMany"] = r.DeductMany(ctx, stock.Cart{ID: "c1", User: "u", Lines: []stock.Line{{SKU: "a", Qty: 1}, {SKU: "b", Qty: 1}}})
	_, out["HoldMany"] = r.HoldMany(ctx, stock.Cart{ID: "c2", User: "u", Lines: []stock.Line{{SKU: "a", Qty: 1}, {SKU: "b", Qty: 1}}}, time.Minute)
	_, out["Restore"] = r.Restore(ctx, "a", "unknown")
	_, out["Cancel"] = r.Cancel(ctx, "a", "unknown2")
	_, out["Confirm"] = r.Confirm(ctx, "a", "h1")
	_, out["Extend"] = r.Extend(ctx, "a", "h1", time.Minute)
	_, out["Restock"] = r.Restock(ctx, "a", "r1", 1)
	out["CloseItem"] = r.CloseItem(ctx, "a")
	out["ReopenItem"] = r.ReopenItem(ctx, "a")
	out["Delist"] = r.Delist(ctx, "a")
	_, out["ConfirmMany"] = r.ConfirmMany(ctx, "c2", "a", "b")
	_, out["CancelMany"] = r.CancelMany(ctx, "c2", "a", "b")
	_, out["Refuse"] = stockops.Refuse(ctx, r, "a", "d1")
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	out["Run"] = r.Run(rctx, stock.RunOptions{Store: memstore.New()})
	out["RunNoStore"] = r.Run(rctx, stock.RunOptions{})
	return out
}

func outsideEvictingServers(t *testing.T) map[string]rueidis.Client {
	out := map[string]rueidis.Client{}
	m := miniredis.RunT(t)
	if err := redistest.MiniredisConfig(m, map[string]string{"maxmemory-policy": "volatile-lru"}); err != nil {
		t.Fatal(err)
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{m.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	out["miniredis-volatile-lru"] = c
	if redistest.ServerBinary(t) != "" {
		for _, p := range []string{"allkeys-lru", "volatile-ttl", "allkeys-random", "volatile-lfu"} {
			s := redistest.StartServer(t, "--maxmemory-policy", p)
			out["standalone-"+p] = s.Client(t)
		}
	}
	return out
}

func TestContractEvictionPolicyRefusesEveryWriteAndRun(t *testing.T) {
	for name, c := range outsideEvictingServers(t) {
		t.Run(name, func(t *testing.T) {
			r, err := stock.New(c)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close(context.Background())
			start := time.Now()
			for op, err := range outsideAllWrites(context.Background(), r) {
				if !errors.Is(err, stock.ErrEvictionPolicy) {
					t.Errorf("%s on an evicting policy: %v, want ErrEvictionPolicy", op, err)
				} else if stock.Outcome(err) != "eviction_policy" {
					t.Errorf("%s: Outcome %q", op, stock.Outcome(err))
				}
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("refusals took %v (Run should return at once)", d)
			}
			if ks := outsideKeys(t, c); len(ks) != 0 {
				t.Errorf("keys written on an evicting policy: %v", ks)
			}
		})
	}
}

func TestContractEvictionPolicyErrorNamesNodePolicyAndFix(t *testing.T) {
	m := miniredis.RunT(t)
	if err := redistest.MiniredisConfig(m, map[string]string{"maxmemory-policy": "allkeys-lfu"}); err != nil {
		t.Fatal(err)
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{m.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, _ := stock.New(c)
	defer r.Close(context.Background())
	err = r.Load(context.Background(), "a", 1)
	msg := fmt.Sprint(err)
	if !strings.Contains(msg, "allkeys-lfu") || !strings.Contains(msg, m.Addr()) || !strings.Contains(msg, "noeviction") {
		t.Errorf("error %q does not name the node %s, its policy and the fix", msg, m.Addr())
	}
}

func TestContractEvictionAllowedWrites(t *testing.T) {
	for name, c := range outsideEvictingServers(t) {
		t.Run(name, func(t *testing.T) {
			r, err := stock.New(c, stock.WithEvictionAllowed())
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close(context.Background())
			if err := r.Load(context.Background(), "a", 3); err != nil {
				t.Fatal(err)
			}
			if _, err := r.Deduct(context.Background(), stock.Request{SKU: "a", ID: "d", Qty: 1}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestContractEvictionPolicyFixedAtRuntimeWritesAgain(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skip("needs STOCK_REDIS_SERVER")
	}
	s := redistest.StartServer(t, "--maxmemory-policy", "allkeys-lru")
	c := s.Client(t)
	r, _ := stock.New(c)
	defer r.Close(context.Background())
	if err := r.Load(context.Background(), "a", 3); !errors.Is(err, stock.ErrEvictionPolicy) {
		t.Fatalf("Load: %v", err)
	}
	outsideConfigSet(t, c, "noeviction")
	deadline := time.Now().Add(3 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		if err = r.Load(context.Background(), "a", 3); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("Load after the policy was fixed: %v", err)
	}
}

func TestContractEvictionPolicyTurnedEvictingReportedAndRefused(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skip("needs STOCK_REDIS_SERVER")
	}
	s := redistest.StartServer(t)
	c := s.Client(t)
	r, _ := stock.New(c)
	defer r.Close(context.Background())
	ctx := context.Background()
	store := memstore.New()
	if err := r.Load(ctx, "a", 3); err != nil {
		t.Fatal(err)
	}
	_ = store.Load(ctx, "a", 3)
	outsideConfigSet(t, c, "volatile-lru")
	rec, err := stockops.NewReconciler(r, store, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, _ := rec.Pass(ctx)
	if res.NeedsHuman == "" {
		t.Errorf("a pass after the policy turned evicting reports nothing: %+v", res)
	}
	if _, err := r.Deduct(ctx, stock.Request{SKU: "a", ID: "d", Qty: 1}); !errors.Is(err, stock.ErrEvictionPolicy) {
		t.Errorf("deduct after a pass saw an evicting policy: %v, want ErrEvictionPolicy", err)
	}
	lv, _ := r.Levels(ctx, "a")
	if lv.Available != 3 {
		t.Errorf("levels %+v", lv)
	}
}

func TestContractEvictedKeysReportedByPass(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skip("needs STOCK_REDIS_SERVER")
	}
	s := redistest.StartServer(t)
	c := s.Client(t)
	ctx := context.Background()
	r, _ := stock.New(c, stock.WithEvictionAllowed())
	defer r.Close(ctx)
	store := memstore.New()
	if err := r.Load(ctx, "a", 3); err != nil {
		t.Fatal(err)
	}
	_ = store.Load(ctx, "a", 3)
	rec, _ := stockops.NewReconciler(r, store, nil)
	if res, _ := rec.Pass(ctx); res.NeedsHuman != "" {
		t.Fatalf("first pass needs a human: %s", res.NeedsHuman)
	}
	// Fill a small maxmemory with volatile keys of our own until Redis evicts some.
	outsideConfigSet(t, c, "volatile-random")
	used, _ := c.Do(ctx, c.B().Info().Section("memory").Build()).ToString()
	var usedBytes int64
	for _, l := range strings.Split(used, "\r\n") {
		if strings.HasPrefix(l, "used_memory:") {
			fmt.Sscan(strings.TrimPrefix(l, "used_memory:"), &usedBytes)
		}
	}
	if err := c.Do(ctx, c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", fmt.Sprint(usedBytes+200000)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", 10000)
	for i := 0; i < 100; i++ {
		_ = c.Do(ctx, c.B().Set().Key(fmt.Sprintf("filler:%d", i)).Value(big).ExSeconds(3600).Build()).Error()
	}
	_ = c.Do(ctx, c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", "0").Build()).Error()
	info, _ := c.Do(ctx, c.B().Info().Section("stats").Build()).ToString()
	if !strings.Contains(info, "evicted_keys:") || strings.Contains(info, "evicted_keys:0\r\n") {
		t.Fatalf("nothing evicted: %s", info)
	}
	res, _ := rec.Pass(ctx)
	if !strings.Contains(strings.ToLower(res.NeedsHuman), "evict") {
		t.Errorf("a pass after evictions: NeedsHuman %q", res.NeedsHuman)
	}
}

// One master of a cluster with an evicting policy refuses the Reserver's writes everywhere.
func TestContractEvictionPolicyOnOneClusterMasterRefused(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skip("needs STOCK_REDIS_SERVER")
	}
	cl := redistest.StartCluster(t, 3)
	last := cl.Servers()[2].Client(t)
	outsideConfigSet(t, last, "allkeys-lru")
	c := cl.Client(t)
	r, _ := stock.New(c)
	defer r.Close(context.Background())
	for op, err := range outsideAllWrites(context.Background(), r) {
		if !errors.Is(err, stock.ErrEvictionPolicy) {
			t.Errorf("%s with one master evicting: %v, want ErrEvictionPolicy", op, err)
		}
	}
	for i, s := range cl.Servers() {
		if ks := outsideKeys(t, s.Client(t)); len(ks) != 0 {
			t.Errorf("master %d has keys: %v", i, ks)
		}
	}
}

// ---------------------------------------------------------------------------------------
// 4. Split items near MaxQty, Run, Close, names, WithUserRequired, ErrConflict.

func TestContractBucketsRestockPastMaxQtyRefusedNothingWritten(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", stock.MaxQty-5)
		if lv := e.levels("a"); lv.Loaded != stock.MaxQty-5 {
			t.Fatalf("loaded %+v", lv)
		}
		before := e.snapshot("stock:{a|*")
		_, err := e.r.Restock(e.ctx, "a", "r1", 6)
		if !errors.Is(err, stock.ErrInvalid) {
			t.Fatalf("restock past MaxQty: %v, want ErrInvalid", err)
		}
		after := e.snapshot("stock:{a|*")
		for k, v := range after {
			if strings.HasSuffix(k, ":i") { // the id's claim is documented to stay
				continue
			}
			if fmt.Sprint(before[k]) != fmt.Sprint(v) {
				t.Errorf("key %s changed by a refused restock: %v -> %v", k, before[k], v)
			}
		}
		if st := e.relay(); st.Claimed != 0 {
			t.Errorf("a refused restock queued events: %+v", st)
		}
		rc, err := e.r.Restock(e.ctx, "a", "r2", 5)
		if err != nil {
			t.Fatalf("restock up to MaxQty: %+v %v", rc, err)
		}
		e.relay()
		e.want("a", stock.MaxQty, 0, 0)
		if _, err := e.r.Restock(e.ctx, "a", "r3", 1); !errors.Is(err, stock.ErrInvalid) {
			t.Errorf("restock of a full item: %v, want ErrInvalid", err)
		}
		rc, err = e.r.Restock(e.ctx, "a", "r2", 5)
		if err != nil || !rc.Replayed {
			t.Errorf("repeat of a made restock once full: %+v %v, want a replay", rc, err)
		}
		e.deduct("a", "d1", 3)
		e.mustRestore("a", "d1")
		e.relay()
		e.want("a", stock.MaxQty, 0, 0)
	}, stock.WithBuckets(func(string) int { return 4 }))
}

func TestContractBucketsRestockWithBucketMissingIsNotLoaded(t *testing.T) {
	e := outsideMini(t, stock.WithBuckets(outsideTwoBuckets))
	e.load("a", 10)
	snap := e.snapshot("stock:{a|1|*")
	var hash string
	for k, v := range snap {
		if v.typ == "hash" && strings.Count(k, ":") == 1 {
			hash = k
		}
	}
	if hash == "" {
		t.Fatalf("no bucket hash among %v", snap)
	}
	if err := e.c.Do(e.ctx, e.c.B().Del().Key(hash).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		_, err := e.r.Restock(e.ctx, "a", fmt.Sprintf("r%d", i), 1)
		if !errors.Is(err, stock.ErrNotLoaded) {
			t.Errorf("restock r%d with bucket 1 missing: %v, want ErrNotLoaded", i, err)
		}
	}
}

func TestContractBucketsLoadMaxQtyAndPastIt(t *testing.T) {
	e := outsideMini(t, stock.WithBuckets(func(string) int { return 64 }))
	if err := e.r.Load(e.ctx, "a", stock.MaxQty); err != nil {
		t.Fatal(err)
	}
	if lv := e.levels("a"); lv.Loaded != stock.MaxQty || lv.Available != stock.MaxQty {
		t.Errorf("levels of an item loaded with MaxQty: %+v", lv)
	}
	if err := e.r.Load(e.ctx, "b", stock.MaxQty+1); !errors.Is(err, stock.ErrInvalid) {
		t.Errorf("Load past MaxQty: %v", err)
	}
	// Take nearly all of it from one bucket's buyer: transfers must keep the sum exact.
	rc, err := e.r.Deduct(e.ctx, stock.Request{SKU: "a", ID: "big", User: "u", Qty: stock.MaxQty - 1})
	if err != nil {
		t.Fatalf("deduct of MaxQty-1 over 64 buckets: %+v %v", rc, err)
	}
	lv := e.levels("a")
	if lv.Sold != stock.MaxQty-1 || lv.Available != 1 {
		t.Errorf("levels %+v", lv)
	}
}

func TestContractRunTwiceConcurrentlyOneRuns(t *testing.T) {
	e := outsideMini(t)
	e.load("a", 10)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const n = 6
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- e.r.Run(ctx, stock.RunOptions{Store: e.store, Drain: -1})
		}()
	}
	time.Sleep(300 * time.Millisecond)
	running := 0
	for len(errs) > 0 {
		if err := <-errs; !errors.Is(err, stock.ErrRunning) {
			t.Errorf("a concurrent Run returned %v, want ErrRunning", err)
		}
	}
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		if errors.Is(err, context.Canceled) {
			running++
		} else {
			t.Errorf("the running Run returned %v", err)
		}
	}
	if running != 1 {
		t.Errorf("%d Runs ran, want 1", running)
	}
	// Run again once it returned.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	if err := e.r.Run(ctx2, stock.RunOptions{Store: e.store, Drain: -1}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Run after the first returned: %v", err)
	}
}

func TestContractRunAfterCloseReturnsAtOnce(t *testing.T) {
	e := outsideMini(t)
	if err := e.r.Close(e.ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := e.r.Run(context.Background(), stock.RunOptions{Store: e.store})
	if !errors.Is(err, stock.ErrReserverClosed) || time.Since(start) > time.Second {
		t.Errorf("Run after Close: %v after %v", err, time.Since(start))
	}
	if err := e.r.Load(e.ctx, "a", 1); !errors.Is(err, stock.ErrReserverClosed) {
		t.Errorf("Load after Close: %v", err)
	}
	if _, err := stockops.NewReconciler(e.r, e.store, nil); err == nil {
		rec, _ := stockops.NewReconciler(e.r, e.store, nil)
		if _, err := rec.Pass(e.ctx); !errors.Is(err, stock.ErrReserverClosed) {
			t.Errorf("reconcile pass after Close: %v", err)
		}
	}
	if ks := outsideKeys(t, e.c); len(ks) != 0 {
		t.Errorf("keys after Close: %v", ks)
	}
}

// Close stops Run (which returns ErrReserverClosed), drains what is due to the store, and once
// it returned nothing more is written, even with calls in flight when it began.
func TestContractCloseWithCallsInFlightThenNothingWritten(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		if b.Name == "cluster" || b.Name == "sentinel" {
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			c := b.Client(t)
			r, err := stock.New(c)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			store := memstore.New()
			if err := r.Load(ctx, "a", 100000); err != nil {
				t.Fatal(err)
			}
			_ = store.Load(ctx, "a", 100000)
			runErr := make(chan error, 1)
			go func() {
				runErr <- r.Run(ctx, stock.RunOptions{Store: store, GuardInterval: -1, Reconcile: &stock.ReconcileOptions{Interval: -1}})
			}()
			var wg sync.WaitGroup
			stop := make(chan struct{})
			var mu sync.Mutex
			took := map[string]bool{}
			for w := 0; w < 8; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						id := fmt.Sprintf("w%d-%d", w, i)
						_, err := r.Deduct(ctx, stock.Request{SKU: "a", ID: id, User: id, Qty: 1})
						if errors.Is(err, stock.ErrReserverClosed) {
							return
						}
						if err != nil {
							t.Errorf("deduct %s: %v", id, err)
							return
						}
						mu.Lock()
						took[id] = true
						mu.Unlock()
					}
				}(w)
			}
			time.Sleep(200 * time.Millisecond)
			if err := r.Close(ctx); err != nil {
				t.Fatalf("Close: %v", err)
			}
			close(stop)
			wg.Wait()
			if err := <-runErr; !errors.Is(err, stock.ErrReserverClosed) {
				t.Errorf("Run stopped by Close returned %v", err)
			}
			dump := func() string {
				ks := outsideKeys(t, c)
				var sb strings.Builder
				for _, k := range ks {
					typ, _ := c.Do(ctx, c.B().Type().Key(k).Build()).ToString()
					switch typ {
					case "hash":
						m, _ := c.Do(ctx, c.B().Hgetall().Key(k).Build()).AsStrMap()
						fmt.Fprintf(&sb, "%s=%v;", k, len(m))
					case "zset":
						n, _ := c.Do(ctx, c.B().Zcard().Key(k).Build()).AsInt64()
						fmt.Fprintf(&sb, "%s=%d;", k, n)
					default:
						fmt.Fprintf(&sb, "%s;", k)
					}
				}
				return sb.String()
			}
			first := dump()
			time.Sleep(500 * time.Millisecond)
			if second := dump(); first != second {
				t.Errorf("Redis changed after Close returned:\n%s\n%s", first, second)
			}
			if _, err := r.Levels(ctx, "a"); !errors.Is(err, stock.ErrReserverClosed) {
				t.Errorf("Levels after Close: %v", err)
			}
			reader, _ := stock.New(c)
			defer reader.Close(ctx)
			lv, err := reader.Levels(ctx, "a")
			if err != nil {
				t.Fatal(err)
			}
			if lv.Sold != int64(len(took)) {
				t.Errorf("sold %d, acknowledged %d", lv.Sold, len(took))
			}
			rem, _ := store.Remaining(ctx, "a")
			if rem != lv.Available {
				t.Errorf("store remaining %d, Redis available %d (drain left %d undelivered)", rem, lv.Available, rem-lv.Available)
			}
		})
	}
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

func TestContractNamesWithFormatCharactersRefused(t *testing.T) {
	e := outsideMini(t, stock.WithUserLimit(5))
	e.load("ok", 100)
	cfs := outsideCfRunes()
	if len(cfs) < 100 {
		t.Fatalf("only %d Cf runes", len(cfs))
	}
	for _, cf := range cfs {
		bad := "x" + string(cf) + "y"
		code := fmt.Sprintf("U+%04X", cf)
		check := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, stock.ErrInvalid) {
				t.Errorf("%s with %s: %v, want ErrInvalid", what, code, err)
				return
			}
			if !strings.Contains(err.Error(), code) || !strings.Contains(err.Error(), "1") {
				t.Errorf("%s with %s: message %q names no code point or offset", what, code, err)
			}
		}
		check("Load sku", e.r.Load(e.ctx, bad, 1))
		_, err := e.r.Deduct(e.ctx, stock.Request{SKU: "ok", ID: bad, User: "u", Qty: 1})
		check("Deduct id", err)
		_, err = e.r.Deduct(e.ctx, stock.Request{SKU: "ok", ID: "i", User: bad, Qty: 1})
		check("Deduct user", err)
		_, err = e.r.Restore(e.ctx, "ok", bad)
		check("Restore id", err)
		_, err = e.r.Restock(e.ctx, "ok", bad, 1)
		check("Restock id", err)
		_, err = e.r.DeductMany(e.ctx, stock.Cart{ID: bad, User: "u", Lines: []stock.Line{{SKU: "ok", Qty: 1}}})
		check("DeductMany id", err)
		_, err = e.r.HoldMany(e.ctx, stock.Cart{ID: "c", User: bad, Lines: []stock.Line{{SKU: "ok", Qty: 1}}}, time.Minute)
		check("HoldMany user", err)
		_, err = e.r.Ledger(e.ctx, "ok", bad)
		check("Ledger id", err)
		_, err = stock.New(e.c, stock.WithPrefix(bad))
		check("WithPrefix", err)
		check("RunOptions.Reconcile.Items", stock.RunOptions{Store: e.store, Reconcile: &stock.ReconcileOptions{Items: []string{bad}}}.Validate())
		check("RunOptions.Relay.Items", stock.RunOptions{Store: e.store, Relay: &stock.RelayOptions{Items: []string{bad}}}.Validate())
	}
	if lv := e.levels("ok"); lv.Sold != 0 || lv.Loaded != 100 {
		t.Errorf("levels %+v", lv)
	}
	ks := outsideKeys(t, e.c)
	for _, k := range ks {
		for _, r := range k {
			if unicode.Is(unicode.Cf, r) {
				t.Errorf("key with a format character: %q", k)
			}
		}
	}
}

// The offset named is the byte offset of the character.
func TestContractNameFormatCharacterOffsetIsByteOffset(t *testing.T) {
	e := outsideMini(t)
	err := e.r.Load(e.ctx, "日本\u200Bx", 1) // 日本 is 6 bytes
	if !errors.Is(err, stock.ErrInvalid) || !strings.Contains(err.Error(), "6") || !strings.Contains(err.Error(), "U+200B") {
		t.Errorf("error %v: want U+200B at byte offset 6", err)
	}
}

func TestContractGroupNameWithFormatCharacterIsNoGroup(t *testing.T) {
	e := outsideMini(t, stock.WithGroups(func(sku string) string { return "g\u200Dh" }))
	e.load("a", 5)
	e.load("b", 5)
	for _, k := range outsideKeys(t, e.c) {
		if strings.Contains(k, "\u200D") {
			t.Errorf("a key holds the group's format character: %q", k)
		}
	}
	if _, err := e.r.Levels(e.ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.r.DeductMany(e.ctx, stock.Cart{ID: "c", User: "u", Lines: []stock.Line{{SKU: "a", Qty: 1}, {SKU: "b", Qty: 1}}}); err != nil {
		t.Fatal(err)
	}
	e.relay()
	e.want("a", 5, 1, 0)
}

// Look-alike names stay distinct: a name with letters that are not format characters works.
func TestContractNamesOfOtherScriptsAccepted(t *testing.T) {
	e := outsideMini(t)
	for _, n := range []string{"café", "cafe\u0301", "日本", "😀", "ㅤ", "a\uFE0F"} {
		if err := e.r.Load(e.ctx, n, 1); err != nil {
			t.Errorf("Load %q: %v", n, err)
		}
	}
}

func TestContractUserRequiredRefusesEveryTakeWithoutUser(t *testing.T) {
	for _, split := range []bool{false, true} {
		t.Run(fmt.Sprint("split=", split), func(t *testing.T) {
			opts := []stock.Option{stock.WithUserLimit(2), stock.WithUserRequired(), stock.WithGroups(outsideGroup)}
			if split {
				opts = []stock.Option{stock.WithUserLimit(2), stock.WithUserRequired(), stock.WithBuckets(func(sku string) int {
					if sku == "s" {
						return 4
					}
					return 1
				})}
			}
			e := outsideMini(t, opts...)
			e.load("a", 10)
			e.load("b", 10)
			e.load("s", 10)
			before := e.snapshot("stock:*")
			check := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, stock.ErrInvalid) || !strings.Contains(err.Error(), "User") {
					t.Errorf("%s without a user: %v, want ErrInvalid naming User", what, err)
				}
			}
			for _, sku := range []string{"a", "s"} {
				_, err := e.r.Deduct(e.ctx, stock.Request{SKU: sku, ID: "d1", Qty: 1})
				check("Deduct "+sku, err)
				_, err = e.r.Deduct(e.ctx, stock.Request{SKU: sku, ID: "d2", Qty: 1, Retry: true})
				check("Deduct retry "+sku, err)
				_, err = e.r.Hold(e.ctx, stock.Request{SKU: sku, ID: "h1", Qty: 1}, time.Minute)
				check("Hold "+sku, err)
			}
			_, err := e.r.DeductMany(e.ctx, stock.Cart{ID: "c1", Lines: []stock.Line{{SKU: "a", Qty: 1}, {SKU: "b", Qty: 1}}})
			check("DeductMany", err)
			_, err = e.r.HoldMany(e.ctx, stock.Cart{ID: "c2", Lines: []stock.Line{{SKU: "a", Qty: 1}, {SKU: "s", Qty: 1}}}, time.Minute)
			check("HoldMany", err)
			after := e.snapshot("stock:*")
			if fmt.Sprint(before) != fmt.Sprint(after) {
				for k, v := range after {
					if fmt.Sprint(before[k]) != fmt.Sprint(v) {
						t.Errorf("refused request without a user wrote %s: %v -> %v", k, before[k], v)
					}
				}
			}
			// The ids were never used: with a user they take stock.
			for _, sku := range []string{"a", "s"} {
				for _, u := range []string{"alice", "bob", "carol"} {
					id := "d1-" + u
					if u == "alice" {
						id = "d1"
					}
					if _, err := e.r.Deduct(e.ctx, stock.Request{SKU: sku, ID: id, User: u, Qty: 1}); err != nil {
						t.Errorf("deduct %s %s by %s after the refusal: %v", sku, id, u, err)
					}
				}
			}
			// Restore, Confirm, Cancel, Extend and Restock need no user.
			if _, err := e.r.Restore(e.ctx, "a", "d1"); err != nil {
				t.Errorf("Restore: %v", err)
			}
			if _, err := e.r.Restock(e.ctx, "a", "r", 1); err != nil {
				t.Errorf("Restock: %v", err)
			}
		})
	}
}

func TestContractUserRequiredWithoutLimitChangesNothing(t *testing.T) {
	e := outsideMini(t, stock.WithUserRequired())
	e.load("a", 10)
	if _, err := e.r.Deduct(e.ctx, stock.Request{SKU: "a", ID: "d", Qty: 1}); err != nil {
		t.Errorf("Deduct without user and without a limit: %v", err)
	}
	if _, err := e.r.DeductMany(e.ctx, stock.Cart{ID: "c", Lines: []stock.Line{{SKU: "a", Qty: 1}}}); err != nil {
		t.Errorf("DeductMany without user and without a limit: %v", err)
	}
}

func TestContractConflictMessagesNameWhatDiffers(t *testing.T) {
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
			must := func(err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
			}
			_, err := e.r.Deduct(ctx, stock.Request{SKU: "a", ID: "d", User: "alice", Qty: 1})
			must(err)
			_, err = e.r.Hold(ctx, stock.Request{SKU: "a", ID: "h", User: "alice", Qty: 2}, time.Hour)
			must(err)
			_, err = e.r.Restock(ctx, "a", "r", 5)
			must(err)
			_, err = e.r.DeductMany(ctx, stock.Cart{ID: "c", User: "alice", Lines: []stock.Line{{SKU: "a", Qty: 1}, {SKU: "b", Qty: 2}}})
			must(err)

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
			_, err = e.r.Deduct(ctx, stock.Request{SKU: "a", ID: "d", User: "alice", Qty: 3})
			add("deduct other qty", err, []string{"with quantity 1, not 3"}, "another user", "hold")
			_, err = e.r.Deduct(ctx, stock.Request{SKU: "a", ID: "d", User: "bob", Qty: 1})
			add("deduct other user", err, []string{"another user"}, "units", "alice", "bob")
			_, err = e.r.Hold(ctx, stock.Request{SKU: "a", ID: "d", User: "alice", Qty: 1}, time.Hour)
			add("hold of a deduct", err, []string{"deduct", "not a hold"}, "units", "another user")
			_, err = e.r.Deduct(ctx, stock.Request{SKU: "a", ID: "h", User: "alice", Qty: 2})
			add("deduct of a hold", err, []string{"hold", "not a deduct"}, "units", "another user")
			_, err = e.r.Deduct(ctx, stock.Request{SKU: "a", ID: "h", User: "alice", Qty: 1})
			add("deduct of a hold, other qty", err, []string{"hold", "not a deduct", "with quantity 2, not 1"}, "another user")
			_, err = e.r.Deduct(ctx, stock.Request{SKU: "a", ID: "r", User: "alice", Qty: 5})
			add("deduct of a restock", err, []string{"restock"}, "another user")
			_, err = e.r.Restock(ctx, "a", "d", 1)
			add("restock of a deduct", err, []string{"deduct"}, "another user")
			_, err = e.r.Restock(ctx, "a", "r", 6)
			add("restock other qty", err, []string{"with quantity 5, not 6"})
			_, err = e.r.Confirm(ctx, "a", "d")
			add("confirm of a deduct", err, []string{"used for a deduct", "not a hold"}, "another user", "units")
			_, err = e.r.Cancel(ctx, "a", "d")
			add("cancel of a deduct", err, []string{"used for a deduct", "not a hold"}, "another user", "units")
			_, err = e.r.Restore(ctx, "a", "r")
			add("restore of a restock", err, []string{"restock"})
			_, err = e.r.DeductMany(ctx, stock.Cart{ID: "c", User: "bob", Lines: []stock.Line{{SKU: "a", Qty: 1}, {SKU: "b", Qty: 2}}})
			add("cart other user", err, []string{"another user"}, "alice", "bob")
			_, err = e.r.DeductMany(ctx, stock.Cart{ID: "c", User: "alice", Lines: []stock.Line{{SKU: "a", Qty: 1}, {SKU: "b", Qty: 3}}})
			add("cart other lines", err, []string{"line"}, "another user")
			_, err = e.r.HoldMany(ctx, stock.Cart{ID: "c", User: "alice", Lines: []stock.Line{{SKU: "a", Qty: 1}, {SKU: "b", Qty: 2}}}, time.Hour)
			add("cart other kind", err, []string{"hold"}, "another user")
			for _, c := range cases {
				if !errors.Is(c.err, stock.ErrConflict) {
					t.Errorf("%s: %v, want ErrConflict", c.name, c.err)
					continue
				}
				msg := c.err.Error()
				for _, w := range c.want {
					if !strings.Contains(msg, w) {
						t.Errorf("%s: message %q lacks %q", c.name, msg, w)
					}
				}
				for _, w := range c.notWant {
					if strings.Contains(msg, w) {
						t.Errorf("%s: message %q says %q", c.name, msg, w)
					}
				}
			}
			if lv := e.levels("a"); lv.Sold != 2 || lv.Held != 2 || lv.Loaded != 105 {
				t.Errorf("levels after conflicts %+v", lv)
			}
		})
	}
}

// An id sold again after its entry was trimmed: the Store took it once, Redis twice.
func TestContractRepairOfSaleCountedTwiceAfterTrim(t *testing.T) {
	e := outsideMini(t)
	e.load("a", 10)
	e.deduct("a", "d1", 2)
	e.relay()
	e.advance(25 * time.Hour)
	e.pass(outsideRet)
	if !e.trimmed("a", "d1") {
		t.Fatalf("not trimmed")
	}
	rc := e.deduct("a", "d1", 2)
	if rc.Replayed {
		t.Fatalf("a trimmed id replayed")
	}
	e.relay()
	res := e.pass(outsideRet)
	outsideNoNeedsHuman(t, res)
	e.want("a", 10, 2, 0)
	e.mustRestore("a", "d1")
	e.relay()
	e.pass(outsideRet)
	e.want("a", 10, 0, 0)
}

// The item hash alone lost (an eviction of one key) with a live hold and a restock.
func TestContractRebuildOfItemHashKeepsLoadedSoldHeld(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 10)
		e.mustRestock("a", "r1", 5)
		e.deduct("a", "d1", 4)
		if _, err := e.r.Hold(e.ctx, stock.Request{SKU: "a", ID: "h1", User: "u", Qty: 2}, time.Hour); err != nil {
			t.Fatal(err)
		}
		e.relay()
		if err := e.c.Do(e.ctx, e.c.B().Del().Key("stock:{a}").Build()).Error(); err != nil {
			t.Fatal(err)
		}
		res := e.pass(nil)
		outsideNoNeedsHuman(t, res)
		e.want("a", 15, 4, 2)
		e.mustConfirm("a", "h1")
		e.mustRestore("a", "d1")
		e.relay()
		e.pass(nil)
		e.want("a", 15, 2, 0)
	})
}

// The same on a plain item, for comparison.
func TestContractPlainRecoveredAfterFlushall(t *testing.T) {
	outsideEach(t, func(t *testing.T, e *outsideEnv) {
		e.load("a", 10)
		e.deduct("a", "d1", 4)
		e.relay()
		if err := e.c.Do(e.ctx, e.c.B().Flushall().Build()).Error(); err != nil {
			t.Fatal(err)
		}
		res := e.pass(nil)
		t.Logf("unregistered %v, store only %v, needs human %q", res.Unregistered, res.StoreOnly, res.NeedsHuman)
		e.want("a", 10, 4, 0)
	})
}
