"""The wallet API: a shopper's coupons, an event's persisted count, and redemption.

It runs as its own process (`flashcoupon-wallet`), shipped in the persister's distribution and
image because it reads and updates the rows the persister owns in MySQL, yet scales with
shoppers rather than with Kafka partitions. It imports nothing of the persister. See
docs/wallet.md.
"""
