"""The transactional outbox: publish(), destinations (one module per broker), the relay,
dead letters and health."""
