-- Start of a phase task: read the head and claim the phase in one round trip.
-- KEYS: run hash, attempts hash, leases zset, messages list
-- ARGV: expected_version, expected_phase, attempt_field, lease_deadline, run_id, want_messages
-- Returns {status, fields..., attempts, messages...}; status "ok" only when the run is at the
-- expected version and phase. Claiming marks the outbox that published this task as sent
-- (its delivery proves the publish), counts the attempt (poison detection) and renews the lease.
local fields = redis.call('HGETALL', KEYS[1])
if #fields == 0 then return {'missing'} end
local version = redis.call('HGET', KEYS[1], 'version')
local phase = redis.call('HGET', KEYS[1], 'phase')
if version ~= ARGV[1] or phase ~= ARGV[2] then
  return {'stale', fields}
end
redis.call('HSET', KEYS[1], 'outbox_sent', '1')
local attempts = redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[5])
local messages = {}
if ARGV[6] == '1' then messages = redis.call('LRANGE', KEYS[4], 0, -1) end
return {'ok', fields, attempts, messages}
