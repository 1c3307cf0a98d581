-- extend.lua: move a live hold's deadline to now + ARGV[2] ms.
--
-- KEYS[1] item hash, KEYS[2] ledger hash, KEYS[3] user hash, KEYS[4] outbox zset, KEYS[5] holds zset
-- ARGV[1] id, ARGV[2] time to live in ms, ARGV[3] '1' to queue events in the outbox
-- Reply: code, remaining available, qty
--   OK extended; EXPIRED past its deadline (released now); CONFIRMED already confirmed;
--   RESTORED cancelled; UNKNOWN no such hold; CONFLICT not a hold.
local id, ttl, queue = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1'
local now = now_ms()
local e = redis.call('HGET', KEYS[2], id)
if not e then
  return {UNKNOWN, 0, 0}
end
local k, s, q, b, a, t, u, d = parse(e)
local avail = tonumber(redis.call('HGET', KEYS[1], 'a'))
if k ~= 'H' then
  return {CONFLICT, avail or 0, q}
end
if s == 'r' or s == 'a' then
  return {CONFIRMED, avail or 0, q}
elseif s == 'e' then
  return {EXPIRED, avail or 0, q}
elseif s ~= 'h' then
  return {RESTORED, avail or 0, q}
end
if not avail then
  return {NOTLOADED, 0, q}
end
if d <= now then
  local freed = expire_holds(KEYS, now, 64, queue)
  return {EXPIRED, avail + freed, q}
end
local nd = now + ttl
redis.call('HSET', KEYS[2], id, entry(k, s, q, b, a, t, u, nd))
redis.call('ZADD', KEYS[5], nd, id)
next_deadline(KEYS[1], KEYS[5])
return {OK, avail, q}
