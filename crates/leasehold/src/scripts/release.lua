-- release.lua: delete the lock only if it still holds our token.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the holder's token
--
-- Returns 1 when the key held our token and was deleted, 0 when the key is
-- gone (the lease expired) or holds another token (it changed hands). A key
-- of another type makes GET fail with WRONGTYPE, which the caller reports.
if call("GET", KEYS[1]) == ARGV[1] then
  return call("DEL", KEYS[1])
end
return 0
