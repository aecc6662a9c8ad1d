-- Record one tool result exactly once, and make the fan-in: the last result of the step commits
-- the OBSERVING head the worker computed with the state machine (with its checkpoint and outbox).
-- KEYS: run hash, results hash of the step, events stream, leases zset, checkpoints list
-- Returns {'stale'} (the run moved on), {'duplicate'} (the call already has another result),
-- {'recorded'}, or {'complete', epoch, pushed} (this result was the last: the run is now OBSERVING;
-- pushed '1' if the script also ran the broker commands that publish observe, ARGV from 15 on,
-- see push_broker; a replayed fan-in says '0').
-- A replay of this very call (same result, same op) answers as the first time did.
local run_id, op, version, step, call_id, claim_token, result, event, n_calls, observe_version,
  observe_body, observe_outbox, queued_lease_ms, events_maxlen = unpack(ARGV, 1, 14)
local run, results_key, events_key, leases, checkpoints = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]

-- One HMGET reads every field of the run hash the script checks or returns (its writes below
-- change none of them before they are used).
local field = call_claim(step, call_id)
local state = redis.call('HMGET', run, F_VERSION, F_PHASE, F_STEP, F_OP, F_EPOCH, field, F_CALLS)
local epoch = state[5]
if state[1] ~= version or state[2] ~= P_ACTING or state[3] ~= step then
  if state[1] == observe_version and state[4] == op then
    return {'complete', epoch, '0'}  -- this very fan-in, replayed
  end
  return {'stale'}
end
if redis.call('HSETNX', results_key, call_id, result) == 0 then
  if redis.call('HGET', results_key, call_id) == result then return {'recorded'} end  -- replayed
  return {'duplicate'}
end
redis.call('XADD', events_key, 'MAXLEN', '~', events_maxlen, '*', EVENT_FIELD, event)
local held = state[6]
local own = held and (claim_parts(held)) == claim_token
if redis.call('HLEN', results_key) < tonumber(n_calls) then
  if own then redis.call('HDEL', run, field) end
  return {'recorded'}
end

-- The step is over: no claim of its calls (live or an expired marker) means anything now.
local claims = {}
if own then claims[1] = field end
for _, id in ipairs(split_calls(state[7])) do claims[#claims + 1] = call_claim(step, id) end
for first = 1, #claims, 100 do redis.call('HDEL', run, unpack(claims, first, math.min(first + 99, #claims))) end
local queued_until = now_ms() + tonumber(queued_lease_ms)
redis.call('HSET', run, F_VERSION, observe_version, F_PHASE, P_OBSERVING, F_BODY, observe_body,
  F_OUTBOX, observe_outbox, F_OUTBOX_CLAIMED, '0', F_QUEUED_UNTIL, queued_until, F_QUEUED_CHECKS, '0',
  F_OP, op)
redis.call('RPUSH', checkpoints, observe_body)
redis.call('ZADD', leases, queued_until, run_id)
return {'complete', epoch, push_broker(epoch, 15)}
