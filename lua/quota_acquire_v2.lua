-- tg quota v2: acquire. Atomically reaps expired leases, then takes a lease only if it fits the
-- limits record (KEYS[6], the same for every replica): a seat under the work-conserving rules
-- (reserved shares, ceilings, lending, borrowing; strict caps under policy strict), the lane's
-- and the global token budgets, and, for a long prompt, the prefill budget.
-- ARGV: id, lane, tokens, ttl_ms, prompt, wait_mark_ms, replica, others_waiting
--   prompt: estimated prompt tokens, the lease's prefill reservation (counted for every lease);
--     a prompt above the record's long_prompt waits for room: it fits when nothing else
--     prefills or prefill:tokens + prompt <= prefill_budget (0 = off). Short prompts never wait.
--   wait_mark_ms (large lane only; 0 = no mark): a refused call marks `replica` as having a
--     large request waiting until now + wait_mark_ms (KEYS[5]); a granted one keeps the mark
--     while others_waiting is 1 (more of its requests wait behind it) and drops it otherwise.
-- Reply: { status, reaped }; status 1 = granted (or already held: a retried call),
--   0 = no seat, -1 = lane token budget full, -2 = global token budget full,
--   -4 = no prefill room (a long prompt), -5 = no limits record (write it, then try again).
local now = now_ms()
local reaped = reap(now)
local status = take_lease(now, false)
local mark, replica = tonumber(ARGV[6] or '0'), ARGV[7]
if mark > 0 and status ~= -5 then
  if status ~= 1 or ARGV[8] == '1' then
    redis.call('ZADD', KEYS[5], now + mark, replica)
  else
    redis.call('ZREM', KEYS[5], replica)
  end
end
return { status, reaped }
