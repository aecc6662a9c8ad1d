-- Claim one tool call of the current step for one delivery.
-- KEYS: run hash, attempts hash, leases zset, results hash of the step, the holder's last-claim key
-- ARGV last_claim: as for a phase (claim_phase.lua).
-- The message must match the run exactly: version, epoch, the ACTING phase, the current step, and
-- a call id of that step. Returns {status, head, attempts, prior, last_error}:
--   'missing', 'stale' (head: version, phase, step, epoch, outbox, outbox_claimed), 'busy' as for
--   a phase; 'done' when the call already has its result; 'ok' when claimed (prior as for a phase).
-- head of 'ok' is {body, request, epoch, cancel}.
-- One HMGET reads everything the claim checks and returns: the claim's own writes below touch none
-- of the fields returned in head.
local run_id, version, epoch, step, call_id, token, holder, lease_ms, last_claim = unpack(ARGV, 1, 9)
local run, attempts_key, leases, results_key, last_claim_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]

local field = call_claim(step, call_id)
local state = redis.call('HMGET', run, F_VERSION, F_PHASE, F_STEP, F_EPOCH, F_OUTBOX, F_OUTBOX_CLAIMED,
  F_CALLS, field, F_BODY, F_REQUEST, F_CANCEL)
if not state[1] then return {'missing'} end
local seen = {state[1], state[2], state[3], state[4], state[5], state[6], state[7]}
if state[1] ~= version or state[2] ~= P_ACTING or state[3] ~= step or state[4] ~= epoch
    or not has_call(state[7], call_id) then
  return {'stale', seen}
end
if redis.call('HEXISTS', results_key, call_id) == 1 then return {'done'} end
local now = now_ms()
local counted = attempts_field(version, field)
local prior = 'none'
local replay = false
local current = state[8]
if current then
  local held_by, deadline = claim_parts(current)
  if held_by == token then
    replay = true
  elseif deadline > now then
    return {'busy', seen}
  else
    prior = 'expired'
  end
end
local deadline = now + tonumber(lease_ms)
redis.call('HSET', run, field, claim_value(token, deadline, holder), F_OUTBOX_CLAIMED, '1')
local attempts
if replay then
  attempts = tonumber(redis.call('HGET', attempts_key, counted) or '1')
else
  attempts = redis.call('HINCRBY', attempts_key, counted, 1)
end
redis.call('ZADD', leases, 'LT', deadline, run_id)
-- At least 1 ms: SET refuses PX 0 (a lease under a millisecond, as a benchmark's takeover loop sets).
redis.call('SET', last_claim_key, last_claim, 'PX', math.max(lease_ms, 1))
-- A last error is written only about a claim counted in attempts (release.lua, recover.lua): the
-- first claim of this call at this version has none to read.
local last_error = ''
if attempts > 1 then last_error = redis.call('HGET', attempts_key, last_error_field(version, field)) or '' end
return {'ok', {state[9], state[10], state[4], state[11]}, attempts, prior, last_error}
