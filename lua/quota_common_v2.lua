-- tg quota v2, shared prelude (prepended to every quota script by the gateway).
-- KEYS[1] = <prefix>:{quota}:expiry  ZSET   lease id -> expiry (Redis server time, ms)
-- KEYS[2] = <prefix>:{quota}:leases  HASH   lease id -> "<lane> <tokens> <prefill>"
-- KEYS[3] = <prefix>:{quota}:usage   HASH   "<lane>:n", "<lane>:tokens", "global:tokens",
--                                            "prefill:tokens"
-- KEYS[4] = <prefix>:{quota}:released (a pub/sub channel, passed as a key)
-- <prefill>: the lease's prefill reservation (estimated prompt tokens until its first token;
-- 0 afterwards). v2 added it; v1 leases had two fields, which is why the layout is versioned.
-- <lane>: the lane whose seat and tokens it holds; a pre-emptible lease (jobs.preempt) has
-- "<seat>@<budget>": its seat in <seat>, its tokens counted in <budget> (the large lane: the
-- seat is borrowed, the reservation is still a review's). See the pre-emption part below.
-- All keys share the hash tag {quota}, so the scripts run on Redis Cluster too.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function parse_lease(v)
  local lane, tokens, prefill = string.match(v, '^(%S+) (%d+) (%d+)$')
  return lane, tonumber(tokens), tonumber(prefill)
end

local function lease_value(lane, tokens, prefill)
  return lane .. ' ' .. tokens .. ' ' .. prefill
end

-- A lease's lane field: the lane of its seat, and the lane its tokens count in ("<seat>@<budget>"
-- for a pre-emptible lease, else one lane for both).
local function split_lane(lane)
  local seat, budget = string.match(lane, '^(%a+)@(%a+)$')
  if seat then
    return seat, budget, true
  end
  return lane, lane, false
end

-- Adds (sign 1) or takes out (sign -1) a lease's slot, tokens and prefill reservation in the
-- usage counters.
local function count(lane, tokens, prefill, sign)
  local seat, budget = split_lane(lane)
  redis.call('HINCRBY', KEYS[3], seat .. ':n', sign)
  redis.call('HINCRBY', KEYS[3], budget .. ':tokens', sign * tokens)
  redis.call('HINCRBY', KEYS[3], 'global:tokens', sign * tokens)
  if prefill > 0 then
    redis.call('HINCRBY', KEYS[3], 'prefill:tokens', sign * prefill)
  end
end

-- Takes a lease's slot, tokens and prefill reservation out of the usage counters.
local function give_back(lane, tokens, prefill)
  count(lane, tokens, prefill, -1)
end

-- The quota's other keys, by name in the same hash slot (KEYS[1] is <base>:expiry).
local function base_key(suffix)
  return string.sub(KEYS[1], 1, -8) .. suffix
end

-- Drops lease `id` and gives its slot, tokens and prefill reservation back; returns its seat's
-- lane, its prefill reservation and the lane its tokens counted in, or nil when it was not
-- held. A pre-emptible lease leaves the borrowers too.
local function drop_lease(id)
  local v = redis.call('HGET', KEYS[2], id)
  redis.call('ZREM', KEYS[1], id)
  if not v then
    return nil
  end
  local lane, tokens, prefill = parse_lease(v)
  give_back(lane, tokens, prefill)
  redis.call('HDEL', KEYS[2], id)
  local seat, budget, borrower = split_lane(lane)
  if borrower then
    redis.call('ZREM', base_key(':borrowers'), id)
    redis.call('HDEL', base_key(':asked'), id)
  end
  return seat, prefill, budget
end

-- Drops every lease whose expiry has passed; returns how many. With no lease left at all,
-- nothing may be counted: counts left behind by a key deleted or evicted from outside (they
-- would hold seats and tokens for good) go.
local function reap(now)
  local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
  for _, id in ipairs(expired) do
    drop_lease(id)
  end
  if redis.call('ZCARD', KEYS[1]) == 0 and redis.call('HLEN', KEYS[2]) == 0 then
    local u = redis.call('HGETALL', KEYS[3])
    for i = 2, #u, 2 do
      if u[i] ~= '0' then
        redis.call('DEL', KEYS[3])
        break
      end
    end
  end
  return #expired
end

local function usage(field)
  return tonumber(redis.call('HGET', KEYS[3], field) or '0')
end

-- KEYS[5] = <prefix>:{quota}:waiting:large  ZSET  replica -> until when (server ms) it has an
--   interactive large request waiting in line. Background work (jobs) starts only while no
--   replica has one (see quota_acquire_v2.lua, which keeps the marks).

