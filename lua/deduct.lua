-- deduct.lua: take stock for one or more requests on one item, exactly once per id.
-- Used by Deduct and Hold; several waiting requests for one item may share one call.
--
-- KEYS[1] item hash, KEYS[2] ledger hash, KEYS[3] user hash, KEYS[4] outbox zset, KEYS[5] holds zset,
-- KEYS[6] sold-out filter
-- ARGV[1] per-user limit (0 = none)
-- ARGV[2] '1' to queue events in the outbox
-- ARGV[3] kind: 'D' deduct (sold at once) or 'H' hold (held until now + ARGV[4] ms)
-- ARGV[4] hold time to live in ms ('0' for deducts)
-- ARGV[5] the caller's estimate of this server's clock in ms, or '' (see below)
-- ARGV[6...] four values per request: id, qty, user ('' for none), retry ('1' when the caller
--           retries after an unknown outcome: a refusal for lack of stock is then recorded as a
--           tombstone "Tf" with the stock available then, so that the earlier attempt, if it
--           arrives later, and every repeat are refused too, as sold out or insufficient as this
--           call was)
-- Reply: three integers per request: code, remaining available, qty (units of the user for code 7)
--
-- A new id is checked in this order: not loaded, closed, sold out (nothing available), per-user
-- limit, insufficient. Sold out comes before the limit so that the in-process sold-out answer
-- (fastpath.go) is the answer this script would give.
--
-- Every read is checked (entries parsed, counters checked) before the first write; the writes of
-- the whole call are grouped at the end: the release of the item's due holds (at most 64, or
-- MAX_EXPIRY when a request could otherwise be refused for stock or its user's limit, and every
-- hold an id of the call names: such an id is answered as expired), then the takes. The common
-- call of one request that is taken writes its entry with HSETNX first (see below).
--
-- Commands of that common call (a plain item, a new id, taken, events queued): HMGET of the
-- item, HSETNX of the entry, HSET of the counters, ZADD of the event: 4, one fewer than the
-- ledger-hash script (HEXISTS, GET, SET, TIME, HSET); with a buyer 5 (HINCRBY of its units).
-- That call reads Redis's clock (TIME) only when the item has a live hold, whose deadline it
-- must compare with the clock holds are judged on; otherwise its entry records ARGV[5], the
-- Reserver's estimate of this clock (its own plus their difference, measured with TIME at most
-- a second before; clock.go), when it is a time at all (else it reads TIME). A hold adds TIME, ZADD to the holds
-- and the ZRANGE and HSET of next_deadline; an item with a sold-out filter adds two SETBITs.
-- What each costs: docs/benchmarks.md, "Choosing a stored layout" (stockbench -layouts).
local limit, queue, kind, ttl = tonumber(ARGV[1]), ARGV[2] == '1', ARGV[3], tonumber(ARGV[4])
local hold = kind == 'H'
local pre = 5 -- the values before the requests'
local cf = hold and 'h' or 's' -- the counter this kind of request moves
local st = redis.call('HMGET', KEYS[1], 'a', 'c', 'n', cf, 'q', 'b', 'bc')
local avail = int(st[1], 'available count')
local closed = st[2] == '1'
local nd = int(st[3], 'next deadline')
local count = int(st[4], hold and 'held count' or 'sold count') or 0
local seq = int(st[5], 'outbox sequence') or 0
int(st[6], 'sold-out filter size') -- remember and filter_step use them after the writes
int(st[7], 'sold-out filter scan cursor')
-- Redis's clock, read only when a hold's deadline is set or compared with it (the general way
-- reads it too): nil in the common call of a deduct on an item with no live hold.
local now = (hold or nd) and now_ms() or nil
local state = hold and 'h' or 'r'
local deadline = hold and (now + ttl) or 0
local event = hold and 'H:' or 'D:'

