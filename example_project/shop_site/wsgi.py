"""WSGI entry point for the example shop."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop_site.settings")

application = get_wsgi_application()
