-- xin.lua: the second half of a transfer (see xout.lua): add the units transfer ARGV[1] took
-- from the donor to this bucket, the target, once.
--
-- KEYS[1] item hash (the target), KEYS[2] transfers hash
-- ARGV[1] transfer id, ARGV[2] the donor bucket's index, ARGV[3] units
-- Reply: code, units added, available after
--   OK added; REPLAY added already; NOTLOADED no such bucket (nothing written: the transfer stays
--   in flight in the donor); CONFLICT the id names another transfer.
local tid, donor, k = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = now_ms()
local st = redis.call('HMGET', KEYS[1], 'a', 't')
local avail = int(st[1], 'available count')
int(st[2], 'transferred count')
local x = redis.call('HGET', KEYS[2], tid)
if x then
  local dir, other, xk = parse_transfer(x, tid)
  if dir ~= 'I' or other ~= donor or xk ~= k then
    return {CONFLICT, 0, avail or 0}
  end
  return {REPLAY, k, avail or 0}
end
if not avail then
  return {NOTLOADED, 0, 0}
end
avail = redis.call('HINCRBY', KEYS[1], 'a', k)
redis.call('HINCRBY', KEYS[1], 't', k)
redis.call('HSET', KEYS[2], tid, 'I|' .. donor .. '|' .. fmt(k) .. '|' .. fmt(now))
return {OK, k, avail}
