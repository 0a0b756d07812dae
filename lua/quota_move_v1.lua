-- tg quota v1: move. Moves a held lease to another lane if that lane has a slot and room for
-- its tokens (the global budget is unchanged); all or nothing.
-- KEYS[4] = released channel (the old lane is published: it gained room).
-- ARGV: id, to_lane, to_max_n, to_max_tokens
-- Reply: { status, reaped }; status 1 = moved (or already there), 0 = no slot, -1 = no token
--   room, -3 = no such lease (released or expired).
local id, to = ARGV[1], ARGV[2]
local max_n, max_tokens = tonumber(ARGV[3]), tonumber(ARGV[4])
local reaped = reap(now_ms())
local v = redis.call('HGET', KEYS[2], id)
if not v then
  return { -3, reaped }
end
local from, tokens = parse_lease(v)
if from == to then
  return { 1, reaped }
end
if usage(to .. ':n') + 1 > max_n then
  return { 0, reaped }
end
if usage(to .. ':tokens') + tokens > max_tokens then
  return { -1, reaped }
end
redis.call('HINCRBY', KEYS[3], from .. ':n', -1)
redis.call('HINCRBY', KEYS[3], from .. ':tokens', -tokens)
redis.call('HINCRBY', KEYS[3], to .. ':n', 1)
redis.call('HINCRBY', KEYS[3], to .. ':tokens', tokens)
redis.call('HSET', KEYS[2], id, to .. ' ' .. tokens)
redis.call('PUBLISH', KEYS[4], from)
return { 1, reaped }
