-- Delete an assistant: its name leaves the tenant's index, so no request reads, lists, changes or
-- runs it any more and it no longer counts against the tenant's cap; its versions stay readable,
-- for keep_s seconds, by the runs already pinned to one of them (assistant_put.lua continues their
-- numbering if the name is created again meanwhile, and keeps them again).
-- KEYS: versions list, the tenant's index. ARGV: name, keep_s
-- Returns 1 if it was deleted, 0 if the tenant has no such assistant.
local versions, index = KEYS[1], KEYS[2]
local name, keep_s = unpack(ARGV, 1, 2)
if redis.call('ZREM', index, name) == 0 then return 0 end
redis.call('EXPIRE', versions, keep_s)
return 1
