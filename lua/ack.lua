-- ack.lua: settle delivered events of an item.
--
-- KEYS[1] outbox zset, KEYS[2] ledger hash, KEYS[3] attempts hash, KEYS[4] published zset
-- ("<event>:<id>" -> sequence: events handed to a publisher that no consumer has applied yet)
-- ARGV[1] mode:
--   'a' applied: the store has the events (the relay applied them, or a consumer did through
--       Consume, or the reconciler found them in the store). They leave the outbox and the
--       published set, and a reserved deduct or restock entry becomes applied.
--   'p' published: a publisher accepted the events and no store was told (the queue path).
--       Events the store applies (D, R, L) move from the outbox to the published set with their
--       sequence, their entries unchanged, so that they stay in flight for the reconciler and
--       hold back the item's later events in Consume until a consumer applies them; the others
--       (H, X, E: a store ignores them) leave the outbox.
-- ARGV[2...] members ("<event>:<id>")
-- Reply: the number of members removed from the outbox or the published set.
local mode = ARGV[1]
if mode ~= 'a' and mode ~= 'p' then
  return redis.error_reply('ERR stock: ack mode')
end
local n = 0
for i = 2, #ARGV do
  local m = ARGV[i]
  local ev = string.sub(m, 1, 1)
  if mode == 'p' then
    local seq = redis.call('ZSCORE', KEYS[1], m)
    if seq then
      n = n + redis.call('ZREM', KEYS[1], m)
      if ev == 'D' or ev == 'R' or ev == 'L' then
        redis.call('ZADD', KEYS[4], seq, m)
      end
    end
    redis.call('HDEL', KEYS[3], m)
  else
    n = n + redis.call('ZREM', KEYS[1], m) + redis.call('ZREM', KEYS[4], m)
    redis.call('HDEL', KEYS[3], m)
    if ev == 'D' or ev == 'L' then
      local id = string.sub(m, 3)
      local e = redis.call('HGET', KEYS[2], id)
      if e and string.sub(e, 2, 2) == 'r' then
        redis.call('HSET', KEYS[2], id, with_state(e, 'a'))
      end
    end
  end
end
return n
