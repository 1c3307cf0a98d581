-- deadletter.lua: set events of an item aside in its dead-letter set, for the reconciler and an
-- operator, so they stop holding back the item's later events: events the store rejects as
-- invalid (they can never be applied), and events whose ledger entry is gone (the relay cannot
-- build them; the units they took are counted nowhere else, so they must not be forgotten).
--
-- KEYS[1] the set the events are in (the outbox, or the published set), KEYS[2] attempts hash,
-- KEYS[3] dead-letter zset (member -> sequence)
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
