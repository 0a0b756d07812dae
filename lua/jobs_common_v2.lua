-- tg jobs v2, shared part (after the quota prelude, before each jobs script's body).
-- KEYS[1..6] are the quota's (see quota_common_v2.lua); then:
-- KEYS[7]  = <base>:jobs:queue    ZSET  job id -> fair start tag (oldest first within a tenant,
--                                       tenants in turns by their shares)
-- KEYS[8]  = <base>:jobs:running  ZSET  job id -> until when its runner's lease holds (server ms)
-- KEYS[9]  = <base>:jobs:ended    ZSET  job id -> when it ended (and, once expired, when that was)
-- KEYS[10] = <base>:jobs:meta     HASH  "vtime" (the fair queue's virtual time: the start tag of
--                                       the job started last), "t:<tenant>" (its last finish
--                                       tag), "bytes" (kept bodies and answers),
--                                       "n:<status>" (jobs per status), "beat" (when
--                                       a replica's beat last ran, server ms)
-- KEYS[11] = <base>:job:<id>      HASH  one job (scripts about many jobs pass a placeholder)
-- KEYS[12] = <base>:job:<id>:text LIST  its streamed pieces, in order
-- <base> = <prefix>:{quota}: every key shares the quota's hash tag, so the jobs scripts run on
-- Redis Cluster, and one script can start a job and take its seat. Scripts about many jobs
-- (jobs_beat) reach their job keys by name under <base>, in the same slot.
-- Changes are announced on the channel <base>:jobs:changed (payload: the job id, or
-- "cancel <id>" for a running job's cancel).

local function job_key(base, id)
  return base .. ':job:' .. id
end

local function text_key(base, id)
  return base .. ':job:' .. id .. ':text'
end

local function announce(base, what)
  redis.call('PUBLISH', base .. ':jobs:changed', what)
end

-- Moves one job between status counters (nil: none).
local function recount(from, to)
  if from then
    redis.call('HINCRBY', KEYS[10], 'n:' .. from, -1)
  end
  if to then
    redis.call('HINCRBY', KEYS[10], 'n:' .. to, 1)
  end
end

local function meta_number(field)
  return tonumber(redis.call('HGET', KEYS[10], field) or '0')
end

-- Ends job `id` (its key `key`) as `status` at `now`, for the result's lifetime.
local function ended(key, id, status, now)
  redis.call('HSET', key, 'status', status, 'finished_ms', now)
  redis.call('ZADD', KEYS[9], now, id)
end

-- Drops the result of job `id` (its key `key`), which ended as `status`: its answer, error,
-- request and text go, its bytes and its place in its tenant's bounds come back; status
-- `expired` from `now`, forgotten result_ttl_ms later (jobs_beat).
local function expire(base, key, id, status, now)
  local bytes = tonumber(redis.call('HGET', key, 'bytes') or '0')
  redis.call('HINCRBY', KEYS[10], 'bytes', -bytes)
  local tenant = redis.call('HGET', key, 'tenant') or ''
  if tenant ~= '' then
    redis.call('HINCRBY', KEYS[10], 'tj:' .. tenant, -1)
    redis.call('HINCRBY', KEYS[10], 'tb:' .. tenant, -bytes)
  end
  redis.call('HDEL', key, 'answer', 'error', 'request')
  redis.call('HSET', key, 'status', 'expired', 'bytes', 0)
  redis.call('DEL', text_key(base, id))
  redis.call('ZADD', KEYS[9], now, id)
  recount(status, 'expired')
  announce(base, id)
end

-- Counts `delta` bytes of a job's kept text against jobs.max_bytes: in the job's own count
-- ("bytes", given back when its result expires), in "text_bytes" (its text kept so far, given
-- back when its text starts over), in the store's and in its tenant's.
local function count_text(key, delta)
  if delta == 0 then
    return
  end
  redis.call('HINCRBY', key, 'bytes', delta)
  redis.call('HINCRBY', key, 'text_bytes', delta)
  redis.call('HINCRBY', KEYS[10], 'bytes', delta)
  local tenant = redis.call('HGET', key, 'tenant') or ''
  if tenant ~= '' then
    redis.call('HINCRBY', KEYS[10], 'tb:' .. tenant, delta)
  end
end

-- Puts a running job back at its place in the queue (its start tag is older than any job that
-- queued after it): its text starts over (and what a continuation would need goes).
local function requeue(base, key, id)
  count_text(key, -tonumber(redis.call('HGET', key, 'text_bytes') or '0'))
  redis.call('HSET', key, 'status', 'queued', 'runner', '')
  redis.call('HDEL', key, 'progress', 'preempted')
  redis.call('DEL', text_key(base, id))
  redis.call('ZADD', KEYS[7], redis.call('HGET', key, 'tag'), id)
end
