-- refresh.lua: extend a lease only if it is still ours.
--
-- KEYS[1] lease key, ARGV[1] our token, ARGV[2] new time to live in ms
-- Reply: 1 extended, 0 not ours
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
end
return 0
