-- Claim one tool call of the current step for one delivery.
-- KEYS: run hash, attempts hash, leases zset, results hash of the step
-- The message must match the run exactly: version, epoch, the ACTING phase, the current step, and
-- a call id of that step. Returns {status, head, attempts, prior, last_error}:
--   'missing', 'stale' (head: version, phase, step, epoch, outbox, outbox_claimed), 'busy' as for
--   a phase; 'done' when the call already has its result; 'ok' when claimed (prior as for a phase).
-- head of 'ok' is {body, request, epoch, cancel}.
local run_id, version, epoch, step, call_id, token, holder, lease_ms = unpack(ARGV, 1, 8)
local run, attempts_key, leases, results_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

local state = redis.call('HMGET', run, F_VERSION, F_PHASE, F_STEP, F_EPOCH, F_OUTBOX, F_OUTBOX_CLAIMED, F_CALLS)
if not state[1] then return {'missing'} end
if state[1] ~= version or state[2] ~= P_ACTING or state[3] ~= step or state[4] ~= epoch
    or not has_call(state[7], call_id) then
  return {'stale', state}
end
if redis.call('HEXISTS', results_key, call_id) == 1 then return {'done'} end
local now = now_ms()
local field = call_claim(step, call_id)
local attempts_field = 'v' .. version .. ':' .. field
local prior = 'none'
local replay = false
local current = redis.call('HGET', run, field)
if current then
  local held_by, deadline = claim_parts(current)
  if held_by == token then
    replay = true
  elseif deadline > now then
    return {'busy', state}
  else
    prior = 'expired'
  end
end
local deadline = now + tonumber(lease_ms)
redis.call('HSET', run, field, claim_value(token, deadline, holder), F_OUTBOX_CLAIMED, '1')
local attempts
if replay then
  attempts = tonumber(redis.call('HGET', attempts_key, attempts_field) or '1')
else
  attempts = redis.call('HINCRBY', attempts_key, attempts_field, 1)
end
redis.call('ZADD', leases, 'LT', deadline, run_id)
local head = redis.call('HMGET', run, F_BODY, F_REQUEST, F_EPOCH, F_CANCEL)
local last_error = redis.call('HGET', attempts_key, 'err:' .. attempts_field) or ''
return {'ok', head, attempts, prior, last_error}
