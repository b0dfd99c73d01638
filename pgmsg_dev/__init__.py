"""Development-only helpers: the embedded PostgreSQL used by the demo, tests and benches.

Not part of the pgmsg package: it is not installed with it.
"""
