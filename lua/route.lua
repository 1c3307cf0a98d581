-- route.lua: the bucket of a request id on a bucketed item (see bucket.go). The first request
-- of an id claims a bucket for it in the claims hash of the id's home bucket; every later one
-- gets that bucket, so an id lives in one bucket whoever sends it.
--
-- KEYS[1] claims hash (in the id's home bucket)
-- ARGV[1] id, ARGV[2] the bucket the request would go to
-- Reply: the id's bucket (ARGV[2] when this call claimed it)
local b = redis.call('HGET', KEYS[1], ARGV[1])
if b then
  return b
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return ARGV[2]
