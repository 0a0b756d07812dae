-- tg quota v2: borrow. A pre-emptible lease for interactive work that gives its seat back when
-- asked (jobs.preempt_answers: a large /answer stream, or its continuation while it may still
-- be pre-empted): an idle seat of its lane or of a lane below (`borrow`), its tokens in its
-- lane, only while no replica has an interactive request of any lane waiting (all_idle) and not
-- within the record's preempt_cooldown (`cooling`). Never waits: refused, the request queues
-- as any other (quota_acquire_v2.lua).
-- ARGV: the lease, as quota_acquire_v2.lua's first five (id, lane, tokens, ttl_ms, prompt).
-- Idempotent: a lease `id` already holds answers as taken, with its seat.
-- Reply: { status, reaped, 0, 0, seat, 1 }, the shape of jobs_take_v2.lua's (the lease's
--   holder reads the seat and "pre-emptible" at the same places): status 1 taken, seat its
--   lane (0 small, 1 medium, 2 large); -11 a request waits somewhere or the cool-down runs;
--   else borrow's (0 no idle seat, -1, -2, -4), or -5 no limits record.
local now = now_ms()
local reaped = reap(now)
local seats = { small = 0, medium = 1, large = 2 }
local held = redis.call('HGET', KEYS[2], ARGV[1])
if held then
  -- Taken already (a call sent again after its reply was lost): its seat, counted once.
  local lane = parse_lease(held)
  local seat = string.match(lane, '^(%a+)@') or lane
  return { 1, reaped, 0, 0, seats[seat] or 2, 1 }
end
local r = limits()
if not r then
  return { -5, reaped }
end
if not all_idle(now) or cooling(now) then
  return { -11, reaped }
end
local status, seat = borrow(r, now, tonumber(ARGV[4]), ARGV[1], ARGV[2], tonumber(ARGV[3]),
  tonumber(ARGV[5]))
if status ~= 1 then
  return { status, reaped }
end
return { 1, reaped, 0, 0, seats[seat], 1 }
