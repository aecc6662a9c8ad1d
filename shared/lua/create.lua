-- Create a run, once: IDLE at version 1, its request stored, its start task in the outbox, and the
-- run entered in its tenant's indexes (all, by agent, by status, by thread) and in-flight count.
-- KEYS: run hash, checkpoints list, leases zset, runs index zset, index registry set, in-flight
--       hash (all of the run's shard), then the index keys to enter it in, then (released given)
--       the sorted set to remove released from
-- released: a member of the sorted set that is the last of KEYS, removed with the create ('': none,
-- and no such key): a submit's hold of its place under its tenant's limits, dropped the moment its
-- run is in the in-flight count (producer/api/limits.py).
-- ARGV after the eight: the broker commands that publish the start task (see push_broker; a new
-- run's epoch is 0), run with the create: the run and its start in one step.
-- Returns {'created', pushed}, or {'exists'} when a run with this id is already there (a replay of
-- this very create answers {'created', '0'}: the caller publishes, as after a replayed commit).
-- pushed: '1' if the start was published here. A replay is known by its request, which the run
-- keeps as created (every create's request holds its own creation time), not by the op id: the
-- run's first commit replaces that, and a worker may commit the run before the replay arrives.
local run_id, op, request, body, outbox, queued_lease_ms, tenant, released = unpack(ARGV, 1, 8)
local run, checkpoints, leases, runs_index, registry, inflight = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]

if redis.call('EXISTS', run) == 1 then
  if redis.call('HGET', run, F_REQUEST) == request then return {'created', '0'} end
  return {'exists'}
end
local now = now_ms()
local queued_until = now + tonumber(queued_lease_ms)
redis.call('HSET', run, F_VERSION, '1', F_PHASE, P_IDLE, F_STEP, '0', F_EPOCH, '0', F_REQUEST, request,
  F_BODY, body, F_OUTBOX, outbox, F_OUTBOX_CLAIMED, '0', F_CALLS, '', F_QUEUED_UNTIL, queued_until,
  F_QUEUED_CHECKS, '0', F_OP, op, F_CREATED, now)
redis.call('RPUSH', checkpoints, body)
redis.call('ZADD', runs_index, now, run_id)
redis.call('ZADD', leases, queued_until, run_id)
local last_index = #KEYS
if released ~= '' then last_index = last_index - 1 end
for i = 7, last_index do
  redis.call('ZADD', KEYS[i], now, run_id)
  redis.call('SADD', registry, KEYS[i])
end
redis.call('HINCRBY', inflight, tenant, 1)
if released ~= '' then redis.call('ZREM', KEYS[#KEYS], released) end
return {'created', push_broker('0', 9)}
