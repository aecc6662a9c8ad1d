-- End a running pipeline, once. KEYS: meta. ARGV: seq ('*': whatever step it is at), status,
-- output JSON, error JSON, finished_ms. Returns 'ok', or the status it had ('stale': another step).
local meta = KEYS[1]
local status = redis.call('HGET', meta, 'status')
if not status then return '' end
if status ~= 'running' then return status end
if ARGV[1] ~= '*' and redis.call('HGET', meta, 'seq') ~= ARGV[1] then return 'stale' end
redis.call('HSET', meta, 'status', ARGV[2], 'output', ARGV[3], 'error', ARGV[4], 'finished_ms', ARGV[5])
return 'ok'
