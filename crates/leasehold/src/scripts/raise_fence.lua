-- raise_fence.lua: raise a fence counter to at least ARGV[1], never lowering
-- it. Used when the storage refused a write because it has seen a fence at
-- least as high as ours: Redis lost increments (a restart without
-- persistence, a failover to a lagging replica, an evicted or expired key),
-- and raising the counter past the stored fence makes the next lease's token
-- win again, after at most one refused write.
--
-- KEYS[1]  the fence counter
-- ARGV[1]  the value it must reach (a positive integer below 2^53)
-- ARGV[2]  how long the counter lives after its last use (ms; 0: forever)
--
-- Returns the counter's value afterwards (at least ARGV[1]).
--
-- Errors: NOTFENCE when KEYS[1] holds anything but a non-negative integer
-- (nothing changed); NOPERM when the ACL refuses a command (see
-- prelude.lua).
local current = call("GET", KEYS[1])
local n = 0
if current then
  n = tonumber(current)
  if not n or n < 0 then
    return redis.error_reply("NOTFENCE fence key does not hold an integer counter")
  end
end
local want = tonumber(ARGV[1])
if n < want then
  call("SET", KEYS[1], ARGV[1])
  n = want
end
if tonumber(ARGV[2]) > 0 then
  call("PEXPIRE", KEYS[1], ARGV[2])
end
return n
