-- A lease-style lock. KEYS: lock key. ARGV: token, ttl_ms, mode
-- mode 'hold': take the lock if free, or extend it if this token holds it; 1 if held after.
-- mode 'release': delete it if this token holds it; 1 if released.
local token, ttl_ms, mode = unpack(ARGV, 1, 3)
local current = redis.call('GET', KEYS[1])
if mode == 'release' then
  if current == token then redis.call('DEL', KEYS[1]) return 1 end
  return 0
end
if current and current ~= token then return 0 end
redis.call('SET', KEYS[1], token, 'PX', tonumber(ttl_ms))
return 1
