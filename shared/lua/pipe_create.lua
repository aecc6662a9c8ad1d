-- Create a pipeline run once. KEYS: meta, active, index. ARGV: pipeline_id, created_ms, then
-- meta field/value pairs. Returns 'created', or 'exists' (the same id names one pipeline run).
if redis.call('EXISTS', KEYS[1]) == 1 then return 'exists' end
for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], tonumber(ARGV[2]), ARGV[1])
return 'created'
