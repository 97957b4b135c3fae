"""flashcoupon_common."""
