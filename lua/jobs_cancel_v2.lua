-- tg jobs v2: cancel. A queued job ends at once; a running one is flagged and its runner told
-- (it drops its stream, which aborts the engine's work, and ends the job cancelled).
-- ARGV: base, id
-- Reply: the job's status after the call ("cancelled", "running", or how it had already
--   ended), or "" when there is no such job.
local base, id = ARGV[1], ARGV[2]
local status = redis.call('HGET', KEYS[11], 'status')
if not status then
  return ''
end
if status == 'queued' then
  redis.call('ZREM', KEYS[7], id)
  ended(KEYS[11], id, 'cancelled', now_ms())
  recount('queued', 'cancelled')
  announce(base, id)
  return 'cancelled'
end
if status == 'running' then
  redis.call('HSET', KEYS[11], 'cancel', 1)
  announce(base, 'cancel ' .. id)
end
return status
