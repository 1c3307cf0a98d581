-- trim.lua: remove settled ledger entries older than a cutoff.
--
-- KEYS[1] ledger hash, KEYS[2] outbox zset, KEYS[3] published zset (optional), KEYS[4]
-- dead-letter zset (optional): an event in any of them is not delivered yet
-- ARGV[1] cutoff (ms), ARGV[2...] candidate ids
-- An entry is settled when it is applied, restored, refused, cancelled, expired or a tombstone,
-- and no event of it is pending. Its age counts from its last field when that is later than its
-- time: a hold's deadline (a hold settles at the latest then), or when a sale was given back
-- (restore.lua writes it): an entry that lived longer than the retention is kept for the
-- retention after it settled. Reply: the number of entries removed.
-- Every candidate is read and parsed before the first removal.
local cutoff = tonumber(ARGV[1])
local gone = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  local e = redis.call('HGET', KEYS[1], id)
  if e then
    local _, s, _, _, t, _, d = parse(e, id)
    if math.max(t, d) < cutoff and (s == 'a' or released(s)) then
      local pending = false
      for _, key in ipairs(KEYS) do
        if key ~= KEYS[1] then
          for _, ev in ipairs({'D:', 'R:', 'L:', 'H:', 'X:', 'E:'}) do
            if redis.call('ZSCORE', key, ev .. id) then
              pending = true
            end
          end
        end
      end
      if not pending then
        gone[#gone + 1] = id
      end
    end
  end
end
if #gone == 0 then
  return 0
end
return redis.call('HDEL', KEYS[1], unpack(gone))
