"""Periodic jobs: cron expressions, the schedules of CONVEYOR["CRON"], and their ticks."""
