-- Create a pipeline run once. KEYS: meta, active, index, the tenant's index. ARGV: pipeline_id,
-- created_ms, retention_ms, then meta field/value pairs. Returns 'created', or 'exists' (the same
-- id names one pipeline run). The tenant's index loses its entries past the retention here, and
-- expires with its last entry, so it stays bounded without a sweep.
if redis.call('EXISTS', KEYS[1]) == 1 then return 'exists' end
for i = 4, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
local created, retention = tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], created, ARGV[1])
redis.call('ZADD', KEYS[4], created, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. (created - retention))
redis.call('PEXPIRE', KEYS[4], retention * 2)
return 'created'
