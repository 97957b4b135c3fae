-- GCRA decision for one key (mirrors flashcoupon_gateway/gcra.py:decide).
-- KEYS[1]  the limiter key, e.g. {rl:u:<user>}:ev:<event>
-- ARGV[1]  emission interval T in microseconds (1/rate)
-- ARGV[2]  burst (requests allowed at once)
-- ARGV[3]  want: tokens asked for (1, or more for a lease); as many as conform are granted
-- Returns {granted (0 = rejected), retry_after_us, remaining, reset_us}.
-- Time is the server's clock (TIME), so every gateway replica agrees on "now"; Redis 7
-- replicates scripts by effects, so the SET below is what replicas see.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tolerance = interval * tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]))
if tat == nil or tat < now then
  tat = now
end
local room = tolerance - (tat - now)
local affordable = math.floor(room / interval)
if affordable < 1 then
  return {0, interval - room, 0, tat - now}
end
local n = math.min(tonumber(ARGV[3]), affordable)
local new_tat = tat + n * interval
-- %.0f: tostring() would print 1.7e+15 and lose the microseconds.
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', math.ceil((new_tat - now) / 1000) + 1)
return {n, 0, affordable - n, new_tat - now}
