-- load.lua: create an item with its initial stock; never overwrites a live item. A retired
-- item (x = '1', see retire.lua) may be loaded again.
--
-- KEYS[1] item hash, KEYS[2] sold-out filter (removed: it is built when the item sells out)
-- ARGV[1] quantity
-- Reply: code (OK, or REPLAY when the item exists), available
local st = redis.call('HMGET', KEYS[1], 'a', 'x', 'q')
if st[1] and st[2] ~= '1' then
  return {REPLAY, tonumber(st[1])}
end
-- A retired item, or a hash left with only its outbox sequence: start afresh, keeping q.
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('HSET', KEYS[1], 'a', ARGV[1], 'h', '0', 's', '0', 'l', ARGV[1])
if st[3] then
  redis.call('HSET', KEYS[1], 'q', st[3])
end
return {OK, tonumber(ARGV[1])}
