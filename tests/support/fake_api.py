"""The gateway app against a fake engine: the engine, the served app, reading SSE and
WebSocket answers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import ClientResponse, ClientWebSocketResponse, web
from aiohttp.test_utils import TestClient, TestServer

from houchu.api.app import STATE_KEY, make_app
from houchu.api.engine_client import EngineError
from houchu.api.limits import GatewayLimits
from houchu.api.tokenize import GatewayTokenizer
from houchu.transport.failures import bad_request, internal
from houchu.transport.messages import (
    GenerateRequest,
    PromptTokenLogprob,
    TextDelta,
    TokenLogprob,
)

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


async def recv(ws: ClientWebSocketResponse) -> dict[str, Any]:
    """The next JSON frame."""
    return await ws.receive_json(timeout=5)


async def collect(ws: ClientWebSocketResponse, ids: set[Any]) -> dict[Any, list[dict]]:
    """Frames per id until each of ``ids`` has a final or error frame."""
    frames: dict[Any, list[dict]] = {i: [] for i in ids}
    open_ids = set(ids)
    while open_ids:
        frame = await recv(ws)
        frames.setdefault(frame["id"], []).append(frame)
        if frame["type"] in ("final", "error"):
            open_ids.discard(frame["id"])
    return frames


def text_of(frames: list[dict]) -> str:
    return "".join(f["text"] for f in frames if f["type"] in ("delta", "final"))


class Echoing(FakeEngine):
    """The first delta carries the prompt's text and logprobs, as the tokenizer sends:
    with as many alternatives as the request's ``prompt_logprobs`` (as the runner
    computes them)."""

    def _delta(self, req, i, last) -> TextDelta:
        d = super()._delta(req, i, last)
        if i == 0 and req.sampling.echo:
            d.prompt_text = "Hello"
        k = req.sampling.prompt_logprobs
        if i == 0 and k is not None:
            d.prompt_logprobs = [msgspec.structs.replace(p, top=p.top[:k]) for p in PROMPT_LPS]
        return d


def routes(app: web.Application) -> list[tuple[str, str]]:
    """(method, concrete path) of every route of ``app`` ({name} filled with "1")."""
    out = []
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or re.sub(r"\{[^}]+\}", "1", info.get("formatter", ""))
        if path and route.method != "*":
            out.append((route.method, path))
    return sorted(set(out))


PROMPT_LPS = [
    PromptTokenLogprob("Hel", 5, None, None, list(b"Hel")),
    PromptTokenLogprob("lo", 6, -1.5, 2, list(b"lo"), [("p", 9, -0.5), ("lo", 6, -1.5)]),
]


class MoeStatsEngine(FakeEngine):
    """The fake engine, its ``/stats`` naming an MoE model (the dashboard's expert panels)."""

    async def stats(self):
        return {"model": "moe", "num_running": 0, "num_waiting": 0}
