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
