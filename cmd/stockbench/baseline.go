package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/rueidis"
)

// ledgerHashScript is a common idempotent deduct script, as a published article gives it
// (comments translated):
// refuse a repeated operation id, check the stock, set the new value, and write a ledger entry
// {action, from, to, change, by, timestamp} as JSON into a hash keyed by the operation id.
//
// KEYS[1] the stock (a string), KEYS[2] the ledger hash; ARGV[1] quantity, ARGV[2] operation id.
const ledgerHashScript = `
-- the operation was already executed: refuse it
if redis.call('hexists', KEYS[2], ARGV[2]) == 1 then
  return redis.error_reply('OPERATION_ALREADY_EXECUTED')
end
local current = redis.call('get', KEYS[1])
if current == false then
  return redis.error_reply('KEY_NOT_FOUND')
end
if tonumber(current) == nil then
  return redis.error_reply('current value is not a number')
end
if tonumber(current) == 0 then
  return redis.error_reply('INVENTORY_IS_ZERO')
end
if tonumber(current) < tonumber(ARGV[1]) then
  return redis.error_reply('INVENTORY_NOT_ENOUGH')
end
local new = tonumber(current) - tonumber(ARGV[1])
redis.call('set', KEYS[1], tostring(new))
local time = redis.call("time")
local currentTimeMillis = (time[1] * 1000) + math.floor(time[2] / 1000)
redis.call('hset', KEYS[2], ARGV[2], cjson.encode({
  action = "decrease",
  from = current,
  to = new,
  change = ARGV[1],
  by = ARGV[2],
  timestamp = currentTimeMillis
}))
return new
`

// noLedgerScript is the bare stock check: GET, compare, DECRBY. No idempotency, no ledger.
//
// KEYS[1] the stock (a string); ARGV[1] quantity. Reply: the stock left, or -1 when short.
const noLedgerScript = `
local current = tonumber(redis.call('get', KEYS[1]))
if current == nil then
  return redis.error_reply('KEY_NOT_FOUND')
end
local q = tonumber(ARGV[1])
if current < q then
  return -1
end
return redis.call('decrby', KEYS[1], q)
`

// onePerUserScript is the common one-purchase-per-user flash-sale script: refuse a buyer already
// in the item's set of buyers, check the stock, DECR it and add the buyer to the set.
//
// KEYS[1] the stock (a string), KEYS[2] the set of buyers; ARGV[1] the buyer. Reply: the stock
// left, -1 when sold out, or the error ALREADY_BOUGHT.
const onePerUserScript = `
if redis.call('sismember', KEYS[2], ARGV[1]) == 1 then
  return redis.error_reply('ALREADY_BOUGHT')
end
local current = tonumber(redis.call('get', KEYS[1]))
if current == nil then
  return redis.error_reply('KEY_NOT_FOUND')
end
if current < 1 then
  return -1
end
local left = redis.call('decr', KEYS[1])
redis.call('sadd', KEYS[2], ARGV[1])
return left
`

var (
	onePerUserLua = rueidis.NewLuaScript(onePerUserScript)
	ledgerHashLua = rueidis.NewLuaScript(ledgerHashScript)
	noLedgerLua   = rueidis.NewLuaScript(noLedgerScript)
)

// rawPhase is the common part of the raw-script phases: for each item a stock key
// "<prefix>:{sku}" set to bigStock and a ledger key "<prefix>:{sku}:l".
func (b *bench) rawPhase(name string) (p *phase, stockKeys, ledgerKeys []string) {
	prefix := b.prefix(name)
	for _, sku := range append(skus(b.cfg.items), warmSKU) {
		base := prefix + ":{" + sku + "}"
		stockKeys = append(stockKeys, base)
		ledgerKeys = append(ledgerKeys, base+":l")
	}
	p = &phase{name: name, g: b.cfg.g, redis: true, keys: append(append([]string{}, stockKeys...), ledgerKeys...)}
	p.setup = func(ctx context.Context) error {
		c := b.client
		for _, k := range stockKeys {
			if err := c.Do(ctx, c.B().Set().Key(k).Value(strconv.Itoa(bigStock)).Build()).Error(); err != nil {
				return err
			}
		}
		return nil
	}
	// The last key of each list is the warm-up item, outside the measured set.
	return p, stockKeys, ledgerKeys
}

