-- delist.lua: close an item for good and stamp when (d, ms). The reconciler retires it (removes
-- its keys) once the retention has passed and Redis agrees with the store. A delisted item stays
-- closed: close.lua refuses to reopen it, and retire.lua removes only a closed, delisted item.
--
-- KEYS[1] item hash
-- Reply: code (OK, REPLAY when already delisted, NOTLOADED), the delisting time (ms)
if not redis.call('HGET', KEYS[1], 'a') then
  return {NOTLOADED, 0}
end
local d = redis.call('HGET', KEYS[1], 'd')
if d then
  return {REPLAY, tonumber(d)}
end
local now = now_ms()
redis.call('HSET', KEYS[1], 'c', '1', 'd', fmt(now))
return {OK, now}
