-- Apply puts and deletes to one tenant's memory, each write id at most once.
-- KEYS: values, versions, created, updated, index, expiry (hashes and sorted sets by item entry),
-- applied (write ids applied, scored by when), vectors (an item's embedding, float32 bytes)
-- ARGV: the tenant's item quota, how long an applied id is remembered (ms), how many expired items
-- to purge first; then six per write: its id ('' for none: always applied), op (put or delete),
-- the item's entry, the value's JSON (a put), its TTL in ms ('' for none), the value's embedding
-- ('' for none: a put without one drops the old value's).
-- Returns one reply per write: {'put', version, created_ms, updated_ms, expires_ms or ''},
-- {'deleted'}, {'absent'} (nothing to delete), {'duplicate'} (its id was applied before), or
-- {'full'} (a new item past the quota: not stored).
local quota, applied_keep_ms, purge_limit = unpack(ARGV, 1, 3)
local values, versions, created, updated, index, expiry, applied, vectors =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local now = now_ms()

-- A put adds data: at a full Redis the whole call is refused before the purges below write (see
-- refuse_when_full). Deletes alone go through, and free memory.
for at = 5, #ARGV, 6 do
  if ARGV[at] == 'put' then
    refuse_when_full(applied)
    break
  end
end

local function drop(entry)
  redis.call('HDEL', values, entry)
  redis.call('HDEL', versions, entry)
  redis.call('HDEL', created, entry)
  redis.call('HDEL', updated, entry)
  redis.call('ZREM', index, entry)
  redis.call('ZREM', expiry, entry)
  redis.call('HDEL', vectors, entry)
end

for _, entry in ipairs(redis.call('ZRANGEBYSCORE', expiry, '-inf', now, 'LIMIT', 0, tonumber(purge_limit))) do
  drop(entry)
end
redis.call('ZREMRANGEBYSCORE', applied, '-inf', now - tonumber(applied_keep_ms))

local replies = {}
for at = 4, #ARGV, 6 do
  local write_id, op, entry, value, ttl_ms, vector =
    ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3], ARGV[at + 4], ARGV[at + 5]
  local reply
  if write_id ~= '' and redis.call('ZSCORE', applied, write_id) then
    reply = {'duplicate'}
  else
    local expires = redis.call('ZSCORE', expiry, entry)
    if expires and tonumber(expires) <= now then drop(entry) end
    local exists = redis.call('HEXISTS', values, entry) == 1
    if op == 'delete' then
      if exists then
        drop(entry)
        reply = {'deleted'}
      else
        reply = {'absent'}
      end
    elseif not exists and redis.call('HLEN', values) >= tonumber(quota) then
      reply = {'full'}
    else
      redis.call('HSET', values, entry, value)
      local version = redis.call('HINCRBY', versions, entry, 1)
      redis.call('HSETNX', created, entry, now)
      redis.call('HSET', updated, entry, now)
      redis.call('ZADD', index, 0, entry)
      if vector ~= '' then
        redis.call('HSET', vectors, entry, vector)
      else
        redis.call('HDEL', vectors, entry)
      end
      local until_ms = ''
      if ttl_ms ~= '' then
        until_ms = now + tonumber(ttl_ms)
        redis.call('ZADD', expiry, until_ms, entry)
      else
        redis.call('ZREM', expiry, entry)
      end
      reply = {'put', version, redis.call('HGET', created, entry), now, until_ms}
    end
    if write_id ~= '' then redis.call('ZADD', applied, now, write_id) end
  end
  replies[#replies + 1] = reply
end
return replies
