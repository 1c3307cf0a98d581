-- rebuild.lua: recreate an item whose hash was lost, from the store's figure; never overwrites.
--
-- KEYS[1] item hash, KEYS[2] ledger hash, KEYS[3] user hash, KEYS[4] outbox zset, KEYS[5] holds zset,
-- KEYS[6] sold-out filter (unused), KEYS[7] published zset, KEYS[8] dead-letter zset (optional)
-- ARGV[1] available + held as the store and the pending events say
-- ARGV[2] optional: the units sold that the surviving ledger records (deducts and confirmed holds
--         not given back; reconcile.go counts them with a paged scan: while the item hash is
--         missing no script changes them)
-- The counters are made consistent with what survived: held from the live holds, sold from the
-- ledger, loaded = available + held + sold, so a later restore of a surviving sale gives back
-- what it took without driving sold below zero. The closed and delisted marks are restored from
-- the copies close.lua and delist.lua keep in the ledger.
-- Reply: code (OK, or REPLAY if the item exists), available, held
if redis.call('HEXISTS', KEYS[1], 'a') == 1 then
  return {REPLAY, 0, 0}
end
local held = 0
for _, id in ipairs(redis.call('ZRANGE', KEYS[5], 0, -1)) do
  local e = redis.call('HGET', KEYS[2], id)
  if e then
    local _, s, q = parse(e, id)
    if s == 'h' then
      held = held + q
    end
  end
end
local sold = tonumber(ARGV[2] or '0')
if not sold or sold < 0 then
  return {INVALID, 0, 0}
end
local marks = redis.call('HMGET', KEYS[2], '{closed}', '{delisted}')
local delisted = marks[2] and int(marks[2], 'delisting time')
local a = tonumber(ARGV[1]) - held
if a < 0 then
  a = 0
end
-- The outbox sequence continues after every event still undelivered (a requeue may have left
-- q): queued, published and not yet applied by a consumer, or set aside.
local q = tonumber(redis.call('HGET', KEYS[1], 'q')) or 0
for _, key in ipairs({KEYS[4], KEYS[7], KEYS[8]}) do
  if key then
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if last[2] and tonumber(last[2]) > q then
      q = tonumber(last[2])
    end
  end
end
redis.call('HSET', KEYS[1], 'a', fmt(a), 'h', fmt(held), 's', fmt(sold), 'l', fmt(a + held + sold), 'q', fmt(q))
if marks[1] == '1' or delisted then
  redis.call('HSET', KEYS[1], 'c', '1')
end
if delisted then
  redis.call('HSET', KEYS[1], 'd', fmt(delisted))
end
next_deadline(KEYS[1], KEYS[5])
return {OK, a, held}
