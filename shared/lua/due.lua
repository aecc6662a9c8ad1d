-- Sweeper: run ids of one shard whose lease time has come, by Redis's clock.
-- KEYS: leases zset. ARGV: limit
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms(), 'LIMIT', 0, tonumber(ARGV[1]))
