-- handoff_acquire.lua: take the lock if it is free and we are first in line,
-- else join (or stay in) the wait queue. Trying and enqueueing happen in one
-- atomic step, so a release can never fall between "it was busy" and "we are
-- in the queue" (the check-then-wait race).
--
-- KEYS[1]  the lock key
-- KEYS[2]  the wait queue: ZSET of waiter tokens, scored by arrival (us)
-- KEYS[3]  the waiters: HASH token -> "<expiry ms> <ttl ms> <f|-> <channel>"
--          ("f": a fenced waiter), or "granted <fence>"
-- KEYS[4]  optional, for a fenced lock: its fence counter (same slot)
-- ARGV[1]  our token
-- ARGV[2]  the lease TTL in milliseconds
-- ARGV[3]  the shard channel that reaches us (in the lock key's slot: on a
--          cluster SPUBLISH counts it as a key of the script)
-- ARGV[4]  how long our queue entry stays valid (ms): our remaining wait
-- ARGV[5]  how long the fence counter lives after its last use (ms; 0:
--          forever)
--
-- Returns {1, 0, fence} when we took the lock now, {2, 0, fence} when it
-- had already been handed to us (or taken by an earlier request of ours
-- whose reply was lost: then a fenced lock gets a fresh fence), {0, pttl, 0} when we wait (pttl: the
-- holder's remaining TTL in ms, or -1 when the lock is free but handed to a
-- waiter ahead of us). fence is our fencing token (issued from KEYS[4] in
-- the step that gave us the lock, see prelude.lua), 0 when unfenced.
--
-- Stale entries (past their owner's deadline) are dropped as they reach the
-- head of the queue. Serving a waiter ahead of us means: SPUBLISH
-- "g <token> <lock key> <fence>" on its channel and, if anyone received it,
-- set the lock to its token with its TTL (a fenced waiter gets its fencing
-- token in the same step, and keeps its entry as "granted <fence>"); a
-- waiter whose channel has no subscriber (its process died) is dropped and
-- the next one is tried. A fenced waiter ahead of an unfenced caller is
-- woken instead ("w <token> <lock key>") and takes the lock itself.
--
-- Errors: NOTFENCE when KEYS[4] holds no integer counter below 2^53;
-- WRONGTYPE when the lock key is not a string. Nothing is changed. NOPERM
-- when the ACL refuses a command (see prelude.lua).
local time = call("TIME")
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local now_ms = math.floor(now_us / 1000)
local fence_key = KEYS[4]

local kind = call("TYPE", KEYS[1])["ok"]
if kind ~= "string" and kind ~= "none" then
  return redis.error_reply("WRONGTYPE lock key holds a " .. kind)
end
-- Issues the next fencing token (see prelude.lua).
local issue, fence_err = fence_issuer(fence_key, ARGV[5])
if fence_err then
  return fence_err
end

local function forget(token)
  call("ZREM", KEYS[2], token)
  call("HDEL", KEYS[3], token)
end

local function next_live()
  while true do
    local first = call("ZRANGE", KEYS[2], 0, 0)
    if #first == 0 then
      return nil
    end
    local token = first[1]
    local entry = call("HGET", KEYS[3], token)
    if entry then
      local expiry, ttl, fenced, channel = string.match(entry, "^(%d+) (%d+) ([f-]) (.+)$")
      if expiry and tonumber(expiry) > now_ms then
        return token, ttl, fenced == "f", channel
      end
    end
    forget(token)
  end
end

local holder = call("GET", KEYS[1])
if holder == ARGV[1] then
  local entry = call("HGET", KEYS[3], ARGV[1]) or ""
  local fence = tonumber(string.match(entry, "^granted (%d+)$") or "0")
  forget(ARGV[1])
  -- Our own earlier request took it (its reply was lost): the fence it
  -- issued is unknown, so a fenced lock gets a fresh one (greater than
  -- every fence issued before; the lost one is never used).
  if fence == 0 and fence_key then
    fence = issue()
  end
  return {2, 0, fence}
end
if not holder then
  local head, ttl, fenced, channel = next_live()
  while head ~= nil and head ~= ARGV[1] do
    if fenced and not fence_key then
      if tell(channel, "w " .. head .. " " .. KEYS[1]) > 0 then
        break
      end
      forget(head)
    else
      forget(head)
      local fence = 0
      if fenced then
        fence = issue()
      end
      if tell(channel, "g " .. head .. " " .. KEYS[1] .. " " .. fence_text(fence)) > 0 then
        call("SET", KEYS[1], head, "PX", ttl)
        if fenced then
          call("HSET", KEYS[3], head, "granted " .. fence_text(fence))
        end
        break
      end
    end
    head, ttl, fenced, channel = next_live()
  end
  if head == nil or head == ARGV[1] then
    -- The token first: if the ACL refuses it, the lock is not taken.
    local fence = 0
    if fence_key then
      fence = issue()
    end
    forget(ARGV[1])
    call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
    return {1, 0, fence}
  end
end

local lifetime = tonumber(ARGV[4])
local fenced = "-"
if fence_key then
  fenced = "f"
end
call("ZADD", KEYS[2], "NX", now_us, ARGV[1])
call("HSET", KEYS[3], ARGV[1], (now_ms + lifetime) .. " " .. ARGV[2] .. " " .. fenced .. " " .. ARGV[3])
for i = 2, 3 do
  if call("PTTL", KEYS[i]) < lifetime then
    call("PEXPIRE", KEYS[i], lifetime)
  end
end
return {0, call("PTTL", KEYS[1]), 0}
