-- issue.lua: coupon issues of one event, atomically, on the node owning the event's slot.
-- Layout: docs/redis-layout.md. Maths (Feistel code, tier draw): flashcoupon_common/coupon_math.py,
-- whose Python reference the unit tests compare against this script.
--
-- KEYS[1] cfg HASH   KEYS[2] stock HASH   KEYS[3] users HASH   KEYS[4] outbox STREAM
-- KEYS[5] allowance HASH (user id -> GCRA TAT in us; see "allowance" below)
-- ARGV: one or more presses, five values each (LuaScript.stride):
--   user id, request id, traceparent ('' for none),
--   allowance interval us and burst ('' '' for none: the press is not rate-limited here)
--
-- Reply: one reply per press, in ARGV's order; each {status, remaining, replay, ncoupons,
-- coupon fields x 8 ..., [allowance left, allowance reset us]}; a coupon is code, tier name,
-- discount type, amount, percent, maxAmount, issued at ms, expires at ms. The two allowance
-- values end the reply of every press that asked for an allowance check (and was not a replay).
-- status: ISSUED | DUPLICATE | SOLD_OUT | NOT_STARTED | ENDED | PAUSED | NOT_FOUND | LIMITED
-- LIMITED: the shopper's allowance refused the press; `remaining` is then the retry-after in us.
--
-- The allowance is the gateway's per-shopper, per-event rate limit (GCRA, the maths of
-- flashcoupon_gateway/gcra.py:decide and lua/ratelimit.lua), decided here when the gateway asks:
-- in the same script call as the issue instead of a call of its own (docs/gateway.md, "The
-- shopper's allowance in the issue call"). A replay is never refused (it issues nothing).
--
-- Why several presses per call: the issuer's batcher sends the presses of one event that
-- arrive together as one call (flashcoupon_common.redis_batch). The call itself, the config
-- and stock reads, the clock, the tier descriptions and the stock write are then paid once per
-- call instead of once per press: the event's master spent 29 us per issue with one press per
-- call and 19 us with 64 (docs/issuer.md). Presses are decided one after another exactly as
-- separate calls would decide them.

-- How the outbox entry is written: 'one-field' (CouponIssued.to_outbox), or 'fields', a field
-- per value as before it, for relays that predate it (flashcoupon_common.lua.ISSUE_FIELD_ENTRIES).
local OUTBOX_ENTRY = 'one-field'

if #ARGV == 0 or #ARGV % 5 ~= 0 then
  return redis.error_reply('issue.lua: ARGV must be (user id, request id, traceparent, '
    .. 'allowance interval, allowance burst) quintuples')
end
local replies = {}
local cfg = redis.call('HMGET', KEYS[1], 'start', 'end', 'limit', 'paused', 'secret',
  'prefix', 'vf', 'nt', 'eid')
if not cfg[1] then
  for i = 1, #ARGV / 5 do
    replies[i] = {'NOT_FOUND', 0, 0, 0}
  end
  return replies
end
local secret, prefix, vf, nt = cfg[5], cfg[6], tonumber(cfg[7]), tonumber(cfg[8])
local start_ms, end_ms, limit = tonumber(cfg[1]), tonumber(cfg[2]), tonumber(cfg[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Made once per run rather than per issue (Lua formats a number with sprintf): an issue's time
-- and expiry as written, and the keyed prefixes of the code's rounds and the tier draw. With
-- the code's digits as bytes below, they took 6-16 % off the master's CPU per issue
-- (docs/loadtest.md, make bench-master).
local now_s, expires_s = tostring(now), tostring(now + vf)
local round_key = {secret .. ':1:', secret .. ':2:', secret .. ':3:', secret .. ':4:'}
local tier_key = secret .. ':t:'

local tiers = {}
local function described(list, code, k, at)
  local d = tiers[k]
  if not d then
    d = redis.call('HMGET', KEYS[1], 'tn' .. k, 'dt' .. k, 'da' .. k, 'dp' .. k, 'dm' .. k)
    tiers[k] = d
  end
  local n = #list
  list[n + 1], list[n + 2], list[n + 3], list[n + 4] = code, d[1], d[2], d[3]
  local expires = at == now_s and expires_s or tostring(tonumber(at) + vf)
  list[n + 5], list[n + 6], list[n + 7], list[n + 8] = d[4], d[5], at, expires
end

-- Stock, read once: this call's issues update these locals, written back once at the end.
local fields = {'n', 'q'}
for k = 1, nt do
  fields[#fields + 1] = 'c' .. k
  fields[#fields + 1] = 'i' .. k
end
local st = redis.call('HMGET', KEYS[2], unpack(fields))
local seq, quantity = tonumber(st[1]) or 0, tonumber(st[2])
local caps, issued = {}, {}
for k = 1, nt do
  caps[k] = tonumber(st[1 + 2 * k]) or 0
  issued[k] = tonumber(st[2 + 2 * k]) or 0
end
local issued_here = 0

-- The shopper's allowance: {granted, left or retry-after us, reset us}. Stale TATs (in the
-- past) mean a full allowance; the hash expires once every TAT written here has passed.
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local allow_ttl_ms = 0
local function allowance(user, interval, burst)
  local tat = tonumber(redis.call('HGET', KEYS[5], user))
  if tat == nil or tat < now_us then
    tat = now_us
  end
  local room = interval * burst - (tat - now_us)
  if room < interval then
    return false, interval - room, tat - now_us
  end
  local new_tat = tat + interval
  -- %.0f: tostring() would print 1.7e+15 and lose the microseconds.
  redis.call('HSET', KEYS[5], user, string.format('%.0f', new_tat))
  local ttl = math.ceil((new_tat - now_us) / 1000) + 1
  if ttl > allow_ttl_ms then
    allow_ttl_ms = ttl
  end
  return true, math.floor(room / interval) - 1, new_tat - now_us
end

local HALF = 33554432
local ALPHA = '0123456789ABCDEFGHJKMNPQRSTVWXYZ'

local decide -- below: what a press that is neither a replay nor refused is answered

local function press(user, rid, tp, interval, burst)
  -- The user's holdings: "code,tier,issuedAtMs,requestId" entries joined by ';'.
  -- A replay of a request that already issued (a batch retried after a lost reply, a client
  -- retrying with the same Idempotency-Key) must get its coupon back, not DUPLICATE: so this
  -- check comes before the pause and window checks too.
  local held = redis.call('HGET', KEYS[3], user)
  local entries = {}
  if held then
    for entry in string.gmatch(held, '[^;]+') do
      local code, k, at, r = string.match(entry, '^([^,]*),([^,]*),([^,]*),(.*)$')
      entries[#entries + 1] = {code, k, at}
      if r == rid then
        -- A real (replicated) write, so that a WAIT after this call on this connection also
        -- covers the original issue: replication is one ordered stream per master.
        redis.call('HINCRBY', KEYS[2], 'rp', 1)
        local reply = {'ISSUED', -1, 1, 1}
        described(reply, code, k, at)
        return reply
      end
    end
  end

  if interval then
    local granted, left, reset = allowance(user, interval, burst)
    if not granted then
      return {'LIMITED', left, 0, 0}, 0, reset
    end
    return decide(held, entries, user, rid, tp), left, reset
  end
  return decide(held, entries, user, rid, tp)
end

decide = function(held, entries, user, rid, tp)
  if cfg[4] == '1' then
    return {'PAUSED', 0, 0, 0}
  end
  if now < start_ms then
    return {'NOT_STARTED', start_ms, 0, 0}
  end
  if now >= end_ms then
    return {'ENDED', end_ms, 0, 0}
  end

  if #entries >= limit then
    local reply = {'DUPLICATE', -1, 0, #entries}
    for _, e in ipairs(entries) do
      described(reply, e[1], e[2], e[3])
    end
    return reply
  end

  if seq >= quantity then
    return {'SOLD_OUT', 0, 0, 0}
  end

  -- Tier: a keyed draw without replacement over what each tier has left (exact totals).
  local total = 0
  for k = 1, nt do
    total = total + caps[k] - issued[k]
  end
  if total <= 0 then
    return {'SOLD_OUT', 0, 0, 0}
  end
  -- One tier is every draw's outcome: its hash would cost the master ~2 us per issue for
  -- nothing (docs/redis-layout.md).
  local tier = 1
  if nt > 1 then
    -- 48 bits of SHA-1: the double-precision modulo below stays exact.
    local r = tonumber(string.sub(redis.sha1hex(tier_key .. seq), 1, 12), 16) % total
    tier = nt
    for k = 1, nt do
      local left = caps[k] - issued[k]
      if r < left then
        tier = k
        break
      end
      r = r - left
    end
  end

  -- Code: a 4-round keyed Feistel permutation of the sequence number over [0, 2^50).
  local L, R = math.floor(seq / HALF), seq % HALF
  for rnd = 1, 4 do
    local f = bit.band(tonumber(string.sub(redis.sha1hex(round_key[rnd] .. R), 1, 7), 16), HALF - 1)
    L, R = R, bit.bxor(L, f)
  end
  local v = L * HALF + R
  local digits = {}
  for i = 10, 1, -1 do
    local d = v % 32
    digits[i] = string.byte(ALPHA, d + 1)
    v = (v - d) / 32
  end
  local code = prefix .. string.char(unpack(digits))

  seq = seq + 1
  issued[tier] = issued[tier] + 1
  issued_here = issued_here + 1
  local at = now_s
  local entry = code .. ',' .. tier .. ',' .. at .. ',' .. rid
  if held then
    entry = held .. ';' .. entry
  end
  redis.call('HSET', KEYS[3], user, entry)

  local reply = {'ISSUED', quantity - seq, 0, 1}
  described(reply, code, tier, at)
  -- The outbox entry: one field, its values joined by the unit separator (\31), as
  -- CouponIssued.to_outbox makes it. One field instead of one per value: ~9 % of this script's
  -- CPU per issue, a third of the replica's. Only the user id is free text (printable, yet
  -- not checked for \31 here), so it goes last: the relay splits off the first twelve values,
  -- and the rest is the user's.
  if OUTBOX_ENTRY == 'one-field' then
    redis.call('XADD', KEYS[4], '*', 'v', table.concat({cfg[9], tostring(#entries + 1), code,
      reply[6], reply[7], reply[8], reply[9], reply[10], at, reply[12], rid, tp, user}, '\31'))
  else
    local xadd = {KEYS[4], '*', 'e', cfg[9], 'u', user, 's', tostring(#entries + 1), 'c', code,
      't', reply[6], 'dt', reply[7], 'da', reply[8], 'dp', reply[9], 'dm', reply[10],
      'at', at, 'ex', reply[12], 'r', rid}
    if tp ~= '' then
      xadd[#xadd + 1] = 'tp'
      xadd[#xadd + 1] = tp
    end
    redis.call('XADD', unpack(xadd))
  end
  return reply
end

for i = 1, #ARGV, 5 do
  local reply, left, reset = press(ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3]),
    tonumber(ARGV[i + 4]))
  if left then
    reply[#reply + 1] = left
    reply[#reply + 1] = reset
  end
  replies[#replies + 1] = reply
end
if allow_ttl_ms > 0 and redis.call('PTTL', KEYS[5]) < allow_ttl_ms then
  redis.call('PEXPIRE', KEYS[5], allow_ttl_ms)
end

if issued_here > 0 then
  -- one write for every counter this call moved
  local counts = {'n', seq}
  for k = 1, nt do
    counts[#counts + 1] = 'i' .. k
    counts[#counts + 1] = issued[k]
  end
  redis.call('HSET', KEYS[2], unpack(counts))
  if seq >= quantity then
    redis.call('PUBLISH', 'flashcoupon:soldout', cfg[9])
  end
end
return replies
