-- load.lua: create an item with its initial stock; never overwrites a live item. A retired
-- item (x = '1', see retire.lua) may be loaded again.
--
-- KEYS[1] item hash
-- ARGV[1] quantity
-- Reply: code (OK, or REPLAY when the item exists), available
if redis.call('EXISTS', KEYS[1]) == 1 then
  if redis.call('HGET', KEYS[1], 'x') ~= '1' then
    return {REPLAY, tonumber(redis.call('HGET', KEYS[1], 'a')) or 0}
  end
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'a', ARGV[1], 'h', '0', 's', '0', 'l', ARGV[1])
return {OK, tonumber(ARGV[1])}
