package main

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"slices"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/redis/rueidis"

	"github.com/stockres/stock"
)

// The -layouts report: what a stored layout costs Redis, measured before a layout is chosen.
//
// Each candidate is the uncoalesced deduct of a new id by a new buyer under a per-user limit of
// 2 (the call most shops send most of the time), written as a Redis function with only the
// commands and checks that call needs on that layout: read the item's counters (and the buyer's
// units), refuse for stock or limit, write the ledger entry if the id is new, the counters, the
// outbox event and the buyer's units. The library's own Deduct (coalescing off) and the
// ledger-hash script (as a function too, so that every row pays the same FCALL) run beside them,
// in alternated rounds, so that the ratios of one run compare like with like.

// layoutLib is the candidates' function library. Every key is declared (KEYS): the caller picks
// a listpack sub-hash, never the script. No input is ever part of the source.
const layoutLib = `#!lua name=stockbench_layouts
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function fmt(n) return string.format('%d', n) end
-- KEYS[1] item hash, KEYS[2] ledger hash (or its sub-hash), KEYS[3] buyers' hash (or its
-- sub-hash; unused when the buyers' units are item fields), KEYS[4] outbox (zset or list).
-- ARGV limit, id, qty, user. Reply {code, available, qty}: 0 taken, 1 known id, 3 refused.
local function take(K, A, list, inItem)
  local limit, id, q, u = tonumber(A[1]), A[2], tonumber(A[3]), A[4]
  local now = now_ms()
  local st, have
  if inItem then
    st = redis.call('HMGET', K[1], 'a', 'c', 'n', 's', 'q', 'b', 'bc', 'u:' .. u)
    have = tonumber(st[8]) or 0
  else
    st = redis.call('HMGET', K[1], 'a', 'c', 'n', 's', 'q', 'b', 'bc')
    have = tonumber(redis.call('HGET', K[3], u)) or 0
  end
  local avail, sold, seq = tonumber(st[1]), tonumber(st[4]) or 0, tonumber(st[5]) or 0
  if not avail or avail < q or have + q > limit then
    return {3, avail or 0, q}
  end
  if redis.call('HSETNX', K[2], id, string.format('Dr|%d|%d|%d|%s', q, avail - q, now, u)) == 0 then
    return {1, avail, q}
  end
  if inItem then
    redis.call('HSET', K[1], 'a', fmt(avail - q), 's', fmt(sold + q), 'q', fmt(seq + 1), 'u:' .. u, fmt(have + q))
  else
    redis.call('HSET', K[1], 'a', fmt(avail - q), 's', fmt(sold + q), 'q', fmt(seq + 1))
  end
  if list then
    redis.call('RPUSH', K[4], fmt(seq + 1) .. '|D:' .. id)
  else
    redis.call('ZADD', K[4], seq + 1, 'D:' .. id)
  end
  if not inItem then
    redis.call('HSET', K[3], u, fmt(have + q))
  end
  return {0, avail - q, q}
end
-- lean: the library's common call since it dropped TIME and the buyer's read: the caller's clock
-- (ARGV[5]) for the entry, HINCRBY of the buyer's units before the entry, undone when the limit
-- is passed or the id is known; the outbox a zset (the library's) or a list.
local function lean(K, A, list)
  local limit, id, q, u, now = tonumber(A[1]), A[2], tonumber(A[3]), A[4], tonumber(A[5])
  local st = redis.call('HMGET', K[1], 'a', 'c', 'n', 's', 'q', 'b', 'bc')
  local avail, sold, seq = tonumber(st[1]), tonumber(st[4]) or 0, tonumber(st[5]) or 0
  if not avail or avail < q then
    return {3, avail or 0, q}
  end
  local v = redis.call('HINCRBY', K[3], u, q)
  if v > limit then
    if v == q then redis.call('HDEL', K[3], u) else redis.call('HINCRBY', K[3], u, -q) end
    return {3, avail, q}
  end
  if redis.call('HSETNX', K[2], id, string.format('Dr|%d|%d|%d|%s', q, avail - q, now, u)) == 0 then
    if v == q then redis.call('HDEL', K[3], u) else redis.call('HINCRBY', K[3], u, -q) end
    return {1, avail, q}
  end
  redis.call('HSET', K[1], 'a', fmt(avail - q), 's', fmt(sold + q), 'q', fmt(seq + 1))
  if list then
    redis.call('RPUSH', K[4], fmt(seq + 1) .. '|D:' .. id)
  else
    redis.call('ZADD', K[4], seq + 1, 'D:' .. id)
  end
  return {0, avail - q, q}
end
redis.register_function('stockbench_layout_lean_zset', function(K, A) return lean(K, A, false) end)
redis.register_function('stockbench_layout_lean_list', function(K, A) return lean(K, A, true) end)
redis.register_function('stockbench_layout_zset', function(K, A) return take(K, A, false, false) end)
redis.register_function('stockbench_layout_list', function(K, A) return take(K, A, true, false) end)
redis.register_function('stockbench_layout_initem', function(K, A) return take(K, A, true, true) end)
redis.register_function('stockbench_layout_listpack', function(K, A) return take(K, A, true, false) end)
redis.register_function('stockbench_layout_ledgerhash', function(KEYS, ARGV)
` + ledgerHashScript + `
end)
`

