"""The gateway app against a fake engine: health, models, stats, unknown routes.

This module also holds the fake engine and the helpers the other ``test_api_*`` modules
import.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient, TestServer

from houchu.api import app as app_module
from houchu.api.app import STATE_KEY, GatewayLimits, make_app
from houchu.api.engine_client import EngineError
from houchu.api.tokenize import GatewayTokenizer
from houchu.options.gateway_options import DEFAULT_MAX_QUEUED_REQUESTS
from houchu.transport.failures import bad_request, internal, unavailable
from houchu.transport.messages import GenerateRequest, TextDelta, TokenLogprob

MODEL = "fake-model"
MAX_CONTEXT = 1024
#: The fake engine's answer, one delta per piece (multi-byte text included).
PIECES = ["Hel", "lo", ", wor", "ld", "! 🍜"]
ANSWER = "".join(PIECES)
PROMPT_TOKENS = 7
CACHED_TOKENS = 3


class FakeEngine:
    """A deterministic ``EngineLike``: answers every request with ``PIECES``.

    Magic words in the prompt (or the last chat message): ``FAIL_NOW`` is rejected (400,
    ``context_length_exceeded``) before any delta; ``FAIL_LATER`` fails (500) after two
    deltas; ``CRASH`` raises a non-engine exception (``CRASH_LATER``: after two
    deltas); ``SLOW`` streams pieces every 10 ms
    for a long time. Like ``EngineClient``, closing the iterator before the final delta
    aborts the request, which is recorded in ``aborted``.
    """

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.requests: list[GenerateRequest] = []
        self.records: list[dict | None] = []  # each request's dashboard parameters
        self.aborted: list[str] = []
        self.stats_error: EngineError | None = None
        self.stats_hang = False

    @staticmethod
    def prompt_text(req: GenerateRequest) -> str:
        """The text the magic words are looked for in."""
        if req.prompt is not None:
            return req.prompt
        if req.messages:
            return req.messages[-1].content
        return ""

    def _delta(self, req: GenerateRequest, i: int, last: bool) -> TextDelta:
        piece = PIECES[i % len(PIECES)]
        lps = None
        if req.sampling.logprobs:
            lp = -0.25 * (i + 1)
            top = [(piece, 100 + i, lp), ("alt", 7, lp - 1.0), ("другой", 8, lp - 2.0)]
            lps = [
                TokenLogprob(
                    piece, 100 + i, lp, list(piece.encode()), top[: req.sampling.top_logprobs]
                )
            ]
        return TextDelta(
            rid=req.rid,
            text=piece,
            token_ids=[100 + i],
            logprobs=lps,
            finish_reason="length" if last else None,
            prompt_tokens=PROMPT_TOKENS,
            completion_tokens=i + 1,
            cached_tokens=CACHED_TOKENS if i == 0 else 0,
        )

    async def generate(
        self, req: GenerateRequest, record: dict | None = None
    ) -> AsyncIterator[TextDelta]:
        """Yield the deltas of ``req`` (see the class docstring for the magic words)."""
        self.requests.append(req)
        self.records.append(record)
        text = self.prompt_text(req)
        finished = False
        try:
            if "FAIL_NOW" in text:
                finished = True
                raise EngineError(
                    bad_request(
                        "prompt has 9000 tokens, more than the context window",
                        code="context_length_exceeded",
                    )
                )
            if text == "CRASH":
                finished = True
                raise RuntimeError("boom")
            slow = "SLOW" in text
            n = 100_000 if slow else len(PIECES)
            for i in range(n):
                if slow or self.delay_s:
                    await asyncio.sleep(0.01 if slow else self.delay_s)
                if "FAIL_LATER" in text and i == 2:
                    finished = True
                    raise EngineError(internal("the runner died"))
                if "CRASH_LATER" in text and i == 2:
                    finished = True
                    raise RuntimeError("boom")
                yield self._delta(req, i, last=i == n - 1)
            finished = True
        finally:
            if not finished:
                await self.abort(req.rid)

    async def abort(self, rid: str) -> None:
        """Record an abort."""
        self.aborted.append(rid)

    async def stats(self) -> dict[str, float | int | str]:
        """Fixed counters, or the configured failure."""
        if self.stats_hang:
            await asyncio.sleep(3600)
        if self.stats_error is not None:
            raise self.stats_error
        return {"num_running": 1, "num_pages_free": 10}


@dataclass
class Api:
    """A test client of the gateway app and the fake engine behind it."""

    client: TestClient
    engine: FakeEngine

    @property
    def in_flight(self) -> int:
        """The gateway's in-flight count."""
        return self.client.app[STATE_KEY].in_flight

    async def post(self, path: str, body: Any) -> tuple[int, Any]:
        """POST JSON; the status and the decoded answer."""
        async with self.client.post(path, json=body) as r:
            return r.status, await r.json(content_type=None)


@contextlib.asynccontextmanager
async def serve(
    engine: FakeEngine | None = None,
    max_context: int = MAX_CONTEXT,
    limits: GatewayLimits | None = None,
    tokenizer: GatewayTokenizer | None = None,
    tool_call_parser: str = "hermes",
    **server_kwargs: Any,
) -> AsyncIterator[Api]:
    """Run the gateway app on 127.0.0.1 (a free port) in front of ``engine``.

    ``limits``: the gateway's limits (None: defaults); ``tokenizer``: for ``/tokenize``
    (None: none); ``tool_call_parser``: the ``--tool-call-parser``. ``server_kwargs`` go
    to aiohttp's
    server (e.g. ``handler_cancellation=True``).
    """
    engine = engine or FakeEngine()
    app = make_app(
        engine,
        model_name=MODEL,
        max_context=max_context,
        limits=limits,
        tokenizer=tokenizer,
        tool_call_parser=tool_call_parser,
    )
    async with TestClient(TestServer(app, host="127.0.0.1", **server_kwargs)) as client:
        yield Api(client, engine)


async def read_sse(resp: ClientResponse) -> list[dict[str, Any]]:
    """Read a whole SSE body; check the framing and the final ``[DONE]``; the chunks."""
    assert resp.status == 200, await resp.text()
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    raw = (await resp.read()).decode()
    assert raw.endswith("data: [DONE]\n\n"), raw[-200:]
    events = raw.split("\n\n")[:-2]
    assert all(e.startswith("data: ") for e in events), events
    return [json.loads(e[len("data: ") :]) for e in events]


async def wait_for(pred: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll until ``pred()`` holds."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def assert_openai_error(body: Any, param: str | None = None) -> dict[str, Any]:
    """``body`` is ``{"error": {"message", "type", "param", "code"}}`` naming ``param``."""
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str)
    if param is not None:
        assert err["param"] == param, err
        assert param in err["message"], err
    return err


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
