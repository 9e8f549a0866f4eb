package redis

import goredis "github.com/redis/go-redis/v9"

// channelSuffix turns a record's key name into its pub/sub channel; the
// scripts' prelude builds the same name.
const channelSuffix = ":done"

// Each script works on KEYS[1] only (one slot, so Cluster runs it) and
// starts with this prelude. Times are Unix milliseconds from the server's
// clock. Numbers are written into the hash with ms(), because Lua numbers
// are doubles and their default string form may use an exponent.
//
// wake publishes on the record's channel only when a waiter said (field w)
// that it listens until a time still to come. Without waiters nothing is
// published, which matters on Cluster, where every PUBLISH is broadcast to
// all nodes.
//
// A record whose hash lacks f or e was not written by this store:
// the scripts refuse it with a CORRUPT error rather than guess.
const prelude = `
local key = KEYS[1]
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
local function ms(n) return string.format('%.0f', n) end
local function wake(w)
  if w and (tonumber(w) or 0) > now then
    redis.call('PUBLISH', key .. '` + channelSuffix + `', '')
  end
end
local function corrupt() return redis.error_reply('CORRUPT idempotency record') end
`

// reserveScript claims the key or reports what holds it.
// ARGV: fingerprint, token, lease ms, keep ms (the in-flight key's PEXPIRE).
// Reply: {1} acquired | {2, detail} mismatch | {3, created, lapse}
// conflict | {4, packed} replay, where packed is "created expiry
// len(head) len(body) " then head, body and detail: one string, which
// go-redis reads in one allocation where six elements took nine (see
// unpackReplay).
//
// A live lease carrying the caller's own token is reported as acquired:
// the token is fresh for every Reserve call, so only a retry of this very
// call (go-redis retries after a lost connection) can carry it, and that
// retry must not report a conflict with itself.
var reserveScript = goredis.NewScript(prelude + `
local r = redis.call('HMGET', key, 'f', 't', 'c', 'e', 'w')
if r[1] or r[4] then
  local e = tonumber(r[4])
  if not r[1] or not e then return corrupt() end
  if now < e then
    if r[2] == ARGV[2] then return {1} end
    if r[1] ~= ARGV[1] then return {2, redis.call('HGET', key, 'd') or ''} end
    if r[2] then return {3, tonumber(r[3]) or 0, e} end
    local hb = redis.call('HMGET', key, 'h', 'b', 'd')
    if not hb[1] then return corrupt() end
    local b = hb[2] or ''
    return {4, ms(tonumber(r[3]) or 0) .. ' ' .. ms(e) .. ' ' .. #hb[1] .. ' ' .. #b .. ' ' .. hb[1] .. b .. (hb[3] or '')}
  end
  -- Expired or lapsed: take it over; waiters on the old lease look again.
  wake(r[5])
  redis.call('DEL', key)
end
redis.call('HSET', key, 'f', ARGV[1], 't', ARGV[2], 'c', ms(now), 'e', ms(now + tonumber(ARGV[3])))
redis.call('PEXPIRE', key, ARGV[4])
return {1}
`)

// completeScript records the response of the lease named by the token.
// ARGV: token, head, body, ttl ms, detail. Reply: 1, 2 when that lease
// completed the record already, or 0 when the lease is lost.
//
// The completed record keeps the lease's token in field k, so that a
// completion sent again (its WAIT fell short: durability.go) finds its
// own record: it then writes k again, unchanged, a write of its own, so
// that the WAIT sent after it counts the replicas that have everything up
// to it, the first completion included.
var completeScript = goredis.NewScript(prelude + `
local r = redis.call('HMGET', key, 't', 'w', 'k')
if not r[1] or r[1] ~= ARGV[1] then
  if r[3] and r[3] == ARGV[1] then
    redis.call('HSET', key, 'k', ARGV[1])
    return 2
  end
  return 0
end
redis.call('HDEL', key, 't', 'w')
redis.call('HSET', key, 'h', ARGV[2], 'b', ARGV[3], 'e', ms(now + tonumber(ARGV[4])), 'k', ARGV[1])
if ARGV[5] ~= '' then redis.call('HSET', key, 'd', ARGV[5]) end
redis.call('PEXPIRE', key, ARGV[4])
wake(r[2])
return 1
`)

