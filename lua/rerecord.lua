-- rerecord.lua: write back ledger entries that Redis lost but the store has, so that a retry of
-- those ids is a replay. Never overwrites an entry.
--
-- KEYS[1] ledger hash, KEYS[2] item hash, KEYS[3] sold-out filter
-- ARGV[...] pairs: id, entry
-- Reply: the number of entries written.
local n = 0
local b = KEYS[2] and redis.call('HGET', KEYS[2], 'b')
int(b, 'sold-out filter size') -- checked before the first write: remember uses it after it
for i = 1, #ARGV, 2 do
  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then
    n = n + 1
    remember(KEYS[3], b, ARGV[i])
  end
end
return n
