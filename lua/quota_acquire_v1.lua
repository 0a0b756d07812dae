-- tg quota v1: acquire. Atomically reaps expired leases, then takes a lease only if the lane's
-- request limit AND the lane's token budget AND the global token budget all fit.
-- ARGV: id, lane, tokens, ttl_ms, lane_max_n, lane_max_tokens, global_max_tokens
-- Reply: { status, reaped }; status 1 = granted (or already held: a retried call),
--   0 = lane slots full, -1 = lane token budget full, -2 = global token budget full.
local id, lane = ARGV[1], ARGV[2]
local tokens, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local max_n, max_tokens, global_max = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local now = now_ms()
local reaped = reap(now)
if redis.call('HEXISTS', KEYS[2], id) == 1 then
  return { 1, reaped }
end
if usage(lane .. ':n') + 1 > max_n then
  return { 0, reaped }
end
if usage(lane .. ':tokens') + tokens > max_tokens then
  return { -1, reaped }
end
if usage('global:tokens') + tokens > global_max then
  return { -2, reaped }
end
redis.call('HSET', KEYS[2], id, lane .. ' ' .. tokens)
redis.call('ZADD', KEYS[1], now + ttl, id)
redis.call('HINCRBY', KEYS[3], lane .. ':n', 1)
redis.call('HINCRBY', KEYS[3], lane .. ':tokens', tokens)
redis.call('HINCRBY', KEYS[3], 'global:tokens', tokens)
return { 1, reaped }
