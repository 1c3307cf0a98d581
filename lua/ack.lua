-- ack.lua: remove delivered events from an item's outbox and mark what the store applied.
--
-- KEYS[1] outbox zset, KEYS[2] ledger hash, KEYS[3] attempts hash
-- ARGV[...] delivered members ("<event>:<id>")
-- Reply: the number of members removed.
local n = 0
for _, m in ipairs(ARGV) do
  n = n + redis.call('ZREM', KEYS[1], m)
  redis.call('HDEL', KEYS[3], m)
  local ev = string.sub(m, 1, 1)
  if ev == 'D' or ev == 'L' then
    local id = string.sub(m, 3)
    local e = redis.call('HGET', KEYS[2], id)
    if e and string.sub(e, 2, 2) == 'r' then
      redis.call('HSET', KEYS[2], id, with_state(e, 'a'))
    end
  end
end
return n
