-- A tenant's submits of the last window (a minute), one sorted-set member per admitted submit
-- scored by Redis's clock: admit one more while the window holds fewer than the limit.
-- KEYS: the tenant's window zset. ARGV: limit, window ms, member (unique per submit)
-- Returns {1, 0} when admitted, else {0, ms until the window has room}.
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local now = now_ms()
-- An admitted submit adds its entry (and its run): at a full Redis the submit is refused before
-- the trim below writes, so a refused submit spends nothing of the tenant's window.
refuse_when_full(KEYS[1])
-- This very call sent again after its reply was lost (the client's retry): its entry is there,
-- and it was admitted. Counted again, the tenant's last free submit would refuse itself.
if redis.call('ZSCORE', KEYS[1], ARGV[3]) then
  return {1, 0}
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local count = redis.call('ZCARD', KEYS[1])
if count >= limit then
  -- Room comes when the entries above the limit (and one more) have left the window; a lowered
  -- limit may leave more than ``limit`` entries in it.
  local edge = redis.call('ZRANGE', KEYS[1], count - limit, count - limit, 'WITHSCORES')
  return {0, math.max(1, tonumber(edge[2]) + window - now)}
end
redis.call('ZADD', KEYS[1], now, ARGV[3])
redis.call('PEXPIRE', KEYS[1], window)
return {1, 0}
