-- Move item ARGV[2] of step ARGV[1] from attempt ARGV[3] to the next, once. KEYS: meta, attempts.
-- Returns 'ok', or 'stale' (moved already, another step, or the pipeline ended).
local meta = KEYS[1]
if redis.call('HGET', meta, PIPE_STATUS) ~= PIPE_RUNNING then return 'stale' end
if redis.call('HGET', meta, PIPE_SEQ) ~= ARGV[1] then return 'stale' end
if (redis.call('HGET', KEYS[2], ARGV[2]) or '0') ~= ARGV[3] then return 'stale' end
redis.call('HSET', KEYS[2], ARGV[2], tostring(tonumber(ARGV[3]) + 1))
return 'ok'
