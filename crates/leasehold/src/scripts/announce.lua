-- announce.lua: a leader names itself, only while the lock holds its token.
--
-- KEYS[1]  the election's lock key
-- KEYS[2]  its leader record (same slot)
-- ARGV[1]  the holder's token
-- ARGV[2]  what the record says (the term's fence, holder and candidate)
-- ARGV[3]  how long the record lives (ms; 0: forever)
--
-- The record is stored after the SHA-1 of the token, so that a reader can
-- tell it belongs to the lock's current holder (leader.lua) without the
-- token ever leaving Redis. Returns 1 when written, 0 when the lock does not
-- hold our token (nothing written). A key of another type makes GET fail
-- with WRONGTYPE, which the caller reports.
if call("GET", KEYS[1]) ~= ARGV[1] then
  return 0
end
local record = redis.sha1hex(ARGV[1]) .. "\n" .. ARGV[2]
if tonumber(ARGV[3]) > 0 then
  call("SET", KEYS[2], record, "PX", ARGV[3])
else
  call("SET", KEYS[2], record)
end
return 1
