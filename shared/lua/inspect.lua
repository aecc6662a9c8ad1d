-- Sweeper, first look at a run whose lease time came: is anything wrong with its current phase?
-- KEYS: run hash, leases zset, results hash of step_hint
-- Returns
--   {'gone'}            no such run (its lease entry is dropped);
--   {'settled'}         terminal, or parked with nothing to resume it: nothing to watch (its
--                       lease entry is dropped). A parked run being resumed (a decide claimed it,
--                       or a decision or cancel waits for one: parked_resuming) is watched as
--                       its one phase task, the decide;
--   {'moved', step}     the run is at another step than step_hint: look again with that step;
--   {'alive'}           every claimed task is live and unclaimed ones are still within their
--                       queued time: the lease entry is rescheduled to the earliest of those times;
--   {'due', version, epoch, phase, step, outbox, states, queued_checks}
--                       some claim expired (its holder stopped renewing), or unclaimed tasks are
--                       past their queued time: the caller decides (states as in task_states).
local run_id, step_hint = unpack(ARGV, 1, 2)
local run, leases, results_key = KEYS[1], KEYS[2], KEYS[3]

local head = redis.call('HMGET', run, F_VERSION, F_PHASE, F_STEP, F_EPOCH, F_OUTBOX, F_CALLS,
  F_QUEUED_UNTIL, F_QUEUED_CHECKS)
if not head[1] then
  redis.call('ZREM', leases, run_id)
  return {'gone'}
end
local phase = head[2]
-- An ended run is watched only while its callback is to be delivered (that is its task then).
if (phase == P_AWAITING_APPROVAL and not parked_resuming(run)) or (TERMINAL[phase] and redis.call('HGET', run, F_CALLBACK) ~= CALLBACK_PENDING) then
  redis.call('ZREM', leases, run_id)
  return {'settled'}
end
if head[3] ~= step_hint then return {'moved', head[3]} end
local now = now_ms()
local states, next_live, expired, unclaimed = task_states(run, results_key, phase, head[3], head[6], now)
local queued_until = tonumber(head[7] or '0')
if expired or (unclaimed and now >= queued_until) then
  return {'due', head[1], head[4], phase, head[3], head[5] or EMPTY_OUTBOX, states, head[8] or '0'}
end
local next_time = next_live
if unclaimed and (not next_time or queued_until < next_time) then next_time = queued_until end
redis.call('ZADD', leases, next_time or (now + 1000), run_id)
return {'alive'}
