-- tg quota v2: move. Moves a held lease to another lane if that lane has a slot and room for
-- its tokens, optionally growing the reservation (mid-stream promotion); all or nothing. The
-- lease's prefill reservation moves with it.
-- KEYS[4] = released channel (the old lane is published: it gained room).
-- ARGV: id, to_lane, to_max_n, to_max_tokens[, new_tokens, global_max_tokens]
--   new_tokens: the reservation after the move (default: unchanged; never smaller);
--   global_max_tokens: the global budget, checked when the reservation grows.
-- Reply: { status, reaped }; status 1 = moved (or already there), 0 = no slot, -1 = no token
--   room in the lane, -2 = no room in the global budget, -3 = no such lease (released or expired).
local id, to = ARGV[1], ARGV[2]
local max_n, max_tokens = tonumber(ARGV[3]), tonumber(ARGV[4])
local reaped = reap(now_ms())
local v = redis.call('HGET', KEYS[2], id)
if not v then
  return { -3, reaped }
end
local from, tokens, prefill = parse_lease(v)
local new_tokens = math.max(tonumber(ARGV[5] or tokens), tokens)
local global_max = tonumber(ARGV[6] or '0')
if from == to and new_tokens == tokens then
  return { 1, reaped }
end
if from ~= to and usage(to .. ':n') + 1 > max_n then
  return { 0, reaped }
end
local lane_after = usage(to .. ':tokens') + new_tokens
if from == to then
  lane_after = lane_after - tokens
end
if lane_after > max_tokens then
  return { -1, reaped }
end
if global_max > 0 and usage('global:tokens') - tokens + new_tokens > global_max then
  return { -2, reaped }
end
redis.call('HINCRBY', KEYS[3], from .. ':n', -1)
redis.call('HINCRBY', KEYS[3], from .. ':tokens', -tokens)
redis.call('HINCRBY', KEYS[3], to .. ':n', 1)
redis.call('HINCRBY', KEYS[3], to .. ':tokens', new_tokens)
redis.call('HINCRBY', KEYS[3], 'global:tokens', new_tokens - tokens)
redis.call('HSET', KEYS[2], id, lease_value(to, new_tokens, prefill))
redis.call('PUBLISH', KEYS[4], from)
return { 1, reaped }
