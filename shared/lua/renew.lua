-- Heartbeat: extend a live claim and the run's lease. KEYS: 1 run hash, 2 leases zset
-- ARGV: 1 claim_field, 2 token, 3 deadline, 4 run_id
-- Returns {held, cancel}: held = 1 while this token still owns the claim.
local claim = redis.call('HGET', KEYS[1], ARGV[1])
local cancel = redis.call('HGET', KEYS[1], 'cancel') == '1' and 1 or 0
if not claim or string.sub(claim, 1, #ARGV[2] + 1) ~= ARGV[2] .. '|' then return {0, cancel} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. '|' .. ARGV[3])
redis.call('ZADD', KEYS[2], 'GT', ARGV[3], ARGV[4])
return {1, cancel}
