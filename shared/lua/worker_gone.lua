-- A sweeper handed on what a dead worker start held: forget the start, unless it beat again since
-- the sweeper saw it dead (its score moved: it was stalled, not dead, and lists its claims anew).
-- KEYS: lives zset, the start's held key. ARGV: life, the score the sweeper saw
-- Returns 1 if forgotten.
local life, seen = unpack(ARGV, 1, 2)
local score = redis.call('ZSCORE', KEYS[1], life)
if score and tonumber(score) ~= tonumber(seen) then return 0 end
redis.call('ZREM', KEYS[1], life)
redis.call('DEL', KEYS[2])
return 1
