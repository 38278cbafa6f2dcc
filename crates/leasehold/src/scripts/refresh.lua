-- refresh.lua: reset the lock's expiry only if it still holds our token.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the holder's token
-- ARGV[2]  the new TTL in milliseconds
--
-- Returns 1 when the key held our token and its TTL was reset, 0 when the key
-- is gone (the lease expired) or holds another token (it changed hands). It
-- never creates or deletes the key. A key of another type makes GET fail
-- with WRONGTYPE, which the caller reports.
if call("GET", KEYS[1]) == ARGV[1] then
  return call("PEXPIRE", KEYS[1], ARGV[2])
end
return 0
