-- deductmany.lua: take every line of a cart whose items share one hash tag, or none, in one
-- script (items of one group live in one Redis Cluster slot).
--
-- KEYS: six per item, in the order of the lines: item hash, ledger hash, user hash, outbox zset,
-- holds zset, sold-out filter
-- ARGV[1] per-user limit (0 = none), ARGV[2] '1' to queue events, ARGV[3] kind 'D' or 'H',
-- ARGV[4] hold time to live in ms, ARGV[5] the cart id, ARGV[6] user ('' for none),
-- ARGV[7...] one quantity per line
-- Reply: three integers per line: code, remaining, qty. Either every line is OK (taken), every
-- line is REPLAY (the cart was taken before: every line has this cart's entry, even one restored
-- or expired since), or nothing was written and the lines that refused
-- carry their code (the others OK-but-not-taken carry code -1).
local limit, queue, kind, ttl, id, u = tonumber(ARGV[1]), ARGV[2] == '1', ARGV[3], tonumber(ARGV[4]), ARGV[5], ARGV[6]
local now = now_ms()
local n = (#ARGV - 6)
local out, plan, mine = {}, {}, {}
local refused, replays = false, 0
for i = 1, n do
  local K = {KEYS[6 * i - 5], KEYS[6 * i - 4], KEYS[6 * i - 3], KEYS[6 * i - 2], KEYS[6 * i - 1], KEYS[6 * i]}
  local q = tonumber(ARGV[6 + i])
  local cf = (kind == 'H') and 'h' or 's'
  local st = redis.call('HMGET', K[1], 'a', 'c', 'n', cf, 'q', 'b')
  if st[1] and st[3] and tonumber(st[3]) <= now then
    expire_holds(K, now, 64, queue)
    st = redis.call('HMGET', K[1], 'a', 'c', 'n', cf, 'q', 'b')
  end
  local avail = tonumber(st[1])
  local code, rem, nq = -1, avail or 0, q
  local e = redis.call('HGET', K[2], id)
  if e then
    code, rem, nq = answer_known(e, kind, q, u, rem)
    if code == REPLAY then
      replays = replays + 1
    end
    local ek, _, eq, ea, _, eu = parse(e)
    if ek == kind and eq == q and eu == u then
      mine[#mine + 1] = ea -- this cart's line, whatever happened to it since
    end
  else
    code = item_refusal(avail, st[2] == '1') or -1
    if code == -1 and u ~= '' and limit > 0 then
      local have = tonumber(redis.call('HGET', K[3], u)) or 0
      if have + q > limit then
        code, nq = USERLIMIT, have
      end
    end
    if code == -1 and avail < q then
      code = SHORT
    end
  end
  if code ~= -1 and code ~= REPLAY then
    refused = true
  end
  plan[i] = {K = K, q = q, avail = avail, st = st, cf = cf}
  out[#out + 1] = code
  out[#out + 1] = rem
  out[#out + 1] = nq
end
if #mine == n then
  -- Every line is this cart's (same kind, quantity and user): the cart was taken, and a retry
  -- answers that, even when a line was restored or expired since. Nothing is written.
  for i = 1, n do
    out[3 * i - 2], out[3 * i - 1] = REPLAY, mine[i]
  end
  return out
end
if refused or replays == n then
  return out
end
if replays > 0 then
  -- Some lines taken, others not: not a cart this script wrote. Refuse as a conflict.
  for i = 1, n do
    if out[3 * i - 2] == -1 then
      out[3 * i - 2] = CONFLICT
    end
  end
  return out
end
local state = (kind == 'H') and 'h' or 'r'
local deadline = (kind == 'H') and (now + ttl) or 0
local event = (kind == 'H') and 'H:' or 'D:'
for i = 1, n do
  local p = plan[i]
  local seq = tonumber(p.st[5]) or 0
  local after = p.avail - p.q
  redis.call('HSET', p.K[1], 'a', fmt(after), p.cf, fmt((tonumber(p.st[4]) or 0) + p.q), 'q', fmt(seq + (queue and 1 or 0)))
  redis.call('HSET', p.K[2], id, entry(kind, state, p.q, after, now, u, deadline))
  if queue then
    redis.call('ZADD', p.K[4], seq + 1, event .. id)
  end
  if kind == 'H' then
    redis.call('ZADD', p.K[5], deadline, id)
    next_deadline(p.K[1], p.K[5])
  end
  if u ~= '' then
    redis.call('HINCRBY', p.K[3], u, p.q)
  end
  remember(p.K[6], p.st[6], id)
  out[3 * i - 2] = OK
  out[3 * i - 1] = after
end
return out
