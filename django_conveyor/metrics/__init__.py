"""Prometheus metrics (`django-conveyor[metrics]`): the scrape view and the worker's port.

`scrape` computes gauges from the database when Prometheus asks;
`worker` counts what a worker process does and serves it on
`conveyor_worker --metrics-port`. Both use prometheus_client for the
exposition; this package's `__init__` imports nothing optional.
"""
