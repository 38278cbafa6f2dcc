-- quorum_acquire.lua: one node's vote in a quorum (Redlock) acquire.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the resource's fence counter on this node
-- ARGV[1]  the holder's token
-- ARGV[2]  the TTL in milliseconds
--
-- Takes the lock with SET NX PX and, only if that worked, returns this node's
-- current fence counter (0 when absent), which the client combines with the
-- other votes. Returns false when the lock is held by someone else.
if not call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
  return false
end
local fence = call("GET", KEYS[2])
if not fence then
  return 0
end
local n = tonumber(fence)
if not n then
  return redis.error_reply("ERR fence counter is not an integer")
end
return n
