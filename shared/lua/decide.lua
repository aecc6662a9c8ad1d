-- Record a human decision on a parked run. KEYS: run hash. ARGV: expected_version, decision_json
-- Returns 1 if recorded, 0 if the run is not parked at that version (already decided, or moved on).
local version, decision = unpack(ARGV, 1, 2)
local run = KEYS[1]
local state = redis.call('HMGET', run, F_PHASE, F_VERSION)
if state[1] ~= P_AWAITING_APPROVAL or state[2] ~= version then return 0 end
if redis.call('HSETNX', run, F_DECISION, decision) == 0 then return 0 end
return 1
