"""flashcoupon_relay: the outbox relay, Redis outbox streams → Kafka coupon-issued, at least once.

Shipped in the issuer's distribution and image (the relay reads what the issuer's script
writes), but it imports nothing of the issuer: the outbox layout is in flashcoupon_common.
"""
