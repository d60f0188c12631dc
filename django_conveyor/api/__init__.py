"""The HTTP API (`django-conveyor[api]`): enqueue and operate jobs from any language.

Mount it with ``path("conveyor/api/", include("django_conveyor.api.urls"))``.
This package's own `__init__` imports nothing optional: the allow-list and
the checks work without the extra; `urls`, `endpoints` and `schemas` need it.
"""
