"""flashcoupon_issuer."""
