-- Record a child run's outcome as its parent's tool result, once, with its ToolCompleted event.
-- KEYS: parent's run hash, results hash of the parent's step, parent's events stream, leases zset
-- The parent must still be parked for its children at that step (a cancelled or moved-on parent
-- takes nothing). Returns {'recorded'|'duplicate', results now} or {'stale'}.
-- Once the step has all its results (`expected`), the parent is owed its resume: marked so at its
-- version (parked_resuming), its decide task is watched by the sweeper from here on, first as a
-- message in the broker (for queued_lease_ms), so a resume message lost before any worker took it
-- is sent again, as for a stored decision (decide.lua).
local step, call_id, result, event, events_maxlen, expected, queued_lease_ms, run_id = unpack(ARGV, 1, 8)
local run, results_key, events_key, leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

local state = redis.call('HMGET', run, F_PHASE, F_STEP, F_VERSION, F_CHILDREN_ENDED)
if state[1] ~= P_AWAITING_APPROVAL or state[2] ~= step then return {'stale'} end
local status = 'duplicate'
if redis.call('HSETNX', results_key, call_id, result) == 1 then
  redis.call('XADD', events_key, 'MAXLEN', '~', events_maxlen, '*', EVENT_FIELD, event)
  status = 'recorded'
end
local count = redis.call('HLEN', results_key)
if count >= tonumber(expected) and state[4] ~= state[3] then
  local queued_until = now_ms() + tonumber(queued_lease_ms)
  redis.call('HSET', run, F_CHILDREN_ENDED, state[3], F_QUEUED_UNTIL, queued_until, F_QUEUED_CHECKS, '0')
  redis.call('ZADD', leases, 'LT', queued_until, run_id)
end
return {status, count}
