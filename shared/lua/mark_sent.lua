-- After a publish: mark the run's outbox sent if the run is still at the version it was published
-- for, so a duplicate or late delivery that finds the run moved on does not publish it again.
-- KEYS: 1 run hash. ARGV: 1 version. Returns 1 if marked, 0 if the run moved on (or is gone).
if redis.call('HGET', KEYS[1], 'version') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'outbox_sent', '1')
return 1
