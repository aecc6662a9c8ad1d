-- Every sweeper, before each look (whether or not it holds the sweeper lock), notes that it reached
-- Redis. Claims and workers' liveness records run out by Redis's clock, which goes on while Redis is
-- down or out of everyone's reach; their holders could not renew them then. So when no sweeper
-- reached Redis for more than gap_ms, or the caller could not reach it since its last look
-- (unreachable '1'), sweepers judge nothing dead or expired for quiet_ms from now: time for every
-- live holder to renew what ran out meanwhile. Only what is still out after that is handed on.
-- KEYS: seen (string: Redis time in ms of the last look), quiet (string, expiring: the quiet time)
-- Returns the milliseconds of quiet left (0 or less: sweepers judge as usual).
local gap_ms, quiet_ms, unreachable = unpack(ARGV, 1, 3)
local seen_key, quiet_key = KEYS[1], KEYS[2]

local now = now_ms()
local seen = tonumber(redis.call('GET', seen_key) or '0')
-- DEL first: a Redis at maxmemory (noeviction) refuses a script whose first write may add data, and
-- a full Redis is within reach: its holders renew (renew.lua), so it must not bring a quiet time.
redis.call('DEL', seen_key)
redis.call('SET', seen_key, now)
local quiet = redis.call('PTTL', quiet_key)
if unreachable == '1' or (seen > 0 and now - seen > tonumber(gap_ms)) then
  if quiet < tonumber(quiet_ms) then
    redis.call('SET', quiet_key, now, 'PX', tonumber(quiet_ms))
    quiet = tonumber(quiet_ms)
  end
end
return quiet
