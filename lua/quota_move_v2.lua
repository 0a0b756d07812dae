-- tg quota v2: move. Moves a held lease to another lane if it fits there under the limits
-- record (the same seat and token rules as acquire, as if the lease had left its lane first),
-- optionally growing the reservation (mid-stream promotion); all or nothing. The lease's
-- prefill reservation moves with it.
-- KEYS[4] = released channel (the old lane is published: it gained room).
-- ARGV: id, to_lane[, new_tokens]
--   new_tokens: the reservation after the move (default: unchanged; never smaller).
-- Reply: { status, reaped }; status 1 = moved (or already there), 0 = no seat, -1 = no token
--   room in the lane, -2 = no room in the global budget, -3 = no such lease (released or
--   expired), -5 = no limits record.
local id, to = ARGV[1], ARGV[2]
local reaped = reap(now_ms())
local v = redis.call('HGET', KEYS[2], id)
if not v then
  return { -3, reaped }
end
local from, tokens, prefill = parse_lease(v)
if string.find(from, '@', 1, true) then
  -- A pre-emptible lease (background work) is not moved: its seat is borrowed.
  return { 0, reaped }
end
local new_tokens = math.max(tonumber(ARGV[3] or tokens), tokens)
if from == to and new_tokens == tokens then
  return { 1, reaped }
end
local r = limits()
if not r then
  return { -5, reaped }
end
-- Check with the lease out of its lane; put it back if it does not fit.
redis.call('HINCRBY', KEYS[3], from .. ':n', -1)
redis.call('HINCRBY', KEYS[3], from .. ':tokens', -tokens)
redis.call('HINCRBY', KEYS[3], 'global:tokens', -tokens)
local status = fits(r, to, new_tokens, false)
if status ~= 1 then
  redis.call('HINCRBY', KEYS[3], from .. ':n', 1)
  redis.call('HINCRBY', KEYS[3], from .. ':tokens', tokens)
  redis.call('HINCRBY', KEYS[3], 'global:tokens', tokens)
  return { status, reaped }
end
redis.call('HINCRBY', KEYS[3], to .. ':n', 1)
redis.call('HINCRBY', KEYS[3], to .. ':tokens', new_tokens)
redis.call('HINCRBY', KEYS[3], 'global:tokens', new_tokens)
redis.call('HSET', KEYS[2], id, lease_value(to, new_tokens, prefill))
redis.call('PUBLISH', KEYS[4], from)
return { 1, reaped }
