"""Durable state of the broker: a checksummed append-only journal with snapshots (see journal.py)."""