local nreq = (#ARGV - pre) / 4

-- The common call: one request, on a loaded, open item with no hold due, that has the stock and
-- whose buyer (if any) is within the limit: if its id is new it is taken. HSETNX writes the entry
-- only when the id is new, and says whether it was: one command where the ledger's read and
-- write were two. The item's counters are read and checked before it.
--
-- A buyer's units are added with HINCRBY before the entry is written, and the add is undone
-- (HINCRBY -q, or HDEL when the buyer had none) when the call goes the general way after all:
-- when the units were not an integer (HINCRBY refuses and writes nothing: the general way raises
-- the error), below zero or past MaxQty (the general way answers or raises the error), past
-- the limit, or when the id is in the ledger (HSETNX writes
-- nothing). The script is atomic: nobody sees the add and its undo. An id the ledger has goes
-- the general way below, which answers it as before.
if nreq == 1 and avail and not closed and avail > 0 and not (nd and nd <= now) and avail >= tonumber(ARGV[pre + 2]) then
  local id, q, u = ARGV[pre + 1], tonumber(ARGV[pre + 2]), ARGV[pre + 3]
  local have, ok = 0, true
  if u ~= '' then
    local v = redis.pcall('HINCRBY', KEYS[3], u, q)
    if type(v) ~= 'number' then
      ok = false -- not an integer (or refused): nothing was written
    else
      have = v - q
      if have < 0 or v > 9007199254740991 or (limit > 0 and v > limit) then -- 2^53 - 1: MaxQty
        ok = false
        undo_units(KEYS[3], u, q, have)
      end
    end
  end
  -- pcall: a server out of memory refuses the write (nothing is written), and the general way
  -- then answers a known id without writing (a replay still answers), a new id with the error.
  if ok then
    local at = now or tonumber(ARGV[5])
    if not at or at < 0 or at ~= math.floor(at) then
      at = now_ms()
    end
    if redis.pcall('HSETNX', KEYS[2], id, entry(kind, state, q, avail - q, at, u, deadline)) == 1 then
      -- The writes of the general way for this one take, in its order after the ledger's.
      redis.call('HSET', KEYS[1], 'a', fmt(avail - q), cf, fmt(count + q), 'q', fmt(queue and seq + 1 or seq))
      if queue then
        redis.call('ZADD', KEYS[4], seq + 1, event .. id)
      end
      if hold then
        redis.call('ZADD', KEYS[5], deadline, id)
        next_deadline(KEYS[1], KEYS[5])
      end
      remember(KEYS[6], st[6], id)
      return {OK, avail - q, q}
    end
    if u ~= '' then
      undo_units(KEYS[3], u, q, have) -- a known id (or a refused write) takes nothing
    end
  end
end

-- The general way. The tables below are made only when a call needs them.
now = now or now_ms()

-- One read of the ledger for the whole call; every entry is parsed here, before any write.
local ids
if nreq == 1 then
  ids = {ARGV[pre + 1]}
else
  ids = {}
  for i = pre + 1, #ARGV, 4 do
    ids[#ids + 1] = ARGV[i]
  end
end
local known = redis.call('HMGET', KEYS[2], unpack(ids))
local also -- {id, entry} of the live holds of this call past their deadline, or nil
for j = 1, nreq do
  local e = known[j]
  if e then
    local k, s, _, _, _, _, d = parse(e, ids[j])
    if due_hold(k, s, d, now) then
      also = also or {}
      also[#also + 1] = {ids[j], e}
    end
  end
end
-- One read of the users' units for the whole call: every buyer of a new id, checked here.
local raw, unames -- user -> units read, and the users read; nil when no new id has a buyer
for j = 1, nreq do
  local u = ARGV[pre + 4 * j - 1]
  if u ~= '' and not known[j] then
    if not raw then
      raw, unames = {}, {}
    end
    if not raw[u] then
      raw[u] = true
      unames[#unames + 1] = u
    end
  end
end
if raw then
  local vs = redis.call('HMGET', KEYS[3], unpack(unames))
  for j, u in ipairs(unames) do
    raw[u] = user_units(vs[j], u) or 0
  end
end
local plan
if avail and ((nd and nd <= now) or also) then
  plan = plan_expiry(KEYS, now, 64, also)
  if plan.full then
    -- More holds are due than one call usually releases. If a request of this call could be
    -- refused for stock or for the per-user limit, release more first: a refusal must not
    -- depend on how many holds are due.
    local need, per, over = 0, {}, false
    for j = 1, #ids do
      if not known[j] then
        local q, u = tonumber(ARGV[pre + 4 * j - 2]), ARGV[pre + 4 * j - 1]
        need = need + q
        if u ~= '' and limit > 0 then
          per[u] = (per[u] or 0) + q
        end
      end
    end
    for u, q in pairs(per) do
      local have = raw[u] - (plan.users[u] or 0)
      over = over or have + q > limit
    end
    if not closed and (avail + plan.freed < need or over) then -- closed: refused whatever is due
      plan = plan_expiry(KEYS, now, MAX_EXPIRY, also)
    end
  end
  avail = avail + plan.freed
  if hold then
    count = count - plan.freed
  end
  local gone = {}
  for _, id in ipairs(plan.ids) do
    gone[id] = true
  end
  for j, id in ipairs(ids) do
    if known[j] and gone[id] then
      known[j] = with_state(known[j], 'e')
    end
  end
end
local pusers = plan and plan.users
-- units_of returns the units user u (a buyer of a new id) has once the plan is written.
local function units_of(u)
  local have = raw[u] - ((pusers and pusers[u]) or 0)
  return (have > 0) and have or 0
end

-- fresh: the entries this call wrote, read by a later request of the call with the same id
-- (only a call of several requests has one). units: what each buyer has so far in this call;
-- delta: what each took. hz: the holds' deadlines and ids; seen: the ids for the filter.
local out, hset, zadd = {}, {}, {}
local fresh = (nreq > 1) and {} or nil
local units, delta, hz, seen
local no, nh = 0, 0
local taken, soldout = 0, false
for j = 1, nreq do
  local i = pre + 4 * j - 3
  local id, q, u = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  local code, rem, n = OK, avail or 0, q
  local e = (fresh and fresh[id]) or known[j]
  if e then
    code, rem, n = answer_known(e, kind, q, u, rem)
  else
    local refusal, have = item_refusal(avail, closed), 0
    if not refusal and u ~= '' and limit > 0 then
      have = units and units[u]
      if not have then
        have = units_of(u)
        units = units or {}
        units[u] = have
      end
      if have + q > limit then
        refusal = USERLIMIT
      end
    end
    if refusal == NOTLOADED or refusal == CLOSED then
      code = refusal
    elseif refusal == USERLIMIT then
      code, n = USERLIMIT, have
    elseif refusal == SOLDOUT or avail < q then
      code = refusal or SHORT
      soldout = soldout or refusal == SOLDOUT
      if ARGV[i + 3] == '1' then -- a retry: its refusal is recorded as a tombstone
        local t = entry('T', 'f', q, avail, now, u)
        if fresh then
          fresh[id] = t
        end
        hset[nh + 1] = id
        hset[nh + 2] = t
        nh = nh + 2
        if st[6] then
          seen = seen or {}
          seen[#seen + 1] = id -- the filter must send the id's repeats to this script
        end
      end
    else
      local e2 = entry(kind, state, q, avail - q, now, u, deadline)
      if fresh then
        fresh[id] = e2
      end
      hset[nh + 1] = id
      hset[nh + 2] = e2
      nh = nh + 2
      if st[6] then
        seen = seen or {}
        seen[#seen + 1] = id -- the item has a sold-out filter: the id goes in it
      end
      if queue then
        zadd[#zadd + 1] = event .. id
      end
      if hold then
        hz = hz or {}
        hz[#hz + 1] = deadline
        hz[#hz + 1] = id
      end
      if u ~= '' then
        units = units or {}
        delta = delta or {}
        units[u] = have + q
        delta[u] = (delta[u] or 0) + q
      end
      avail = avail - q
      taken = taken + q
      rem = avail
    end
  end
  out[no + 1] = code
  out[no + 2] = rem
  out[no + 3] = n
  no = no + 3
end

-- The writes.
local _, queued = release(KEYS, plan, queue)
seq = seq + queued
if nh > 0 and taken == 0 then
  redis.call('HSET', KEYS[2], unpack(hset)) -- only refusals of retries
end
if taken > 0 then
  -- One write of the counters: available, sold or held, and the outbox sequence.
  redis.call('HSET', KEYS[1], 'a', fmt(avail), cf, fmt(count + taken), 'q', fmt(seq + #zadd))
  redis.call('HSET', KEYS[2], unpack(hset))
  if #zadd == 1 then
    redis.call('ZADD', KEYS[4], seq + 1, zadd[1])
  elseif #zadd > 1 then
    local z = {}
    for j, m in ipairs(zadd) do
      z[#z + 1] = seq + j
      z[#z + 1] = m
    end
    redis.call('ZADD', KEYS[4], unpack(z))
  end
  if hz then
    redis.call('ZADD', KEYS[5], unpack(hz))
    next_deadline(KEYS[1], KEYS[5])
  end
  -- One write of the users' units: what each had once the plan is written, plus what it took.
  if delta then
    local us = {}
    for u, d in pairs(delta) do
      us[#us + 1] = u
      us[#us + 1] = fmt(units_of(u) + d)
    end
    redis.call('HSET', KEYS[3], unpack(us))
  end
end
if seen then
  for _, id in ipairs(seen) do
    remember(KEYS[6], st[6], id)
  end
end
if soldout then
  filter_step(KEYS, st[6], st[7]) -- after the ledger writes: the scan sees them
end
return out
