-- claim.lua: lease up to ARGV[1] due outbox events of one item to a relay.
--
-- KEYS[1] outbox zset ("<event>:<id>" -> due ms), KEYS[2] ledger hash, KEYS[3] attempts hash
-- ARGV[1] most events to claim, ARGV[2] lease in ms
-- Reply: flat strings, three per event: member, ledger entry ('' if the entry is gone), attempts
--
-- A claimed event's due time moves to now + lease: no other relay sees it until the lease runs
-- out, so a relay that dies holding it only delays it. Attempts count every claim.
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local out = {}
if #due == 0 then
  return out
end
local lease = now + tonumber(ARGV[2])
local z = {}
for _, m in ipairs(due) do
  z[#z + 1] = lease
  z[#z + 1] = m
  local id = string.sub(m, 3)
  out[#out + 1] = m
  out[#out + 1] = redis.call('HGET', KEYS[2], id) or ''
  out[#out + 1] = fmt(redis.call('HINCRBY', KEYS[3], m, 1))
end
redis.call('ZADD', KEYS[1], 'XX', unpack(z))
return out
