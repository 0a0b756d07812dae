-- tg quota v2: limits. Writes the limits record (KEYS[6]) every replica's scripts enforce, and
-- announces it on the released channel ("limits"): replicas agree on one versioned record.
-- ARGV: mode, policy, seats, global_tokens, prefill_budget, long_prompt, then for small,
--   medium, large in turn: max, ceiling, tokens, lend, borrow; then ARGV[22]: the origin
--   (who writes it: "start <replica>", "reload <replica>", "limits push <who>"); ARGV[23]:
--   preempt_grace (jobs.preempt_prefill_grace_tokens; absent: 0); ARGV[24]: preempt_cooldown
--   (jobs.preempt_cooldown_ms; absent: 0).
--   mode "ensure": only when there is no record (a replica starting, or Redis lost it);
--   mode "reload": a replica's reloaded file, unless the record in force came from
--     `tutor-gateway limits push` (a push is reverted only on purpose: mode "force");
--   mode "force": always (a reload with force, or `tutor-gateway limits push`).
--   Each write is a new version, stamped with Redis's time (written_at_ms).
-- Reply: { version, written, origin, differs } (written 0: nothing written; origin: the
--   record's; differs 1: "ensure" found a record whose limits are not the ones given, or lack
--   some of them (an older build's): the record stays in force, the caller says so).
local mode = ARGV[1]
local version = tonumber(redis.call('HGET', KEYS[6], 'version') or '0')
local origin = redis.call('HGET', KEYS[6], 'origin') or ''
if mode == 'ensure' and version > 0 then
  local want = { policy = ARGV[2], seats = ARGV[3], global_tokens = ARGV[4],
    prefill_budget = ARGV[5], long_prompt = ARGV[6], preempt_grace = ARGV[23] or '0',
    preempt_cooldown = ARGV[24] or '0' }
  for i, lane in ipairs(LANES) do
    local at = 6 + (i - 1) * 5
    want[lane .. ':max'] = ARGV[at + 1]
    want[lane .. ':ceiling'] = ARGV[at + 2]
    want[lane .. ':tokens'] = ARGV[at + 3]
    want[lane .. ':lend'] = ARGV[at + 4]
    want[lane .. ':borrow'] = ARGV[at + 5]
  end
  local differs = 0
  for field, value in pairs(want) do
    if redis.call('HGET', KEYS[6], field) ~= value then
      differs = 1
    end
  end
  return { version, 0, origin, differs }
end
if mode == 'reload' and string.sub(origin, 1, 11) == 'limits push' then
  return { version, 0, origin, 0 }
end
version = version + 1
local now = redis.call('TIME')
local at_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('HSET', KEYS[6], 'version', version, 'policy', ARGV[2], 'seats', ARGV[3],
  'global_tokens', ARGV[4], 'prefill_budget', ARGV[5], 'long_prompt', ARGV[6],
  'origin', ARGV[22], 'written_at_ms', at_ms, 'preempt_grace', ARGV[23] or '0',
  'preempt_cooldown', ARGV[24] or '0')
for i, lane in ipairs(LANES) do
  local at = 6 + (i - 1) * 5
  redis.call('HSET', KEYS[6], lane .. ':max', ARGV[at + 1], lane .. ':ceiling', ARGV[at + 2],
    lane .. ':tokens', ARGV[at + 3], lane .. ':lend', ARGV[at + 4], lane .. ':borrow', ARGV[at + 5])
end
redis.call('PUBLISH', KEYS[4], 'limits')
return { version, 1, ARGV[22], 0 }
