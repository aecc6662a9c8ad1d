-- Record whether a schedule's tick starts a run, once: the first decision of the tick holds, and
-- every scheduler firing the tick again (racing, or after a crash) follows it.
-- KEYS: the schedule's hash
-- Returns {'ok', the decision that holds}, or {'stale'} when the tick is not the schedule's next
-- (fired already, paused, or the schedule is gone).
local schedule = KEYS[1]
local tick, decision = unpack(ARGV, 1, 2)
if redis.call('HGET', schedule, SCHED_NEXT) ~= tick then return {'stale'} end
if redis.call('HGET', schedule, SCHED_PAUSED) == SCHED_YES then return {'stale'} end
local field = SCHED_DECISION_PREFIX .. tick
redis.call('HSETNX', schedule, field, decision)
return {'ok', redis.call('HGET', schedule, field)}