// layout is one candidate of the -layouts report.
type layout struct {
	name, desc string
	fn         string // the function; "" for the library's Deduct
	sub        bool   // the ledger and the buyers' units in listpack sub-hashes
	cmds       int    // Redis commands in the call, the call itself excluded
}

var layouts = []layout{
	{name: "library", desc: "Deduct (coalescing off), buyers + WithUserLimit(2)", cmds: 5},
	{name: "lean-zset", desc: "Deduct's commands only: no TIME, HINCRBY of the buyer, zset outbox", fn: "stockbench_layout_lean_zset", cmds: 5},
	{name: "lean-list", desc: "the same with a list outbox", fn: "stockbench_layout_lean_list", cmds: 5},
	{name: "zset", desc: "the earlier common call's commands: TIME, HGET and HSET of the buyer, zset outbox", fn: "stockbench_layout_zset", cmds: 7},
	{name: "list", desc: "hash ledger, hash of buyers, list outbox", fn: "stockbench_layout_list", cmds: 7},
	{name: "initem", desc: "hash ledger, buyers' units as item fields, list outbox", fn: "stockbench_layout_initem", cmds: 5},
	{name: "listpack", desc: "ledger and buyers in listpack sub-hashes, list outbox", fn: "stockbench_layout_listpack", sub: true, cmds: 7},
	{name: "ledger-hash", desc: "the ledger-hash script (HEXISTS, GET/SET, JSON entry), as a function", fn: "stockbench_layout_ledgerhash", cmds: 5},
}

// LayoutResult is one candidate's row of the -layouts report.
type LayoutResult struct {
	Name, Desc  string
	Calls       int64
	CallsPerSec float64
	UsPerCall   float64  // Redis time of the calls (INFO commandstats usec, the commands inside included)
	CPUPerCall  float64  // all of the server's CPU (INFO cpu) per call
	BytesPerOp  *float64 // MEMORY USAGE of the candidate's keys per entry; nil when unknown
	Commands    int      // commands in one call
	// VsLedgerHash is the median over the rounds of this row's UsPerCall over the ledger-hash
	// script's, and VsLibrary over the library's.
	VsLedgerHash, VsLibrary float64
	rounds                  []float64 // µs per call of each round
}

