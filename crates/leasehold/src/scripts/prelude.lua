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
