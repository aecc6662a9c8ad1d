-- Read the live items of one tenant's memory whose entries lie in a lexical range.
-- KEYS: values, versions, created, updated, index, expiry (as memory_write.lua)
-- ARGV: the range's low and high bounds (ZRANGEBYLEX syntax), at most how many items, at most how
-- many bytes of values.
-- Returns {more, row...}: more is '1' when the range held items past the bounds; a row is
-- {entry, value, version, created_ms, updated_ms, expires_ms or ''}. Expired items are skipped.
local low, high, most, most_bytes = unpack(ARGV, 1, 4)
local values, versions, created, updated, index, expiry =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local now = now_ms()
local limit = tonumber(most)
local entries = redis.call('ZRANGEBYLEX', index, low, high, 'LIMIT', 0, limit + 1)
local more = '0'
if #entries > limit then
  more = '1'
  entries[#entries] = nil
end
local reply = {more}
local bytes = 0
for _, entry in ipairs(entries) do
  local expires = redis.call('ZSCORE', expiry, entry)
  if not expires or tonumber(expires) > now then
    local value = redis.call('HGET', values, entry)
    if value then
      bytes = bytes + #value
      if bytes > tonumber(most_bytes) and #reply > 1 then
        reply[1] = '1'
        break
      end
      reply[#reply + 1] = {entry, value, redis.call('HGET', versions, entry), redis.call('HGET', created, entry),
        redis.call('HGET', updated, entry), expires or ''}
    end
  end
end
return reply
