"""Following a job: its tags and metadata, progress, search, per-attempt logs and traces.

See docs/observability.md. Nothing here runs for a job that uses none of it.
"""
