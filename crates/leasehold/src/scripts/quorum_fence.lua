-- quorum_fence.lua: record a quorum lease's fencing token on one node.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the resource's fence counter on this node
-- ARGV[1]  the holder's token
-- ARGV[2]  the fencing token chosen for the lease (below 2^53)
-- ARGV[3]  how long the fence counter lives after its last use (ms; 0:
--          forever)
--
-- Raises the counter to ARGV[2] if it is lower (a counter never goes down),
-- whether or not we hold the lock here: a higher counter on more nodes only
-- helps the next acquirer. Returns 1 if this node's lock still holds our
-- token (the write counts towards the quorum), else 0.
--
-- Errors: NOTFENCE when KEYS[2] holds no integer counter below 2^53 or
-- ARGV[2] is out of range (nothing changed); NOPERM when the ACL refuses.
local _, err = raise_fence_to(KEYS[2], tonumber(ARGV[2]), ARGV[3])
if err then
  return err
end
if call("GET", KEYS[1]) == ARGV[1] then
  return 1
end
return 0
