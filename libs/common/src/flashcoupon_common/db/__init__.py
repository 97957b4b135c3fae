"""MySQL schema, engine and migrations: shared by the persister, couponctl and the auditor."""
