"""flashcoupon_gateway."""