// ledgerHashPhase: the ledger-hash script with unique ids and the same share of retries as deduct.
func (b *bench) ledgerHashPhase() *phase {
	p, stockKeys, ledgerKeys := b.rawPhase(phLedgerHash)
	items := len(stockKeys) - 1
	load := p.setup
	p.setup = func(ctx context.Context) error {
		if err := load(ctx); err != nil {
			return err
		}
		return ledgerHashLua.Exec(ctx, b.client, []string{stockKeys[items], ledgerKeys[items]}, []string{"1", "warm"}).Error()
	}
	share := b.cfg.retry
	qty := "1"
	p.op = func(ctx context.Context, w *worker) {
		if s, ok := w.retry(share); ok {
			t0 := time.Now()
			err := ledgerHashLua.Exec(ctx, b.client, []string{stockKeys[s.item], ledgerKeys[s.item]}, []string{qty, s.id}).Error()
			switch {
			case isReply(err, "OPERATION_ALREADY_EXECUTED"):
				w.done(t0, outReplayed)
			case err == nil: // applied twice
				w.done(t0, outOK)
				w.mismatch++
			default:
				w.fail(err)
			}
			return
		}
		i, id := w.item(), w.nextID()
		t0 := time.Now()
		left, err := ledgerHashLua.Exec(ctx, b.client, []string{stockKeys[i], ledgerKeys[i]}, []string{qty, id}).AsInt64()
		switch {
		case err == nil:
			w.done(t0, outOK)
			w.fresh[i] += w.qty
			w.remember(sent{item: i, id: id, remaining: left})
		case isReply(err, "INVENTORY_IS_ZERO") || isReply(err, "INVENTORY_NOT_ENOUGH"):
			w.done(t0, outSoldOut)
		default:
			w.fail(err)
		}
	}
	p.finish = func(ctx context.Context, res *PhaseResult, ws []*worker) ([]Check, error) {
		lens, bytes, err := b.ledgerStats(ctx, ledgerKeys[:items])
		if err != nil {
			return nil, err
		}
		res.LedgerBytes = bytes
		var entries int64
		for _, n := range lens {
			entries += n
		}
		res.RequestBytes = b.requestBytes(ctx, append(append([]string{}, ledgerKeys[:items]...), stockKeys[:items]...), entries)
		return b.rawChecks(ctx, phLedgerHash, stockKeys[:items], lens, ws)
	}
	return p
}

// onePerUserPhase: the one-per-user script, each request by a buyer of its own, with the same
// share of retries (a buyer asking again) as deduct. The buyers' sets take the ledger keys.
func (b *bench) onePerUserPhase() *phase {
	p, stockKeys, setKeys := b.rawPhase(phOnePerUser)
	items := len(stockKeys) - 1
	load := p.setup
	p.setup = func(ctx context.Context) error {
		if err := load(ctx); err != nil {
			return err
		}
		return onePerUserLua.Exec(ctx, b.client, []string{stockKeys[items], setKeys[items]}, []string{"uwarm"}).Error()
	}
	share := b.cfg.retry
	p.op = func(ctx context.Context, w *worker) {
		if s, ok := w.retry(share); ok {
			t0 := time.Now()
			err := onePerUserLua.Exec(ctx, b.client, []string{stockKeys[s.item], setKeys[s.item]}, []string{"u" + s.id}).Error()
			switch {
			case isReply(err, "ALREADY_BOUGHT"):
				w.done(t0, outReplayed)
			case err == nil: // bought twice
				w.done(t0, outOK)
				w.mismatch++
			default:
				w.fail(err)
			}
			return
		}
		i, id := w.item(), w.nextID()
		t0 := time.Now()
		left, err := onePerUserLua.Exec(ctx, b.client, []string{stockKeys[i], setKeys[i]}, []string{"u" + id}).AsInt64()
		switch {
		case err != nil:
			w.fail(err)
		case left < 0:
			w.done(t0, outSoldOut)
		default:
			w.done(t0, outOK)
			w.fresh[i] += w.qty
			w.remember(sent{item: i, id: id, remaining: left})
		}
	}
	p.finish = func(ctx context.Context, res *PhaseResult, ws []*worker) ([]Check, error) {
		c := b.client
		lens := make([]int64, items)
		for i, k := range setKeys[:items] {
			n, err := c.Do(ctx, c.B().Scard().Key(k).Build()).AsInt64()
			if err != nil {
				return nil, fmt.Errorf("SCARD %s: %w", k, err)
			}
			lens[i] = n
		}
		return b.rawChecks(ctx, phOnePerUser, stockKeys[:items], lens, ws)
	}
	return p
}

