-- refresh.lua: reset the lock's expiry only if it still holds our token,
-- and keep its fence counter alive with it.
--
-- KEYS[1]  the lock key
-- KEYS[2]  optional, for a fenced lock: its fence counter (same slot)
-- ARGV[1]  the holder's token
-- ARGV[2]  the new TTL in milliseconds
-- ARGV[3]  with KEYS[2]: how long the counter lives after this use (ms;
--          0: forever, untouched)
--
-- Returns 1 when the key held our token and its TTL was reset, 0 when the key
-- is gone (the lease expired) or holds another token (it changed hands). It
-- never creates or deletes a key (a counter that is gone stays gone: the
-- next token comes from the server's clock, see prelude.lua). A key of
-- another type makes GET fail with WRONGTYPE, which the caller reports.
if call("GET", KEYS[1]) == ARGV[1] then
  local extended = call("PEXPIRE", KEYS[1], ARGV[2])
  if KEYS[2] and tonumber(ARGV[3]) > 0 then
    call("PEXPIRE", KEYS[2], ARGV[3])
  end
  return extended
end
return 0
