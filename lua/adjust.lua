-- adjust.lua: move an item's available (and loaded) stock by a delta computed by the reconciler.
-- A delta, not a value: deducts that ran since the reconciler's snapshot stay counted.
--
-- KEYS[1] item hash
-- ARGV[1] delta (may be negative)
-- Reply: code (OK, or NOTLOADED), the delta applied (clamped so available stays >= 0), available
local d = tonumber(ARGV[1])
local a = tonumber(redis.call('HGET', KEYS[1], 'a'))
if not a then
  return {NOTLOADED, 0, 0}
end
if a + d < 0 then
  d = -a
end
if d ~= 0 then
  a = redis.call('HINCRBY', KEYS[1], 'a', d)
  redis.call('HINCRBY', KEYS[1], 'l', d)
end
return {OK, d, a}
