-- Commit one transition atomically: fenced head + appended messages + events + checkpoint + outbox.
-- KEYS: run hash, messages list, checkpoints list, events stream, leases zset, index registry
--       set, in-flight hash, the run's status index before and after this commit (the same key
--       when the status does not change), the shard's ended-runs zset, then (terminal commits
--       only) every other key of the run, to expire with it
-- The commit is fenced twice: the run must be at expected_version (compare-and-set), and the
-- committing delivery must still hold its claim (a delivery whose claim expired and was taken over
-- cannot commit). An unclaimed commit (claim_field '') is only allowed while no claim is live.
-- A pending cancel wins over every transition but the interruption itself.
-- ARGV after the messages and events: the broker commands that publish the outbox (see
-- push_broker), run with the commit when the run is still at the epoch they were built for.
-- Returns {'committed', epoch, pushed}, {'fenced', current_version} or {'cancel_pending', version}
-- (pushed: '1' if the outbox was published here; a replayed commit says '0').
local run_id, op, expected_version, claim_field, claim_token, new_version, phase, step, body, outbox,
  calls, kind, queued_lease_ms, retention_s, events_maxlen, n_messages, n_events, tenant, callback =
  unpack(ARGV, 1, 19)
local run, messages_key, checkpoints, events_key, leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local registry, inflight, status_from, status_to, ended = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]

local current = redis.call('HGET', run, F_VERSION)
if current ~= expected_version then
  if current == new_version and redis.call('HGET', run, F_OP) == op then
    return {'committed', redis.call('HGET', run, F_EPOCH), '0'}  -- this very commit, replayed
  end
  return {'fenced', current or ''}
end
local now = now_ms()
if claim_token ~= '' then
  local held = redis.call('HGET', run, claim_field)
  if not held or (claim_parts(held)) ~= claim_token then return {'fenced', current} end
else
  local running = redis.call('HGET', run, F_RUNNING)
  if running and select(2, claim_parts(running)) > now then return {'fenced', current} end
end
if phase ~= P_INTERRUPTED and redis.call('HGET', run, F_CANCEL) == '1' then
  return {'cancel_pending', current}
end

local queued_until = now + tonumber(queued_lease_ms)
if claim_field ~= '' then redis.call('HDEL', run, claim_field) end
redis.call('HDEL', run, F_RUNNING, F_DECISION)
redis.call('HSET', run, F_VERSION, new_version, F_PHASE, phase, F_STEP, step, F_BODY, body,
  F_OUTBOX, outbox, F_OUTBOX_CLAIMED, '0', F_CALLS, calls, F_QUEUED_UNTIL, queued_until,
  F_QUEUED_CHECKS, '0', F_OP, op)
local base = 19
for i = 1, tonumber(n_messages) do redis.call('RPUSH', messages_key, ARGV[base + i]) end
base = base + tonumber(n_messages)
for i = 1, tonumber(n_events) do
  redis.call('XADD', events_key, 'MAXLEN', '~', events_maxlen, '*', 'e', ARGV[base + i])
end
local pushed = push_broker(run, base + tonumber(n_events) + 1)
redis.call('RPUSH', checkpoints, body)
if status_from ~= status_to then
  local created = redis.call('HGET', run, F_CREATED) or '0'
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
  if callback == '1' then redis.call('HSET', run, F_CALLBACK, 'pending') end
  local ttl = tonumber(retention_s)
  for i = 1, 4 do redis.call('EXPIRE', KEYS[i], ttl) end
  for i = 11, #KEYS do redis.call('EXPIRE', KEYS[i], ttl) end
end
return {'committed', redis.call('HGET', run, F_EPOCH), pushed}
