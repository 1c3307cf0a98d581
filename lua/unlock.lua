-- unlock.lua: release a lease only if it is still ours.
--
-- KEYS[1] lease key, ARGV[1] our token
-- Reply: 1 released, 0 not ours
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
