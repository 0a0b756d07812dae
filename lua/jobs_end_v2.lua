-- tg jobs v2: end. The run that owns a running job ends it, or hands it back to the queue.
-- ARGV: base, id, token, status (done | failed | cancelled | queued | untaken), result (the
--   answer's JSON for done, the error's for failed, "" otherwise), text_bytes
--   untaken: the take script's reply never reached the replica that sent it (Redis slower
--   than the call's timeout, a dropped connection), so no run started under `token`: the job
--   goes back to its place in the queue as it was before that take (a fresh start gives its
--   attempt back, a handed-back job keeps its text and progress), unless its cancel was
--   asked meanwhile: then it ends cancelled. Without it the job stayed "running" under a run
--   that does not exist until its runner lease lapsed, and that cost one of its
--   jobs.max_attempts.
--   queued: the gateway is shutting down; the job goes back to the queue for another replica
--   (not counted against jobs.max_attempts), unless its cancel was asked: then it ends
--   cancelled. With a result (jobs.preempt: the run was pre-empted, or handed back with text
--   streamed), the result is the run's progress (JSON: "preempted" times so far, the tokens
--   generated, the first run's usage): the job keeps its text, and whichever replica takes it
--   next continues the answer (jobs_take_v2.lua); the text streamed so far counts against
--   jobs.max_bytes from then on.
-- Reply: the status the job now has, or "" when this run no longer owns the job (its runner
--   lease had expired and it was put back or failed: the newer outcome stands, so a job ends
--   once). A call sent again because the reply to the first was lost (Redis slower than the
--   call's timeout) answers what the first did (`ended_by`), so the run still sends its webhook.
local base, id, token, to = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local result, text_bytes = ARGV[5], tonumber(ARGV[6])
local applied = redis.call('HGET', KEYS[11], 'ended_by')
if applied and string.sub(applied, 1, #token + 1) == token .. ' ' then
  return string.sub(applied, #token + 2)
end
if redis.call('HGET', KEYS[11], 'runner') ~= token
  or redis.call('HGET', KEYS[11], 'status') ~= 'running' then
  return ''
end
redis.call('ZREM', KEYS[8], id)
if (to == 'queued' or to == 'untaken') and redis.call('HGET', KEYS[11], 'cancel') == '1' then
  to = 'cancelled'
end
if to == 'untaken' then
  if redis.call('HEXISTS', KEYS[11], 'progress') == 0 then
    redis.call('HINCRBY', KEYS[11], 'attempt', -1)
  end
  redis.call('HSET', KEYS[11], 'status', 'queued', 'runner', '')
  redis.call('ZADD', KEYS[7], redis.call('HGET', KEYS[11], 'tag'), id)
  to = 'queued'
elseif to == 'queued' and result ~= '' then
  local preempted = tonumber(cjson.decode(result)['preempted']) or 0
  redis.call('HSET', KEYS[11], 'status', 'queued', 'runner', '', 'progress', result,
    'preempted', preempted)
  -- The text it keeps counts now: the runs that continue it count only their own.
  count_text(KEYS[11], text_bytes)
  redis.call('ZADD', KEYS[7], redis.call('HGET', KEYS[11], 'tag'), id)
  -- Not counted as a run given back: the run that continues it keeps its number
  -- (`attempt`), so a loss of that one counts once (jobs.max_attempts).
elseif to == 'queued' then
  requeue(base, KEYS[11], id)
  redis.call('HINCRBY', KEYS[11], 'handed', 1)
else
  ended(KEYS[11], id, to, now_ms())
  if to == 'done' then
    redis.call('HSET', KEYS[11], 'answer', result)
  elseif to == 'failed' then
    redis.call('HSET', KEYS[11], 'error', result)
  end
  count_text(KEYS[11], text_bytes)
end
recount('running', to)
redis.call('HSET', KEYS[11], 'ended_by', token .. ' ' .. to)
announce(base, id)
return to
