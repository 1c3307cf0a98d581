-- deductmany.lua: take every line of a cart whose items share one hash tag, or none, in one
-- script (items of one group live in one Redis Cluster slot).
--
-- KEYS: six per item, in the order of the lines: item hash, ledger hash, user hash, outbox zset,
-- holds zset, sold-out filter
-- ARGV[1] per-user limit (0 = none), ARGV[2] '1' to queue events, ARGV[3] kind 'D' or 'H',
-- ARGV[4] hold time to live in ms, ARGV[5] the cart id, ARGV[6] user ('' for none),
-- ARGV[7...] one quantity per line
-- Reply: three integers per line: code, remaining, qty. Either every line is OK (taken), every
-- line is REPLAY (the cart was taken before: every line has this cart's entry, same kind,
-- quantity and user; for deducts even one restored since), or nothing was taken and the lines
-- that refused
-- carry their code (the others OK-but-not-taken carry code UNTAKEN).
--
-- Every line is read and checked (entries parsed, counters checked) before the first write. The
-- writes: first each item's due holds are released (at most 64 per item, and the cart id's own
-- hold when it is one of them: that line is then answered as expired), whatever the answer;
-- then, if every line can be taken, the takes.
local limit, queue, kind, ttl, id, u = tonumber(ARGV[1]), ARGV[2] == '1', ARGV[3], tonumber(ARGV[4]), ARGV[5], ARGV[6]
local now = now_ms()
local n = (#ARGV - 6)
local cf = (kind == 'H') and 'h' or 's'
local out, plan, mine = {}, {}, {}
local refused, replays = false, 0
for i = 1, n do
  local K = {KEYS[6 * i - 5], KEYS[6 * i - 4], KEYS[6 * i - 3], KEYS[6 * i - 2], KEYS[6 * i - 1], KEYS[6 * i]}
  local q = tonumber(ARGV[6 + i])
  local st = redis.call('HMGET', K[1], 'a', 'c', 'n', cf, 'q', 'b')
  local avail = int(st[1], 'available count')
  local nd = int(st[3], 'next deadline')
  local count = int(st[4], (kind == 'H') and 'held count' or 'sold count') or 0
  local seq = int(st[5], 'outbox sequence') or 0
  int(st[6], 'sold-out filter size') -- remember uses it after the writes
  local e = redis.call('HGET', K[2], id)
  local also
  if e then
    local k, s, _, _, _, _, d = parse(e, id)
    if due_hold(k, s, d, now) then
      also = {{id, e}}
    end
  end
  local x
  if avail and ((nd and nd <= now) or also) then
    x = plan_expiry(K, now, 64, also)
    if x.full and st[2] ~= '1' and (avail + x.freed < q or (u ~= '' and limit > 0 and
        (user_units(redis.call('HGET', K[3], u), u) or 0) - (x.users[u] or 0) + q > limit)) then
      x = plan_expiry(K, now, MAX_EXPIRY, also) -- see deduct.lua: a refusal must not depend on it
    end
    avail = avail + x.freed
    if kind == 'H' then
      count = count - x.freed
    end
    if also then
      e = with_state(e, 'e')
    end
  end
  local code, rem, nq = UNTAKEN, avail or 0, q
  if e then
    code, rem, nq = answer_known(e, kind, q, u, rem)
    if code == REPLAY then
      replays = replays + 1
    end
    local ek, _, eq, ea, _, eu = parse(e, id)
    if ek == kind and eq == q and eu == u then
      mine[#mine + 1] = ea -- this cart's line, whatever happened to it since
    end
  else
    code = item_refusal(avail, st[2] == '1') or UNTAKEN
    if u ~= '' then
      local have = user_units(redis.call('HGET', K[3], u), u) or 0
      have = have - ((x and x.users[u]) or 0)
      if have < 0 then
        have = 0
      end
      if code == UNTAKEN and limit > 0 and have + q > limit then
        code, nq = USERLIMIT, have
      end
    end
    if code == UNTAKEN and avail < q then
      code = SHORT
    end
  end
  if code ~= UNTAKEN and code ~= REPLAY then
    refused = true
  end
  plan[i] = {K = K, q = q, avail = avail, count = count, seq = seq, b = st[6], x = x}
  out[#out + 1] = code
  out[#out + 1] = rem
  out[#out + 1] = nq
end
-- The writes: the release of due holds first, whatever the answer.
for i = 1, n do
  local _, queued = release(plan[i].K, plan[i].x, queue)
  plan[i].seq = plan[i].seq + queued
end
if kind == 'D' and #mine == n then
  -- Every line is this cart's: the cart was taken, and a retry answers that, even when a line was
  -- restored since. Nothing else is written. (A cart of holds answers its holds' state, as Hold
  -- does: a line expired or cancelled is refused below.)
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
    if out[3 * i - 2] == UNTAKEN then
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
  local after = p.avail - p.q
  redis.call('HSET', p.K[1], 'a', fmt(after), cf, fmt(p.count + p.q), 'q', fmt(p.seq + (queue and 1 or 0)))
  redis.call('HSET', p.K[2], id, entry(kind, state, p.q, after, now, u, deadline))
  if queue then
    redis.call('ZADD', p.K[4], p.seq + 1, event .. id)
  end
  if kind == 'H' then
    redis.call('ZADD', p.K[5], deadline, id)
    next_deadline(p.K[1], p.K[5])
  end
  if u ~= '' then
    redis.call('HINCRBY', p.K[3], u, p.q)
  end
  remember(p.K[6], p.b, id)
  out[3 * i - 2] = OK
  out[3 * i - 1] = after
end
return out
