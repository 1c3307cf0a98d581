-- confirm.lua: make a live hold final (sold), once, and queue it for the store.
--
-- KEYS[1] item hash, KEYS[2] ledger hash, KEYS[3] user hash, KEYS[4] outbox zset, KEYS[5] holds zset
-- ARGV[1] id, ARGV[2] '1' to queue events in the outbox, ARGV[3] '1' when the store has the
-- confirm already (the reconciler, after Redis lost it): the hold is made final whatever its
-- deadline, as applied, with no event
-- Reply: code, remaining available, qty
--   OK confirmed; REPLAY already confirmed; EXPIRED past its deadline (the hold is released now,
--   as the sweep would have); RESTORED cancelled; UNKNOWN no such hold; CONFLICT not a hold.
--
-- Like deduct.lua, every call but the reconciler's (ARGV[3], which queues no events) first
-- releases the item's other holds past their deadline (at most 64). Everything is read and
-- checked before the first write.
local id, queue, stored = ARGV[1], ARGV[2] == '1', ARGV[3] == '1'
local now = now_ms()
local h, reply = hold_call(KEYS, id, now, REPLAY, stored, queue)
if not h then
  return reply
end
local e, q, avail = h.e, h.q, h.avail
redis.call('HINCRBY', KEYS[1], 'h', -q)
redis.call('ZREM', KEYS[5], id)
next_deadline(KEYS[1], KEYS[5])
redis.call('HINCRBY', KEYS[1], 's', q)
if stored then
  redis.call('HSET', KEYS[2], id, with_state(e, 'a'))
  return {OK, avail, q}
end
redis.call('HSET', KEYS[2], id, with_state(e, 'r'))
if queue then
  queue_event(KEYS, 'D:', id)
end
return {OK, avail, q}
