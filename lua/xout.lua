-- xout.lua: the first half of a transfer of stock between two buckets of one item (see
-- bucket.go): take up to ARGV[3] units from this bucket, the donor, for transfer ARGV[1], once.
-- The units leave the donor's available count and its net transferred count t (units moved in
-- less units moved out), so that available + held + sold - t stays the bucket's loaded count;
-- the transfer is recorded in the donor's transfers hash and in its set of transfers in flight
-- until xdone.lua, after xin.lua has added the units to the target.
--
-- The entry records the donor's outbox sequence q at this moment (the last event it wrote):
-- the units taken may be ones that the donor's events up to it gave back (a restock, a restore),
-- so xin.lua makes the target's later events wait for them at the relay (a barrier).
--
-- KEYS[1] item hash (the donor), KEYS[2] transfers hash, KEYS[3] transfers in flight (zset)
-- ARGV[1] transfer id, ARGV[2] the target bucket's index, ARGV[3] units wanted, ARGV[4] the
--         fewest units worth moving (nothing is taken below it)
-- Reply: code, units taken, available left, the donor's sequence recorded with the transfer
--   OK taken; REPLAY the transfer took its units already (units taken and sequence then); SHORT
--   fewer than ARGV[4] available (nothing written); NOTLOADED no such bucket; CONFLICT the id
--   names another transfer.
-- Transfers hash entry: "O|target|units|at_ms|seq" (out) or "I|donor|units|at_ms" (in).
local tid, target, want, least = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local st = redis.call('HMGET', KEYS[1], 'a', 't', 'q')
local avail = int(st[1], 'available count')
int(st[2], 'transferred count')
local seq = int(st[3], 'outbox sequence') or 0
local x = redis.call('HGET', KEYS[2], tid)
if x then
  local dir, other, k, xseq = parse_transfer(x, tid)
  if dir ~= 'O' or other ~= target then
    return {CONFLICT, 0, avail or 0, 0}
  end
  return {REPLAY, k, avail or 0, xseq}
end
if not avail then
  return {NOTLOADED, 0, 0, 0}
end
local k = math.min(want, avail)
if k < least or k <= 0 then
  return {SHORT, 0, avail, 0}
end
redis.call('HINCRBY', KEYS[1], 'a', -k)
redis.call('HINCRBY', KEYS[1], 't', -k)
redis.call('HSET', KEYS[2], tid, 'O|' .. target .. '|' .. fmt(k) .. '|' .. fmt(now) .. '|' .. fmt(seq))
redis.call('ZADD', KEYS[3], now, tid)
return {OK, k, avail - k, seq}
