-- Add a run to its conversation thread, once, and return the thread's runs, oldest first.
-- KEYS: thread list. ARGV: run_id, ttl_s
local run_id, ttl = unpack(ARGV, 1, 2)
if not redis.call('LPOS', KEYS[1], run_id) then redis.call('RPUSH', KEYS[1], run_id) end
redis.call('EXPIRE', KEYS[1], tonumber(ttl))
return redis.call('LRANGE', KEYS[1], 0, -1)
