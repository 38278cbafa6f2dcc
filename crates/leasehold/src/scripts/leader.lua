-- leader.lua: who leads an election now, as this server sees it.
--
-- KEYS[1]  the election's lock key
-- KEYS[2]  its leader record (same slot)
--
-- Returns {record, pttl}: what announce.lua stored (without the token's
-- hash) and the lock's time to live in ms, when the lock is held and the
-- record was written by its holder; nil when the lock is free, or its
-- holder has not named itself (yet), or the record is an earlier leader's.
local token = call("GET", KEYS[1])
if not token then
  return false
end
local record = call("GET", KEYS[2])
if not record then
  return false
end
local hash = redis.sha1hex(token)
if string.sub(record, 1, #hash + 1) ~= hash .. "\n" then
  return false
end
return {string.sub(record, #hash + 2), call("PTTL", KEYS[1])}
