-- Record a human decision on a parked run. KEYS: run hash, leases zset.
-- ARGV: run_id, expected_version, decision_json, queued_lease_ms
-- Returns 1 if recorded, 0 if the run is not parked at that version (already decided, or moved on).
-- From here on the run is being resumed (parked_resuming): its decide task is watched by the
-- sweeper like any phase's, first as a message in the broker (for queued_lease_ms),
-- then under the claim of the delivery that takes it.
local run_id, version, decision, queued_lease_ms = unpack(ARGV, 1, 4)
local run, leases = KEYS[1], KEYS[2]
local state = redis.call('HMGET', run, F_PHASE, F_VERSION)
if state[1] ~= P_AWAITING_APPROVAL or state[2] ~= version then return 0 end
if redis.call('HSETNX', run, F_DECISION, decision) == 0 then return 0 end
local queued_until = now_ms() + tonumber(queued_lease_ms)
redis.call('HSET', run, F_QUEUED_UNTIL, queued_until, F_QUEUED_CHECKS, '0')
redis.call('ZADD', leases, 'LT', queued_until, run_id)
return 1
