-- Commit one transition atomically: fenced checkpoint + appended messages + events + outbox.
-- KEYS: run hash, messages list, checkpoints list, events stream, leases zset, runs index zset,
--       then (terminal commits only) every other key of the run, to expire with it
-- ARGV: 1 expected_version ('' = create), 2 new_version, 3 phase, 4 step, 5 epoch, 6 head_json,
--       7 outbox_json, 8 terminal ('1'/'0'), 9 events_maxlen, 10 retention_s, 11 lease_deadline
--       ('' = no lease: parked or terminal), 12 run_id, 13 now, 14 n_messages, 15 n_events,
--       then the messages, then the events.
-- Returns {1, version} on success, {0, current_version} if fenced off, {-1, version} if a cancel
-- is pending and this transition is not terminal (the caller then commits the interruption).
local current = redis.call('HGET', KEYS[1], 'version')
if ARGV[1] == '' then
  if current then return {0, current} end
elseif current ~= ARGV[1] then
  return {0, current or ''}
end
if ARGV[8] ~= '1' and redis.call('HGET', KEYS[1], 'cancel') == '1' then
  return {-1, current}
end
-- The phase claim ends with the commit; tool claims end when their result is recorded.
redis.call('HDEL', KEYS[1], 'running', 'decision')
redis.call('HSET', KEYS[1], 'version', ARGV[2], 'phase', ARGV[3], 'step', ARGV[4], 'epoch', ARGV[5],
  'body', ARGV[6], 'outbox', ARGV[7], 'outbox_sent', '0')
local n_messages = tonumber(ARGV[14])
local n_events = tonumber(ARGV[15])
local base = 15
for i = 1, n_messages do redis.call('RPUSH', KEYS[2], ARGV[base + i]) end
base = base + n_messages
for i = 1, n_events do
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[9], '*', 'e', ARGV[base + i])
end
redis.call('RPUSH', KEYS[3], ARGV[6])
if ARGV[1] == '' then redis.call('ZADD', KEYS[6], ARGV[13], ARGV[12]) end
if ARGV[11] ~= '' then
  redis.call('ZADD', KEYS[5], ARGV[11], ARGV[12])
else
  redis.call('ZREM', KEYS[5], ARGV[12])
end
if ARGV[8] == '1' then
  local ttl = tonumber(ARGV[10])
  for i = 1, 4 do redis.call('EXPIRE', KEYS[i], ttl) end
  for i = 7, #KEYS do redis.call('EXPIRE', KEYS[i], ttl) end
end
return {1, ARGV[2]}
