"""flashcoupon_persister."""
