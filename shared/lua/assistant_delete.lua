-- Delete an assistant: its name leaves the tenant's index, so no request reads, lists, changes or
-- runs it any more and it no longer counts against the tenant's cap; its versions stay readable,
-- for keep_s seconds, by the runs already pinned to one of them (assistant_put.lua continues their
-- numbering if the name is created again meanwhile, and keeps them again). Their bytes count
-- against the tenant's quota until they expire: the kept set says when.
-- KEYS: versions list, the tenant's index, the tenant's kept set. ARGV: name, keep_s
-- Returns 1 if it was deleted, 0 if the tenant has no such assistant.
local versions, index, kept = KEYS[1], KEYS[2], KEYS[3]
local name, keep_s = unpack(ARGV, 1, 2)
-- A full Redis accepts a delete (its first write is this ZREM; see refuse_when_full): it frees
-- the index entry and its kept entry is of about that size, and a tenant must be able to delete.
if redis.call('ZREM', index, name) == 0 then return 0 end
redis.call('EXPIRE', versions, keep_s)
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZADD', kept, now_ms + tonumber(keep_s) * 1000, name)
return 1
