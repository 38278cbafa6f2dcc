-- handoff_release.lua: give the lock to the first live waiter, or delete it
-- when nobody waits. Also used by a waiter that gives up (ARGV[3] = "leave"):
-- it leaves the queue first, and if the lock was handed to it meanwhile (or
-- is free with waiters queued), it serves the next waiter in the same step.
-- And by a holder that passes the lock on within its own process at a
-- checkpoint (ARGV[3] = "pass"): the queue is served first and, with nobody
-- live in it, the lock moves to the next local holder's token ARGV[6] with
-- TTL ARGV[5]. The move is token-checked: a holder whose lock expired or
-- changed hands passes nothing on (code 0), so no local holder is ever
-- handed a lease Redis does not hold for it. (Passes between checkpoints
-- use the smaller relay.lua.)
--
-- Fencing: every holder of a fenced lock gets its own fencing token, issued
-- from KEYS[4] (see prelude.lua) in the same step that hands it the lock. A queued
-- waiter's entry says whether it is fenced; a fenced waiter granted the
-- lock keeps its entry as "granted <fence>", so that it learns its token
-- even if the pub/sub message is lost. Without KEYS[4] (the caller's lock
-- is not fenced) a fenced waiter is woken instead of granted, and takes the
-- lock (and its token) with its own request.
--
-- A waiter is live when its entry is not past its deadline and, for a
-- waiter of another locker, its channel has a subscriber (SPUBLISH reports
-- how many received the message); dead ones are dropped and the next one is
-- tried. A waiter of the calling locker (its channel is ARGV[4]) is served
-- without SPUBLISH: its token is returned and the caller wakes it in its own
-- process (if it no longer waits, it won the lock another way or its own
-- leave passes it on).
--
-- KEYS[1]  the lock key
-- KEYS[2]  the wait queue: ZSET of waiter tokens, scored by arrival (us)
-- KEYS[3]  the waiters: HASH token -> "<expiry ms> <ttl ms> <f|-> <channel>"
--          ("f": a fenced waiter), or "granted <fence>"
-- KEYS[4]  optional: the lock's fence counter (same slot)
-- ARGV[1]  the holder's (or leaving waiter's) token
-- ARGV[2]  "grant": set the lock to the next waiter's token with its TTL
--          (the lease moves without a round trip) and tell it ("g <token>
--          <lock key> <fence>" on its channel, fence 0 when unfenced);
--          "wake": delete the lock and tell the next waiter ("w <token>
--          <lock key>"), which takes it with its own request
-- ARGV[3]  "leave" to first drop ARGV[1]'s own queue entry, "pass" to move
--          the lock to ARGV[6] when nobody waits, else ""
-- ARGV[4]  the calling locker's shard channel for this lock key (waiters'
--          channels are in the lock key's slot: on a cluster SPUBLISH
--          counts the channel as a key of the script)
-- ARGV[5]  with "pass": the TTL (ms) of the next local holder
-- ARGV[6]  with "pass": the next local holder's token
-- ARGV[7]  with "pass": "f" when the next local holder is fenced
-- ARGV[8]  how long the fence counter lives after its last use (ms; 0:
--          forever)
--
-- Returns {code, local, fence}: code 0 when the lock did not hold ARGV[1]
-- (expired or changed hands; nothing else was touched, unless leaving found
-- the lock free and served the queue), 1 when it was deleted with nobody
-- waiting, 2 when the next waiter was served, 3 when "pass" moved it to
-- ARGV[6]; local is the token of the served waiter when it
-- belongs to the calling locker (not told: the caller must), else ""; fence
-- is the fencing token issued to that local waiter or to ARGV[6] (0: none;
-- -1: the waiter was woken, not granted, and must take the lock itself).
--
-- Errors: NOTFENCE when KEYS[4] holds no integer counter below 2^53
-- (nothing was changed); NOPERM when the ACL refuses a command (see prelude.lua).
local time = call("TIME")
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local grant = ARGV[2] == "grant"
local fence_key = KEYS[4]

-- Issues the next fencing token (see prelude.lua).
local issue, fence_err = fence_issuer(fence_key, ARGV[8])
if fence_err then
  return fence_err
end

-- Pops (grant) or peeks at (wake: the woken waiter keeps its place until it
-- takes the lock) the first waiter, dropping stale entries on the way.
local function next_live()
  while true do
    local token
    if grant then
      local popped = call("ZPOPMIN", KEYS[2])
      token = popped[1]
    else
      token = call("ZRANGE", KEYS[2], 0, 0)[1]
    end
    if token == nil then
      return nil
    end
    local entry = call("HGET", KEYS[3], token)
    if entry then
      local expiry, ttl, fenced, channel = string.match(entry, "^(%d+) (%d+) ([f-]) (.+)$")
      if expiry and tonumber(expiry) > now_ms then
        return token, ttl, fenced == "f", channel
      end
    end
    if not grant then
      call("ZREM", KEYS[2], token)
    end
    call("HDEL", KEYS[3], token)
  end
end

-- Serves the first live waiter: returns false when nobody waits, else its
-- token if it is ours to tell (else "") and the fence issued to it.
local function serve()
  while true do
    local head, ttl, fenced, channel = next_live()
    if head == nil then
      return false, 0
    end
    local mine = channel == ARGV[4]
    if grant and fenced and not fence_key then
      -- We cannot issue its token: wake it instead (it keeps its place).
      call("ZADD", KEYS[2], 0, head)
      if mine or tell(channel, "w " .. head .. " " .. KEYS[1]) > 0 then
        call("DEL", KEYS[1])
        return mine and head or "", -1
      end
      call("ZREM", KEYS[2], head)
      call("HDEL", KEYS[3], head)
    elseif grant then
      local fence = 0
      if fenced then
        fence = issue()
      end
      if mine or tell(channel, "g " .. head .. " " .. KEYS[1] .. " " .. fence_text(fence)) > 0 then
        call("SET", KEYS[1], head, "PX", ttl)
        if fenced then
          call("HSET", KEYS[3], head, "granted " .. fence_text(fence))
        else
          call("HDEL", KEYS[3], head)
        end
        return mine and head or "", fence
      end
      call("HDEL", KEYS[3], head)
    else
      if mine or tell(channel, "w " .. head .. " " .. KEYS[1]) > 0 then
        return mine and head or "", 0
      end
      call("ZREM", KEYS[2], head)
      call("HDEL", KEYS[3], head)
    end
  end
end

-- Moves the lock to the next local holder ARGV[6], with its own fence.
local function move()
  local fence = 0
  if ARGV[7] == "f" then
    if not fence_key then
      return redis.error_reply("NOTFENCE no fence key for a fenced holder")
    end
    fence = issue()
  end
  call("SET", KEYS[1], ARGV[6], "PX", ARGV[5])
  return {3, "", fence}
end

if ARGV[3] == "leave" then
  call("ZREM", KEYS[2], ARGV[1])
  call("HDEL", KEYS[3], ARGV[1])
end
local holder = call("GET", KEYS[1])
if holder ~= ARGV[1] then
  if ARGV[3] == "leave" and not holder then
    local served, fence = serve()
    return {0, served or "", fence}
  end
  return {0, "", 0}
end
local served, fence = serve()
if served then
  if not grant then
    call("DEL", KEYS[1])
  end
  return {2, served, fence}
end
if ARGV[3] == "pass" then
  return move()
end
call("DEL", KEYS[1])
return {1, "", 0}
