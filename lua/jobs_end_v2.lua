-- tg jobs v2: end. The run that owns a running job ends it, or hands it back to the queue.
-- ARGV: base, id, token, status (done | failed | cancelled | queued), result (the answer's
--   JSON for done, the error's for failed, "" otherwise), text_bytes, result_ttl_ms
-- Reply: 1, or 0 when this run no longer owns the job (its runner lease had expired and it was
--   put back or failed: the newer outcome stands, so a job ends once).
local base, id, token, to = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local result, text_bytes, ttl = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
if redis.call('HGET', KEYS[10], 'runner') ~= token
  or redis.call('HGET', KEYS[10], 'status') ~= 'running' then
  return 0
end
redis.call('ZREM', KEYS[7], id)
if to == 'queued' then
  requeue(base, KEYS[10], id)
else
  local now = now_ms()
  ended(KEYS[10], id, to, now)
  if to == 'done' then
    redis.call('HSET', KEYS[10], 'answer', result)
  elseif to == 'failed' then
    redis.call('HSET', KEYS[10], 'error', result)
  end
  redis.call('HINCRBY', KEYS[10], 'bytes', text_bytes)
  redis.call('HINCRBY', KEYS[9], 'bytes', text_bytes)
  -- A backstop: the sweep forgets a job two lifetimes after it ended.
  local keep = math.floor(ttl * 3 / 1000) + 60
  redis.call('EXPIRE', KEYS[10], keep)
  redis.call('EXPIRE', KEYS[11], keep)
end
recount('running', to)
announce(base, id)
return 1
