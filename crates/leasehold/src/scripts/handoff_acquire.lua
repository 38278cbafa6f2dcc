-- handoff_acquire.lua: take the lock if it is free and we are first in line,
-- else join (or stay in) the wait queue. Trying and enqueueing happen in one
-- atomic step, so a release can never fall between "it was busy" and "we are
-- in the queue" (the check-then-wait race).
--
-- KEYS[1]  the lock key
-- KEYS[2]  the wait queue: ZSET of waiter tokens, scored by arrival (us)
-- KEYS[3]  the waiters: HASH token -> "<expiry ms> <ttl ms> <channel>"
-- ARGV[1]  our token
-- ARGV[2]  the lease TTL in milliseconds
-- ARGV[3]  the pub/sub channel that reaches us
-- ARGV[4]  how long our queue entry stays valid (ms): our remaining wait
--
-- Returns {1, 0} when we took the lock now, {2, 0} when it had already been
-- handed to us, {0, pttl} when we wait (pttl: the holder's remaining TTL in
-- ms, or -1 when the lock is free but handed to a waiter ahead of us).
--
-- Stale entries (past their owner's deadline) are dropped as they reach the
-- head of the queue. Serving a waiter ahead of us means: PUBLISH
-- "g <token> <lock key>" on its channel and, if anyone received it, set the
-- lock to its token with its TTL; a waiter whose channel has no subscriber
-- (its process died) is dropped and the next one is tried.
local time = redis.call("TIME")
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local now_ms = math.floor(now_us / 1000)

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

local holder = redis.call("GET", KEYS[1])
if holder == ARGV[1] then
  forget(ARGV[1])
  return {2, 0}
end
if not holder then
  local head, ttl, channel = next_live()
  while head ~= nil and head ~= ARGV[1] do
    forget(head)
    if redis.call("PUBLISH", channel, "g " .. head .. " " .. KEYS[1]) > 0 then
      redis.call("SET", KEYS[1], head, "PX", ttl)
      break
    end
    head, ttl, channel = next_live()
  end
  if head == nil or head == ARGV[1] then
    forget(ARGV[1])
    redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
    return {1, 0}
  end
end

local lifetime = tonumber(ARGV[4])
redis.call("ZADD", KEYS[2], "NX", now_us, ARGV[1])
redis.call("HSET", KEYS[3], ARGV[1], (now_ms + lifetime) .. " " .. ARGV[2] .. " " .. ARGV[3])
for i = 2, 3 do
  if redis.call("PTTL", KEYS[i]) < lifetime then
    redis.call("PEXPIRE", KEYS[i], lifetime)
  end
end
return {0, redis.call("PTTL", KEYS[1])}
