-- requeue.lua: queue again the events the outbox lost.
--
-- KEYS[1] item hash, KEYS[2] ledger hash, KEYS[3] user hash, KEYS[4] outbox zset, KEYS[5] holds zset,
-- KEYS[6] dead-letter zset, KEYS[7] published zset (an event set aside in the dead-letter set or
-- handed to a publisher and awaiting its consumer is not lost: it is not queued again)
-- ARGV[...] ids: an id in state reserved whose 'D:' event is missing gets it again; an id that
-- was restored or refused gets its 'R:' event again if it is missing (the caller passes only
-- ids the store has applied).
-- Reply: the number of events queued.
int(redis.call('HGET', KEYS[1], 'q'), 'outbox sequence') -- checked before queue_event's first write
local n = 0
for _, id in ipairs(ARGV) do
  local e = redis.call('HGET', KEYS[2], id)
  if e then
    local s = string.sub(e, 2, 2)
    local k = string.sub(e, 1, 1)
    local ev
    if s == 'r' and k ~= 'L' then
      ev = 'D:'
    elseif s == 'r' then
      ev = 'L:'
    elseif (s == 'x' or s == 'f') and k ~= 'T' then
      ev = 'R:'
    end
    if ev and not redis.call('ZSCORE', KEYS[4], ev .. id) and not redis.call('ZSCORE', KEYS[6], ev .. id)
        and not redis.call('ZSCORE', KEYS[7], ev .. id) then
      queue_event(KEYS, ev, id)
      n = n + 1
    end
  end
end
return n
