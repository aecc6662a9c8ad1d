-- A worker's main process is alive: it says so until ttl_ms from now (Redis's clock), and, when
-- given, replaces the list of claims its pool processes hold (mode 'set'; '' deletes it).
-- KEYS: lives zset, this start's held key. ARGV: life, ttl_ms, mode ('keep' or 'set'), held
-- Returns 1 when the held list is there after the beat, 0 when the caller must send it (a sweeper
-- judged this start dead meanwhile and dropped it: the next beat carries the list again).
local life, ttl_ms, mode, held = unpack(ARGV, 1, 4)
redis.call('ZADD', KEYS[1], now_ms() + tonumber(ttl_ms), life)
if mode == 'set' then
  if held == '' then redis.call('DEL', KEYS[2]) else redis.call('SET', KEYS[2], held) end
  return 1
end
return redis.call('EXISTS', KEYS[2])