// layoutReport runs every candidate cfg.layouts times in total, in cfg.rounds alternated rounds
// of g goroutines (the first -g), prints the table and returns the rows.
func (b *bench) layoutReport(ctx context.Context, w io.Writer) ([]LayoutResult, error) {
	if b.mini != nil {
		return nil, errors.New("stockbench: -layouts needs a real Redis 7 or later (Redis functions)")
	}
	if len(b.cfg.cluster) > 0 {
		return nil, errors.New("stockbench: -layouts measures one standalone Redis (-redis): its function library and its counters are one node's")
	}
	c := b.client
	if err := c.Do(ctx, c.B().FunctionLoad().Replace().FunctionCode(layoutLib).Build()).Error(); err != nil {
		return nil, fmt.Errorf("stockbench: -layouts loads a function library (Redis 7 or later): %w", err)
	}
	defer c.Do(context.WithoutCancel(ctx), c.B().FunctionDelete().LibraryName("stockbench_layouts").Build())

	n := int64(b.cfg.layouts)
	subs := 1
	for int64(subs)*64 < n { // about 64 entries per sub-hash, under hash-max-listpack-entries (128)
		subs *= 2
	}
	g := b.cfg.g
	per := n / int64(b.cfg.rounds)
	res := make([]LayoutResult, len(layouts))
	for i, l := range layouts {
		res[i] = LayoutResult{Name: l.name, Desc: l.desc, Commands: l.cmds}
	}
	var r *stock.Reserver
	var err error
	if r, err = stock.New(c, stock.WithPrefix(b.prefix("layout-library")), stock.WithUserLimit(2), stock.WithCoalescing(0)); err != nil {
		return nil, err
	}
	if err := r.Load(ctx, "x", bigStock); err != nil {
		return nil, err
	}
	for i, l := range layouts {
		if l.fn == "" {
			continue
		}
		item := b.prefix("layout-"+l.name) + ":{x}"
		key := item
		if l.name == "ledger-hash" {
			key += ":s" // the script's stock is a string
			err = c.Do(ctx, c.B().Set().Key(key).Value(strconv.FormatInt(bigStock, 10)).Build()).Error()
		} else {
			err = c.Do(ctx, c.B().Hset().Key(key).FieldValue().FieldValue("a", strconv.FormatInt(bigStock, 10)).Build()).Error()
		}
		if err != nil {
			return nil, fmt.Errorf("stockbench: -layouts: load %s: %w", layouts[i].name, err)
		}
	}

	for round := range b.cfg.rounds {
		for i, l := range layouts {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			s0, err := b.sample(ctx)
			if err != nil {
				return nil, err
			}
			start := time.Now()
			calls, err := b.layoutRound(ctx, r, l, round, g, per, subs)
			if err != nil {
				return nil, err
			}
			wall := time.Since(start)
			s1, err := b.sample(ctx)
			if err != nil {
				return nil, err
			}
			x := &res[i]
			x.Calls += calls
			x.CallsPerSec += float64(calls) / wall.Seconds() / float64(b.cfg.rounds)
			if s1.scripts > s0.scripts {
				usec := s1.scriptUsec - s0.scriptUsec
				x.rounds = append(x.rounds, usec/(s1.scripts-s0.scripts))
				x.UsPerCall += usec
				x.CPUPerCall += (s1.cpu - s0.cpu) * 1e6
			}
		}
	}
	for i, l := range layouts {
		if err := b.layoutCheck(ctx, r, l, res[i].Calls, subs); err != nil {
			return nil, err
		}
	}
	for i := range res {
		x := &res[i]
		if x.Calls > 0 {
			x.UsPerCall /= float64(x.Calls)
			x.CPUPerCall /= float64(x.Calls)
		}
		bpe, err := b.layoutBytes(ctx, layouts[i], subs)
		if err != nil {
			return nil, err
		}
		if bpe > 0 && x.Calls > 0 {
			v := bpe / float64(x.Calls)
			x.BytesPerOp = &v
		}
	}
	for i := range res {
		res[i].VsLedgerHash = medianOf(res[i].rounds, res[len(res)-1].rounds)
		res[i].VsLibrary = medianOf(res[i].rounds, res[0].rounds)
	}
	if b.cfg.json {
		return res, nil
	}
	fmt.Fprintf(w, "stockbench -layouts: %s, %d calls per candidate, g=%d, %d round(s), %d listpack sub-hashes\n", b.target, res[0].Calls, g, b.cfg.rounds, subs)
	fmt.Fprintln(w, "(one run on one machine: compare the rows with each other, not with other runs)")
	tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  layout\tcalls/s\tcommands\tµs/call\tredis cpu µs/call\tB/entry\tvs ledger-hash\tvs library\twhat")
	for _, x := range res {
		bpe := "—"
		if x.BytesPerOp != nil {
			bpe = fmt.Sprintf("%.0f", *x.BytesPerOp)
		}
		fmt.Fprintf(tw, "  %s\t%.0f\t%d\t%.1f\t%.1f\t%s\t%.2fx\t%.2fx\t%s\n", x.Name, x.CallsPerSec, x.Commands,
			x.UsPerCall, x.CPUPerCall, bpe, x.VsLedgerHash, x.VsLibrary, x.Desc)
	}
	return res, tw.Flush()
}

// layoutRound sends per calls of candidate l from g goroutines, each id and buyer new.
func (b *bench) layoutRound(ctx context.Context, r *stock.Reserver, l layout, round, g int, per int64, subs int) (int64, error) {
	item := b.prefix("layout-"+l.name) + ":{x}"
	var wg sync.WaitGroup
	var mu sync.Mutex
	var calls int64
	var first error
	each := per / int64(g)
	for w := range g {
		wg.Go(func() {
			c := b.client
			var done int64
			for i := range each {
				id := fmt.Sprintf("r%d-w%d-%d", round, w, i)
				user := "u" + id
				var err error
				switch {
				case l.fn == "":
					_, err = r.Deduct(ctx, stock.Request{SKU: "x", ID: id, User: user, Qty: 1})
				case l.name == "ledger-hash":
					err = c.Do(ctx, c.B().Fcall().Function(l.fn).Numkeys(2).Key(item+":s", item+":l").Arg("1", id).Build()).Error()
				default:
					ledger, users := item+":l", item+":u"
					if l.sub {
						ledger += ":" + strconv.Itoa(subOf(id, subs))
						users += ":" + strconv.Itoa(subOf(user, subs))
					}
					err = c.Do(ctx, c.B().Fcall().Function(l.fn).Numkeys(4).Key(item, ledger, users, item+":o").Arg("2", id, "1", user, strconv.FormatInt(time.Now().UnixMilli(), 10)).Build()).Error()
				}
				if err != nil {
					mu.Lock()
					first = firstErr(first, fmt.Errorf("stockbench: -layouts %s: %w", l.name, err))
					mu.Unlock()
					return
				}
				done++
			}
			mu.Lock()
			calls += done
			mu.Unlock()
		})
	}
	wg.Wait()
	return calls, first
}

