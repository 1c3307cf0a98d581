-- rerecord.lua: write back ledger entries that Redis lost but the store has, so that a retry of
-- those ids is a replay. Never overwrites an entry. The counters are not touched: whether they
-- lost the entries' effect too (a failover) or not (a ledger key lost alone) is what the
-- reconciler's drift tells, and its adjust repairs.
--
-- KEYS[1] ledger hash, KEYS[2] item hash, KEYS[3] sold-out filter
-- ARGV[...] pairs: id, entry
-- Reply: the number of entries written, and the units of the restocks and of the sales (deducts
-- and confirmed holds, applied) among them: the adjust that follows counts them as loaded and as
-- sold, since a failover that lost them lost their counts too.
local n, restocked, sold = 0, 0, 0
local b = KEYS[2] and redis.call('HGET', KEYS[2], 'b')
int(b, 'sold-out filter size') -- checked before the first write: remember uses it after it
local what, qtys = {}, {}
for i = 1, #ARGV, 2 do
  local k, s, q = parse(ARGV[i + 1], ARGV[i])
  if s == 'a' and k == 'L' then
    what[i] = 'restock'
  elseif s == 'a' and (k == 'D' or k == 'H') then
    what[i] = 'sale'
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
    end
    remember(KEYS[3], b, ARGV[i])
  end
end
return {n, restocked, sold}
