-- extend.lua: move a live hold's deadline to now + ARGV[2] ms.
--
-- KEYS[1] item hash, KEYS[2] ledger hash, KEYS[3] user hash, KEYS[4] outbox zset, KEYS[5] holds zset
-- ARGV[1] id, ARGV[2] time to live in ms, ARGV[3] '1' to queue events in the outbox
-- Reply: code, remaining available, qty
--   OK extended; EXPIRED past its deadline (released now); CONFIRMED already confirmed;
--   RESTORED cancelled; UNKNOWN no such hold; CONFLICT not a hold.
--
-- Like deduct.lua, every call first releases the item's other holds past their deadline (at
-- most 64). Everything is read and checked before the first write.
local id, ttl, queue = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1'
local now = now_ms()
local h, reply = hold_call(KEYS, id, now, CONFIRMED, false, queue)
if not h then
  return reply
end
local nd = now + ttl
redis.call('HSET', KEYS[2], id, entry('H', 'h', h.q, h.a, h.t, h.u, nd))
redis.call('ZADD', KEYS[5], nd, id)
next_deadline(KEYS[1], KEYS[5])
return {OK, h.avail, h.q}
