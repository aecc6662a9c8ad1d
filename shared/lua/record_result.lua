-- Record one tool result exactly once and decide the fan-in atomically.
-- KEYS: run hash, results hash, events stream, leases zset
-- ARGV: 1 expected_version, 2 call_id, 3 result_json, 4 event_json, 5 n_calls,
--       6 observe_outbox_json, 7 events_maxlen, 8 lease_deadline, 9 run_id
-- Returns 'stale' (run moved on), 'duplicate' (this call already has a result), 'recorded', or
-- 'complete:<epoch>' (the last result: the run is now OBSERVING and the outbox holds observe).
if redis.call('HGET', KEYS[1], 'version') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'phase') ~= 'acting' then
  return 'stale'
end
if redis.call('HSETNX', KEYS[2], ARGV[2], ARGV[3]) == 0 then return 'duplicate' end
redis.call('HDEL', KEYS[1], 'claim:' .. ARGV[2])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[7], '*', 'e', ARGV[4])
if redis.call('HLEN', KEYS[2]) < tonumber(ARGV[5]) then return 'recorded' end
redis.call('HSET', KEYS[1], 'phase', 'observing', 'version', tostring(tonumber(ARGV[1]) + 1),
  'outbox', ARGV[6], 'outbox_sent', '0')
redis.call('ZADD', KEYS[4], ARGV[8], ARGV[9])
-- The observe task must carry the run's current epoch (the sweeper may have bumped it).
return 'complete:' .. redis.call('HGET', KEYS[1], 'epoch')
