-- tg jobs v2: take. Starts the queue's head and takes its seat, in one step, only out of idle
-- large-lane capacity: the lease fits the lane's own seats and the token and prefill budgets
-- (take_lease), no replica has an interactive large request waiting (large_idle), and fewer
-- than max_running jobs run.
-- ARGV[1..5]: the lease, as quota_acquire_v2.lua's; then base, id, max_running, run_ttl_ms.
--   ARGV[1] (the lease id) is also the run's token: only its holder may write the job.
-- Reply: { status, reaped, attempt, waited_ms }; status 1 started, -10 not the head (any
--   more), -11 an interactive large request waits, -12 max_running jobs run; else the
--   take_lease status (0, -1, -2, -4, -5).
local now = now_ms()
local reaped = reap(now)
local base, id = ARGV[6], ARGV[7]
local max_running, run_ttl = tonumber(ARGV[8]), tonumber(ARGV[9])
local head = redis.call('ZRANGE', KEYS[7], 0, 0, 'WITHSCORES')
if head[1] ~= id then
  return { -10, reaped }
end
if not large_idle(now) then
  return { -11, reaped }
end
if max_running > 0 and redis.call('ZCARD', KEYS[8]) >= max_running then
  return { -12, reaped }
end
local status = take_lease(now, true)
if status ~= 1 then
  return { status, reaped }
end
redis.call('ZREM', KEYS[7], id)
if tonumber(head[2]) > meta_number('vtime') then
  redis.call('HSET', KEYS[10], 'vtime', head[2])
end
redis.call('ZADD', KEYS[8], now + run_ttl, id)
local attempt = redis.call('HINCRBY', KEYS[11], 'attempt', 1)
redis.call('HSET', KEYS[11], 'status', 'running', 'started_ms', now, 'runner', ARGV[1])
redis.call('DEL', KEYS[12])
recount('queued', 'running')
announce(base, id)
local submitted = tonumber(redis.call('HGET', KEYS[11], 'submitted_ms') or now)
return { 1, reaped, attempt, now - submitted }
