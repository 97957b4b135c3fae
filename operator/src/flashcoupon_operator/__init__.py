"""flashcoupon_operator."""
