"""The gateway app against a fake engine: health, models, stats, unknown routes (the fake
engine and the helpers the ``test_api_*`` modules share: ``tests.support.fake_api``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from houchu.api import app as app_module
from houchu.api.app import make_app
from houchu.api.engine_client import EngineError
from houchu.options.gateway_options import DEFAULT_MAX_QUEUED_REQUESTS
from houchu.transport.failures import unavailable
from tests.support.fake_api import (
    MAX_CONTEXT,
    MODEL,
    Api,
    FakeEngine,
    assert_openai_error,
    serve,
    wait_for,
)

# -------------------------------------------------------------------------- tests


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with serve() as a:
        yield a


async def test_health(api: Api) -> None:
    async with api.client.get("/health") as r:
        assert r.status == 200
        assert await r.json() == {"status": "ok"}


async def test_models(api: Api) -> None:
    async with api.client.get("/v1/models") as r:
        body = await r.json()
    assert r.status == 200 and body["object"] == "list"
    (model,) = body["data"]
    assert model["id"] == MODEL and model["object"] == "model"
    assert model["max_model_len"] == MAX_CONTEXT and isinstance(model["created"], int)


async def test_stats_adds_in_flight(api: Api) -> None:
    async with api.client.get("/stats") as r:
        assert r.status == 200
        assert await r.json() == {
            "num_running": 1,
            "num_pages_free": 10,
            "model": MODEL,  # the served name, whatever the engine calls its weights
            "in_flight": 0,
            "max_in_flight": DEFAULT_MAX_QUEUED_REQUESTS,
            "num_refused_overload": 0,
        }


async def test_stats_counts_a_running_request(api: Api) -> None:
    async with api.client.post("/v1/completions", json={"prompt": "SLOW", "stream": True}) as r:
        await r.content.readline()
        async with api.client.get("/stats") as s:
            assert (await s.json())["in_flight"] == 1
    await wait_for(lambda: api.in_flight == 0)


async def test_stats_503_when_engine_does_not_answer(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    api.engine.stats_error = EngineError(unavailable("scheduler did not answer", code="timeout"))
    async with api.client.get("/stats") as r:
        assert r.status == 503
        assert assert_openai_error(await r.json())["code"] == "timeout"
    api.engine.stats_error = None
    api.engine.stats_hang = True
    monkeypatch.setattr(app_module, "STATS_TIMEOUT_S", 0.05)
    async with api.client.get("/stats") as r:
        assert r.status == 503
        assert_openai_error(await r.json())


async def test_health_is_readiness(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """503 with Retry-After while the runner loads or the engine does not answer."""
    monkeypatch.setattr(
        api.engine, "stats", lambda: asyncio.sleep(0, {"runner_ready": 0, "num_running": 0})
    )
    async with api.client.get("/health") as r:
        assert r.status == 503 and r.headers["Retry-After"] == "1"
        assert (await r.json())["status"] == "starting"
    monkeypatch.undo()
    api.engine.stats_error = EngineError(unavailable("scheduler did not answer", code="timeout"))
    async with api.client.get("/health") as r:  # never ready yet: still starting
        assert r.status == 503 and (await r.json())["status"] == "starting"
    api.engine.stats_error = None
    async with api.client.get("/health") as r:
        assert r.status == 200 and (await r.json()) == {"status": "ok"}
    api.engine.stats_error = EngineError(unavailable("scheduler did not answer", code="timeout"))
    async with api.client.get("/health") as r:
        body = await r.json()
        assert r.status == 503 and body["status"] == "unavailable"
        assert "scheduler did not answer" in body["detail"]
    api.engine.stats_error = None
    api.engine.stats_hang = True
    monkeypatch.setattr(app_module, "HEALTH_TIMEOUT_S", 0.05)
    async with api.client.get("/health") as r:
        assert r.status == 503 and (await r.json())["status"] == "unavailable"


async def test_unknown_route_and_method_are_json_errors(api: Api) -> None:
    async with api.client.get("/v1/nope") as r:
        assert r.status == 404
        assert assert_openai_error(await r.json())["code"] == "not_found"
    async with api.client.get("/v1/completions") as r:
        assert r.status == 405
        assert_openai_error(await r.json())


def test_make_app_rejects_bad_context() -> None:
    with pytest.raises(ValueError):
        make_app(FakeEngine(), model_name=MODEL, max_context=0)


async def test_a_model_by_id(api: Api) -> None:
    """``GET /v1/models/{id}``: the ``openai`` client's ``models.retrieve``."""
    async with api.client.get(f"/v1/models/{MODEL}") as r:
        body = await r.json()
    assert r.status == 200 and body["id"] == MODEL and body["object"] == "model"
    async with api.client.get("/v1/models/gpt-4o") as r:
        body = await r.json()
    assert r.status == 404 and body["error"]["code"] == "model_not_found"


async def test_an_empty_model_name_means_the_served_model(api: Api) -> None:
    """``"model": ""`` is the served model, as vLLM reads it (not a 404)."""
    body = {"model": "", "prompt": "Hi", "max_tokens": 2}
    async with api.client.post("/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
