"""Errors as problem details (RFC 9457): one shape for every 4xx the API returns.

Also the body limit: a request whose body is larger than
`CONVEYOR["API_MAX_BODY_BYTES"]` is refused before it is parsed.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.http import Http404, HttpRequest, HttpResponse
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser

from ..conf import conveyor_settings

if TYPE_CHECKING:
    from ninja import NinjaAPI

TITLES = {
    400: "Bad request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
}


class Problem(Exception):
    """Raised by an endpoint to answer with a problem document."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        errors: list[dict[str, Any]] | None = None,
        job_id: str | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.errors = errors or []
        self.job_id = job_id


def field_problem(field: str | None, message: str, location: str | None = "body") -> Problem:
    """A 400 about one field; its message is the detail too."""
    return Problem(
        400, message, errors=[{"field": field, "location": location, "message": message}]
    )


class BodyTooLarge(ValueError):
    pass


def body_limit_problem(limit: int) -> Problem:
    return field_problem(
        None, f"The request body is larger than CONVEYOR['API_MAX_BODY_BYTES'] ({limit} bytes)."
    )


class LimitedJSONParser(Parser):
    """JSON bodies up to the configured size; NaN and Infinity are not JSON."""

    def parse_body(self, request: HttpRequest) -> Any:
        limit = conveyor_settings().API_MAX_BODY_BYTES
        if len(request.body) > limit:
            raise BodyTooLarge(limit)
        return json.loads(request.body, parse_constant=_refuse_constant)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def limit_body(run: Callable[..., Any]) -> Callable[..., Any]:
    """Refuse a body that says it is too large before anything reads it."""

    @functools.wraps(run)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        limit = conveyor_settings().API_MAX_BODY_BYTES
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length > limit:
            return problem_response(body_limit_problem(limit))
        return run(request, *args, **kwargs)

    return wrapper


def problem_response(problem: Problem) -> HttpResponse:
    document = {
        "status": problem.status,
        "title": TITLES.get(problem.status, "Error"),
        "detail": problem.detail,
        "errors": problem.errors,
    }
    if problem.job_id is not None:
        document["job_id"] = problem.job_id
    response = HttpResponse(
        json.dumps(document), status=problem.status, content_type="application/json"
    )
    if problem.status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="django-conveyor"'
    return response


def _validation_errors(exc: ValidationError) -> list[dict[str, Any]]:
    errors = []
    for error in exc.errors:
        location, *path = [str(part) for part in error.get("loc", ())] or [None]
        if location == "body" and path and path[0] == "body":
            path = path[1:]  # ninja nests the body under the parameter's name.
        message = error.get("msg", "Invalid value.")
        errors.append(
            {"field": ".".join(path) or None, "location": location, "message": f"{message}."}
        )
    return errors


def _http_error(exc: HttpError) -> Problem:
    cause = exc.__cause__
    if isinstance(cause, BodyTooLarge):
        return body_limit_problem(cause.args[0])
    if exc.status_code == 400 and isinstance(cause, ValueError):
        # JSONDecodeError and UnicodeDecodeError are both ValueErrors.
        return field_problem(None, f"The request body is not valid JSON: {cause}.")
    if isinstance(exc, AuthenticationError):
        return Problem(
            401, "Send an API key as 'Authorization: Bearer <key>' (or use a staff session)."
        )
    return Problem(exc.status_code, str(exc))


def install(api: NinjaAPI) -> None:
    """Answer every error the API raises with a problem document."""

    def handle(request: HttpRequest, exc: Exception) -> HttpResponse:
        if isinstance(exc, Problem):
            return problem_response(exc)
        if isinstance(exc, ValidationError):
            errors = _validation_errors(exc)
            detail = (
                "; ".join(f"{e['field'] or e['location']}: {e['message']}" for e in errors)
                or "The request is not valid."
            )
            return problem_response(Problem(400, detail, errors=errors))
        if isinstance(exc, HttpError):
            return problem_response(_http_error(exc))
        if isinstance(exc, Http404):
            return problem_response(Problem(404, str(exc) or "Not found."))
        raise exc

    for kind in (Problem, ValidationError, HttpError, Http404):
        api.add_exception_handler(kind, handle)
