-- Whether a user already holds a coupon of an event: 1 or 0.
-- KEYS[1] the event's users HASH (flashcoupon_common.keys.users_key)   ARGV[1] user id
-- A script rather than a plain HEXISTS so that it shares the gateway's batched round trips.
return redis.call('HEXISTS', KEYS[1], ARGV[1])
