-- sweep.lua: release holds past their deadline, at most ARGV[1] of them.
--
-- KEYS[1] item hash, KEYS[2] ledger hash, KEYS[3] user hash, KEYS[4] outbox zset, KEYS[5] holds zset
-- ARGV[1] most holds to release, ARGV[2] '1' to queue events in the outbox
-- Reply: units released, 1 if more holds are past their deadline (call again), else 0
-- The holds are read and checked before the first write: a corrupt entry among them is an
-- error that names it, and nothing is released.
local now = now_ms()
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {0, 0}
end
local freed = release(KEYS, plan_expiry(KEYS, now, tonumber(ARGV[1])), ARGV[2] == '1')
local more = redis.call('ZCOUNT', KEYS[5], '-inf', now) > 0 and 1 or 0
return {freed, more}
