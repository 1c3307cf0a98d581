-- rerecord.lua: write back ledger entries that Redis lost but the store has, so that a retry of
-- those ids is a replay. Never overwrites an entry.
--
-- KEYS[1] ledger hash
-- ARGV[...] pairs: id, entry
-- Reply: the number of entries written.
local n = 0
for i = 1, #ARGV, 2 do
  n = n + redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
end
return n
