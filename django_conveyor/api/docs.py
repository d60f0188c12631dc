"""The docs page, offline: django-ninja's own Swagger UI files, served by this app.

django-ninja ships Swagger UI in its wheel, but renders it from a CDN unless
"ninja" is in INSTALLED_APPS with static files served. This page serves the
same files from the installed package instead, so it works on a machine
without internet access and on a site that configured neither.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import ninja
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.middleware.csrf import get_token
from django.urls import reverse
from django.utils.html import format_html, json_script
from ninja.openapi.docs import Swagger

if TYPE_CHECKING:
    from ninja import NinjaAPI

ASSET_DIR = Path(ninja.__file__).resolve().parent / "static" / "ninja"
ASSETS = {
    "swagger-ui.css": "text/css",
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui-init.js": "text/javascript",
    "favicon.png": "image/png",
}
ASSET_MAX_AGE_SECONDS = 24 * 3600

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<link rel="stylesheet" href="{css}">
<link rel="icon" href="{icon}" type="image/png">
</head>
<body data-csrf-token="{csrf}" data-api-csrf="{api_csrf}">
{settings}
<div id="swagger-ui"></div>
<script src="{bundle}"></script>
<script src="{init}"></script>
</body>
</html>
"""


def asset(request: HttpRequest, name: str) -> FileResponse:
    """One of the Swagger UI files that django-ninja installed (a fixed list, no paths)."""
    if name not in ASSETS:
        raise Http404("No such asset.")
    response = FileResponse((ASSET_DIR / name).open("rb"), content_type=ASSETS[name])
    response["Cache-Control"] = f"public, max-age={ASSET_MAX_AGE_SECONDS}"
    return response


class OfflineSwagger(Swagger):
    def render_page(self, request: HttpRequest, api: NinjaAPI, **kwargs: Any) -> HttpResponse:
        self.settings["url"] = self.get_openapi_url(api, kwargs)
        logged_in = getattr(getattr(request, "user", None), "is_authenticated", False)
        csrf = get_token(request) if logged_in else ""
        # swagger-ui-init.js reads the settings from the element with this id.
        settings = json_script(self.settings, "swagger-settings")
        html = format_html(
            PAGE,
            title=api.title,
            css=_asset_url(api, "swagger-ui.css"),
            icon=_asset_url(api, "favicon.png"),
            csrf=csrf,
            api_csrf="true" if csrf else "",
            settings=settings,
            bundle=_asset_url(api, "swagger-ui-bundle.js"),
            init=_asset_url(api, "swagger-ui-init.js"),
        )
        return HttpResponse(html)


def _asset_url(api: NinjaAPI, name: str) -> str:
    return reverse(f"{api.urls_namespace}:docs-asset", kwargs={"name": name})
