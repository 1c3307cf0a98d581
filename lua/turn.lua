-- turn.lua: what must a consumer apply before an event of an item? Used by Consume on the queue
-- path, before it applies an event to the store. An item's events must reach the store in
-- their sequence: a queue that redelivers after a consumer crash may hand over a later event
-- first, and the store would refuse a deduct whose stock an earlier restore gives back.
--
-- KEYS[1] outbox zset, KEYS[2] published zset, KEYS[3] relay lease, KEYS[4] ledger hash
-- ARGV[1] the event's sequence, ARGV[2] most earlier events to return from each set
-- Reply: flat strings: '2' when a reconcile pass holds the item (it compares the store with
-- Redis and needs the store still: apply nothing); else '0' ('1' when a set had more earlier
-- events than ARGV[2]), then three per earlier event that the store applies (D, R or L) still
-- in the published set or the outbox, not applied yet: member, ledger entry ('' if gone),
-- sequence. The caller applies them first, in sequence. They are always the first of the
-- item's earlier events: when a set has more than ARGV[2], the events of the other set past the
-- last one read from it are left out (applied first, they would overtake the ones not read).
local holder = redis.call('GET', KEYS[3])
if holder and string.sub(holder, 1, 10) == 'reconcile-' then
  return {'2'}
end
local out = {'0'}
local sets, upto = {}, nil
for _, key in ipairs({KEYS[2], KEYS[1]}) do
  local ms = redis.call('ZRANGEBYSCORE', key, '-inf', '(' .. ARGV[1], 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
  if #ms == 2 * tonumber(ARGV[2]) then
    out[1] = '1'
    local last = tonumber(ms[#ms])
    if not upto or last < upto then
      upto = last
    end
  end
  sets[#sets + 1] = ms
end
for _, ms in ipairs(sets) do
  for i = 1, #ms, 2 do
    local m = ms[i]
    local ev = string.sub(m, 1, 1)
    local seq = tonumber(ms[i + 1])
    if (ev == 'D' or ev == 'R' or ev == 'L') and (not upto or seq <= upto) then
      out[#out + 1] = m
      out[#out + 1] = redis.call('HGET', KEYS[4], string.sub(m, 3)) or ''
      out[#out + 1] = fmt(seq)
    end
  end
end
return out
