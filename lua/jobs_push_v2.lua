-- tg jobs v2: push. Appends streamed pieces to a running job's text, for its current run only.
-- ARGV: base, id, token (the run's), piece...
-- Reply: the pieces now kept, or -1 when this run no longer owns the job (it was put back in
--   the queue, or ended).
local base, id, token = ARGV[1], ARGV[2], ARGV[3]
if redis.call('HGET', KEYS[11], 'runner') ~= token
  or redis.call('HGET', KEYS[11], 'status') ~= 'running' then
  return -1
end
for i = 4, #ARGV do
  redis.call('RPUSH', KEYS[12], ARGV[i])
end
announce(base, id)
return redis.call('LLEN', KEYS[12])
