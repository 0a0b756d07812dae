-- tg quota v2: acquire. Atomically reaps expired leases, then takes a lease only if the lane's
-- request limit AND the lane's token budget AND the global token budget all fit, and, for a
-- long prompt under a prefill budget, the prefill budget has room.
-- ARGV: id, lane, tokens, ttl_ms, lane_max_n, lane_max_tokens, global_max_tokens,
--       prompt, prefill_budget, long_prompt, wait_mark_ms, replica, others_waiting
--   prompt: estimated prompt tokens, the lease's prefill reservation (counted for every lease);
--   prefill_budget: 0 = off; a prompt above long_prompt waits for room: it fits when nothing
--     else prefills or prefill:tokens + prompt <= prefill_budget. Short prompts never wait.
--   wait_mark_ms (large lane only; 0 = no mark): a refused call marks `replica` as having a
--     large request waiting until now + wait_mark_ms (KEYS[5]); a granted one keeps the mark
--     while others_waiting is 1 (more of its requests wait behind it) and drops it otherwise.
-- Reply: { status, reaped }; status 1 = granted (or already held: a retried call),
--   0 = lane slots full, -1 = lane token budget full, -2 = global token budget full,
--   -4 = no prefill room (a long prompt).
local now = now_ms()
local reaped = reap(now)
local status = take_lease(now)
local mark, replica = tonumber(ARGV[11] or '0'), ARGV[12]
if mark > 0 then
  if status ~= 1 or ARGV[13] == '1' then
    redis.call('ZADD', KEYS[5], now + mark, replica)
  else
    redis.call('ZREM', KEYS[5], replica)
  end
end
return { status, reaped }
