"""Minimal Django project shared by the Django-based systems (one at a time)."""
