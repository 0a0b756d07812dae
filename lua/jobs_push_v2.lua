-- tg jobs v2: push. Appends streamed pieces to a running job's text, for its current run only.
-- ARGV: base, id, token (the run's), seq (this batch's number in the run: 1, 2, ...), piece...
-- A run sends its batches in order and retries one until it has an answer, so only its last
-- batch can come twice (the reply to the first call was lost: a timeout while Redis was slow):
-- a batch whose (token, seq) is the last one pushed is not appended again.
-- Reply: the pieces now kept, or -1 when this run no longer owns the job (it was put back in
--   the queue, or ended).
local base, id, token, seq = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if redis.call('HGET', KEYS[11], 'runner') ~= token
  or redis.call('HGET', KEYS[11], 'status') ~= 'running' then
  return -1
end
local mark = token .. ' ' .. seq
if redis.call('HGET', KEYS[11], 'pushed') == mark then
  return redis.call('LLEN', KEYS[12])
end
for i = 5, #ARGV do
  redis.call('RPUSH', KEYS[12], ARGV[i])
end
redis.call('HSET', KEYS[11], 'pushed', mark)
announce(base, id)
return redis.call('LLEN', KEYS[12])
