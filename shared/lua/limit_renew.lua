-- Keep a concurrent call's slot while its holder lives. KEYS: the limit's slots zset
-- ARGV: the holder's id, the lease (ms). Returns 1 if the slot was still held (and is extended).
local holder, lease_ms = ARGV[1], tonumber(ARGV[2])
if not redis.call('ZSCORE', KEYS[1], holder) then return 0 end
redis.call('ZADD', KEYS[1], 'XX', now_ms() + lease_ms, holder)
redis.call('PEXPIRE', KEYS[1], lease_ms * 2 + 60000)
return 1
