-- provision.lua: write (or update) an event's config and supply, atomically.
-- Called by flashcoupon_common.event_state.provision, which computes the per-tier caps from
-- what it read; this script re-checks them against the live counters (issuance may run during
-- a raise) and answers RETRY if a cap fell below its tier's issued count in between.
--
-- KEYS[1] cfg HASH   KEYS[2] stock HASH
-- ARGV: spec json, start ms, end ms, perUserLimit, validFor ms, event id, secret, prefix,
--       quantity, tier count, then per tier: name, type, amount, percent, maxAmount, cap
local q, nt = tonumber(ARGV[9]), tonumber(ARGV[10])
local n = tonumber(redis.call('HGET', KEYS[2], 'n')) or 0
if n > q then
  return {'BELOW', n}
end
for k = 1, nt do
  local issued = tonumber(redis.call('HGET', KEYS[2], 'i' .. k)) or 0
  if issued > tonumber(ARGV[10 + 6 * k]) then
    return {'RETRY', k}
  end
end
local old_nt = tonumber(redis.call('HGET', KEYS[1], 'nt')) or 0
for k = nt + 1, old_nt do
  redis.call('HDEL', KEYS[1], 'tn' .. k, 'dt' .. k, 'da' .. k, 'dp' .. k, 'dm' .. k)
  redis.call('HDEL', KEYS[2], 'c' .. k, 'i' .. k)
end
-- The secret (and the prefix derived from it) never changes once set: codes already issued
-- were derived from it.
redis.call('HSETNX', KEYS[1], 'secret', ARGV[7])
redis.call('HSETNX', KEYS[1], 'prefix', ARGV[8])
redis.call('HSETNX', KEYS[1], 'paused', '0')
redis.call('HSET', KEYS[1], 'spec', ARGV[1], 'start', ARGV[2], 'end', ARGV[3], 'limit', ARGV[4],
  'vf', ARGV[5], 'eid', ARGV[6], 'nt', nt)
redis.call('HSETNX', KEYS[2], 'n', 0)
redis.call('HSET', KEYS[2], 'q', q)
for k = 1, nt do
  local b = 10 + 6 * (k - 1)
  redis.call('HSET', KEYS[1], 'tn' .. k, ARGV[b + 1], 'dt' .. k, ARGV[b + 2], 'da' .. k,
    ARGV[b + 3], 'dp' .. k, ARGV[b + 4], 'dm' .. k, ARGV[b + 5])
  redis.call('HSET', KEYS[2], 'c' .. k, ARGV[b + 6])
  redis.call('HSETNX', KEYS[2], 'i' .. k, 0)
end
local ver = redis.call('HINCRBY', KEYS[1], 'ver', 1)
redis.call('PUBLISH', 'flashcoupon:supply', ARGV[6])
return {'OK', ver}