-- KEYS[6] = <prefix>:{quota}:limits  HASH  the limits every replica enforces, one versioned
--   record (written by quota_limits_v2.lua): "version", "policy" (lanes | strict), "seats",
--   "global_tokens", "prefill_budget", "long_prompt", and per lane "<lane>:max" (its reserved
--   share; strict: its cap), "<lane>:ceiling", "<lane>:tokens", "<lane>:lend", "<lane>:borrow".

local LANES = { 'small', 'medium', 'large' }

-- The limits record, numbers; nil when there is none (Redis lost it: the caller writes it).
local function limits()
  local raw = redis.call('HGETALL', KEYS[6])
  if #raw == 0 then
    return nil
  end
  local r = {}
  for i = 1, #raw, 2 do
    r[raw[i]] = tonumber(raw[i + 1]) or raw[i + 1]
  end
  return r
end

-- Whether one more lease of `lane` with `tokens` fits under the record `r`: the tokens within
-- the lane's and the global budgets, and a seat: below the lane's reserved share always; above
-- it (policy lanes, a lane that borrows, below its ceiling) while fewer than `seats` are taken,
-- not counting the idle shares of the lanes that do not lend (the in-process rule, see
-- src/admission/budget.rs). `own`: background work takes only the lane's own seats.
-- Returns 1, or 0 (no seat), -1 (lane tokens), -2 (global tokens).
local function fits(r, lane, tokens, own)
  -- One read of the three counters the common case needs (a script's every call costs).
  local u = redis.call('HMGET', KEYS[3], lane .. ':tokens', 'global:tokens', lane .. ':n')
  if tonumber(u[1] or '0') + tokens > r[lane .. ':tokens'] then
    return -1
  end
  if tonumber(u[2] or '0') + tokens > r['global_tokens'] then
    return -2
  end
  local mine = tonumber(u[3] or '0')
  if mine < r[lane .. ':max'] then
    return 1
  end
  if own or r['policy'] ~= 'lanes' or r[lane .. ':borrow'] ~= 1 or mine >= r[lane .. ':ceiling'] then
    return 0
  end
  local taken, held_back = 0, 0
  local seated = redis.call('HMGET', KEYS[3], 'small:n', 'medium:n', 'large:n')
  for i, l in ipairs(LANES) do
    local n = tonumber(seated[i] or '0')
    taken = taken + n
    if l ~= lane and r[l .. ':lend'] ~= 1 then
      held_back = held_back + math.max(0, r[l .. ':max'] - n)
    end
  end
  if taken + held_back < r['seats'] then
    return 1
  end
  return 0
end

-- Writes lease `id` (its slot, tokens and prefill reservation) and counts it, for `ttl` ms.
local function put_lease(now, ttl, id, lane, tokens, prefill)
  redis.call('HSET', KEYS[2], id, lease_value(lane, tokens, prefill))
  redis.call('ZADD', KEYS[1], now + ttl, id)
  count(lane, tokens, prefill, 1)
end

-- Whether a prompt of `prompt` tokens has prefill room under the record `r`: a short one
-- always; a long one when nothing else prefills or it fits the prefill budget (0 = off).
local function prefill_room(r, prompt)
  local budget = r['prefill_budget']
  if budget > 0 and prompt > r['long_prompt'] then
    local prefilling = usage('prefill:tokens')
    return prefilling == 0 or prefilling + prompt <= budget
  end
  return true
end

-- Whether one more lease of `lane` (`tokens`, a prefill reservation of `prompt`) fits the
-- limits record `r` now (`own`: only the lane's own seats, background work). Returns the
-- status: 1 it fits, 0 no seat, -1 lane tokens, -2 global tokens, -4 no prefill room.
local function admits(r, lane, tokens, prompt, own)
  local status = fits(r, lane, tokens, own)
  if status ~= 1 then
    return status
  end
  if not prefill_room(r, prompt) then
    return -4
  end
  return 1
end

-- Takes lease `id` (new: the caller checked it is not held yet) in `lane` (`tokens`, for `ttl`
-- ms, a prefill reservation of `prompt`) if it fits the limits record `r` (`admits`). Returns
-- admits' status.
local function take_lease_with(r, now, own, id, lane, tokens, ttl, prompt)
  local status = admits(r, lane, tokens, prompt, own)
  if status == 1 then
    put_lease(now, ttl, id, lane, tokens, prompt)
  end
  return status
end

-- Takes a lease for ARGV[1..5] (the acquire script's layout: id, lane, tokens, ttl_ms, prompt,
-- the prompt being the lease's prefill reservation), as take_lease_with says. Returns its
-- status, or -5 when there is no limits record (the caller writes it and tries again).
local function take_lease(now, own)
  if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then
    return 1
  end
  local r = limits()
  if not r then
    return -5
  end
  return take_lease_with(r, now, own, ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]),
    tonumber(ARGV[5]))
end

-- The longest a waiting mark is written for (ms): replicas mark for a second at a time.
local MARK_MAX_MS = 60000

-- Drops the waiting marks past their time, and those further ahead than any mark is written
-- for: written before the server's clock was set back, they would otherwise hold every job
-- and borrower off for as long as the clock went back.
local function forget_marks(now)
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '(' .. (now + MARK_MAX_MS), '+inf')
end

