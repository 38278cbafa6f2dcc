-- raise_fence.lua: raise a fence counter to at least ARGV[1], never lowering
-- it. Used when the storage refused a write because it has seen a fence at
-- least as high as ours (a counter lost while the assumptions of
-- prelude.lua did not hold: a server whose clock was behind issued next),
-- or as high as ours from another holder. The next token is then above
-- both the stored fence and the server's clock (prelude.lua), so the next
-- lease wins again, after at most one refused write.
--
-- KEYS[1]  the fence counter
-- ARGV[1]  the value it must reach (a positive integer below 2^53)
-- ARGV[2]  how long the counter lives after its last use (ms; 0: forever)
--
-- Returns the counter's value afterwards (at least ARGV[1]).
--
-- Errors: NOTFENCE when KEYS[1] holds anything but an integer below 2^53,
-- or ARGV[1] is not below 2^53 (nothing changed); NOPERM when the ACL
-- refuses a command (see prelude.lua).
local n, err = read_fence(KEYS[1])
if err then
  return err
end
local want = tonumber(ARGV[1])
if n < want then
  local _, store_err = store_fence(KEYS[1], want, ARGV[2])
  if store_err then
    return store_err
  end
  return want
end
if tonumber(ARGV[2]) > 0 then
  call("PEXPIRE", KEYS[1], ARGV[2])
end
return n
