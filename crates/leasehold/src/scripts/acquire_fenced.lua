-- acquire_fenced.lua: take the lock and, only if that worked, issue the next
-- fencing token (see prelude.lua: above the counter and at least the
-- server's clock in microseconds).
--
-- KEYS[1]  the lock key
-- KEYS[2]  the fence key (an integer counter); same hash slot
-- ARGV[1]  the holder's token
-- ARGV[2]  the TTL in milliseconds (at least 1)
-- ARGV[3]  how long the fence counter lives after its last use (ms; 0:
--          forever)
--
-- Returns the new fencing token when the lock was free and is now ours,
-- nil (false) when someone else holds it.
--
-- Errors, with nothing left behind:
--   WRONGTYPE  KEYS[1] exists but is not a string, so it is not a lock and
--              would look busy forever;
--   NOTFENCE   KEYS[2] does not hold an integer counter below 2^53;
--   NOPERM     the ACL refuses a command (see prelude.lua).
-- Once the lock is taken, a failure deletes it again, so no lease exists
-- without a token.
if not call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
  local kind = call("TYPE", KEYS[1])["ok"]
  if kind ~= "string" and kind ~= "none" then
    return redis.error_reply("WRONGTYPE lock key holds a " .. kind)
  end
  return false
end

local fence, err = issue_fence(KEYS[2], ARGV[3])
if err then
  call("DEL", KEYS[1])
  return err
end
return fence
