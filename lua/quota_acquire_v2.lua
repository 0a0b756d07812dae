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
--     while others_waiting is 1 (more of its requests wait behind the ones in this call) or
--     one of those behind it in this call was not granted, and drops it otherwise.
--   then, optionally, the requests waiting behind it in the replica's line, in their order:
--   (id, tokens, prompt) each, same lane and ttl. Once the first is granted they are taken in
--   that order until the first that does not fit (the rest keep waiting), so a line's order
--   holds and a burst in line costs one round trip, not one per request.
-- Reply: { status, reaped, followers, asked }; status (of the first) 1 = granted (or already
--   held: a retried call), 0 = no seat, -1 = lane token budget full, -2 = global token budget
--   full, -4 = no prefill room (a long prompt), -5 = no limits record (write it, then try
--   again); followers: how many of those behind it were granted too (the first ones); asked: 1
--   when, refused, it asked pre-emptible background work to leave (ask_borrowers).
local now = now_ms()
local reaped = reap(now)
local status = take_lease(now, false)
local lane, ttl = ARGV[2], tonumber(ARGV[4])
local behind = math.floor((#ARGV - 8) / 3)
local granted = 0
local r = status == 1 and behind > 0 and limits()
if r then
  for i = 9, 8 + 3 * behind, 3 do
    -- Held already (a call sent again after its reply was lost): granted, counted once.
    local took = 1
    if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 0 then
      took = take_lease_with(r, now, false, ARGV[i], lane, tonumber(ARGV[i + 1]), ttl,
        tonumber(ARGV[i + 2]))
    end
    if took ~= 1 then
      break
    end
    granted = granted + 1
  end
end
local asked = 0
if status ~= 1 and status ~= -5 then
  local rec = limits()
  if rec then
    asked = ask_borrowers(rec, now, lane, tonumber(ARGV[3]), tonumber(ARGV[5]), status)
    if (tonumber(rec['preempt_cooldown']) or 0) > 0 then
      -- The start of the pre-emption cool-down: no job takes a seat until it has passed.
      redis.call('HSET', base_key(':preempt'), 'waited', now)
    end
  end
end
local mark, replica = tonumber(ARGV[6] or '0'), ARGV[7]
if mark > 0 and status ~= -5 then
  -- Marks past their time go (a replica that died while its requests waited left its own):
  -- otherwise only the jobs and borrow scripts dropped them, and without jobs none did.
  forget_marks(now)
  if status ~= 1 or granted < behind or ARGV[8] == '1' then
    redis.call('ZADD', KEYS[5], now + mark, replica)
  else
    redis.call('ZREM', KEYS[5], replica)
  end
end
return { status, reaped, granted, asked }
