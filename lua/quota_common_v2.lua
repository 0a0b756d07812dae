-- tg quota v2, shared prelude (prepended to every quota script by the gateway).
-- KEYS[1] = <prefix>:{quota}:expiry  ZSET   lease id -> expiry (Redis server time, ms)
-- KEYS[2] = <prefix>:{quota}:leases  HASH   lease id -> "<lane> <tokens> <prefill>"
-- KEYS[3] = <prefix>:{quota}:usage   HASH   "<lane>:n", "<lane>:tokens", "global:tokens",
--                                            "prefill:tokens"
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

-- Drops every lease whose expiry has passed; returns how many.
local function reap(now)
  local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
  for _, id in ipairs(expired) do
    local v = redis.call('HGET', KEYS[2], id)
    if v then
      local lane, tokens, prefill = parse_lease(v)
      give_back(lane, tokens, prefill)
      redis.call('HDEL', KEYS[2], id)
    end
    redis.call('ZREM', KEYS[1], id)
  end
  return #expired
end

local function usage(field)
  return tonumber(redis.call('HGET', KEYS[3], field) or '0')
end

-- KEYS[5] = <prefix>:{quota}:waiting:large  ZSET  replica -> until when (server ms) it has an
--   interactive large request waiting in line. Background work (jobs) starts only while no
--   replica has one (see quota_acquire_v2.lua, which keeps the marks).

-- Whether a lease for ARGV[1..10] (the acquire script's layout, below) fits; if so, takes it.
-- Returns the status: 1 granted, 0 lane slots full, -1 lane tokens, -2 global tokens,
-- -4 no prefill room.
local function take_lease(now)
  local id, lane = ARGV[1], ARGV[2]
  local tokens, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
  local max_n, max_tokens, global_max = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
  local prompt, budget, long = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
  if redis.call('HEXISTS', KEYS[2], id) == 1 then
    return 1
  end
  if usage(lane .. ':n') + 1 > max_n then
    return 0
  end
  if usage(lane .. ':tokens') + tokens > max_tokens then
    return -1
  end
  if usage('global:tokens') + tokens > global_max then
    return -2
  end
  if budget > 0 and prompt > long then
    local prefilling = usage('prefill:tokens')
    if prefilling > 0 and prefilling + prompt > budget then
      return -4
    end
  end
  redis.call('HSET', KEYS[2], id, lease_value(lane, tokens, prompt))
  redis.call('ZADD', KEYS[1], now + ttl, id)
  redis.call('HINCRBY', KEYS[3], lane .. ':n', 1)
  redis.call('HINCRBY', KEYS[3], lane .. ':tokens', tokens)
  redis.call('HINCRBY', KEYS[3], 'global:tokens', tokens)
  if prompt > 0 then
    redis.call('HINCRBY', KEYS[3], 'prefill:tokens', prompt)
  end
  return 1
end

-- True when no replica has an interactive large request waiting (marks past their time drop).
local function large_idle(now)
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
  return redis.call('ZCARD', KEYS[5]) == 0
end
