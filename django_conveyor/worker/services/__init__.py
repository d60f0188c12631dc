"""The maintenance services a worker's control loop schedules (base.py says what one is)."""
