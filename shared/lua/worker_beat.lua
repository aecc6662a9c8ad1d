-- A worker's heartbeat in the registry: its record (with a TTL) and its time in the index.
-- KEYS: the worker's record key, the workers zset. ARGV: worker id, record json, ttl_ms
-- Returns the Redis time (ms) of this beat. Entries of workers gone for long are dropped.
local id, record, ttl_ms = unpack(ARGV, 1, 3)
local now = now_ms()
-- The trim first: at maxmemory (noeviction) Redis refuses a script whose first write may add data,
-- but lets it go on once it wrote. A record replaces one of about its size, and a worker waiting
-- out a full Redis must stay listed (and say whether it consumes) rather than look dead.
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - 100 * tonumber(ttl_ms))
redis.call('SET', KEYS[1], record, 'PX', tonumber(ttl_ms))
redis.call('ZADD', KEYS[2], now, id)
return now
