-- Commit one transition atomically: fenced head + appended messages + events + checkpoint + outbox.
-- KEYS: run hash, messages list, checkpoints list, events stream, leases zset, index registry
--       set, in-flight hash, the run's status index before and after this commit (the same key
--       when the status does not change), the shard's ended-runs zset, then (terminal commits
--       only) every other key of the run, to expire with it: its attempts hash, its inbox, then
--       the results hash of each step
-- The commit is fenced twice: the run must be at expected_version (compare-and-set), and the
-- committing delivery must still hold its claim (a delivery whose claim expired and was taken over
-- cannot commit). An unclaimed commit (claim_field '') is only allowed while no claim is live.
-- A pending cancel wins over every transition but the interruption itself.
-- An answer (signals_cursor given: the cursor of the think that answered) is refused while the
-- run's inbox holds signals past that cursor: they were taken while the run was live, so the think
-- applies them and asks again ('signals_pending') instead of ending the run without them. As a
-- signal is taken only while the run has not ended (signal.lua), none can fall between the two.
-- ARGV after the messages and events: the broker commands that publish the outbox (see
-- push_broker), run with the commit when the run is still at the epoch they were built for.
-- Returns {'committed', epoch, pushed}, {'fenced', current_version}, {'cancel_pending', version}
-- or {'signals_pending', version}
-- (pushed: '1' if the outbox was published here; a replayed commit says '0').
local run_id, op, expected_version, claim_field, claim_token, new_version, phase, step, body, outbox,
  calls, kind, queued_lease_ms, retention_s, events_maxlen, n_messages, n_events, tenant, callback,
  signals_cursor = unpack(ARGV, 1, 20)
local run, messages_key, checkpoints, events_key, leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local registry, inflight, status_from, status_to, ended = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]

-- One HMGET reads every field the checks and the reply need (the commit's writes change none of
-- the claim's, the cancel's, the epoch's or the creation time's).
local claim_read = F_RUNNING
if claim_token ~= '' then claim_read = claim_field end
local state = redis.call('HMGET', run, F_VERSION, F_OP, claim_read, F_CANCEL, F_EPOCH, F_CREATED)
local current, epoch = state[1], state[5]
if current ~= expected_version then
  if current == new_version and state[2] == op then
    return {'committed', epoch, '0'}  -- this very commit, replayed
  end
  return {'fenced', current or ''}
end
local now = now_ms()
if claim_token ~= '' then
  local held = state[3]
  if not held or (claim_parts(held)) ~= claim_token then return {'fenced', current} end
else
  local running = state[3]
  if running and select(2, claim_parts(running)) > now then return {'fenced', current} end
end
if phase ~= P_INTERRUPTED and state[4] == '1' then
  return {'cancel_pending', current}
end
if signals_cursor ~= '' and tonumber(redis.call('HGET', KEYS[12], INBOX_NEXT) or '0') > tonumber(signals_cursor) then
  return {'signals_pending', current}
end

local queued_until = now + tonumber(queued_lease_ms)
-- A run that moves on from IDLE waits for its thread no more. A duplicate start can park it again
-- (thread_park.lua) after its wake and just before the woken start claims it and goes; that
-- duplicate's own wake then finds the run started and leaves the mark, so the start clears it.
local cleared = {F_RUNNING, F_DECISION}
if claim_field ~= '' then cleared[#cleared + 1] = claim_field end
if phase ~= P_IDLE then cleared[#cleared + 1] = F_THREAD_WAIT end
redis.call('HDEL', run, unpack(cleared))
redis.call('HSET', run, F_VERSION, new_version, F_PHASE, phase, F_STEP, step, F_BODY, body,
  F_OUTBOX, outbox, F_OUTBOX_CLAIMED, '0', F_CALLS, calls, F_QUEUED_UNTIL, queued_until,
  F_QUEUED_CHECKS, '0', F_OP, op)
local base = 20
-- One RPUSH per chunk of messages, not per message (chunks keep unpack's stack use bounded).
local last = base + tonumber(n_messages)
for first = base + 1, last, 100 do
  redis.call('RPUSH', messages_key, unpack(ARGV, first, math.min(first + 99, last)))
end
base = base + tonumber(n_messages)
for i = 1, tonumber(n_events) do
  redis.call('XADD', events_key, 'MAXLEN', '~', events_maxlen, '*', EVENT_FIELD, ARGV[base + i])
end
local pushed = push_broker(epoch, base + tonumber(n_events) + 1)
redis.call('RPUSH', checkpoints, body)
if status_from ~= status_to then
  local created = state[6] or '0'
  redis.call('ZREM', status_from, run_id)
  redis.call('ZADD', status_to, created, run_id)
  redis.call('SADD', registry, status_to)
end
if kind == 'live' or (kind == 'terminal' and callback == '1') then
  -- Live: the next phase is queued. Ended with a callback to deliver: that is the task now.
  redis.call('ZADD', leases, queued_until, run_id)
else
  redis.call('ZREM', leases, run_id)  -- parked or ended: nothing for the sweeper to watch
end
if kind == 'terminal' then
  redis.call('HINCRBY', inflight, tenant, -1)
  redis.call('ZADD', ended, now, run_id)  -- where the archiver finds it
  if callback == '1' then redis.call('HSET', run, F_CALLBACK, CALLBACK_PENDING) end
  local ttl = tonumber(retention_s)
  for i = 1, 4 do redis.call('EXPIRE', KEYS[i], ttl) end
  for i = 11, #KEYS do redis.call('EXPIRE', KEYS[i], ttl) end
end
return {'committed', epoch, pushed}
