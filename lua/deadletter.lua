-- deadletter.lua: move outbox events that the store rejects as invalid (they can never be
-- applied) to the item's dead-letter set, for an operator, so they stop holding back the item.
--
-- KEYS[1] outbox zset, KEYS[2] attempts hash, KEYS[3] dead-letter zset (member -> sequence)
-- ARGV[...] members
-- Reply: the number of members moved.
local n = 0
for _, m in ipairs(ARGV) do
  local seq = redis.call('ZSCORE', KEYS[1], m)
  if seq then
    redis.call('ZADD', KEYS[3], seq, m)
    redis.call('ZREM', KEYS[1], m)
    redis.call('HDEL', KEYS[2], m)
    n = n + 1
  end
end
return n