func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// subOf is the listpack sub-hash of a name: FNV-1a, mod subs.
func subOf(s string, subs int) int {
	h := fnv.New32a()
	h.Write([]byte(s))
	return int(h.Sum32() % uint32(subs))
}

// layoutBytes returns MEMORY USAGE (every element counted) of the keys candidate l wrote.
func (b *bench) layoutBytes(ctx context.Context, l layout, subs int) (float64, error) {
	c := b.client
	var keys []string
	if l.fn == "" {
		base := b.prefix("layout-library") + ":{x}"
		keys = []string{base, base + ":l", base + ":u", base + ":o"}
	} else {
		item := b.prefix("layout-"+l.name) + ":{x}"
		keys = []string{item, item + ":s", item + ":l", item + ":u", item + ":o"}
		if l.sub {
			for i := range subs {
				keys = append(keys, item+":l:"+strconv.Itoa(i), item+":u:"+strconv.Itoa(i))
			}
		}
	}
	cmds := make(rueidis.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = c.B().MemoryUsage().Key(k).Samples(0).Build()
	}
	var sum float64
	for i, res := range c.DoMulti(ctx, cmds...) {
		v, err := res.AsInt64()
		if rueidis.IsRedisNil(err) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("stockbench: MEMORY USAGE %s: %w", keys[i], err)
		}
		sum += float64(v)
	}
	return sum, nil
}

// medianOf is the median of a[i]/b[i] over the rounds both have (0 when none).
func medianOf(a, b []float64) float64 {
	var rs []float64
	for i := range min(len(a), len(b)) {
		if b[i] > 0 {
			rs = append(rs, a[i]/b[i])
		}
	}
	if len(rs) == 0 {
		return 0
	}
	slices.Sort(rs)
	return rs[len(rs)/2]
}

// layoutCheck confirms that candidate l did the work of calls deducts: the stock went down by
// calls, and the ledger and the outbox have an entry and an event per call.
func (b *bench) layoutCheck(ctx context.Context, r *stock.Reserver, l layout, calls int64, subs int) error {
	c := b.client
	fail := func(what string, got int64) error {
		return fmt.Errorf("stockbench: -layouts %s: %s %d after %d deducts", l.name, what, got, calls)
	}
	if l.fn == "" {
		lv, err := r.Levels(ctx, "x")
		if err != nil {
			return err
		}
		if lv.Sold != calls {
			return fail("sold", lv.Sold)
		}
		return nil
	}
	item := b.prefix("layout-"+l.name) + ":{x}"
	var left, entries, events int64
	var err error
	if l.name == "ledger-hash" {
		left, err = c.Do(ctx, c.B().Get().Key(item+":s").Build()).AsInt64()
	} else {
		left, err = c.Do(ctx, c.B().Hget().Key(item).Field("a").Build()).AsInt64()
	}
	if err != nil {
		return fmt.Errorf("stockbench: -layouts %s: read the stock: %w", l.name, err)
	}
	ledgers := []string{item + ":l"}
	if l.sub {
		ledgers = ledgers[:0]
		for i := range subs {
			ledgers = append(ledgers, item+":l:"+strconv.Itoa(i))
		}
	}
	for _, k := range ledgers {
		n, err := c.Do(ctx, c.B().Hlen().Key(k).Build()).AsInt64()
		if err != nil {
			return fmt.Errorf("stockbench: -layouts %s: HLEN %s: %w", l.name, k, err)
		}
		entries += n
	}
	switch l.name {
	case "ledger-hash":
		events = calls // no outbox
	case "zset", "lean-zset":
		events, err = c.Do(ctx, c.B().Zcard().Key(item+":o").Build()).AsInt64()
	default:
		events, err = c.Do(ctx, c.B().Llen().Key(item+":o").Build()).AsInt64()
	}
	switch {
	case err != nil:
		return fmt.Errorf("stockbench: -layouts %s: read the outbox: %w", l.name, err)
	case bigStock-left != calls:
		return fail("units taken", bigStock-left)
	case entries != calls:
		return fail("ledger entries", entries)
	case events != calls:
		return fail("outbox events", events)
	}
	return nil
}
