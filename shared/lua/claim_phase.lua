-- Claim a phase (start, think, observe, decide) for one delivery, and read what the phase needs.
-- KEYS: run hash, attempts hash, leases zset, messages list, results hash of the step, inbox hash,
--       the holder's last-claim key in this shard
-- ARGV last_claim: this claim as the liveness records list it, kept for the lease under the
-- holder's last-claim key (a worker killed before its main process listed the claim).
-- Returns {status, head, attempts, messages, prior, results, last_error, signals_sent, callback} where
-- status is
--   'missing'  no such run;
--   'stale'    the run is not at this version, phase, epoch and step: a duplicate or late delivery
--              (head then holds version, phase, step, epoch, outbox, outbox_claimed);
--   'busy'     another delivery holds a claim on the phase that has not expired by Redis's clock;
--   'ok'       claimed (or this delivery's own claim, replayed). prior is 'none', or 'expired' when
--              an earlier delivery claimed the phase and stopped renewing before it finished.
-- head of 'ok' is {body, request, epoch, cancel}. signals_sent (with want_inbox '1', else '') is the
-- sequence number of the last signal sent into the run: a think compares it with its cursor and
-- reads the inbox only when it is behind, so a run no one signals pays no round trip for it.
-- callback (with want_callback '1', else empty) is {callback, callback_state} of the run: where its
-- callback stands and its attempts so far, which a callback's delivery reads with its claim.
-- One HMGET reads everything the claim checks and returns: the claim's own writes below touch none
-- of the fields returned in head.
local run_id, version, phase, epoch, step, token, holder, lease_ms, messages_from, want_results, want_inbox,
  last_claim, want_callback = unpack(ARGV, 1, 13)
local run, attempts_key, leases, messages_key, results_key, inbox, last_claim_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]

local state = redis.call('HMGET', run, F_VERSION, F_PHASE, F_STEP, F_EPOCH, F_OUTBOX, F_OUTBOX_CLAIMED,
  F_RUNNING, F_BODY, F_REQUEST, F_CANCEL)
if not state[1] then return {'missing'} end
local seen = {state[1], state[2], state[3], state[4], state[5], state[6]}
if state[1] ~= version or state[2] ~= phase or state[3] ~= step or state[4] ~= epoch then
  return {'stale', seen}
end
local now = now_ms()
local counted = attempts_field(version, F_RUNNING)
local prior = 'none'
local current = state[7]
local replay = false
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
redis.call('HSET', run, F_RUNNING, claim_value(token, deadline, holder), F_OUTBOX_CLAIMED, '1')
local attempts
if replay then
  attempts = tonumber(redis.call('HGET', attempts_key, counted) or '1')
else
  attempts = redis.call('HINCRBY', attempts_key, counted, 1)
end
redis.call('ZADD', leases, 'LT', deadline, run_id)
-- At least 1 ms: SET refuses PX 0 (a lease under a millisecond, as a benchmark's takeover loop sets).
redis.call('SET', last_claim_key, last_claim, 'PX', math.max(lease_ms, 1))
local messages = {}
if messages_from ~= '' then messages = redis.call('LRANGE', messages_key, tonumber(messages_from), -1) end
local results = {}
if want_results == '1' then results = redis.call('HVALS', results_key) end
-- A last error is written only about a claim counted in attempts (release.lua, recover.lua): the
-- first claim of this work at this version has none to read.
local last_error = ''
if attempts > 1 then last_error = redis.call('HGET', attempts_key, last_error_field(version, F_RUNNING)) or '' end
local signals_sent = ''
if want_inbox == '1' then signals_sent = redis.call('HGET', inbox, INBOX_NEXT) or '0' end
local callback = {}
if want_callback == '1' then callback = redis.call('HMGET', run, F_CALLBACK, F_CALLBACK_STATE) end
return {'ok', {state[8], state[9], state[4], state[10]}, attempts, messages, prior, results, last_error,
  signals_sent, callback}
