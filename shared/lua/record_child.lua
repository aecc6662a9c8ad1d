-- Record a child run's outcome as its parent's tool result, once, with its ToolCompleted event.
-- KEYS: parent's run hash, results hash of the parent's step, parent's events stream
-- The parent must still be parked for its children at that step (a cancelled or moved-on parent
-- takes nothing). Returns {'recorded'|'duplicate', results now} or {'stale'}.
local step, call_id, result, event, events_maxlen = unpack(ARGV, 1, 5)
local run, results_key, events_key = KEYS[1], KEYS[2], KEYS[3]

local state = redis.call('HMGET', run, F_PHASE, F_STEP)
if state[1] ~= P_AWAITING_APPROVAL or state[2] ~= step then return {'stale'} end
if redis.call('HSETNX', results_key, call_id, result) == 0 then
  return {'duplicate', redis.call('HLEN', results_key)}
end
redis.call('XADD', events_key, 'MAXLEN', '~', events_maxlen, '*', EVENT_FIELD, event)
return {'recorded', redis.call('HLEN', results_key)}
