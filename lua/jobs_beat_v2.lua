-- tg jobs v2: beat (every replica, every quota heartbeat). Renews the runner leases of this
-- replica's running jobs, puts back in the queue the jobs whose runner stopped renewing (a
-- crashed replica), at most max_attempts lost runs in all (runs handed back at a clean
-- shutdown do not count), and expires results: result_ttl_ms after a job ended its result is
-- dropped (status expired), as long again later the job is forgotten.
-- ARGV: base, run_ttl_ms, max_attempts, result_ttl_ms, then id, token pairs (this replica's
--   running jobs and their runs' tokens)
-- Reply: { requeued, lost, expired, forgotten, bytes, n:queued, n:running, n:done, n:failed,
--   n:cancelled, n:expired, {cancel...}, {gone...}, {ended...} }:
--   lost = failed with runner_lost; cancel = this replica's runs whose cancel is asked;
--   gone = this replica's runs that no longer own their job (stop them, write nothing);
--   ended = jobs this call ended (cancelled or runner_lost): their webhooks are the caller's.
local base, run_ttl = ARGV[1], tonumber(ARGV[2])
local max_attempts, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local cancel, gone, ended_ids = {}, {}, {}
-- No replica beat for a whole run TTL by Redis's clock (each beats every quota.heartbeat_ms,
-- at most a third of it): the clock ran ahead (an NTP step, a failover to a server whose clock
-- is ahead), and sweeping now would take every running job from its live runner. The runner
-- leases count from now instead (a runner that did die is swept one TTL later).
local last_beat = tonumber(redis.call('HGET', KEYS[10], 'beat') or '')
redis.call('HSET', KEYS[10], 'beat', now)
if last_beat and now - last_beat > run_ttl then
  for _, id in ipairs(redis.call('ZRANGE', KEYS[8], 0, -1)) do
    redis.call('ZADD', KEYS[8], 'XX', now + run_ttl, id)
  end
end
for i = 5, #ARGV - 1, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local key = job_key(base, id)
  if redis.call('HGET', key, 'runner') == token and redis.call('ZSCORE', KEYS[8], id) then
    redis.call('ZADD', KEYS[8], 'XX', now + run_ttl, id)
    if redis.call('HGET', key, 'cancel') == '1' then
      table.insert(cancel, id)
    end
  else
    table.insert(gone, id)
  end
end
local requeued, lost = 0, 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[8], '-inf', now, 'LIMIT', 0, 100)) do
  redis.call('ZREM', KEYS[8], id)
  local key = job_key(base, id)
  if redis.call('HGET', key, 'status') == 'running' then
    local runs = tonumber(redis.call('HGET', key, 'attempt') or '0')
      - tonumber(redis.call('HGET', key, 'handed') or '0')
    if redis.call('HGET', key, 'cancel') == '1' then
      ended(key, id, 'cancelled', now)
      recount('running', 'cancelled')
      table.insert(ended_ids, id)
    elseif runs < max_attempts then
      requeue(base, key, id)
      recount('running', 'queued')
      requeued = requeued + 1
    else
      ended(key, id, 'failed', now)
      redis.call('HSET', key, 'error', cjson.encode({ code = 'runner_lost',
        message = 'the gateway running this job stopped ' .. runs ..
          ' times (jobs.max_attempts); it is not tried again' }))
      recount('running', 'failed')
      lost = lost + 1
      table.insert(ended_ids, id)
    end
    announce(base, id)
  end
end
local expired, forgotten = 0, 0
-- Up to 500 a beat (a few ms of this script): at 100, a fleet whose jobs ended faster than 50
-- a second per replica fell behind for good, and results outlived result_ttl, holding their
-- room in max_jobs and max_bytes.
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[9], '-inf', now - ttl, 'LIMIT', 0, 500)) do
  local key = job_key(base, id)
  local status = redis.call('HGET', key, 'status')
  if not status then
    -- Deleted from outside: nothing of it is left to count.
    redis.call('ZREM', KEYS[9], id)
  elseif status == 'expired' then
    redis.call('DEL', key, text_key(base, id))
    redis.call('ZREM', KEYS[9], id)
    recount('expired', nil)
    forgotten = forgotten + 1
  else
    expire(base, key, id, status, now)
    expired = expired + 1
  end
end
local reply = { requeued, lost, expired, forgotten, meta_number('bytes') }
for _, s in ipairs({ 'queued', 'running', 'done', 'failed', 'cancelled', 'expired' }) do
  table.insert(reply, meta_number('n:' .. s))
end
table.insert(reply, cancel)
table.insert(reply, gone)
table.insert(reply, ended_ids)
return reply
