-- retire.lua: one bounded step of removing a delisted item's keys.
--
-- KEYS[1] item hash, KEYS[2] ledger hash, KEYS[3] user hash, KEYS[4] outbox zset, KEYS[5] holds zset,
-- KEYS[6] dead-letter zset, KEYS[7] attempts hash, KEYS[8] relay lease, KEYS[9] sold-out filter;
-- for a bucket of a split item also KEYS[10] published zset, KEYS[11] transfers hash, KEYS[12]
-- in-flight zset, KEYS[13] claims hash, KEYS[14] transfer barriers zset (deleted with the rest: with
-- no event left anywhere, no barrier holds anything back)
-- ARGV[1] cutoff (ms): the item must have been delisted before it; ARGV[2] most hash fields
-- (ledger entries, and a bucket's transfers and claims) to remove in this step
-- Reply: code, ledger entries removed. OK: the item is retired (its hash keeps only x = '1' and
-- d); REPLAY: call again (more entries); CONFLICT: not retirable now (not delisted long enough,
-- events pending, holds live, dead letters; for a bucket also events published and not applied,
-- transfers in flight); CLOSED: delisted but open for sale (a reopen made before reopening a
-- delisted item was refused): never retired; NOTLOADED: no such item.
--
-- Only a closed, delisted item is ever retired: this script checks it, with the rest, at each
-- step, whatever its caller checked before.
local bucket = #KEYS >= 13
local st = redis.call('HMGET', KEYS[1], 'x', 'a', 'c', 'd')
local d = st[4]
if st[1] == '1' then
  return {OK, 0}
end
if not st[2] then
  return {NOTLOADED, 0}
end
if d and st[3] ~= '1' then
  return {CLOSED, 0}
end
if not d or tonumber(d) > tonumber(ARGV[1]) or redis.call('ZCARD', KEYS[4]) > 0 or
   redis.call('ZCARD', KEYS[5]) > 0 or redis.call('ZCARD', KEYS[6]) > 0 then
  return {CONFLICT, 0}
end
if bucket and (redis.call('ZCARD', KEYS[10]) > 0 or redis.call('ZCARD', KEYS[12]) > 0) then
  return {CONFLICT, 0}
end
-- The hashes of entries go a page at a time: the ledger first, then a bucket's transfers and
-- claims.
local hashes = {KEYS[2]}
if bucket then
  hashes = {KEYS[2], KEYS[11], KEYS[13]}
end
local removed = 0
for _, key in ipairs(hashes) do
  if redis.call('EXISTS', key) == 1 then
    local page = redis.call('HSCAN', key, '0', 'COUNT', tonumber(ARGV[2]))
    local fields = {}
    for i = 1, #page[2], 2 do
      fields[#fields + 1] = page[2][i]
    end
    if #fields > 0 then
      redis.call('HDEL', key, unpack(fields))
    end
    if key == KEYS[2] then
      removed = #fields
    end
    break
  end
end
for _, key in ipairs(hashes) do
  if redis.call('EXISTS', key) == 1 then
    return {REPLAY, removed}
  end
end
redis.call('DEL', KEYS[1], KEYS[3], KEYS[7], KEYS[8], KEYS[9])
if KEYS[14] then
  redis.call('DEL', KEYS[14])
end
redis.call('HSET', KEYS[1], 'x', '1', 'd', d)
return {OK, removed}
