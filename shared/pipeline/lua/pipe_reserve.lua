-- Take up to ARGV[2] items of step ARGV[1] to start, within the step's cap on live children.
-- KEYS: meta. An item is live from here until its result is recorded (pipe_record), so the cap
-- holds across the pool whoever starts items. Returns {first item, count} (count 0: none now).
local meta = KEYS[1]
if redis.call('HGET', meta, PIPE_STATUS) ~= PIPE_RUNNING then return {0, 0} end
if redis.call('HGET', meta, PIPE_SEQ) ~= ARGV[1] then return {0, 0} end
local started = tonumber(redis.call('HGET', meta, PIPE_STARTED))
local done = tonumber(redis.call('HGET', meta, PIPE_DONE))
local cap = tonumber(redis.call('HGET', meta, PIPE_CAP))
local total = tonumber(redis.call('HGET', meta, PIPE_TOTAL))
local n = math.min(cap - (started - done), total - started, tonumber(ARGV[2]))
if n <= 0 then return {started, 0} end
redis.call('HSET', meta, PIPE_STARTED, tostring(started + n))
return {started, n}
