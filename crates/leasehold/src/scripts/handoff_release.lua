-- handoff_release.lua: give the lock to the first live waiter, or delete it
-- when nobody waits. Also used by a waiter that gives up (ARGV[3] = "leave"):
-- it leaves the queue first, and if the lock was handed to it meanwhile, it
-- passes the lock on in the same step.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the wait queue: ZSET of waiter tokens, scored by arrival (us)
-- KEYS[3]  the waiters: HASH token -> "<expiry ms> <ttl ms> <channel>"
-- ARGV[1]  the holder's (or leaving waiter's) token
-- ARGV[2]  "grant": set the lock to the next waiter's token with its TTL and
--          PUBLISH "g <token>" on its channel (the lease moves without a
--          round trip); "wake": delete the lock and PUBLISH "w <token>", so
--          the next waiter takes it with its own request
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

if ARGV[3] == "leave" then
  forget(ARGV[1])
end
if redis.call("GET", KEYS[1]) ~= ARGV[1] then
  return 0
end
local head, ttl, channel = next_live()
if head == nil then
  redis.call("DEL", KEYS[1])
  return 1
end
if ARGV[2] == "grant" then
  forget(head)
  redis.call("SET", KEYS[1], head, "PX", ttl)
  redis.call("PUBLISH", channel, "g " .. head)
else
  redis.call("DEL", KEYS[1])
  redis.call("PUBLISH", channel, "w " .. head)
end
return 2
