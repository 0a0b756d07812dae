-- tg jobs v2: take. Starts the queue's head and takes its seat, in one step, only out of idle
-- large-lane capacity: the lease fits the lane's own seats and the token and prefill budgets
-- (take_lease), no replica has an interactive large request waiting (large_idle), and fewer
-- than max_running jobs run.
-- ARGV[1..5]: the lease, as quota_acquire_v2.lua's; then base, id, max_running, run_ttl_ms,
--   and (jobs.preempt) max_preemptions.
--   ARGV[1] (the lease id) is also the run's token: only its holder may write the job.
--   With max_preemptions (jobs.preempt), a job pre-empted fewer times than that takes a
--   pre-emptible lease instead (`borrow`: an idle seat of its lane or of a lane below, its
--   tokens in its lane), only while no replica has an interactive request of any lane waiting
--   (all_idle) and not within the record's preempt_cooldown (ms) after an interactive request
--   was last refused a seat (`<base>:preempt` "waited", written by the acquire script); one
--   that used them up takes its own lane's seat as above. A job handed back
--   with its text (`progress`, see jobs_end_v2.lua) keeps its run and its text: it resumes.
-- Reply: { status, reaped, attempt, waited_ms, seat, preemptible, resumed }; status 1 started,
--   -10 not the head (any more), -11 an interactive request waits (large; any lane with
--   preemption), -12 max_running jobs run; else the take status (0, -1, -2, -4, -5). seat: the
--   seat's lane (0 small, 1 medium, 2 large); preemptible: 1 when the lease is; resumed: 1
--   when the job was handed back with its text (the run continues it).
local now = now_ms()
local reaped = reap(now)
local base, id = ARGV[6], ARGV[7]
local max_running, run_ttl = tonumber(ARGV[8]), tonumber(ARGV[9])
local head = redis.call('ZRANGE', KEYS[7], 0, 0, 'WITHSCORES')
if head[1] ~= id then
  return { -10, reaped }
end
local max_preemptions = tonumber(ARGV[10] or '')
local idle
if max_preemptions then
  idle = all_idle(now)
else
  idle = large_idle(now)
end
if max_preemptions and idle then
  -- The cool-down (jobs.preempt_cooldown_ms).
  idle = not cooling(now)
end
if not idle then
  return { -11, reaped }
end
if max_running > 0 and redis.call('ZCARD', KEYS[8]) >= max_running then
  return { -12, reaped }
end
local status, seat, preemptible = 1, ARGV[2], 0
local preempted = tonumber(redis.call('HGET', KEYS[11], 'preempted') or '0')
if max_preemptions and preempted < max_preemptions
  and redis.call('HEXISTS', KEYS[2], ARGV[1]) == 0 then
  local r = limits()
  if not r then
    return { -5, reaped }
  end
  status, seat = borrow(r, now, tonumber(ARGV[4]), ARGV[1], ARGV[2], tonumber(ARGV[3]),
    tonumber(ARGV[5]))
  preemptible = 1
else
  status = take_lease(now, true)
end
if status ~= 1 then
  return { status, reaped }
end
redis.call('ZREM', KEYS[7], id)
if tonumber(head[2]) > meta_number('vtime') then
  redis.call('HSET', KEYS[10], 'vtime', head[2])
end
redis.call('ZADD', KEYS[8], now + run_ttl, id)
local attempt, resumed = nil, 0
if redis.call('HEXISTS', KEYS[11], 'progress') == 1 then
  resumed = 1
  -- Handed back with its text: the same run goes on.
  attempt = tonumber(redis.call('HGET', KEYS[11], 'attempt') or '1')
else
  attempt = redis.call('HINCRBY', KEYS[11], 'attempt', 1)
  redis.call('DEL', KEYS[12])
end
redis.call('HSET', KEYS[11], 'status', 'running', 'runner', ARGV[1])
if resumed == 0 then
  -- A continued job keeps its first run's start: started_at spans the job.
  redis.call('HSET', KEYS[11], 'started_ms', now)
end
recount('queued', 'running')
announce(base, id)
local submitted = tonumber(redis.call('HGET', KEYS[11], 'submitted_ms') or now)
local seats = { small = 0, medium = 1, large = 2 }
return { 1, reaped, attempt, now - submitted, seats[seat] or 2, preemptible, resumed }
