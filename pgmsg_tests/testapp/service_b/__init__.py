"""Service B of the two-service proofs: an ordered inbox fed by a webhook, whose handler
records each message's effect in B's own database (installed only by service_b_settings)."""
