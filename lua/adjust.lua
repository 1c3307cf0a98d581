-- adjust.lua: move an item's available stock by a delta computed by the reconciler, keeping
-- Loaded = Available + Held + Sold. A delta, not a value: deducts that ran since the reconciler's
-- snapshot stay counted.
--
-- Loaded changes only by what was loaded and restocked. Units the store has taken that Redis
-- does not count (sales a failover lost: the store has them, the promoted replica does not) are
-- counted as sold: available down, sold up. Units the store has that Redis does not count as
-- available go to loaded first up to the restocks the store has and Redis lost (ARGV[2]), then
-- come back from sold (a sale Redis counted twice: an id sold again after its entry was trimmed,
-- which the store took once), and only what exceeds sold is counted as loaded (stock added to the
-- store by hand). No counter goes below zero.
--
-- KEYS[1] item hash
-- ARGV[1] delta to available (may be negative)
-- ARGV[2] optional: the units of restocks the store has and Redis lost (>= 0; default 0)
-- Reply: code (OK, NOTLOADED, or INVALID for a bad argument), the delta applied (clamped so
-- available stays >= 0), available
local d, restocked = tonumber(ARGV[1]), tonumber(ARGV[2] or '0')
if not d or d ~= math.floor(d) or not restocked or restocked < 0 or restocked ~= math.floor(restocked) then
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
if d == 0 then
  return {OK, 0, a}
end
local ds, dl = -d, 0
if d > 0 then
  dl = math.min(d, restocked)
  local back = math.min(d - dl, s)
  ds = -back
  dl = d - back
end
a = redis.call('HINCRBY', KEYS[1], 'a', d)
if ds ~= 0 then
  redis.call('HINCRBY', KEYS[1], 's', ds)
end
if dl ~= 0 then
  redis.call('HINCRBY', KEYS[1], 'l', dl)
end
return {OK, d, a}
