-- close.lua: close an item for sale (or reopen it). Never creates an item.
--
-- KEYS[1] item hash
-- ARGV[1] '1' to close, '0' to reopen
-- Reply: code (OK, REPLAY when already so, NOTLOADED), available
local a = redis.call('HGET', KEYS[1], 'a')
if not a then
  return {NOTLOADED, 0}
end
local closed = redis.call('HGET', KEYS[1], 'c') == '1'
if (ARGV[1] == '1') == closed then
  return {REPLAY, tonumber(a)}
end
if ARGV[1] == '1' then
  redis.call('HSET', KEYS[1], 'c', '1')
else
  redis.call('HDEL', KEYS[1], 'c')
end
return {OK, tonumber(a)}
