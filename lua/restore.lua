-- restore.lua: give back exactly what one id took, once. Used by Restore, Cancel and the relay
-- when the store refuses a deduct.
--
-- KEYS[1] item hash, KEYS[2] ledger hash, KEYS[3] user hash, KEYS[4] outbox zset, KEYS[5] holds zset,
-- KEYS[6] sold-out filter
-- ARGV[1] id
-- ARGV[2] reason: 'x' restore (a deduct, a confirmed hold or a live hold), 'c' cancel (holds only),
--         'f' refused by the store (a deduct or a confirmed hold)
-- ARGV[3] '1' to queue events in the outbox
-- ARGV[4] optional: the kind ('D' or 'H'), ARGV[5] the quantity and ARGV[6] the user ('' for
--         none) the id must have taken with (carts undo only what they took); an entry that
--         differs is a CONFLICT
-- Reply: code, remaining available, qty
--   OK given back; REPLAY already given back (a hold past its deadline too, released now if no
--   sweep had); UNKNOWN id never taken (a tombstone is left so a
--   late deduct or hold with this id is refused); CONFIRMED cancel of a confirmed hold;
--   CONFLICT the id names something this reason cannot give back; NOTLOADED item keys missing.
local id, reason, queue = ARGV[1], ARGV[2], ARGV[3] == '1'
local now = now_ms()
-- Every value this script may use is read and checked before its first write.
local st = redis.call('HMGET', KEYS[1], 'a', 'h', 's', 'q', 'b')
local avail = int(st[1], 'available count')
int(st[2], 'held count')
int(st[3], 'sold count')
int(st[4], 'outbox sequence')
int(st[5], 'sold-out filter size')
local e = redis.call('HGET', KEYS[2], id)
if not e then
  redis.call('HSET', KEYS[2], id, entry('T', 'x', 0, 0, now, ''))
  remember(KEYS[6], st[5], id)
  return {UNKNOWN, 0, 0}
end
local k, s, q, after, at, u, d = parse(e, id)
if u ~= '' then
  int(redis.call('HGET', KEYS[3], u), 'units of user ' .. u)
end
if k == 'T' then
  return {UNKNOWN, 0, 0}
end
if ARGV[4] and ARGV[4] ~= '' and (k ~= ARGV[4] or q ~= tonumber(ARGV[5]) or u ~= (ARGV[6] or '')) then
  return {CONFLICT, 0, q}
end
if k == 'L' or (reason == 'c' and k ~= 'H') or (reason == 'f' and s == 'h') then
  return {CONFLICT, avail or 0, q}
end
if released(s) then
  return {REPLAY, avail or 0, q}
end
if reason == 'c' and s ~= 'h' then
  return {CONFIRMED, avail or 0, q}
end
if not avail then
  return {NOTLOADED, 0, q}
end
local ev = 'R:'
if s == 'h' then
  redis.call('HINCRBY', KEYS[1], 'h', -q)
  redis.call('ZREM', KEYS[5], id)
  next_deadline(KEYS[1], KEYS[5])
  if d <= now then
    s, ev = 'e', 'E:'
  else
    s, ev = 'c', 'X:'
  end
else
  redis.call('HINCRBY', KEYS[1], 's', -q)
  s = reason
  -- A sale given back settles now: the retention counts from the last field (a hold's deadline,
  -- when it is later; see trim.lua), so a late restore's entry is kept as long as any other's.
  e = entry(k, s, q, after, at, u, math.max(d, now))
end
avail = redis.call('HINCRBY', KEYS[1], 'a', q)
give_user(KEYS[3], u, q)
redis.call('HSET', KEYS[2], id, with_state(e, s))
if queue then
  queue_event(KEYS, ev, id)
end
-- A hold past its deadline had gone back already, whether or not a sweep had got to it: a
-- replay, the answer a released hold gets, however many other holds are due.
return {(s == 'e') and REPLAY or OK, avail, q}
