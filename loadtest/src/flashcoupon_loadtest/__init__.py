"""flashcoupon_loadtest."""
