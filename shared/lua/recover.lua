-- Sweeper, second step: act on what it decided after inspect (and, for unclaimed tasks, after
-- asking the broker whether their messages are still there). Everything is re-checked here,
-- atomically, by Redis's clock: two sweepers deciding on the same run act once.
-- KEYS: run hash, leases zset, attempts hash, results hash of the step
-- action 'wait': every unclaimed task is still in the broker: look again after wait_ms.
-- action 'hand_on': some claim expired, or unclaimed tasks are missing from the broker (listed
--   in missing): bump the epoch, so every earlier message of this phase is stale, and return the
--   tasks to publish again under it (every task that has no result and no live claim).
-- Returns {'moved'} when the run changed since inspect, {'waiting'}, or
-- {'handed_on', epoch, lost, tasks} where lost counts hand-ons of vanished messages at this version.
local run_id, op, action, version, epoch, step, missing, wait_ms, queued_lease_ms, reason =
  unpack(ARGV, 1, 10)
local run, leases, attempts_key, results_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

local head = redis.call('HMGET', run, F_VERSION, F_PHASE, F_STEP, F_EPOCH, F_CALLS, F_OP, F_CALLBACK)
if head[1] ~= version or head[3] ~= step or (head[2] == P_AWAITING_APPROVAL and not parked_resuming(run))
    or (TERMINAL[head[2]] and head[7] ~= CALLBACK_PENDING) then
  return {'moved'}
end
local phase = head[2]
local now = now_ms()
local replay = head[6] == op
if replay then epoch = head[4] elseif head[4] ~= epoch then return {'moved'} end
local states, next_live, expired = task_states(run, results_key, phase, step, head[5], now)
local by_key = {}
for i = 1, #states, 2 do by_key[states[i]] = states[i + 1] end

if action == 'wait' then
  local queued_until = now + tonumber(wait_ms)
  redis.call('HSET', run, F_QUEUED_UNTIL, queued_until)
  redis.call('HINCRBY', run, F_QUEUED_CHECKS, 1)
  local next_time = queued_until
  if next_live and next_live < next_time then next_time = next_live end
  redis.call('ZADD', leases, next_time, run_id)
  return {'waiting'}
end

local lost = 0
if not replay then
  local lost_keys = split_calls(missing)
  if not expired and #lost_keys == 0 then return {'moved'} end
  for _, key in ipairs(lost_keys) do
    if key == MISSING_PHASE_TASK then key = '' end
    if by_key[key] ~= TASK_UNCLAIMED then return {'moved'} end
  end
  epoch = tostring(redis.call('HINCRBY', run, F_EPOCH, 1))
  -- Tasks whose publish failed were never in the broker: sending them again is no sign of poison.
  if #lost_keys > 0 and redis.call('HGET', run, F_QUEUED_CHECKS) ~= QUEUED_UNSENT then
    lost = redis.call('HINCRBY', attempts_key, lost_field(version), 1)
  elseif #lost_keys > 0 then
    lost = tonumber(redis.call('HGET', attempts_key, lost_field(version)) or '0')
  end
  for key, state in pairs(by_key) do
    if state == TASK_EXPIRED then
      local field = F_RUNNING
      if key ~= '' then field = call_claim(step, key) end
      local err = last_error_field(version, field)
      if redis.call('HEXISTS', attempts_key, err) == 0 then
        local _, _, holder = claim_parts(redis.call('HGET', run, field))
        redis.call('HSET', attempts_key, err, expired_error(reason, holder))
      end
      -- The phase claim is dropped; an expired call claim stays, marked handed on, so the next
      -- delivery of the call knows an earlier one may have had its effect, and the sweeper does
      -- not hand it on again while its new message waits in a queue nobody consumes.
      if key == '' then
        redis.call('HDEL', run, F_RUNNING)
      else
        local token, _, holder = claim_parts(redis.call('HGET', run, field))
        redis.call('HSET', run, field, claim_value(token, HANDED_ON, holder))
      end
    end
  end
  redis.call('HSET', run, F_OP, op)
else
  lost = tonumber(redis.call('HGET', attempts_key, lost_field(version)) or '0')
end
local tasks = {}
for i = 1, #states, 2 do
  if states[i + 1] ~= TASK_DONE and states[i + 1] ~= TASK_LIVE then tasks[#tasks + 1] = states[i] end
end
local queued_until = now + tonumber(queued_lease_ms)
redis.call('HSET', run, F_QUEUED_UNTIL, queued_until, F_QUEUED_CHECKS, '0')
local next_time = queued_until
if next_live and next_live < next_time then next_time = next_live end
redis.call('ZADD', leases, next_time, run_id)
return {'handed_on', epoch, lost, tasks}
