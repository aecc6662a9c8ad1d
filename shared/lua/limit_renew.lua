-- Keep a concurrent call's slot while its holder lives. KEYS: the limit's slots zset
-- ARGV: the holder's id, the lease (ms). Returns 1 if the slot was still held (and is extended),
-- 0 if it is gone or its lease had run out (it may be someone else's already: it is not revived).
local holder, lease_ms = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local deadline = tonumber(redis.call('ZSCORE', KEYS[1], holder) or '0')
if deadline <= now then
  redis.call('ZREM', KEYS[1], holder)
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + lease_ms, holder)
redis.call('PEXPIRE', KEYS[1], lease_ms * 2 + 60000)
return 1
