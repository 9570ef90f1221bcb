"""The optional API key (``--api-key`` or ``HOUCHU_API_KEY``).

When a key is set, every API route needs ``Authorization: Bearer <key>``: the
generation APIs (``/v1/*``, ``/ws``), the engine's counters (``/stats``, ``/metrics``) and
any write. A missing or wrong key gets 401 with an OpenAI-style error body (code
``invalid_api_key``) and ``WWW-Authenticate: Bearer``; keys are compared in constant time
(``hmac.compare_digest``).

Open without a key: ``/health`` (liveness probes), ``/openapi.json`` (the API's
description), and the dashboard's pages and read-only JSON API (``GET /dashboard...``),
so a plain browser can show them. The dashboard cannot change anything: all its routes
are reads, except ``POST /dashboard/api/bench`` (store a benchmark run), which needs the
key like any API route. What the dashboard shows is metadata (timings, token counts,
parameters, the lever ledger), never prompt or completion text.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from aiohttp import web

from houchu.api.errors import ApiError

#: Routes that never need the key.
PUBLIC_PATHS = frozenset({"/health", "/openapi.json"})
#: Methods that only read.
READ_METHODS = frozenset({"GET", "HEAD"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def needs_key(method: str, path: str) -> bool:
    """Whether a request to ``path`` with ``method`` needs the API key (when one is set)."""
    if path in PUBLIC_PATHS:
        return False
    if path == "/dashboard" or path.startswith("/dashboard/"):
        return method not in READ_METHODS
    return True


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme case-insensitive)."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def key_matches(given: str | None, key: str) -> bool:
    """Constant-time comparison of a client's key with the server's."""
    if given is None:
        return False
    return hmac.compare_digest(given.encode(), key.encode())


def make_auth_middleware(api_key: str) -> Callable[[web.Request, Handler], Awaitable]:
    """An aiohttp middleware requiring ``api_key`` on the routes ``needs_key`` names.

    Raises (from the middleware):
        ApiError: 401 for a missing or wrong key.
    """
    if not api_key:
        raise ValueError("api_key must not be empty")

    @web.middleware
    async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if needs_key(request.method, request.path):
            given = bearer_token(request.headers.get("Authorization"))
            if given is None:
                raise _unauthorized("missing API key: send 'Authorization: Bearer <key>'")
            if not key_matches(given, api_key):
                raise _unauthorized("incorrect API key")
        return await handler(request)

    return auth_middleware


def _unauthorized(message: str) -> ApiError:
    return ApiError(
        message, status=401, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}
    )
