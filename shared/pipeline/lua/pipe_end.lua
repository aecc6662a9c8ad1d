-- End a running pipeline, once. KEYS: meta. ARGV: seq ('*': whatever step it is at), status,
-- output JSON, error JSON, finished_ms. Returns 'ok', or the status it had ('stale': another step).
local meta = KEYS[1]
local status = redis.call('HGET', meta, PIPE_STATUS)
if not status then return '' end
if status ~= PIPE_RUNNING then return status end
if ARGV[1] ~= '*' and redis.call('HGET', meta, PIPE_SEQ) ~= ARGV[1] then return 'stale' end
redis.call('HSET', meta, PIPE_STATUS, ARGV[2], PIPE_OUTPUT, ARGV[3], PIPE_ERROR, ARGV[4], PIPE_FINISHED_MS, ARGV[5])
return 'ok'
