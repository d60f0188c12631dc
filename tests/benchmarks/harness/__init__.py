"""Parent-side benchmark harness: standard library only."""
