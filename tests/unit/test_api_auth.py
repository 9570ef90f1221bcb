"""The API key: required on every API route of the app (found by walking its router), a
wrong one gets 401; the dashboard stays open and read-only; ``HOUCHU_API_KEY``."""

from __future__ import annotations

import pytest

from houchu.api.auth import PUBLIC_PATHS, bearer_token, key_matches, needs_key
from houchu.api.limits import GatewayLimits
from houchu.cli.main import build_parser
from tests.support.fake_api import Api, assert_openai_error, routes, serve

KEY = "sk-test-😀-key"
GOOD = {"Authorization": f"Bearer {KEY}"}
WRONG = [
    {},
    {"Authorization": f"Bearer {KEY}x"},
    {"Authorization": f"Bearer {KEY[:-1]}"},
    {"Authorization": "Bearer "},
    {"Authorization": f"Basic {KEY}"},
    {"Authorization": KEY},
]


@pytest.fixture
async def api():
    async with serve(limits=GatewayLimits(api_key=KEY)) as a:
        yield a


async def status_of(api: Api, method: str, path: str, headers: dict[str, str]) -> int:
    kwargs = {"json": {}} if method == "POST" else {}
    async with api.client.request(method, path, headers=headers, **kwargs) as r:
        if r.status == 401:
            if method != "HEAD":  # a HEAD answer has no body
                err = assert_openai_error(await r.json())
                assert err["code"] == "invalid_api_key"
                assert err["type"] == "authentication_error"
            assert r.headers["WWW-Authenticate"] == "Bearer"
        return r.status


async def test_every_api_route_needs_the_key(api: Api) -> None:
    all_routes = routes(api.client.app)
    protected = [(m, p) for m, p in all_routes if needs_key(m, p)]
    names = {p for _, p in protected}
    # the API routes are all among them
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/ws"} <= names
    assert {"/stats", "/metrics", "/dashboard/api/bench"} <= names
    for method, path in protected:
        for headers in WRONG:
            assert await status_of(api, method, path, headers) == 401, (method, path, headers)
        assert await status_of(api, method, path, GOOD) != 401, (method, path)
    assert await status_of(api, "GET", "/no/such/route", {}) == 401  # no probing for paths


async def test_open_routes_and_a_read_only_dashboard(api: Api) -> None:
    open_routes = [(m, p) for m, p in routes(api.client.app) if not needs_key(m, p)]
    assert {p for _, p in open_routes} >= set(PUBLIC_PATHS) | {"/dashboard"}
    for method, path in open_routes:
        assert method in ("GET", "HEAD"), (method, path)  # nothing open can change state
        assert path in PUBLIC_PATHS or path.startswith("/dashboard"), path
        assert await status_of(api, method, path, {}) != 401, path
    # every dashboard route that is not a read needs the key
    for method, path in routes(api.client.app):
        if path.startswith("/dashboard") and method not in ("GET", "HEAD"):
            assert needs_key(method, path)


async def test_generation_with_the_key(api: Api) -> None:
    async with api.client.post(
        "/v1/completions", json={"prompt": "hi", "max_tokens": 3}, headers=GOOD
    ) as r:
        assert r.status == 200
    async with api.client.ws_connect("/ws", headers=GOOD) as ws:
        await ws.send_json({"id": 1, "prompt": "hi", "max_tokens": 2})
        while (frame := await ws.receive_json(timeout=5))["type"] == "delta":
            pass
        assert frame["type"] == "final"


async def test_no_key_configured_means_open() -> None:
    async with serve() as api:
        assert await status_of(api, "GET", "/stats", {}) == 200


def test_bearer_parsing_and_comparison() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token(None) is None and bearer_token("Bearer") is None
    assert key_matches("abc", "abc") and not key_matches("abd", "abc")
    assert not key_matches(None, "abc") and not key_matches("", "abc")


def test_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOUCHU_API_KEY", "from-env")
    assert build_parser().parse_args(["serve"]).api_key == "from-env"
    assert build_parser().parse_args(["serve", "--api-key", "flag"]).api_key == "flag"
    monkeypatch.delenv("HOUCHU_API_KEY")
    args = build_parser().parse_args(["serve"])
    assert args.api_key is None and args.host == "127.0.0.1"  # loopback by default
