"""OpenAI-style error bodies for the gateway's HTTP and WebSocket APIs.

Every error a client sees has the shape of the OpenAI API's::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature",
               "code": "invalid_value"}}

``ApiError`` is raised anywhere in request handling; the app's error middleware turns it
(and aiohttp's own HTTP exceptions, and unexpected exceptions) into such a response.
An overload answer (429, or 503 while the engine is unavailable) carries a
``Retry-After`` header (seconds).

A request the engine refused or failed arrives as a ``Failed`` exception (an
``EngineError``) carrying the ``Failure`` made where the error happened; ``api_error``
is the one place that turns it into the ``ApiError`` the HTTP and WebSocket APIs send.
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from houchu.transport.failures import Failed
from houchu.transport.messages import Failure

#: Seconds a client is told to wait (``Retry-After``) after a 429 or 503.
RETRY_AFTER_S = 1
#: Statuses that tell the client to come back later.
RETRY_STATUSES = frozenset({429, 503})

#: OpenAI's ``type`` for each HTTP status class we produce.
_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    503: "service_unavailable_error",
}


def error_type_for(status: int) -> str:
    """The OpenAI error ``type`` string for an HTTP status."""
    if status in _TYPE_BY_STATUS:
        return _TYPE_BY_STATUS[status]
    return "invalid_request_error" if status < 500 else "internal_server_error"


class ApiError(Failed):
    """A request the gateway refuses or cannot serve: a ``Failure`` with what HTTP adds
    (the OpenAI error ``type``, ``Retry-After`` and other headers).

    Args:
        message: human-readable explanation; names the offending parameter if any.
        status: HTTP status of the response.
        param: the request parameter at fault, or None.
        code: a short machine-readable code ("invalid_type", "invalid_value", ...).
        type_: the OpenAI error type; derived from ``status`` when omitted.
        retry_after_s: seconds for the ``Retry-After`` header; defaults to
            ``RETRY_AFTER_S`` for 429 and 503, and None (no header) otherwise.
        headers: more response headers (e.g. ``WWW-Authenticate`` for a 401).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        type_: str | None = None,
        retry_after_s: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(Failure(message=message, status=status, code=code, param=param))
        self.type = type_ or error_type_for(status)
        if retry_after_s is None and status in RETRY_STATUSES:
            retry_after_s = RETRY_AFTER_S
        self.retry_after_s = retry_after_s
        self.extra_headers = dict(headers or {})

    @property
    def headers(self) -> dict[str, str]:
        """Response headers of this error (``Retry-After`` for overload answers)."""
        out = dict(self.extra_headers)
        if self.retry_after_s is not None:
            out["Retry-After"] = str(self.retry_after_s)
        return out

    @classmethod
    def of(cls, failure: Failure) -> ApiError:
        """The error a client gets for ``failure`` (a status outside 400..599 is a 500)."""
        status = failure.status if 400 <= failure.status < 600 else 500
        return cls(failure.message, status=status, param=failure.param, code=failure.code)

    def body(self) -> dict[str, Any]:
        """The ``{"error": {...}}`` JSON object."""
        return error_body(self.message, type_=self.type, param=self.param, code=self.code)


def api_error(exc: Failed) -> ApiError:
    """The ``ApiError`` for any ``Failed`` (an engine failure, or already an ApiError)."""
    return exc if isinstance(exc, ApiError) else ApiError.of(exc.failure)


def error_body(
    message: str,
    *,
    type_: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """An OpenAI-style error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def json_response(
    obj: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """A JSON response encoded with msgspec."""
    return web.Response(
        body=msgspec.json.encode(obj),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def error_response(exc: ApiError) -> web.Response:
    """The HTTP response for an ``ApiError`` (with its ``Retry-After``, if any)."""
    return json_response(exc.body(), status=exc.status, headers=exc.headers or None)
