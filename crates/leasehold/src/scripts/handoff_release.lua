-- handoff_release.lua: give the lock to the first live waiter, or delete it
-- when nobody waits. Also used by a waiter that gives up (ARGV[3] = "leave"):
-- it leaves the queue first, and if the lock was handed to it meanwhile (or
-- is free with waiters queued), it serves the next waiter in the same step.
--
-- A waiter is live when its entry is not past its deadline and its channel
-- has a subscriber (PUBLISH reports how many received the message); dead
-- ones are dropped and the next one is tried.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the wait queue: ZSET of waiter tokens, scored by arrival (us)
-- KEYS[3]  the waiters: HASH token -> "<expiry ms> <ttl ms> <channel>"
-- ARGV[1]  the holder's (or leaving waiter's) token
-- ARGV[2]  "grant": PUBLISH "g <token> <lock key>" on the next waiter's
--          channel and set the lock to its token with its TTL (the lease
--          moves without a round trip); "wake": delete the lock and PUBLISH
--          "w <token> <lock key>", so the next waiter takes it with its own
--          request
-- ARGV[3]  "leave" to first drop ARGV[1]'s own queue entry, else ""
--
-- Returns 0 when the lock did not hold ARGV[1] (expired or changed hands;
-- nothing else was touched), 1 when it was deleted with nobody waiting, 2
-- when the next waiter was served.
local time = redis.call("TIME")
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local function forget(token)
  redis.call("ZREM", KEYS[2], token)
  redis.call("HDEL", KEYS[3], token)
end

local function next_live()
  while true do
    local first = redis.call("ZRANGE", KEYS[2], 0, 0)
    if #first == 0 then
      return nil
    end
    local token = first[1]
    local entry = redis.call("HGET", KEYS[3], token)
    if entry then
      local expiry, ttl, channel = string.match(entry, "^(%d+) (%d+) (.+)$")
      if expiry and tonumber(expiry) > now_ms then
        return token, ttl, channel
      end
    end
    forget(token)
  end
end

local function serve()
  while true do
    local head, ttl, channel = next_live()
    if head == nil then
      return false
    end
    if ARGV[2] == "grant" then
      if redis.call("PUBLISH", channel, "g " .. head .. " " .. KEYS[1]) > 0 then
        forget(head)
        redis.call("SET", KEYS[1], head, "PX", ttl)
        return true
      end
    elseif redis.call("PUBLISH", channel, "w " .. head .. " " .. KEYS[1]) > 0 then
      return true
    end
    forget(head)
  end
end

if ARGV[3] == "leave" then
  forget(ARGV[1])
end
local holder = redis.call("GET", KEYS[1])
if holder ~= ARGV[1] then
  if ARGV[3] == "leave" and not holder then
    serve()
  end
  return 0
end
if ARGV[2] == "wake" then
  redis.call("DEL", KEYS[1])
end
if serve() then
  return 2
end
redis.call("DEL", KEYS[1])
return 1
