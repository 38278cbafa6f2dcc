-- relay.lua: pass the lock to the next holder in the same process, in one
-- token-checked step: the lock moves from the releasing holder's token to the
-- next holder's own token (with its TTL) only if it still holds the former,
-- and a fenced next holder gets its fencing token in the same step. A holder
-- whose lock expired or changed hands passes nothing on.
--
-- (The queue in Redis is not served here: every few passes the release
-- script's "pass" mode does that instead, see handoff_release.lua. This
-- script is the common case, kept small because it runs once per lease.)
--
-- KEYS[1]  the lock key
-- KEYS[2]  optional, for a fenced next holder: the fence counter (same slot)
-- ARGV[1]  the releasing holder's token
-- ARGV[2]  the next holder's token
-- ARGV[3]  the next holder's TTL in milliseconds
-- ARGV[4]  how long the fence counter lives after its last use (ms; 0:
--          forever)
--
-- Returns {1, fence} when the lock moved (fence 0 when unfenced), {0, 0}
-- when it did not hold ARGV[1] (nothing changed).
--
-- Errors: NOTFENCE when KEYS[2] holds no integer counter below 2^53
-- (nothing changed); NOPERM when the ACL refuses a command (see prelude.lua).
if call("GET", KEYS[1]) ~= ARGV[1] then
  return {0, 0}
end
local fence = 0
if KEYS[2] then
  local issued, err = issue_fence(KEYS[2], ARGV[4])
  if err then
    return err
  end
  fence = issued
end
call("SET", KEYS[1], ARGV[2], "PX", ARGV[3])
return {1, fence}
