-- cart.lua: the saga log of multi-item carts (DeductMany, HoldMany). All carts share one slot.
--
-- KEYS[1] carts hash (cart id -> "state|started_ms|cart"), KEYS[2] pending zset (id -> started_ms)
-- A record's state is p (pending: the saga runs), d (done: every line was taken) or u (undone:
-- its lines are being, or were, given back). A cart moves p -> d or p -> u, once: the attempt
-- that moves it decides the outcome of every copy of the cart id, concurrent or later. A cart
-- stays in the pending zset until its undo has given every line back, so RecoverCarts finishes an
-- undo that a crash cut short.
-- cart: "K{user}|sku:qty|sku:qty" in SKU order (internal/protocol EncodeCart); a record is the same cart
-- only when its kind, user and lines are all equal.
-- cause: why a cart was undone, "code:sku" (the item's refusal), or '' (RecoverCarts); an undone
-- record keeps it after its lines: "u|started|cart|{code:sku}" (no line starts with a brace).
--
-- ARGV[1] op:
-- begin ARGV[2] id, ARGV[3] cart. Reply {code, cause}: OK new; REPLAY same cart pending (a retry
--   or a concurrent copy: go on); CONFLICT the id names another cart (nothing changed);
--   CONFIRMED the cart is done; RESTORED the cart was undone (cause says why).
-- done  ARGV[2] id. Reply {code, cause}: OK the cart is done now (this copy completed it);
--   REPLAY it was done before (by another copy); RESTORED it was undone first (the caller must
--   run the undo too, and answer with cause).
-- undo  ARGV[2] id, ARGV[3] cause. Reply {code, cause}: OK the cart is undone now, with this
--   cause; REPLAY it was undone before, with the cause it has; CONFIRMED it is done (give
--   nothing back); UNKNOWN no record.
-- end   ARGV[2] id: the undo gave every line back; the cart leaves the pending set. Reply {OK, ''}.
local id = ARGV[2]
local c = redis.call('HGET', KEYS[1], id)
local s, started, rest, why
if c then
  s, started, rest = string.match(c, '^(.)|(%d+)|(.*)$')
  if not s then
    return {INVALID, 'corrupt cart record'}
  end
  -- an undone record may end with its cause in braces, "|{code:sku}": no line starts with '{'
  local r2, w = string.match(rest, '^(.*)|{([^}]*)}$')
  if r2 then
    rest, why = r2, w
  end
end
local op = ARGV[1]
if op == 'begin' then
  if c then
    if rest ~= ARGV[3] then
      return {CONFLICT, ''}
    elseif s == 'd' then
      return {CONFIRMED, ''}
    elseif s == 'u' then
      return {RESTORED, why or ''}
    end
    return {REPLAY, ''}
  end
  local now = now_ms()
  redis.call('HSET', KEYS[1], id, 'p|' .. fmt(now) .. '|' .. ARGV[3])
  redis.call('ZADD', KEYS[2], now, id)
  return {OK, ''}
elseif op == 'done' then
  if not c then
    return {UNKNOWN, ''}
  elseif s == 'u' then
    return {RESTORED, why or ''}
  elseif s == 'd' then
    return {REPLAY, ''}
  end
  redis.call('HSET', KEYS[1], id, 'd|' .. started .. '|' .. rest)
  redis.call('ZREM', KEYS[2], id)
  return {OK, ''}
elseif op == 'undo' then
  if not c then
    return {UNKNOWN, ''}
  elseif s == 'd' then
    return {CONFIRMED, ''}
  elseif s == 'u' then
    return {REPLAY, why or ''}
  end
  local rec = 'u|' .. started .. '|' .. rest
  if ARGV[3] ~= '' then
    rec = rec .. '|{' .. ARGV[3] .. '}'
  end
  redis.call('HSET', KEYS[1], id, rec)
  return {OK, ARGV[3]}
elseif op == 'end' then
  redis.call('ZREM', KEYS[2], id)
  return {OK, ''}
end
return {INVALID, 'unknown cart operation'}