// releaseScript deletes the in-flight record of the lease named by the
// token. ARGV: token. Reply: 1, or 0 when the lease is lost.
var releaseScript = goredis.NewScript(prelude + `
local r = redis.call('HMGET', key, 't', 'w')
if not r[1] or r[1] ~= ARGV[1] then return 0 end
redis.call('DEL', key)
wake(r[2])
return 1
`)

// renewScript extends the lease named by the token, lapsed or not (only a
// takeover, which replaces the token, fences the owner).
// ARGV: token, lease ms, keep ms. Reply: 1, or 0 when the lease is lost.
var renewScript = goredis.NewScript(prelude + `
if redis.call('HGET', key, 't') ~= ARGV[1] then return 0 end
redis.call('HSET', key, 'e', ms(now + tonumber(ARGV[2])))
redis.call('PEXPIRE', key, ARGV[3])
return 1
`)

// getScript reads a live record. ARGV: "1" to include the body.
// Reply: {0} absent | {1, fingerprint, token, created, lapse} in flight |
// {2, fingerprint, created, expiry, head[, body]} completed.
var getScript = goredis.NewScript(prelude + `
local r = redis.call('HMGET', key, 'f', 't', 'c', 'e')
if not r[1] and not r[4] then return {0} end
local e = tonumber(r[4])
if not r[1] or not e then return corrupt() end
if now >= e then return {0} end
if r[2] then return {1, r[1], r[2], tonumber(r[3]) or 0, e} end
if ARGV[1] == '1' then
  local hb = redis.call('HMGET', key, 'h', 'b')
  if not hb[1] then return corrupt() end
  return {2, r[1], tonumber(r[3]) or 0, e, hb[1], hb[2] or ''}
end
local h = redis.call('HGET', key, 'h')
if not h then return corrupt() end
return {2, r[1], tonumber(r[3]) or 0, e, h}
`)

// deleteScript removes a live record whatever its state. A record this
// store cannot read is removed too: Delete is how an operator clears it.
// Reply: 1, or 0 when there is no live record.
var deleteScript = goredis.NewScript(prelude + `
local r = redis.call('HMGET', key, 'f', 'e', 'w')
if not r[1] and not r[2] then return 0 end
local e = tonumber(r[2])
if r[1] and e and now >= e then return 0 end
redis.call('DEL', key)
wake(r[3])
return 1
`)

// releaseUnknownScript deletes a live record whose outcome is unknown,
// and nothing else: its head (field h, storage.AppendResponse's encoding)
// starts with version 2 and has the outcome-unknown flag
// (storage.EncodedOutcomeUnknown). Reply: 1, or 0 when the record is no
// such one.
var releaseUnknownScript = goredis.NewScript(prelude + `
local r = redis.call('HMGET', key, 'h', 'e', 't', 'w')
local e = tonumber(r[2])
if not r[1] or r[3] or not e or now >= e then return 0 end
if string.byte(r[1], 1) ~= 2 or math.floor((string.byte(r[1], 2) or 0) / 2) % 2 ~= 1 then return 0 end
redis.call('DEL', key)
wake(r[4])
return 1
`)

// watchScript registers a waiter on a live in-flight record.
// ARGV: how long the waiter listens, ms.
// Reply: {0} nothing in flight | {1, ms until the lease lapses}.
var watchScript = goredis.NewScript(prelude + `
local r = redis.call('HMGET', key, 't', 'e', 'w')
local e = tonumber(r[2])
if not r[1] or not e or now >= e then return {0} end
local u = now + tonumber(ARGV[1])
if (tonumber(r[3]) or 0) < u then redis.call('HSET', key, 'w', ms(u)) end
return {1, e - now}
`)
