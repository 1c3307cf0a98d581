-- lib.lua: helpers prepended to every script of this package. Not a script by itself.
--
-- Item hash fields:  a = available, h = held, s = sold, l = loaded, c = '1' when closed,
--                    n = earliest hold deadline (ms), present only while holds are live,
--                    b = log2 of the bits of the item's sold-out filter (see remember),
--                    bc = the ledger scan's cursor while the filter is being built,
--                    t = a bucket's net units transferred (in less out; see xout.lua).
--                    No field named v<n> is ever written: the sold-out fast path names one in
--                    its cached read of the hash to version that read (fastpath.go).
-- Ledger entry:      "KS|qty|after|at|user[|deadline]"
--   K (kind):  D deduct, H hold, L restock, T tombstone (a restore or cancel of an unknown id)
--   S (state): h held, r reserved (taken, not yet in the store), a applied (in the store),
--              x restored, f refused by the store (restored), c cancelled, e expired
--   after: available after the operation (before is not stored: it follows from the kind, qty
--   and after, see internal/protocol Entry.Before); at, deadline: ms since the epoch
--   (Redis TIME). Numbers are written with %d: Lua numbers are doubles and tostring would print
--   15+ digit values in exponent form on a real Redis.
-- Outbox member:     "E:id" where E is the event: D deducted, R restored, L restocked, H held,
--                    X cancelled, E expired. The score is the event's sequence number in the
--                    item (item field q), so a relay delivers an item's events in the order
--                    they happened: a restore always reaches the store before a later deduct.
-- Reply codes (the third slot carries the quantity, or the user's units for code 7); the Go side
-- is internal/protocol/codes.go, and its test fails when the two differ:
local OK, REPLAY, SOLDOUT, SHORT, NOTLOADED, CONFLICT, RESTORED, USERLIMIT, CLOSED, UNKNOWN, EXPIRED, CONFIRMED, INVALID =
      0,  1,      2,       3,     4,         5,        6,        7,         8,      9,       10,      11,        12
-- UNTAKEN (deductmany.lua): a line of a cart that could be taken, not taken as another line refused.
local UNTAKEN = -1

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function fmt(n)
  return string.format('%d', n)
end

-- parse returns kind, state, qty, after, at, user, deadline (0 when absent) of the ledger entry e
-- of id. A corrupt entry raises an error that names the id: every script parses what it reads
-- before its first write (Redis does not roll a script back), so the error changes nothing.
local function parse(e, id)
  local k, s, q, a, t, u, d = string.match(e, '^(.)(.)|(%d+)|(%d+)|(%d+)|([^|]*)|?(%d*)$')
  if not k then
    error('stock: corrupt ledger entry of id ' .. (id or '?') .. ': ' .. string.sub(e, 1, 64))
  end
  return k, s, tonumber(q), tonumber(a), tonumber(t), u, tonumber(d) or 0
end

-- int reads an integer value of a counter (what names it in the error): nil when absent (false,
-- as HGET and HMGET return it), a number when it is one, else an error, raised before the
-- script's first write like parse's (HINCRBY would fail on it halfway through the writes).
-- A value a double cannot hold exactly (beyond 2^53 - 1, MaxQty) is not an integer either.
local function int(v, what)
  if not v then
    return nil
  end
  local n = tonumber(v)
  if not n or n ~= math.floor(n) or n > 9007199254740991 or n < -9007199254740991 then
    error('stock: corrupt ' .. what .. ': ' .. string.sub(tostring(v), 1, 64))
  end
  return n
end

-- user_units reads the units of user u (HGET or HMGET of the users' hash) as int does, and takes
-- only what the scripts write there ('%d': an optional '-' and digits): not what Lua's tonumber
-- also reads (hexadecimal, exponents, spaces), which HINCRBY, that adds to it, refuses. The
-- common deduct's HINCRBY checks its own; a read checks with this (a scan of the string, only
-- where units are read).
local function user_units(v, u)
  if v and string.find(v, '[^%d%-]') then
    error('stock: corrupt units of user ' .. u .. ': ' .. string.sub(v, 1, 64))
  end
  return int(v, 'units of user ' .. u)
end

-- parse_transfer returns the direction ('O' out of this bucket, 'I' into it), the other
-- bucket's index (a string), the units and, for a transfer out, the donor's outbox sequence when
-- it took the units (0 in an entry written before it was recorded) of the transfers hash entry x
-- of transfer tid: "O|target|units|at_ms|seq" or "I|donor|units|at_ms". A corrupt entry raises
-- an error that names it, before any write.
local function parse_transfer(x, tid)
  local dir, other, k = string.match(x, '^([OI])|(%d+)|(%d+)|%d+$')
  local seq = '0'
  if not dir then
    dir, other, k, seq = string.match(x, '^(O)|(%d+)|(%d+)|%d+|(%d+)$')
  end
  if not dir then
    error('stock: corrupt transfer entry of ' .. (tid or '?') .. ': ' .. string.sub(x, 1, 64))
  end
  return dir, other, tonumber(k), tonumber(seq)
end

-- entry writes a ledger entry: kind, state, qty, after, at, user, deadline (none when nil or 0).
local function entry(k, s, q, a, t, u, d)
  if d and d > 0 then
    return string.format('%s%s|%d|%d|%d|%s|%d', k, s, q, a, t, u, d)
  end
  return string.format('%s%s|%d|%d|%d|%s', k, s, q, a, t, u)
end

local function with_state(e, s)
  return string.sub(e, 1, 1) .. s .. string.sub(e, 3)
end

local function released(s)
  return s == 'x' or s == 'f' or s == 'c' or s == 'e'
end

-- answer_known is the answer to a take (kind 'D' or 'H') of q units by user u of an id whose
-- ledger entry e exists: the code, the remaining stock to report (the entry's for a replay and
-- for a retry's recorded refusal, else avail) and the quantity to report.
local function answer_known(e, kind, q, u, avail)
  local k, s, eq, ea, _, eu = parse(e) -- checked by the caller before its writes
  if k == 'T' then
    if s == 'f' then
      -- Tf: a retry refused for lack of stock, answered as it was told, with the stock of then:
      -- sold out when nothing was available, insufficient when some was (the script refuses a
      -- new id as sold out exactly when nothing is available).
      return (ea == 0) and SOLDOUT or SHORT, ea, q
    end
    return RESTORED, avail, q
  elseif k ~= kind or eq ~= q or eu ~= u then
    return CONFLICT, avail, eq
  elseif s == 'e' then
    return EXPIRED, avail, q
  elseif released(s) then
    return RESTORED, avail, q
  end
  return REPLAY, ea, q
end

-- item_refusal is the refusal a new id gets from the item itself, checked before the per-user
-- limit (sold out comes first so that the in-process sold-out answer of fastpath.go is the
-- answer of the scripts), or nil.
local function item_refusal(avail, closed)
  if not avail then
    return NOTLOADED
  elseif closed then
    return CLOSED
  elseif avail == 0 then
    return SOLDOUT
  end
  return nil
end

local function give_user(users, u, q)
  if u ~= '' then
    if redis.call('HINCRBY', users, u, -q) <= 0 then
      redis.call('HDEL', users, u)
    end
  end
end

-- undo_units takes back the q units just added with HINCRBY to user u, who had have before the
-- add: the field is as it was (gone when the user had none).
local function undo_units(users, u, q, have)
  if have == 0 then
    redis.call('HDEL', users, u)
  else
    redis.call('HINCRBY', users, u, -q)
  end
end

-- next_deadline keeps the item's n field equal to the earliest live hold deadline.
local function next_deadline(item, holds)
  local nx = redis.call('ZRANGE', holds, 0, 0, 'WITHSCORES')
  if nx[2] then
    redis.call('HSET', item, 'n', nx[2])
  else
    redis.call('HDEL', item, 'n')
  end
end

-- queue appends one event to the item's outbox, after every earlier one.
-- K: KEYS of the item (item, ledger, users, outbox, holds).
local function queue_event(K, ev, id)
  redis.call('ZADD', K[4], redis.call('HINCRBY', K[1], 'q', 1), ev .. id)
end

-- Expiry is planned, then written: plan_expiry reads and checks everything releasing holds
-- needs (the due ids, their entries, the item's counters and the users' units) and writes
-- nothing, so a corrupt entry stops the script before its first write; release writes the plan.
-- Every script that takes or moves held stock (deduct, deductmany, confirm, extend) releases the
-- item's due holds first, at most 64 per call, and always the holds its own ids name: an id's
-- answer never depends on how many other holds are due.

-- MAX_EXPIRY is how many due holds one call releases at most when it would otherwise refuse a
-- request for stock or for the per-user limit (64 otherwise): a request is refused for lack of
-- stock only when the due holds left cannot explain it, up to that many.
local MAX_EXPIRY = 10000

-- plan_expiry plans the release of at most max holds whose deadline (holds zset) has passed,
-- plus the holds in also (pairs {id, entry} the caller read: live holds past their ledger
-- deadline), never the hold skip (a hold the caller keeps). Returns the plan: zrem (ids to drop
-- from the holds zset), ids and es (the live holds to release and their entries), freed (units),
-- users (user -> units to give back).
-- K: KEYS of the item (item, ledger, users, outbox, holds).
local function plan_expiry(K, now, max, also, skip)
  local p = {zrem = {}, ids = {}, es = {}, freed = 0, users = {}}
  local st = redis.call('HMGET', K[1], 'a', 'h', 'q')
  int(st[1], 'available count')
  int(st[2], 'held count')
  int(st[3], 'outbox sequence')
  local seen, due = {}, {}
  if skip then
    seen[skip] = true
  end
  local range = redis.call('ZRANGEBYSCORE', K[5], '-inf', now, 'LIMIT', 0, max)
  p.full = #range >= max -- more holds may be due than this plan releases
  for _, id in ipairs(range) do
    if not seen[id] then
      seen[id] = true
      due[#due + 1] = id
    end
  end
  local es = (#due > 0) and redis.call('HMGET', K[2], unpack(due)) or {}
  for _, pair in ipairs(also or {}) do
    if not seen[pair[1]] then
      seen[pair[1]] = true
      due[#due + 1] = pair[1]
      es[#due] = pair[2]
    end
  end
  for i, id in ipairs(due) do
    p.zrem[#p.zrem + 1] = id
    local e = es[i]
    if e then
      local _, s, q, _, _, u = parse(e, id)
      if s == 'h' then
        p.ids[#p.ids + 1] = id
        p.es[#p.es + 1] = e
        p.freed = p.freed + q
        if u ~= '' then
          p.users[u] = (p.users[u] or 0) + q
        end
      end
    end
  end
  for u in pairs(p.users) do
    user_units(redis.call('HGET', K[3], u), u)
  end
  return p
end

-- release writes a plan of plan_expiry (nil: nothing) and returns the units freed and the
-- number of events it queued.
local function release(K, p, queue)
  if not p then
    return 0, 0
  end
  for i, id in ipairs(p.ids) do
    redis.call('HSET', K[2], id, with_state(p.es[i], 'e'))
    if queue then
      queue_event(K, 'E:', id)
    end
  end
  for u, q in pairs(p.users) do
    give_user(K[3], u, q)
  end
  if #p.zrem > 0 then
    redis.call('ZREM', K[5], unpack(p.zrem))
    next_deadline(K[1], K[5])
  end
  if p.freed > 0 then
    redis.call('HINCRBY', K[1], 'a', p.freed)
    redis.call('HINCRBY', K[1], 'h', -p.freed)
  end
  return p.freed, queue and #p.ids or 0
end

-- due_hold reports whether the entry e (of kind k, state s, deadline d) is a live hold whose
-- deadline has passed: it must be answered, and released, as expired.
local function due_hold(k, s, d, now)
  return k == 'H' and s == 'h' and d > 0 and d <= now
end

-- read_hold reads and checks what confirm.lua and extend.lua need, and plans the release of the
-- item's due holds, writing nothing. It returns the live hold id names (a table: e, q, a, t, u, d,
-- avail) or nil and the reply (its available count is before the release: the caller adds the
-- units release frees), and the plan.
-- confirmed: the code for a hold already confirmed. keep: the hold is made final whatever its
-- deadline (a confirm the store has, by the reconciler, which queues no events): nothing is
-- released, since a release it made would never reach the store.
-- K: KEYS of the item (item, ledger, users, outbox, holds).
local function read_hold(K, id, now, confirmed, keep)
  local e = redis.call('HGET', K[2], id)
  local st = redis.call('HMGET', K[1], 'a', 'n', 's', 'h', 'q')
  local avail, n = int(st[1], 'available count'), int(st[2], 'next deadline')
  int(st[3], 'sold count') -- the counters the caller moves: checked before its first write
  int(st[4], 'held count')
  int(st[5], 'outbox sequence')
  local k, s, q, a, t, u, d
  if e then
    k, s, q, a, t, u, d = parse(e, id)
  end
  local due = e and not keep and due_hold(k, s, d, now)
  local live = e and k == 'H' and s == 'h' and not due
  local plan
  if avail and not keep and ((n and n <= now) or due) then
    plan = plan_expiry(K, now, 64, due and {{id, e}} or nil, live and id or nil)
  end
  if not e then
    return nil, {UNKNOWN, 0, 0}, plan
  elseif k ~= 'H' then
    return nil, {CONFLICT, avail or 0, q}, plan
  elseif s == 'r' or s == 'a' then
    return nil, {confirmed, avail or 0, q}, plan
  elseif s == 'e' then
    return nil, {EXPIRED, avail or 0, q}, plan
  elseif s ~= 'h' then
    return nil, {RESTORED, avail or 0, q}, plan
  elseif not avail then
    return nil, {NOTLOADED, 0, q}, plan
  elseif due then
    return nil, {EXPIRED, avail, q}, plan
  end
  return {e = e, q = q, a = a, t = t, u = u, d = d, avail = avail}, nil, plan
end

-- hold_call is the start of confirm.lua and extend.lua: read_hold, then the release of the due
-- holds it planned, the first write, after every check (queue: queue their events). It returns
-- the live hold (a table as read_hold's, whose avail counts the units the release freed), or
-- nil and the reply to return.
local function hold_call(K, id, now, confirmed, keep, queue)
  local h, reply, plan = read_hold(K, id, now, confirmed, keep)
  local freed = release(K, plan, queue)
  if not h then
    if reply[1] ~= UNKNOWN and reply[1] ~= NOTLOADED then
      reply[2] = reply[2] + freed
    end
    return nil, reply
  end
  h.avail = h.avail + freed
  return h
end

-- The sold-out filter (key "<item>:b", 2^b bits): a Bloom filter of every id the ledger has had,
-- two positions per id from its SHA-1, plus a sentinel bit at 2^b (a filter recreated by a write
-- after its key was lost lacks it and is not trusted). A client that knows the item is sold out
-- answers a new id the filter has surely never seen without a round trip (fastpath.go); any
-- other id goes to the scripts. The filter costs nothing while the item sells: it is started by
-- the first request refused as sold out (filter_step), filled from the ledger in bounded steps
-- by the refusals that follow, and from its start every script that adds an id to the ledger
-- adds it to the filter too (remember). It is trusted once b is set and bc is gone.

-- remember records an id in the item's filter if the item has one (b set).
local function remember(filter, b, id)
  if filter and b then
    local m = 2 ^ tonumber(b)
    local h = redis.sha1hex(id)
    redis.call('SETBIT', filter, fmt(tonumber(string.sub(h, 1, 8), 16) % m), 1)
    redis.call('SETBIT', filter, fmt(tonumber(string.sub(h, 9, 16), 16) % m), 1)
  end
end

-- filter_step starts the item's filter if it has none (b nil) and adds one page of the ledger's
-- ids to it; the scan that ends clears bc. Ids the ledger gains after the start are added by
-- remember, so the scan only has to cover the ids that were there before it began.
-- K: KEYS of the item (item, ledger, users, outbox, holds, filter).
local function filter_step(K, b, bc)
  if not K[6] or (b and not bc) then
    return
  end
  if not b then
    local want = (tonumber(redis.call('HGET', K[1], 'l')) or 0) * 16 -- bits: 16 per unit loaded
    b = 12
    while b < 23 and 2 ^ b < want do
      b = b + 1
    end
    bc = '0'
    redis.call('DEL', K[6])
    redis.call('SETBIT', K[6], fmt(2 ^ b), 1)
    redis.call('HSET', K[1], 'b', fmt(b), 'bc', bc)
  end
  local page = redis.call('HSCAN', K[2], bc, 'COUNT', 256)
  for i = 1, #page[2], 2 do
    remember(K[6], b, page[2][i])
  end
  if page[1] == '0' then
    redis.call('HDEL', K[1], 'bc')
  else
    redis.call('HSET', K[1], 'bc', page[1])
  end
end
