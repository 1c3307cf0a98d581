-- rerecord.lua: write back ledger entries that Redis lost but the store has, so that a retry of
-- those ids is a replay. Never overwrites an entry. The item's counters are not touched here
-- (the adjust that follows counts what was written back); a sale's units are counted for its
-- user again (KEYS[4]), since a failover that lost the entry lost them too: a later restore of
-- it gives them back.
--
-- KEYS[1] ledger hash, KEYS[2] item hash, KEYS[3] sold-out filter, KEYS[4] user hash (optional)
-- ARGV[...] pairs: id, entry
-- Reply: the number of entries written, and the units of the restocks and of the sales (deducts
-- and confirmed holds, applied) among them: the adjust that follows counts them as loaded and as
-- sold, since a failover that lost them lost their counts too.
local n, restocked, sold = 0, 0, 0
local b = KEYS[2] and redis.call('HGET', KEYS[2], 'b')
int(b, 'sold-out filter size') -- checked before the first write: remember uses it after it
local what, qtys, users = {}, {}, {}
for i = 1, #ARGV, 2 do
  local k, s, q, _, _, u = parse(ARGV[i + 1], ARGV[i])
  if s == 'a' and k == 'L' then
    what[i] = 'restock'
  elseif s == 'a' and (k == 'D' or k == 'H') then
    what[i] = 'sale'
    if KEYS[4] and u ~= '' then
      int(redis.call('HGET', KEYS[4], u), 'units of user ' .. u)
      users[i] = u
    end
  end
  qtys[i] = q
end
for i = 1, #ARGV, 2 do
  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then
    n = n + 1
    if what[i] == 'restock' then
      restocked = restocked + qtys[i]
    elseif what[i] == 'sale' then
      sold = sold + qtys[i]
      if users[i] then
        redis.call('HINCRBY', KEYS[4], users[i], qtys[i])
      end
    end
    remember(KEYS[3], b, ARGV[i])
  end
end
return {n, restocked, sold}
