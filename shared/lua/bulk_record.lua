-- Record what a bulk job did to one run, once: the first record of the run counts, a redone
-- chunk's second record of it does nothing.
-- KEYS: the job's hash, its outcomes hash
-- Returns 1 when recorded, 0 when the run had been recorded already.
local job, outcomes = KEYS[1], KEYS[2]
local run_id, outcome, counter = unpack(ARGV, 1, 3)
if redis.call('HSETNX', outcomes, run_id, outcome) == 0 then return 0 end
redis.call('HINCRBY', job, counter, 1)
return 1
