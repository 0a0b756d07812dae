-- tg quota v2: limits. Writes the limits record (KEYS[6]) every replica's scripts enforce, and
-- announces it on the released channel ("limits"): replicas agree on one versioned record.
-- ARGV: mode, policy, seats, global_tokens, prefill_budget, long_prompt, then for small,
--   medium, large in turn: max, ceiling, tokens, lend, borrow
--   mode "ensure": only when there is no record (a replica starting, or Redis lost it);
--   mode "push": always (a reload, or `tutor-gateway limits push`); the version goes up.
-- Reply: { version, written } (written 0: a record was there and mode was ensure).
local mode = ARGV[1]
local version = tonumber(redis.call('HGET', KEYS[6], 'version') or '0')
if mode == 'ensure' and version > 0 then
  return { version, 0 }
end
version = version + 1
redis.call('HSET', KEYS[6], 'version', version, 'policy', ARGV[2], 'seats', ARGV[3],
  'global_tokens', ARGV[4], 'prefill_budget', ARGV[5], 'long_prompt', ARGV[6])
for i, lane in ipairs(LANES) do
  local at = 6 + (i - 1) * 5
  redis.call('HSET', KEYS[6], lane .. ':max', ARGV[at + 1], lane .. ':ceiling', ARGV[at + 2],
    lane .. ':tokens', ARGV[at + 3], lane .. ':lend', ARGV[at + 4], lane .. ':borrow', ARGV[at + 5])
end
redis.call('PUBLISH', KEYS[4], 'limits')
return { version, 1 }
