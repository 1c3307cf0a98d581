-- xin.lua: the second half of a transfer (see xout.lua): add the units transfer ARGV[1] took
-- from the donor to this bucket, the target, once.
--
-- On its first application, when the donor had written events before it took the units
-- (ARGV[4] > 0), it also sets a barrier in the target: the target's sequence q moves on by one,
-- and the barriers zset gets "<donor>|<donor seq>|<tid>" scored by it. The target's events
-- written after (a higher sequence) may spend units the donor's events up to donor seq gave
-- back (a restock, a restore): the relay hands them to the store only once those are delivered
-- (relay.go), so that the store never refuses a sale Redis acknowledged for want of them. A
-- replay writes nothing.
--
-- KEYS[1] item hash (the target), KEYS[2] transfers hash, KEYS[3] barriers (zset)
-- ARGV[1] transfer id, ARGV[2] the donor bucket's index, ARGV[3] units, ARGV[4] the donor's
--         sequence recorded by xout.lua (0: none)
-- Reply: code, units added, available after
--   OK added; REPLAY added already; NOTLOADED no such bucket (nothing written: the transfer stays
--   in flight in the donor); CONFLICT the id names another transfer.
local tid, donor, k = ARGV[1], ARGV[2], tonumber(ARGV[3])
local dseq = int(ARGV[4], 'donor sequence')
if not dseq or dseq < 0 then
  error('stock: xin: donor sequence missing or negative')
end
local now = now_ms()
local st = redis.call('HMGET', KEYS[1], 'a', 't', 'q')
local avail = int(st[1], 'available count')
int(st[2], 'transferred count')
int(st[3], 'outbox sequence')
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
if dseq > 0 then
  redis.call('ZADD', KEYS[3], redis.call('HINCRBY', KEYS[1], 'q', 1), donor .. '|' .. fmt(dseq) .. '|' .. tid)
end
return {OK, k, avail}
