-- Start of a phase task: read the head and claim the phase in one round trip.
-- KEYS: 1 run hash, 2 attempts hash, 3 leases zset, 4 messages list, 5 results hash of the step
-- ARGV: 1 expected_version, 2 expected_phase, 3 attempt_field, 4 lease_deadline, 5 run_id,
--       6 messages_from ('' = none, else the first index to read), 7 expected_epoch, 8 claim_field,
--       9 token, 10 now, 11 takeover, 12 results ('' = none, 'all', or a call id to check)
-- Returns {status, fields, attempts, messages, prior, results}:
--   'missing'  no such run;
--   'stale'    the run is not at this version/phase/epoch: a duplicate or late delivery;
--   'done'     the call named in ARGV[12] already has its result (a duplicate tool delivery);
--   'busy'     another delivery holds a live claim on this phase (it will commit, or its claim
--              will expire and the sweeper hands the phase on);
--   'ok'       claimed. prior is 'none', or 'expired'/'takeover' when an earlier attempt had
--              claimed the same work and never finished it (its outcome is unknown).
-- Claiming marks the outbox that published this task as sent (its delivery proves the publish),
-- counts the attempt (poison detection) and sets the lease the sweeper watches.
local fields = redis.call('HGETALL', KEYS[1])
if #fields == 0 then return {'missing'} end
local version = redis.call('HGET', KEYS[1], 'version')
local phase = redis.call('HGET', KEYS[1], 'phase')
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if version ~= ARGV[1] or phase ~= ARGV[2] or epoch ~= ARGV[7] then
  return {'stale', fields}
end
local results = {}
if ARGV[12] == 'all' then
  results = redis.call('HVALS', KEYS[5])
elseif ARGV[12] ~= '' and redis.call('HEXISTS', KEYS[5], ARGV[12]) == 1 then
  return {'done', fields}
end
local prior = 'none'
local claim = redis.call('HGET', KEYS[1], ARGV[8])
if claim then
  local sep = string.find(claim, '|', 1, true)
  local deadline = tonumber(string.sub(claim, sep + 1))
  if deadline > tonumber(ARGV[10]) and ARGV[11] ~= '1' then
    return {'busy', fields}
  end
  prior = (deadline > tonumber(ARGV[10])) and 'takeover' or 'expired'
end
redis.call('HSET', KEYS[1], ARGV[8], ARGV[9] .. '|' .. ARGV[4], 'outbox_sent', '1')
local attempts = redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[5])
local messages = {}
if ARGV[6] ~= '' then messages = redis.call('LRANGE', KEYS[4], tonumber(ARGV[6]), -1) end
return {'ok', fields, attempts, messages, prior, results}
