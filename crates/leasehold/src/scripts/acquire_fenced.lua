-- acquire_fenced.lua: take the lock and, only if that worked, issue the next
-- fencing token.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the fence key (an integer counter); same hash slot
-- ARGV[1]  the holder's token
-- ARGV[2]  the TTL in milliseconds (at least 1)
-- ARGV[3]  how long the fence counter lives after its last use (ms; 0:
--          forever)
--
-- Returns the new fencing token (INCR of KEYS[2]) when the lock was free and
-- is now ours, nil (false) when someone else holds it.
--
-- Errors, with nothing left behind:
--   WRONGTYPE  KEYS[1] exists but is not a string, so it is not a lock and
--              would look busy forever;
--   NOTFENCE   KEYS[2] does not hold an integer counter (wrong type, not a
--              number, out of range, or not positive after INCR);
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

-- Gives the lock back and returns the error `err`.
local function undo(err)
  call("DEL", KEYS[1])
  return err
end

local fence = redis.pcall("INCR", KEYS[2])
if type(fence) == "table" and fence["err"] then
  return undo(refusal("INCR", fence)
    or redis.error_reply("NOTFENCE fence key does not hold an integer counter"))
end
if fence < 1 then
  return undo(redis.error_reply("NOTFENCE fence counter is not positive"))
end
if tonumber(ARGV[3]) > 0 then
  local expiry = redis.pcall("PEXPIRE", KEYS[2], ARGV[3])
  if type(expiry) == "table" and expiry["err"] then
    return undo(refusal("PEXPIRE", expiry) or expiry)
  end
end
return fence
