-- tg quota v2, shared prelude (prepended to every quota script by the gateway).
-- KEYS[1] = <prefix>:{quota}:expiry  ZSET   lease id -> expiry (Redis server time, ms)
-- KEYS[2] = <prefix>:{quota}:leases  HASH   lease id -> "<lane> <tokens> <prefill>"
-- KEYS[3] = <prefix>:{quota}:usage   HASH   "<lane>:n", "<lane>:tokens", "global:tokens",
--                                            "prefill:tokens"
-- KEYS[4] = <prefix>:{quota}:released (a pub/sub channel, passed as a key)
-- <prefill>: the lease's prefill reservation (estimated prompt tokens until its first token;
-- 0 afterwards). v2 added it; v1 leases had two fields, which is why the layout is versioned.
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

-- Takes a lease's slot, tokens and prefill reservation out of the usage counters.
local function give_back(lane, tokens, prefill)
  redis.call('HINCRBY', KEYS[3], lane .. ':n', -1)
  redis.call('HINCRBY', KEYS[3], lane .. ':tokens', -tokens)
  redis.call('HINCRBY', KEYS[3], 'global:tokens', -tokens)
  if prefill > 0 then
    redis.call('HINCRBY', KEYS[3], 'prefill:tokens', -prefill)
  end
end

-- Drops lease `id` and gives its slot, tokens and prefill reservation back; returns its lane
-- and prefill reservation, or nil when it was not held.
local function drop_lease(id)
  local v = redis.call('HGET', KEYS[2], id)
  redis.call('ZREM', KEYS[1], id)
  if not v then
    return nil
  end
  local lane, tokens, prefill = parse_lease(v)
  give_back(lane, tokens, prefill)
  redis.call('HDEL', KEYS[2], id)
  return lane, prefill
end

-- Drops every lease whose expiry has passed; returns how many.
local function reap(now)
  local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
  for _, id in ipairs(expired) do
    drop_lease(id)
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
  redis.call('HINCRBY', KEYS[3], lane .. ':n', 1)
  redis.call('HINCRBY', KEYS[3], lane .. ':tokens', tokens)
  redis.call('HINCRBY', KEYS[3], 'global:tokens', tokens)
  if prefill > 0 then
    redis.call('HINCRBY', KEYS[3], 'prefill:tokens', prefill)
  end
end

-- Takes lease `id` (new: the caller checked it is not held yet) in `lane` (`tokens`, for `ttl`
-- ms, a prefill reservation of `prompt`) if it fits the limits record `r` and, for a long
-- prompt, the record's prefill budget. `own`: only the lane's own seats (background work).
-- Returns the status: 1 granted, 0 no seat, -1 lane tokens, -2 global tokens, -4 no prefill
-- room.
local function take_lease_with(r, now, own, id, lane, tokens, ttl, prompt)
  local status = fits(r, lane, tokens, own)
  if status ~= 1 then
    return status
  end
  local budget, long = r['prefill_budget'], r['long_prompt']
  if budget > 0 and prompt > long then
    local prefilling = usage('prefill:tokens')
    if prefilling > 0 and prefilling + prompt > budget then
      return -4
    end
  end
  put_lease(now, ttl, id, lane, tokens, prompt)
  return 1
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

-- True when no replica has an interactive large request waiting (marks past their time drop).
local function large_idle(now)
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
  return redis.call('ZCARD', KEYS[5]) == 0
end
