-- snapshot.lua: read an item's counters and its undelivered events at one instant.
--
-- KEYS[1] item hash, KEYS[2] ledger hash, KEYS[3] user hash, KEYS[4] outbox zset, KEYS[5] holds zset,
-- KEYS[6] dead-letter zset, KEYS[7] published zset (handed to a publisher, not yet applied by a
-- consumer)
-- ARGV[1] most events to return from each set
-- Reply: flat strings: exists ('1'/'0'), a, h, s, l, pending count, dead-letter count, published
-- count, t (a bucket's net units transferred in, '0' for an item that is not a bucket), then two
-- per returned event, pending ones first, then dead letters, then published ones (none of them
-- is in the store yet, as far as Redis knows): member, ledger entry ('' if gone)
local st = redis.call('HMGET', KEYS[1], 'a', 'h', 's', 'l', 't')
local out = {st[1] and '1' or '0', st[1] or '0', st[2] or '0', st[3] or '0', st[4] or '0'}
out[6] = fmt(redis.call('ZCARD', KEYS[4]))
out[7] = fmt(redis.call('ZCARD', KEYS[6]))
out[8] = fmt(redis.call('ZCARD', KEYS[7]))
out[9] = st[5] or '0'
for _, key in ipairs({KEYS[4], KEYS[6], KEYS[7]}) do
  for _, m in ipairs(redis.call('ZRANGE', key, 0, tonumber(ARGV[1]) - 1)) do
    out[#out + 1] = m
    out[#out + 1] = redis.call('HGET', KEYS[2], string.sub(m, 3)) or ''
  end
end
return out