// noLedgerPhase: the GET + DECRBY script, no ids.
func (b *bench) noLedgerPhase() *phase {
	p, stockKeys, _ := b.rawPhase(phNoLedger)
	p.keys = stockKeys
	items := len(stockKeys) - 1
	load := p.setup
	p.setup = func(ctx context.Context) error {
		if err := load(ctx); err != nil {
			return err
		}
		return noLedgerLua.Exec(ctx, b.client, stockKeys[items:], []string{"1"}).Error()
	}
	qty := []string{"1"}
	p.op = func(ctx context.Context, w *worker) {
		i := w.item()
		t0 := time.Now()
		left, err := noLedgerLua.Exec(ctx, b.client, stockKeys[i:i+1], qty).AsInt64()
		switch {
		case err != nil:
			w.fail(err)
		case left < 0:
			w.done(t0, outSoldOut)
		default:
			w.done(t0, outOK)
			w.fresh[i] += w.qty
		}
	}
	p.finish = func(ctx context.Context, res *PhaseResult, ws []*worker) ([]Check, error) {
		return b.rawChecks(ctx, phNoLedger, stockKeys[:items], nil, ws)
	}
	return p
}

// isReply reports whether err is a Redis error reply that contains text. (miniredis and Redis
// word errors raised by scripts differently; the text given to error_reply survives in both.)
func isReply(err error, text string) bool {
	var re *rueidis.RedisError
	return errors.As(err, &re) && strings.Contains(re.Error(), text)
}

// rawChecks checks, per item, that the stock went down by the units taken and, when lens is not
// nil, that the ledger has one entry per successful id; and that no retried id was applied.
func (b *bench) rawChecks(ctx context.Context, phase string, stockKeys []string, lens []int64, ws []*worker) ([]Check, error) {
	var mismatch, slack, fresh, left, entries int64
	perFresh := make([]int64, len(stockKeys))
	for _, w := range ws {
		for i := range stockKeys {
			perFresh[i] += w.fresh[i]
		}
		mismatch += w.mismatch
		slack += w.errs
	}
	stockFail, ledgerFail := "", ""
	for i, k := range stockKeys {
		c := b.client
		n, err := c.Do(ctx, c.B().Get().Key(k).Build()).AsInt64()
		if err != nil {
			return nil, fmt.Errorf("GET %s: %w", k, err)
		}
		fresh += perFresh[i]
		left += n
		if stockFail == "" && !within(bigStock-n, perFresh[i], slack) {
			stockFail = fmt.Sprintf("%s: %d taken, %d successful calls (%d unknown outcomes)", k, bigStock-n, perFresh[i], slack)
		}
		if lens != nil {
			entries += lens[i]
			if ledgerFail == "" && !within(lens[i], perFresh[i], slack) {
				ledgerFail = fmt.Sprintf("%s: %d ledger entries, %d successful ids", k, lens[i], perFresh[i])
			}
		}
	}
	checks := []Check{{Phase: phase, Name: "stock taken = successful calls", OK: stockFail == "",
		Detail: orElse(stockFail, fmt.Sprintf("%d taken, %d calls", int64(len(stockKeys))*bigStock-left, fresh))}}
	if lens != nil {
		checks = append(checks,
			Check{Phase: phase, Name: "ledger entries = successful ids", OK: ledgerFail == "",
				Detail: orElse(ledgerFail, fmt.Sprintf("%d entries, %d ids", entries, fresh))},
			Check{Phase: phase, Name: "retries refused as already executed", OK: mismatch == 0,
				Detail: fmt.Sprintf("%d applied again", mismatch)})
	}
	return checks, nil
}

// orElse returns fail when it is set, else ok.
func orElse(fail, ok string) string {
	if fail != "" {
		return fail
	}
	return ok
}

// watchPhase: optimistic check-and-decrement with WATCH/GET then MULTI/DECRBY/EXEC, retried
// until it commits or the stock runs out. Each operation borrows a dedicated connection, so at
// most min(g, 64) goroutines run. Latency is from the first WATCH to the commit; aborts count
// the EXECs that a concurrent write made fail.
func (b *bench) watchPhase() *phase {
	p, stockKeys, _ := b.rawPhase(phWatch)
	p.keys = stockKeys
	p.g = min(b.cfg.g, defaultMaxG)
	items := len(stockKeys) - 1
	p.op = func(ctx context.Context, w *worker) {
		i := w.item()
		key := stockKeys[i]
		t0 := time.Now()
		err := b.client.Dedicated(func(c rueidis.DedicatedClient) error {
			for {
				if err := ctx.Err(); err != nil {
					return err
				}
				rs := c.DoMulti(ctx, c.B().Watch().Key(key).Build(), c.B().Get().Key(key).Build())
				if err := rs[0].Error(); err != nil {
					return err
				}
				cur, err := rs[1].AsInt64()
				if err != nil {
					return err
				}
				if cur < w.qty {
					w.done(t0, outSoldOut)
					return c.Do(ctx, c.B().Unwatch().Build()).Error()
				}
				rs = c.DoMulti(ctx, c.B().Multi().Build(), c.B().Decrby().Key(key).Decrement(w.qty).Build(), c.B().Exec().Build())
				for _, r := range rs[:2] {
					if err := r.Error(); err != nil {
						return err
					}
				}
				err = rs[2].Error()
				if rueidis.IsRedisNil(err) {
					w.aborts++
					continue
				}
				if err != nil {
					return err
				}
				w.done(t0, outOK)
				w.fresh[i] += w.qty
				return nil
			}
		})
		if err != nil {
			w.fail(err)
		}
	}
	p.finish = func(ctx context.Context, res *PhaseResult, ws []*worker) ([]Check, error) {
		return b.rawChecks(ctx, phWatch, stockKeys[:items], nil, ws)
	}
	return p
}

