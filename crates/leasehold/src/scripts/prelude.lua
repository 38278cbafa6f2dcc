-- prelude.lua: put in front of every script (scripts.rs does it). The
-- scripts call Redis through call(), never redis.call().
--
-- A command the ACL refuses is reported as "NOPERM ... 'incr' ..." when we
-- send it ourselves, but inside a script Redis 7.0 says "ERR The user
-- executing the script can't run this command or subcommand" (no NOPERM,
-- no command) and 7.2 and Valkey "ERR ACL failure in script: ...". call()
-- turns every such refusal into the reply a direct refusal gets, naming
-- the command, so the caller maps it like any other NOPERM:
--   NOPERM this user has no permissions to run the '<command>' command
--   NOPERM this user has no permissions to access one of the keys used as
--     arguments of '<command>'  (or "channels" for SPUBLISH's channel)
-- Any other error is raised as redis.call() would raise it.

-- The NOPERM error for `reply`, an error table from redis.pcall(command,
-- ...), when it is an ACL refusal; nil otherwise.
local function refusal(command, reply)
  local err = reply["err"]
  if not (string.find(err, "NOPERM", 1, true)
      or string.find(err, "ACL failure", 1, true)
      or string.find(err, "user executing the script can't", 1, true)) then
    return nil
  end
  local text = string.lower(err)
  local name = "'" .. string.lower(command) .. "'"
  local what = "run the " .. name .. " command"
  if not (string.find(text, "to run ", 1, true) or string.find(text, "can't run ", 1, true)) then
    if string.find(text, "channel", 1, true) then
      what = "access one of the channels used as arguments of " .. name
    elseif string.find(text, "key", 1, true) then
      what = "access one of the keys used as arguments of " .. name
    end
  end
  return {err = "NOPERM this user has no permissions to " .. what}
end

-- redis.call(command, ...), with an ACL refusal named (see above).
local function call(command, ...)
  local reply = redis.pcall(command, ...)
  if type(reply) == "table" and reply["err"] then
    local name = command
    if string.upper(command) == "PUBSUB" then
      name = command .. "|" .. select(1, ...) -- as Redis names a subcommand
    end
    error(refusal(name, reply) or reply)
  end
  return reply
end


-- Hand-off: SPUBLISH `message` on a waiter's shard `channel` only if this
-- node (the lock key's primary) has a subscriber to it, and return how many
-- received it. A subscriber on a *replica* of the shard also receives what
-- the primary publishes, but SPUBLISH does not count it: a locker whose
-- subscription landed on a replica (a node demoted by a failover, an
-- address that now points to a replica) would act on a grant the script
-- counted as undelivered, and hold a lock Redis never gave it. Checking the
-- primary's own count first means a message goes out only when the
-- script will act on its delivery (PUBSUB SHARDNUMSUB has no slot check,
-- and the channel is this locker's alone).
local function tell(channel, message)
  if call("PUBSUB", "SHARDNUMSUB", channel)[2] == 0 then
    return 0
  end
  return call("SPUBLISH", channel, message)
end

-- Fencing tokens: every script that issues one, reads a counter or raises
-- one goes through the functions below.
--
-- A token is max(counter + 1, this server's clock in microseconds since
-- the Unix epoch), and the counter is set to it. The clock is the floor a
-- lost counter restarts from: a counter that is gone (a restart without
-- persistence, FLUSHALL, eviction, expiry) or behind (a failover to a
-- replica that missed the last increments) issues next a token at least
-- the server's time, which is above every token issued before, as long
-- as (1) the server that issues next does not read its clock earlier
-- than the one that issued the lost tokens read its own, and (2) one
-- resource is given fewer than one token per microsecond on average (a
-- burst is absorbed by the +1). A counter that survives needs neither:
-- it only grows. Tokens stay below 2^53, exact in a Lua number (a double)
-- and in PostgreSQL's bigint; the clock reaches that in the year 2255.
local FENCE_LIMIT = 9007199254740992 -- 2^53

-- redis.pcall(command, ...): its reply, or nil and the error reply (an ACL
-- refusal named as call() names it), returned instead of raised.
local function try(command, ...)
  local reply = redis.pcall(command, ...)
  if type(reply) == "table" and reply["err"] then
    return nil, refusal(command, reply) or reply
  end
  return reply
end

local function not_a_counter()
  return redis.error_reply("NOTFENCE fence key does not hold an integer counter below 2^53")
end

-- The fence counter `key`: its value, 0 when absent; or nil and the error
-- reply: NOTFENCE when it holds anything but a decimal integer below 2^53,
-- NOPERM when the ACL refuses.
local function read_fence(key)
  local current, err = try("GET", key)
  if err then
    if string.find(err["err"], "WRONGTYPE", 1, true) then
      return nil, not_a_counter()
    end
    return nil, err
  end
  if not current then
    return 0
  end
  if not string.match(current, "^%d+$") or #current > 16 or tonumber(current) >= FENCE_LIMIT then
    return nil, not_a_counter()
  end
  return tonumber(current)
end

-- The lowest token this server may issue now: its clock in microseconds;
-- or nil and the error reply.
local function fence_floor()
  local time, err = try("TIME")
  if err then
    return nil, err
  end
  return tonumber(time[1]) * 1000000 + tonumber(time[2])
end

-- A token as text: every digit (Lua's own `..` would print a token above
-- 10^14 in exponent notation, which no reader parses as the token).
local function fence_text(fence)
  return string.format("%d", fence)
end

-- Sets the counter `key` to `value`, living `ttl` ms after this use (0:
-- forever); nil and the error reply on failure.
local function store_fence(key, value, ttl)
  if value >= FENCE_LIMIT then
    return nil, redis.error_reply("NOTFENCE fence counter would reach 2^53")
  end
  local text = fence_text(value)
  if tonumber(ttl) > 0 then
    return try("SET", key, text, "PX", ttl)
  end
  return try("SET", key, text)
end

-- Raises the counter `key` to `want` if it is lower (never lowers it),
-- and keeps it alive `ttl` ms (0: forever): its value afterwards, or nil
-- and the error reply, with nothing changed.
local function raise_fence_to(key, want, ttl)
  local current, err = read_fence(key)
  if err then
    return nil, err
  end
  if current < want then
    local _, store_err = store_fence(key, want, ttl)
    if store_err then
      return nil, store_err
    end
    return want
  end
  if tonumber(ttl) > 0 then
    call("PEXPIRE", key, ttl)
  end
  return current
end

-- What every token of the counter `key` is made from: {counter = its
-- value (0 when absent), floor = the lowest token this server may issue
-- now (its clock)}; or nil and the error reply.
local function fence_basis(key)
  local current, err = read_fence(key)
  if err then
    return nil, err
  end
  local floor, clock_err = fence_floor()
  if clock_err then
    return nil, clock_err
  end
  return {counter = current, floor = floor}
end

-- Issues the next token of the counter `key` (see above):
-- max(counter + 1, clock), and the counter is set to it, living `ttl` ms
-- after this use (0: forever). The token, or nil and the error reply,
-- with nothing changed.
local function issue_fence(key, ttl)
  local basis, err = fence_basis(key)
  if err then
    return nil, err
  end
  local fence = math.max(basis.counter + 1, basis.floor)
  local _, store_err = store_fence(key, fence, ttl)
  if store_err then
    return nil, store_err
  end
  return fence
end

-- A quorum node's vote for the next token of the counter `key`:
-- max(counter, clock), nothing written (the client takes one more than
-- the highest vote, and records it on every node with raise_fence_to);
-- or nil and the error reply.
local function fence_vote(key)
  local basis, err = fence_basis(key)
  if err then
    return nil, err
  end
  return math.max(basis.counter, basis.floor)
end

-- For a script that issues a token only after changing other keys (a
-- hand-off's grant): checks the counter `key` (if any) first, while
-- nothing is changed, and returns the function that issues its next token
-- (living `ttl` ms), raising on failure (after the check, only an ACL
-- refusal can fail it); or nil and the error reply of the check.
local function fence_issuer(key, ttl)
  if key then
    local _, err = read_fence(key)
    if err then
      return nil, err
    end
  end
  return function()
    local fence, err = issue_fence(key, ttl)
    if err then
      error(err)
    end
    return fence
  end
end
