-- Claim the scoring of one item, and read its case. KEYS: results, scoring, cases.
-- ARGV: item, lease_ms, case (the item's case index).
-- {'done'}: its result is recorded; {'busy'}: another scorer holds a live claim; {'ok', case}:
-- claimed, with the case as JSON (false when the eval's cases are not in Redis).
local item, lease_ms, case = ARGV[1], tonumber(ARGV[2]), ARGV[3]
if redis.call('HEXISTS', KEYS[1], item) == 1 then return {'done'} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = redis.call('ZSCORE', KEYS[2], item)
if held and tonumber(held) > now then return {'busy'} end
redis.call('ZADD', KEYS[2], now + lease_ms, item)
return {'ok', redis.call('HGET', KEYS[3], case)}
