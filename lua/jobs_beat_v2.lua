-- tg jobs v2: beat (every replica, every quota heartbeat). Renews the runner leases of this
-- replica's running jobs, puts back in the queue (at most max_attempts runs in all) the jobs
-- whose runner stopped renewing (a crashed replica), and expires results.
-- ARGV: base, run_ttl_ms, max_attempts, result_ttl_ms, id... (this replica's running jobs)
-- Reply: { requeued, lost, expired, forgotten, bytes, n:queued, n:running, n:done, n:failed,
--   n:cancelled, n:expired, cancelled... }: lost = given up after max_attempts runs;
--   cancelled = the ids among this replica's whose cancel is asked.
local base, run_ttl = ARGV[1], tonumber(ARGV[2])
local max_attempts, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local cancelled = {}
for i = 5, #ARGV do
  local id = ARGV[i]
  if redis.call('ZSCORE', KEYS[7], id) then
    redis.call('ZADD', KEYS[7], 'XX', now + run_ttl, id)
    if redis.call('HGET', job_key(base, id), 'cancel') == '1' then
      table.insert(cancelled, id)
    end
  end
end
local requeued, lost = 0, 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', now, 'LIMIT', 0, 100)) do
  redis.call('ZREM', KEYS[7], id)
  local key = job_key(base, id)
  local attempt = tonumber(redis.call('HGET', key, 'attempt') or '0')
  if redis.call('HGET', key, 'status') == 'running' then
    if redis.call('HGET', key, 'cancel') == '1' then
      ended(key, id, 'cancelled', now)
      recount('running', 'cancelled')
    elseif attempt < max_attempts then
      requeue(base, key, id)
      recount('running', 'queued')
      requeued = requeued + 1
    else
      ended(key, id, 'failed', now)
      redis.call('HSET', key, 'error', cjson.encode({ code = 'runner_lost',
        message = 'the gateway running this job stopped ' .. attempt ..
          ' times (jobs.max_attempts); it is not tried again' }))
      recount('running', 'failed')
      lost = lost + 1
    end
    announce(base, id)
  end
end
local expired, forgotten = 0, 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[8], '-inf', now - ttl, 'LIMIT', 0, 100)) do
  local key = job_key(base, id)
  local status = redis.call('HGET', key, 'status')
  if not status then
    redis.call('ZREM', KEYS[8], id)
  elseif status == 'expired' then
    redis.call('DEL', key, text_key(base, id))
    redis.call('ZREM', KEYS[8], id)
    recount('expired', nil)
    forgotten = forgotten + 1
  else
    local bytes = tonumber(redis.call('HGET', key, 'bytes') or '0')
    redis.call('HINCRBY', KEYS[9], 'bytes', -bytes)
    redis.call('HDEL', key, 'answer', 'error', 'request')
    redis.call('HSET', key, 'status', 'expired', 'bytes', 0)
    redis.call('DEL', text_key(base, id))
    redis.call('ZADD', KEYS[8], now, id)
    recount(status, 'expired')
    expired = expired + 1
    announce(base, id)
  end
end
local reply = { requeued, lost, expired, forgotten, meta_number('bytes') }
for _, s in ipairs({ 'queued', 'running', 'done', 'failed', 'cancelled', 'expired' }) do
  table.insert(reply, meta_number('n:' .. s))
end
for _, id in ipairs(cancelled) do
  table.insert(reply, id)
end
return reply
