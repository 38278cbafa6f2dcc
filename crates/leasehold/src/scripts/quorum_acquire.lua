-- quorum_acquire.lua: one node's vote in a quorum (Redlock) acquire.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the resource's fence counter on this node
-- ARGV[1]  the holder's token
-- ARGV[2]  the TTL in milliseconds
--
-- Takes the lock with SET NX PX and, only if that worked, returns the
-- lowest token this node would accept as above everything it has issued:
-- max(its fence counter (0 when absent), its clock in microseconds) (see
-- prelude.lua). The client takes one more than the highest vote. Returns
-- false when the lock is held by someone else.
--
-- Errors, with nothing changed: NOTFENCE when KEYS[2] holds no integer
-- counter below 2^53; NOPERM when the ACL refuses a command.
local vote, err = fence_vote(KEYS[2])
if err then
  return err
end
if not call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
  return false
end
return vote
