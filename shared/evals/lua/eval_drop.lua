-- Delete an archived eval's keys, if it is still completed (the archive holds it as it was).
-- KEYS: meta, cases, pending, slots, scoring, results, counts, index, active, its tenant's index.
-- ARGV: eval_id.
-- Returns 1 when deleted, 0 when it was no longer completed (nothing is deleted then).
if redis.call('HGET', KEYS[1], EVAL_STATUS) ~= EVAL_COMPLETED then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7])
redis.call('ZREM', KEYS[8], ARGV[1])
redis.call('SREM', KEYS[9], ARGV[1])
redis.call('ZREM', KEYS[10], ARGV[1])
return 1
