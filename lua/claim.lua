-- claim.lua: lease an item's outbox to one relay and return the oldest events.
--
-- KEYS[1] outbox zset ("<event>:<id>" -> sequence), KEYS[2] ledger hash,
-- KEYS[3] attempts hash, KEYS[4] relay lease (string: holder token, with a TTL)
-- ARGV[1] most events to return, ARGV[2] lease in ms, ARGV[3] the relay's token
-- Reply: flat strings, four per event, oldest first: member, ledger entry ('' if the entry is
-- gone), attempts, sequence (the member's score: the event's place in the item's sequence).
-- When another holder has the lease and the outbox has events: two strings, the holder's kind
-- ('b' a backoff, 'l' another relay or a reconcile pass) and the lease's remaining ms, so the
-- relay knows when to look again.
--
-- One relay at a time drains an item, in order, so the store sees an item's events in the order
-- they happened. The lease runs out if the relay dies (its events are then delivered again by
-- the next relay) or when a backoff set after a failure ends.
local holder = redis.call('GET', KEYS[4])
if holder and holder ~= ARGV[3] then
  if redis.call('ZCARD', KEYS[1]) == 0 then
    return {}
  end
  local kind = 'l'
  if holder == 'backoff' then
    kind = 'b'
  end
  return {kind, fmt(redis.call('PTTL', KEYS[4]))}
end
local ms = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
if #ms == 0 then
  if holder then
    redis.call('DEL', KEYS[4])
  end
  return {}
end
redis.call('SET', KEYS[4], ARGV[3], 'PX', tonumber(ARGV[2]))
local out = {}
for i = 1, #ms, 2 do
  local m = ms[i]
  out[#out + 1] = m
  out[#out + 1] = redis.call('HGET', KEYS[2], string.sub(m, 3)) or ''
  out[#out + 1] = fmt(redis.call('HINCRBY', KEYS[3], m, 1))
  out[#out + 1] = fmt(tonumber(ms[i + 1]))
end
return out
