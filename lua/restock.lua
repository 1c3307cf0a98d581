-- restock.lua: add stock to a live item, exactly once per id, ledgered like a deduct.
--
-- KEYS[1] item hash, KEYS[2] ledger hash, KEYS[3] user hash, KEYS[4] outbox zset, KEYS[5] holds zset,
-- KEYS[6] sold-out filter
-- ARGV[1] id, ARGV[2] qty, ARGV[3] '1' to queue events, ARGV[4] the most the item may hold after
-- the restock (2^53-1; for a bucket, that less the other buckets' loaded counts)
-- Reply: code, remaining available, qty
local id, q, queue, max = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1', tonumber(ARGV[4])
local now = now_ms()
local e = redis.call('HGET', KEYS[2], id)
local st = redis.call('HMGET', KEYS[1], 'a', 'l', 'b')
-- Checked before the first write: remember and HINCRBY use them after it.
local avail, loaded = int(st[1], 'available count'), int(st[2], 'loaded count')
int(st[3], 'sold-out filter size')
int(redis.call('HGET', KEYS[1], 'q'), 'outbox sequence')
if e then
  local k, s, eq, ea = parse(e, id)
  if k == 'T' then
    return {RESTORED, avail or 0, q}
  end
  if k ~= 'L' or eq ~= q then
    return {CONFLICT, avail or 0, eq}
  end
  return {REPLAY, ea, q}
end
if not avail then
  return {NOTLOADED, 0, q}
end
if loaded + q > max then
  return {INVALID, avail, q}
end
redis.call('HINCRBY', KEYS[1], 'a', q)
redis.call('HINCRBY', KEYS[1], 'l', q)
redis.call('HSET', KEYS[2], id, entry('L', 'r', q, avail + q, now, ''))
remember(KEYS[6], st[3], id)
if queue then
  queue_event(KEYS, 'L:', id)
end
return {OK, avail + q, q}