-- True when no replica has an interactive large request waiting (marks past their time drop).
-- A large request's mark is the replica's id; with jobs.preempt the other lanes mark too, as
-- "<replica> <lane>".
local function large_idle(now)
  forget_marks(now)
  for _, m in ipairs(redis.call('ZRANGE', KEYS[5], 0, -1)) do
    if not string.find(m, ' ', 1, true) then
      return false
    end
  end
  return true
end

-- True when no replica has an interactive request of any lane waiting.
local function all_idle(now)
  forget_marks(now)
  return redis.call('ZCARD', KEYS[5]) == 0
end

-- True within the limits record's preempt_cooldown (ms) after an interactive request was last
-- refused a seat (`<base>:preempt` "waited", written by the acquire script): no pre-emptible
-- work takes a seat then.
local function cooling(now)
  local cooldown = tonumber(redis.call('HGET', KEYS[6], 'preempt_cooldown') or '0') or 0
  if cooldown <= 0 then
    return false
  end
  local waited = tonumber(redis.call('HGET', base_key(':preempt'), 'waited') or '')
  if waited ~= nil and waited > now then
    -- Written before the server's clock was set back: it counts from now (one cool-down, not
    -- the step's length).
    redis.call('HSET', base_key(':preempt'), 'waited', now)
    waited = now
  end
  return waited ~= nil and now - waited < cooldown
end

-- Pre-emption (jobs.preempt; see src/admission/redis/mod.rs). Keys by name under <base>:
-- <base>:borrowers ZSET  pre-emptible lease id -> when it was taken (server ms)
-- <base>:asked     HASH  lease id -> "<lane> <reason> <ms>": asked to leave (for a request of
--                         <lane> that lacked <reason>) at <ms>, not gone yet
-- <base>:preempt   HASH  "rate": the prefill rate (tokens/s) measured at the last borrower's
--                         first token (a prefill cut short teaches none); "waited": when an
--                         interactive request was last refused a seat (server ms; written only
--                         with a preempt_cooldown in the limits record)
-- Asking is a message on the channel <base>:leave, "<lease id> <lane> <reason>"; the replica
-- holding the lease drops its stream and gives the lease back. An ask older than a second is
-- sent again (a replica reconnecting may have missed it); a lease whose replica died expires.

-- Takes a pre-emptible lease `id` for background work of `lane` (`tokens`, `prompt`): the
-- tokens in that lane's and the global budgets, the prompt's prefill room, and an idle seat of
-- its own, tried in that lane, then each lane below it (large, medium, small). Returns 1 and
-- the seat's lane, or the take status (0 no idle seat, -1, -2, -4).
local function borrow(r, now, ttl, id, lane, tokens, prompt)
  if not prefill_room(r, prompt) then
    return -4
  end
  local u = redis.call('HMGET', KEYS[3], lane .. ':tokens', 'global:tokens', 'large:n', 'medium:n',
    'small:n')
  if tonumber(u[1] or '0') + tokens > r[lane .. ':tokens'] then
    return -1
  end
  if tonumber(u[2] or '0') + tokens > r['global_tokens'] then
    return -2
  end
  local below = false
  for i, seat in ipairs({ 'large', 'medium', 'small' }) do
    below = below or seat == lane
    if below and tonumber(u[2 + i] or '0') < r[seat .. ':max'] then
      put_lease(now, ttl, id, seat .. '@' .. lane, tokens, prompt)
      redis.call('ZADD', base_key(':borrowers'), now, id)
      return 1, seat
    end
  end
  return 0
end

