"""The worker runtime: one process's control loop, its attempts and its services.

docs/architecture.md maps the modules of this package.
"""
