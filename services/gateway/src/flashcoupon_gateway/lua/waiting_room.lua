-- An event's waiting room: FIFO tickets and an admission cursor advanced by server time.
-- KEYS[1] seq  (STRING) arrivals so far; a ticket's number n is its INCR
-- KEYS[2] cur  (HASH)   a = admitted cursor (float), t = server time (us) a was computed at
-- KEYS[3] q    (ZSET)   tickets waiting, member = score = n
-- KEYS[4] u    (HASH)   user -> "n:expiry_us" (one live ticket per user; re-press = same ticket)
-- KEYS[5] log  (LIST)   "n:ms" when each n was admitted (popped from q), for audits and tests
-- ARGV: mode (enter|status|consume|advance), rate per second, start_us (the cursor does not move
--       before the event starts), user, n, ticket lifetime us, key ttl s, max pops per call
-- Returns {state, n, position, admitted cursor, arrivals, now_ms};
--   state 1 admitted (for enter/consume: the ticket is used now), 2 queued,
--         3 admitted and not yet used (status), 4 gone (used or expired), 0 advance only.
-- Tickets n <= floor(a) are admitted. a grows at `rate` per second of server time but never
-- past the number of arrivals, so idle capacity is not banked into a burst, and a never
-- decreases, so a ticket's position (n - floor(a)) never goes backwards.
local mode = ARGV[1]
local rate = tonumber(ARGV[2])
local start = tonumber(ARGV[3])
local user = ARGV[4]
local lifetime = tonumber(ARGV[6])
local ttl = tonumber(ARGV[7])
local pop_max = tonumber(ARGV[8])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local function user_ticket()
  local e = redis.call('HGET', KEYS[4], user)
  if not e then return nil end
  local sep = string.find(e, ':', 1, true)
  local n, exp = tonumber(string.sub(e, 1, sep - 1)), tonumber(string.sub(e, sep + 1))
  if exp <= now then
    redis.call('HDEL', KEYS[4], user)
    return nil
  end
  return n
end

local function advance(arrivals)
  local c = redis.call('HMGET', KEYS[2], 'a', 't')
  local a = tonumber(c[1]) or 0
  local last = tonumber(c[2]) or now
  local clock = now
  if clock < last then clock = last end -- a server clock step back must not undo admissions
  local from, to = math.max(last, start), math.max(clock, start)
  local na = a + (to - from) * rate / 1000000
  if na > arrivals then na = arrivals end
  if na < a then na = a end
  redis.call('HSET', KEYS[2], 'a', string.format('%.6f', na), 't', string.format('%.0f', clock))
  redis.call('EXPIRE', KEYS[2], ttl)
  local admitted = math.floor(na)
  local popped = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', admitted, 'LIMIT', 0, pop_max)
  if #popped > 0 then
    local ms = math.floor(now / 1000)
    local entries = {}
    for i, m in ipairs(popped) do entries[i] = m .. ':' .. ms end
    redis.call('ZREM', KEYS[3], unpack(popped))
    redis.call('RPUSH', KEYS[5], unpack(entries))
    redis.call('LTRIM', KEYS[5], -200000, -1)
    redis.call('EXPIRE', KEYS[5], ttl)
  end
  return admitted
end

local function reply(state, n, admitted, arrivals)
  local pos = 0
  if n > admitted then pos = n - admitted end
  return {state, n, pos, admitted, arrivals, math.floor(now / 1000)}
end

local arrivals = tonumber(redis.call('GET', KEYS[1])) or 0

if mode == 'advance' then
  return reply(0, 0, advance(arrivals), arrivals)
end

if mode == 'enter' then
  local n = user_ticket()
  if n then
    local admitted = advance(arrivals)
    if n <= admitted then
      redis.call('HDEL', KEYS[4], user)
      return reply(1, n, admitted, arrivals)
    end
    return reply(2, n, admitted, arrivals)
  end
  n = redis.call('INCR', KEYS[1])
  redis.call('EXPIRE', KEYS[1], ttl)
  local admitted = advance(n)
  if n <= admitted then
    -- Nobody waiting and capacity left: admitted at once, recorded like a popped ticket.
    redis.call('RPUSH', KEYS[5], n .. ':' .. math.floor(now / 1000))
    redis.call('EXPIRE', KEYS[5], ttl)
    return reply(1, n, admitted, n)
  end
  redis.call('ZADD', KEYS[3], n, n)
  redis.call('EXPIRE', KEYS[3], ttl)
  redis.call('HSET', KEYS[4], user, n .. ':' .. string.format('%.0f', now + lifetime))
  redis.call('EXPIRE', KEYS[4], ttl)
  return reply(2, n, admitted, n)
end

-- status / consume of ticket n held by user
local n = tonumber(ARGV[5])
local admitted = advance(arrivals)
if n > admitted then
  return reply(2, n, admitted, arrivals)
end
if user_ticket() ~= n then
  return reply(4, n, admitted, arrivals)
end
if mode == 'consume' then
  redis.call('HDEL', KEYS[4], user)
  return reply(1, n, admitted, arrivals)
end
return reply(3, n, admitted, arrivals)
