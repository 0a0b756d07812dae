-- The shared quota's epoch: a random id, set once. A Redis that lost its data (restarted
-- without persistence, flushed, failed over to an empty replica) has none, and the first
-- replica to look sets a new one: every replica that saw another id knows its leases were
-- lost with the data, not taken over, and registers them again.
-- KEYS[1]: the epoch key. ARGV[1]: a fresh id. Returns the epoch in force.
local epoch = redis.call('GET', KEYS[1])
if epoch then
  return epoch
end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
