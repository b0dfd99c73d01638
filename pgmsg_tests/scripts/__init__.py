"""Programs that process-level tests run as separate processes (producers, contenders)."""