// pgPhase: the SQL hot row. Each operation is one transaction: a conditional decrement of the
// item's row and, when it took stock, the insert of a ledger row with a unique (sku, id). The
// tables live in a schema created for the run and dropped after the phase.
func (b *bench) pgPhase() *phase {
	g := min(b.cfg.g, defaultMaxG)
	schema := "stockbench_" + b.runID
	items := pgx.Identifier{schema, "items"}.Sanitize()
	ledger := pgx.Identifier{schema, "ledger"}.Sanitize()
	names := skus(b.cfg.items)
	update := "UPDATE " + items + " SET remain = remain - $2 WHERE sku = $1 AND remain >= $2"
	insert := "INSERT INTO " + ledger + " (sku, id, qty) VALUES ($1, $2, $3)"
	var pool *pgxpool.Pool
	var created bool
	errSoldOut := errors.New("sold out")

	p := &phase{name: phPGHotRow, g: g}
	p.setup = func(ctx context.Context) error {
		cfg, err := pgxpool.ParseConfig(b.cfg.pg)
		if err != nil {
			return err
		}
		cfg.MaxConns = int32(g)
		if pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
			return err
		}
		stmts := []string{
			"CREATE SCHEMA " + pgx.Identifier{schema}.Sanitize(),
			"CREATE TABLE " + items + " (sku text PRIMARY KEY, remain bigint NOT NULL CHECK (remain >= 0))",
			"CREATE TABLE " + ledger + " (sku text NOT NULL, id text NOT NULL, qty bigint NOT NULL," +
				" at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (sku, id))",
		}
		for i, s := range stmts {
			if _, err := pool.Exec(ctx, s); err != nil {
				return err
			}
			created = created || i == 0
		}
		for _, sku := range names {
			if _, err := pool.Exec(ctx, "INSERT INTO "+items+" (sku, remain) VALUES ($1, $2)", sku, int64(bigStock)); err != nil {
				return err
			}
		}
		// Open every connection before the clock starts.
		conns := make([]*pgxpool.Conn, g)
		defer func() {
			for _, c := range conns {
				if c != nil {
					c.Release()
				}
			}
		}()
		var wg sync.WaitGroup
		errs := make([]error, g)
		for i := range conns {
			wg.Go(func() { conns[i], errs[i] = pool.Acquire(ctx) })
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	p.op = func(ctx context.Context, w *worker) {
		i, id := w.item(), w.nextID()
		t0 := time.Now()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, update, names[i], w.qty)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				return errSoldOut
			}
			_, err = tx.Exec(ctx, insert, names[i], id, w.qty)
			return err
		})
		switch {
		case err == nil:
			w.done(t0, outOK)
			w.fresh[i] += w.qty
		case errors.Is(err, errSoldOut):
			w.done(t0, outSoldOut)
		default:
			w.fail(err)
		}
	}
	p.finish = func(ctx context.Context, res *PhaseResult, ws []*worker) ([]Check, error) {
		var slack, fresh int64
		for _, w := range ws {
			for i := range names {
				fresh += w.fresh[i]
			}
			slack += w.errs
		}
		var remain, rows, units int64
		err := pool.QueryRow(ctx, "SELECT (SELECT coalesce(sum(remain), 0) FROM "+items+"),"+
			" (SELECT count(*) FROM "+ledger+"), (SELECT coalesce(sum(qty), 0) FROM "+ledger+")").Scan(&remain, &rows, &units)
		if err != nil {
			return nil, err
		}
		loaded := int64(len(names)) * bigStock
		return []Check{
			{Phase: phPGHotRow, Name: "loaded = remain + ledger units", OK: remain+units == loaded,
				Detail: fmt.Sprintf("%d = %d + %d", loaded, remain, units)},
			{Phase: phPGHotRow, Name: "ledger rows = successful transactions", OK: within(rows, fresh, slack),
				Detail: fmt.Sprintf("%d rows, %d commits (%d unknown outcomes)", rows, fresh, slack)},
		}, nil
	}
	p.teardown = func() {
		if pool == nil {
			return
		}
		defer pool.Close()
		if created {
			ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
			defer cancel()
			if _, err := pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
				fmt.Fprintf(b.stderr, "stockbench: drop schema %s: %v\n", schema, err)
			}
		}
	}
	return p
}
