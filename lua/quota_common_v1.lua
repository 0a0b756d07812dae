-- tg quota v1, shared prelude (prepended to every quota script by the gateway).
-- KEYS[1] = <prefix>:{quota}:expiry  ZSET   lease id -> expiry (Redis server time, ms)
-- KEYS[2] = <prefix>:{quota}:leases  HASH   lease id -> "<lane> <tokens>"
-- KEYS[3] = <prefix>:{quota}:usage   HASH   "<lane>:n", "<lane>:tokens", "global:tokens"
-- All keys share the hash tag {quota}, so the scripts run on Redis Cluster too.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function parse_lease(v)
  local lane, tokens = string.match(v, '^(%S+) (%d+)$')
  return lane, tonumber(tokens)
end

-- Takes a lease's slot and tokens out of the usage counters.
local function give_back(lane, tokens)
  redis.call('HINCRBY', KEYS[3], lane .. ':n', -1)
  redis.call('HINCRBY', KEYS[3], lane .. ':tokens', -tokens)
  redis.call('HINCRBY', KEYS[3], 'global:tokens', -tokens)
end

-- Drops every lease whose expiry has passed; returns how many.
local function reap(now)
  local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
  for _, id in ipairs(expired) do
    local v = redis.call('HGET', KEYS[2], id)
    if v then
      local lane, tokens = parse_lease(v)
      give_back(lane, tokens)
      redis.call('HDEL', KEYS[2], id)
    end
    redis.call('ZREM', KEYS[1], id)
  end
  return #expired
end

local function usage(field)
  return tonumber(redis.call('HGET', KEYS[3], field) or '0')
end
