-- tg jobs v2: cancel. A queued job ends at once and gives its turn to its tenant's next queued
-- job, and that one's to the next, so the tenant's newest turn is free again (as the in-process
-- queue does); a running one is flagged and its runner told (it drops its stream, which aborts
-- the engine's work, and ends the job cancelled). With an error (ARGV[3]), a queued job ends
-- failed with it instead (a replica found it could never take a seat under the limits in
-- force), and nothing else is touched. Without an error, a job that had already ended (done,
-- failed, cancelled) has its result dropped at once, as at its expiry (`DELETE` of a finished
-- job frees its tenant's room), and is forgotten (as is an expired one).
-- ARGV: base, id[, error JSON {"code","message"}]
-- Reply: "ended" when this call ended it (it was queued: its webhook is the caller's),
--   "dropped" when it forgot a job that had ended (or expired), else the job's status
--   ("running"; with an error, any), or "" when there is no such job.
local base, id, error = ARGV[1], ARGV[2], ARGV[3] or ''
local final = 'cancelled'
if error ~= '' then
  final = 'failed'
end
local status = redis.call('HGET', KEYS[11], 'status')
if not status then
  return ''
end
if status == 'queued' then
  local tenant = redis.call('HGET', KEYS[11], 'tenant') or ''
  local tag = redis.call('ZSCORE', KEYS[7], id)
  redis.call('ZREM', KEYS[7], id)
  if tag then
    -- Its tenant's later jobs (in queue order) each take the turn before theirs.
    local later = redis.call('ZRANGEBYSCORE', KEYS[7], tag, '+inf', 'WITHSCORES')
    for i = 1, #later, 2 do
      local key = job_key(base, later[i])
      if (redis.call('HGET', key, 'tenant') or '') == tenant then
        redis.call('ZADD', KEYS[7], tag, later[i])
        redis.call('HSET', key, 'tag', tag)
        tag = later[i + 1]
      end
    end
    -- The last turn is free again: the tenant's next job starts from it.
    if tonumber(tag) < meta_number('t:' .. tenant) then
      redis.call('HSET', KEYS[10], 't:' .. tenant, tag)
    end
  end
  if error ~= '' then
    redis.call('HSET', KEYS[11], 'error', error)
  end
  ended(KEYS[11], id, final, now_ms())
  recount('queued', final)
  announce(base, id)
  return 'ended'
end
if error == '' and (status == 'done' or status == 'failed' or status == 'cancelled'
    or status == 'expired') then
  if status ~= 'expired' then
    expire(base, KEYS[11], id, status, now_ms())
  end
  -- And the job is forgotten (its client is done with it): kept as an expired record,
  -- uncounted by max_jobs, a loop of submit, DELETE, DELETE left one more record a round for
  -- result_ttl, without bound.
  redis.call('DEL', KEYS[11], text_key(base, id))
  redis.call('ZREM', KEYS[9], id)
  recount('expired', nil)
  announce(base, id)
  return 'dropped'
end
if status == 'running' and error == '' then
  redis.call('HSET', KEYS[11], 'cancel', 1)
  announce(base, 'cancel ' .. id)
end
return status
