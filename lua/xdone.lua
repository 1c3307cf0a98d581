-- xdone.lua: end a transfer in its donor once the target has its units (see xout.lua): it
-- leaves the set of transfers in flight. The transfers hash keeps its entry.
--
-- KEYS[1] transfers hash, KEYS[2] transfers in flight (zset)
-- ARGV[1] transfer id
-- Reply: code (OK ended now, REPLAY ended already, UNKNOWN no such transfer out of this bucket)
local x = redis.call('HGET', KEYS[1], ARGV[1])
if not x or parse_transfer(x, ARGV[1]) ~= 'O' then
  return {UNKNOWN}
end
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then
  return {REPLAY}
end
return {OK}
