-- cart.lua: the saga log of multi-item carts (DeductMany, HoldMany). All carts share one slot.
--
-- KEYS[1] carts hash (cart id -> "state|started_ms|kind|lines"), KEYS[2] pending zset (id -> started_ms)
-- ARGV[1] op: 'begin' | 'end'
-- begin: ARGV[2] id, ARGV[3] kind|lines ("D|sku:qty|sku:qty" in SKU order)
--   Reply {OK, 0} new; {REPLAY, 0} same cart pending (a retry: go on); {CONFLICT, 0} the id names
--   another cart; {CONFIRMED, 0} the cart completed; {RESTORED, 0} the cart was undone.
-- end: ARGV[2] id, ARGV[3] final state: 'd' done or 'u' undone. Reply {OK, 0}.
local now = now_ms()
local id = ARGV[2]
if ARGV[1] == 'begin' then
  local c = redis.call('HGET', KEYS[1], id)
  if c then
    local s, _, rest = string.match(c, '^(.)|(%d+)|(.*)$')
    if rest ~= ARGV[3] then
      return {CONFLICT, 0}
    elseif s == 'd' then
      return {CONFIRMED, 0}
    elseif s == 'u' then
      return {RESTORED, 0}
    end
    return {REPLAY, 0}
  end
  redis.call('HSET', KEYS[1], id, 'p|' .. fmt(now) .. '|' .. ARGV[3])
  redis.call('ZADD', KEYS[2], now, id)
  return {OK, 0}
end
local c = redis.call('HGET', KEYS[1], id)
if c then
  redis.call('HSET', KEYS[1], id, ARGV[3] .. string.sub(c, 2))
end
redis.call('ZREM', KEYS[2], id)
return {OK, 0}
