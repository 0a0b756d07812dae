-- tg quota v2: move. Moves a held lease to another lane if it fits there under the limits
-- record (the same seat and token rules as acquire, as if the lease had left its lane first),
-- optionally growing the reservation (mid-stream promotion); all or nothing. The lease's
-- prefill reservation moves with it.
-- KEYS[4] = released channel (the old lane is published: it gained room).
-- ARGV: id, to_lane[, new_tokens[, ask]]
--   new_tokens: the reservation after the move (default: unchanged; never smaller).
--   ask: "1" for a running request's move to another lane: refused for room, it asks
--   pre-emptible borrowers whose leaving lets it in to leave for it, as a refused acquire does
--   (a student's answer outgrowing its lane goes before background work; never for the
--   engine's time alone), and starts the pre-emption cool-down.
-- Reply: { status, reaped, asked }; status 1 = moved (or already there), 0 = no seat, -1 = no
--   token room in the lane, -2 = no room in the global budget, -3 = no such lease (released
--   or expired), -5 = no limits record; asked 1 when refused while borrowers are leaving that
--   would let it in (room comes within moments).
local id, to = ARGV[1], ARGV[2]
local now = now_ms()
local reaped = reap(now)
local v = redis.call('HGET', KEYS[2], id)
if not v then
  return { -3, reaped, 0 }
end
local from, tokens, prefill = parse_lease(v)
if string.find(from, '@', 1, true) then
  -- A pre-emptible lease (background work) is not moved: its seat is borrowed.
  return { 0, reaped, 0 }
end
local new_tokens = math.max(tonumber(ARGV[3] or tokens), tokens)
if from == to and new_tokens == tokens then
  return { 1, reaped, 0 }
end
local r = limits()
if not r then
  return { -5, reaped, 0 }
end
-- Check with the lease out of its lane; put it back if it does not fit.
redis.call('HINCRBY', KEYS[3], from .. ':n', -1)
redis.call('HINCRBY', KEYS[3], from .. ':tokens', -tokens)
redis.call('HINCRBY', KEYS[3], 'global:tokens', -tokens)
local status
if from == to then
  -- Growing where it is needs tokens only: the lease keeps its seat (which, with lent seats
  -- taken back, a fresh acquire might not get).
  local u = redis.call('HMGET', KEYS[3], to .. ':tokens', 'global:tokens')
  if tonumber(u[1] or '0') + new_tokens > r[to .. ':tokens'] then
    status = -1
  elseif tonumber(u[2] or '0') + new_tokens > r['global_tokens'] then
    status = -2
  else
    status = 1
  end
else
  status = fits(r, to, new_tokens, false)
end
if status ~= 1 then
  local asked = 0
  if ARGV[4] == '1' and from ~= to and redis.call('ZCARD', base_key(':borrowers')) > 0 then
    -- Asked while the lease is out of its lane: what it needs is counted as after the move.
    if ask_borrowers(r, now, to, new_tokens, 0, status, true) == 1
      and (tonumber(r['preempt_cooldown']) or 0) > 0 then
      redis.call('HSET', base_key(':preempt'), 'waited', now)
    end
    -- Room comes when those leaving let it in (not when one was asked only to give the
    -- engine time back, the lane being at its own limits).
    local leaving = redis.call('HKEYS', base_key(':asked'))
    for _, b in ipairs(leaving) do
      suppose_gone(b, 1)
    end
    if #leaving > 0 and fits(r, to, new_tokens, false) == 1 then
      asked = 1
    end
    for _, b in ipairs(leaving) do
      suppose_gone(b, -1)
    end
  end
  redis.call('HINCRBY', KEYS[3], from .. ':n', 1)
  redis.call('HINCRBY', KEYS[3], from .. ':tokens', tokens)
  redis.call('HINCRBY', KEYS[3], 'global:tokens', tokens)
  return { status, reaped, asked }
end
redis.call('HINCRBY', KEYS[3], to .. ':n', 1)
redis.call('HINCRBY', KEYS[3], to .. ':tokens', new_tokens)
redis.call('HINCRBY', KEYS[3], 'global:tokens', new_tokens)
redis.call('HSET', KEYS[2], id, lease_value(to, new_tokens, prefill))
redis.call('PUBLISH', KEYS[4], from)
return { 1, reaped, 0 }
