-- route.lua: the buckets of request ids on a bucketed item (see bucket.go). The first request
-- of an id claims a bucket for it in the claims hash of the id's home bucket; every later one
-- gets that bucket, so an id lives in one bucket whoever sends it. One call answers the claims
-- of many requests whose ids share a home bucket (coalesced, see coalesce.go), in order: a
-- later pair of an id claimed by an earlier pair of the same call gets the earlier claim.
--
-- KEYS[1] claims hash (in the ids' home bucket)
-- ARGV pairs: id, the claim the request would make ("<bucket>", or "<bucket>r" for a give-back)
-- Reply: one claim per pair, in order: the id's claim (the pair's own when this call made it)
-- Every pair is checked before the first write: a bad one refuses the call, which writes nothing.
local n = #ARGV
if n == 0 or n % 2 ~= 0 then
  return redis.error_reply('ERR stock: route wants id/claim pairs')
end
for i = 1, n, 2 do
  if ARGV[i] == '' or not string.match(ARGV[i + 1], '^%d+r?$') then
    return redis.error_reply('ERR stock: route: bad claim pair')
  end
end
local out = {}
for i = 1, n, 2 do
  local b = redis.call('HGET', KEYS[1], ARGV[i])
  if not b then
    b = ARGV[i + 1]
    redis.call('HSET', KEYS[1], ARGV[i], b)
  end
  out[#out + 1] = b
end
return out
