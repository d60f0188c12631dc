"""Fault-injection harness: real workers, a real PostgreSQL, injected faults."""
