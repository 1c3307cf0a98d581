-- close.lua: close an item for sale (or reopen it). Never creates an item.
--
-- KEYS[1] item hash
-- ARGV[1] '1' to close, '0' to reopen
-- Reply: code (OK, REPLAY when already so, NOTLOADED, CLOSED for a reopen of a delisted item:
-- a delisting is for good, see delist.lua), available
local st = redis.call('HMGET', KEYS[1], 'a', 'c', 'd')
local a = st[1]
if not a then
  return {NOTLOADED, 0}
end
local closed = st[2] == '1'
if ARGV[1] ~= '1' and st[3] then
  return {CLOSED, tonumber(a) or 0}
end
if (ARGV[1] == '1') == closed then
  return {REPLAY, tonumber(a) or 0}
end
if ARGV[1] == '1' then
  redis.call('HSET', KEYS[1], 'c', '1')
else
  redis.call('HDEL', KEYS[1], 'c')
end
return {OK, tonumber(a) or 0}
