-- tg quota v2: acquire. Atomically reaps expired leases, then takes a lease only if the lane's
-- request limit AND the lane's token budget AND the global token budget all fit, and, for a
-- long prompt under a prefill budget, the prefill budget has room.
-- ARGV: id, lane, tokens, ttl_ms, lane_max_n, lane_max_tokens, global_max_tokens,
--       prompt, prefill_budget, long_prompt
--   prompt: estimated prompt tokens, the lease's prefill reservation (counted for every lease);
--   prefill_budget: 0 = off; a prompt above long_prompt waits for room: it fits when nothing
--     else prefills or prefill:tokens + prompt <= prefill_budget. Short prompts never wait.
-- Reply: { status, reaped }; status 1 = granted (or already held: a retried call),
--   0 = lane slots full, -1 = lane token budget full, -2 = global token budget full,
--   -4 = no prefill room (a long prompt).
local id, lane = ARGV[1], ARGV[2]
local tokens, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local max_n, max_tokens, global_max = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local prompt, budget, long = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
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
if budget > 0 and prompt > long then
  local prefilling = usage('prefill:tokens')
  if prefilling > 0 and prefilling + prompt > budget then
    return { -4, reaped }
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
return { 1, reaped }
