-- adjust.lua: move an item's available stock by a delta computed by the reconciler, keeping
-- Loaded = Available + Held + Sold. A delta, not a value: deducts that ran since the reconciler's
-- snapshot stay counted.
--
-- Loaded changes only by what was loaded and restocked. The pass first counts what it wrote back
-- (ARGV[2], ARGV[3]: the restocks and the sales the store has and Redis lost, whose counts Redis
-- lost with them in a failover): restocks as loaded, sales as sold. What the delta leaves beyond
-- that is counted by its sign: units the store has taken that Redis does not count are sold
-- (available down, sold up); units the store has that Redis does not count as available come
-- back from sold (a sale Redis counted twice: an id sold again after its entry was trimmed,
-- which the store took once), and only what exceeds sold is counted as loaded (stock added to the
-- store by hand). No counter goes below zero.
--
-- KEYS[1] item hash
-- ARGV[1] delta to available (may be negative)
-- ARGV[2] optional: the units of the restocks the pass wrote back (>= 0; default 0)
-- ARGV[3] optional: the units of the sales the pass wrote back (>= 0; default 0)
-- Reply: code (OK, NOTLOADED, or INVALID for a bad argument), the delta applied (clamped so
-- available stays >= 0), available
local d, restocked, sold = tonumber(ARGV[1]), tonumber(ARGV[2] or '0'), tonumber(ARGV[3] or '0')
local function whole(n, least)
  return n and n == math.floor(n) and n >= least
end
if not whole(d, -2 ^ 53) or not whole(restocked, 0) or not whole(sold, 0) then
  return {INVALID, 0, 0}
end
-- Every value this script may use is read and checked before its first write.
local st = redis.call('HMGET', KEYS[1], 'a', 's', 'l')
local a = int(st[1], 'available count')
local s = int(st[2], 'sold count') or 0
int(st[3], 'loaded count')
if not a then
  return {NOTLOADED, 0, 0}
end
if a + d < 0 then
  d = -a
end
-- What was written back first; then the rest of the delta by its sign.
local dl, ds = restocked, sold
local rest = d - (restocked - sold)
if rest < 0 then
  ds = ds - rest
elseif rest > 0 then
  local back = math.min(rest, s + ds)
  ds = ds - back
  dl = dl + rest - back
end
if d ~= 0 then
  a = redis.call('HINCRBY', KEYS[1], 'a', d)
end
if ds ~= 0 then
  redis.call('HINCRBY', KEYS[1], 's', ds)
end
if dl ~= 0 then
  redis.call('HINCRBY', KEYS[1], 'l', dl)
end
return {OK, d, a}
