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
local n, err = raise_fence_to(KEYS[1], tonumber(ARGV[1]), ARGV[2])
if err then
  return err
end
return n
