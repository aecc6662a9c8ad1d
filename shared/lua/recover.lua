-- Sweeper: take over a run whose lease expired. KEYS: 1 run hash, 2 leases zset, 3 attempts hash
-- ARGV: 1 run_id, 2 now, 3 new lease deadline
-- Returns {'gone'|'parked'|'alive'} or {'recover', phase, version, epoch, step, outbox, takeovers}
-- where takeovers counts the sweeper's takeovers at this version (a bound against a phase whose
-- task fails before it can even claim the run).
-- A run whose claim holder is still renewing is 'alive' (its lease is pushed to the claim's
-- deadline). Otherwise the epoch is bumped, so deliveries from before the takeover are stale,
-- the expired phase claim is dropped and the caller re-publishes the outbox under the new epoch.
local phase = redis.call('HGET', KEYS[1], 'phase')
if not phase then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return {'gone'}
end
if phase == 'completed' or phase == 'failed' or phase == 'interrupted' or phase == 'awaiting_approval' then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return {'parked'}
end
local now = tonumber(ARGV[2])
local latest = 0
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local name = fields[i]
  if name == 'running' or string.sub(name, 1, 6) == 'claim:' then
    local value = fields[i + 1]
    local deadline = tonumber(string.sub(value, string.find(value, '|', 1, true) + 1))
    if deadline > latest then latest = deadline end
  end
end
if latest > now then
  redis.call('ZADD', KEYS[2], latest, ARGV[1])
  return {'alive'}
end
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
local version = redis.call('HGET', KEYS[1], 'version')
local takeovers = redis.call('HINCRBY', KEYS[3], 'takeover:v' .. version, 1)
redis.call('HDEL', KEYS[1], 'running')
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
return {'recover', phase, version, tostring(epoch),
        redis.call('HGET', KEYS[1], 'step'), redis.call('HGET', KEYS[1], 'outbox') or '[]', takeovers}
