"""bench/load: concurrent streaming clients through the gateway to real edge nodes (see __main__.py)."""
