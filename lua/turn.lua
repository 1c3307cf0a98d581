-- turn.lua: may a consumer apply an item's event now? Used by Consume on the queue path, before
-- it applies an event to the store. An item's events must reach the store in their sequence:
-- a queue that redelivers after a consumer crash may hand over a later event first, and the
-- store would refuse a deduct whose stock an earlier restore gives back.
--
-- KEYS[1] outbox zset, KEYS[2] published zset, KEYS[3] relay lease
-- ARGV[1] the event's sequence
-- Reply: 0 go ahead; 1 an earlier event the store applies (D, R or L) is still in the outbox or
-- the published set: not applied yet, hold this one back; 2 a reconcile pass holds the item
-- (it compares the store with Redis and needs the store still): hold it back.
local holder = redis.call('GET', KEYS[3])
if holder and string.sub(holder, 1, 10) == 'reconcile-' then
  return 2
end
local seq = tonumber(ARGV[1])
for _, key in ipairs({KEYS[2], KEYS[1]}) do
  -- Events the store ignores (H, X, E) do not count; 64 of them in a row before a later event
  -- hold it back all the same (they leave the outbox as soon as a relay publishes them).
  local ms = redis.call('ZRANGEBYSCORE', key, '-inf', '(' .. fmt(seq), 'LIMIT', 0, 64)
  for _, m in ipairs(ms) do
    local ev = string.sub(m, 1, 1)
    if ev == 'D' or ev == 'R' or ev == 'L' then
      return 1
    end
  end
  if #ms == 64 then
    return 1
  end
end
return 0