-- Takes lease `id` out of the counters (sign -1) or puts it back (1), to ask "what if it left".
local function suppose_gone(id, sign)
  local v = redis.call('HGET', KEYS[2], id)
  if v then
    local lane, tokens, prefill = parse_lease(v)
    count(lane, tokens, prefill, -sign)
  end
end

-- Whether borrower `id` is still prefilling within `grace` tokens of done, at the measured
-- rate (none measured: its whole prompt is left).
local function in_grace(id, now, grace, rate)
  local v = redis.call('HGET', KEYS[2], id)
  if not v then
    return false
  end
  local _, _, prefill = parse_lease(v)
  if prefill == 0 then
    return false
  end
  local since = tonumber(redis.call('ZSCORE', base_key(':borrowers'), id) or now)
  local left = math.max(0, prefill - rate * math.max(0, now - since) / 1000)
  return left <= grace
end

local REASONS = { [0] = 'seat', [-1] = 'tokens', [-2] = 'tokens', [-4] = 'prefill' }

-- A request of `lane` (`tokens`, `prompt`) was refused with `status`: unless the borrowers
-- already asked to leave make room for it once gone, asks one more, the youngest whose leaving
-- alone lets it in; else the youngest, when all of them together would; else (it waits for
-- its own lane's limits: the engine's time is what it waits for) the youngest, reason
-- "pressure", only while none is leaving and no borrower in its prefill grace would let it in
-- (it waits for that one's first token). Never one in its prefill grace (the limits record's
-- preempt_grace). With `room_only` (a running request's move), never for the engine's time
-- ("pressure"): only one whose leaving lets it in. Returns 1 when it asked one.
local function ask_borrowers(r, now, lane, tokens, prompt, status, room_only)
  local ids = redis.call('ZREVRANGE', base_key(':borrowers'), 0, -1)
  if #ids == 0 then
    return 0
  end
  local akey = base_key(':asked')
  local asked, free = {}, {}
  for _, id in ipairs(ids) do
    local a = redis.call('HGET', akey, id)
    if a then
      asked[#asked + 1] = id
      -- Sent again when it was not acted on within a second (a message missed).
      local l, why, at = string.match(a, '^(%S+) (%S+) (%d+)$')
      -- (Or asked "later" than now: before the server's clock was set back.)
      if at and (now - tonumber(at) > 1000 or tonumber(at) > now) then
        redis.call('HSET', akey, id, l .. ' ' .. why .. ' ' .. now)
        redis.call('PUBLISH', base_key(':leave'), id .. ' ' .. l .. ' ' .. why)
      end
    else
      free[#free + 1] = id
    end
  end
  for _, id in ipairs(asked) do
    suppose_gone(id, 1)
  end
  local victim, reason = nil, REASONS[status] or 'seat'
  if admits(r, lane, tokens, prompt, false) ~= 1 then
    local grace = tonumber(r['preempt_grace'] or '0') or 0
    local rate = tonumber(redis.call('HGET', base_key(':preempt'), 'rate') or '0') or 0
    local candidates = {}
    for _, id in ipairs(free) do
      if not in_grace(id, now, grace, rate) then
        candidates[#candidates + 1] = id
      end
    end
    for _, id in ipairs(candidates) do
      suppose_gone(id, 1)
      local lets_in = admits(r, lane, tokens, prompt, false) == 1
      suppose_gone(id, -1)
      if lets_in then
        victim = id
        break
      end
    end
    if not victim and #candidates > 0 then
      for _, id in ipairs(candidates) do
        suppose_gone(id, 1)
      end
      local all = admits(r, lane, tokens, prompt, false) == 1
      for _, id in ipairs(candidates) do
        suppose_gone(id, -1)
      end
      if all then
        victim = candidates[1]
      elseif room_only then
        victim = nil
      elseif #asked == 0 and #candidates == #free then
        -- (With borrowers in their grace it waits for their first token, where it asks them.)
        victim, reason = candidates[1], 'pressure'
      elseif #asked == 0 then
        for _, id in ipairs(free) do
          suppose_gone(id, 1)
        end
        local spared_would = admits(r, lane, tokens, prompt, false) == 1
        for _, id in ipairs(free) do
          suppose_gone(id, -1)
        end
        if not spared_would then
          victim, reason = candidates[1], 'pressure'
        end
      end
    end
  end
  for _, id in ipairs(asked) do
    suppose_gone(id, -1)
  end
  if not victim then
    return 0
  end
  redis.call('HSET', akey, victim, lane .. ' ' .. reason .. ' ' .. now)
  redis.call('PUBLISH', base_key(':leave'), victim .. ' ' .. lane .. ' ' .. reason)
  return 1
end
