"""What the dashboard's request view records of a request (``houchu.api.requests.record_params``):
every parameter a client set, over HTTP (completions, chat) and the WebSocket API in
front of the fake engine, each choice of an ``n`` / ``best_of`` request linked to its
parent, tool names only where prompt previews are kept, the stored rows' ``choice`` as
``/dashboard/api/requests`` returns it, and the dashboard page's request view (a real
browser) labelling the choices and showing the parameters."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from houchu.api.app import make_app
from houchu.api.observe import RequestObserver, arrived_params
from houchu.dashboard.store import DashboardStore
from houchu.storage.db import open_db
from houchu.storage.ingest import ingest
from houchu.storage.requests_view import recent_requests, request_detail
from houchu.transport.telemetry import LifecycleEvent, TelemetryBatch
from tests.support.dashboard_browser import CHROMIUM, dashboard_page
from tests.support.fake_api import Api, FakeEngine, collect
from tests.support.vocab_api import serve_vocab

pytestmark = pytest.mark.slow

TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
    for n in ("get_weather", "get_time", "book", "call", "email")
]
MESSAGES = [{"role": "user", "content": "my secret question"}]


def _choices(api: Api) -> list[dict[str, Any]]:
    """The "arrived" parameters of every request the fake engine got, in order."""
    return [
        arrived_params(r, rec)
        for r, rec in zip(api.engine.requests, api.engine.records, strict=True)
    ]


async def test_a_completion_records_every_parameter_it_sets() -> None:
    body = {
        "prompt": "Hello",
        "max_tokens": 4,
        "n": 2,
        "best_of": 3,
        "seed": 5,
        "echo": True,
        "logprobs": 2,
        "prompt_logprobs": 1,
        "logit_bias": {"5": -100, "7": 3, "9": 1, "11": 2, "13": 4},
        "min_tokens": 2,
        "stop_token_ids": [1, 2],
        "allowed_token_ids": [5, 7, 9, 11, 13, 15],
        "bad_words": ["never", "this"],
    }
    async with serve_vocab() as api:
        status, out = await api.post("/v1/completions", body)
    assert status == 200, out
    choices = _choices(api)
    assert len(choices) == 3  # best_of generated, n returned
    for i, p in enumerate(choices):
        assert p["parent"] == out["id"] and p["choice"] == i and p["choices"] == 3
        assert p["n"] == 2 and p["best_of"] == 3 and p["seed"] == 5 + i
        assert p["api"] == "completion" and p["echo"] == 1 and p["prompt_logprobs"] == 1
        assert p["logprobs"] == 1 and p["top_logprobs"] == 2
        assert p["logit_bias"] == "5: 5=-100, 7=+3, 9=+1, 11=+2, …"
        assert p["min_tokens"] == 2 and p["stop_token_ids"] == "2: 1, 2"
        assert p["allowed_token_ids"] == "6: 5, 7, 9, 11, …" and p["bad_words"] == 2
        assert "never" not in str(p)


@pytest.mark.parametrize("frame", [False, True])
async def test_echo_records_the_prompt_logprobs_the_client_sent_only(frame: bool) -> None:
    """``echo`` with ``logprobs`` computes the prompt's logprobs (``prompt_logprobs`` on
    the wire request); the request view shows the client's own fields: no
    ``prompt_logprobs`` when it sent none, and 0 when it sent 0, over HTTP and on a
    WebSocket prompt frame."""
    bodies = [
        {"prompt": "Hello", "max_tokens": 2, "echo": True, "logprobs": 3},
        {"prompt": "Hello", "max_tokens": 2, "echo": True, "logprobs": 3, "prompt_logprobs": 0},
    ]
    async with serve_vocab() as api:
        for i, body in enumerate(bodies):
            if frame:
                async with api.client.ws_connect("/ws") as ws:
                    await ws.send_json({"id": i, **body})
                    assert (await collect(ws, {i}))[i][-1]["type"] == "final"
            else:
                status, out = await api.post("/v1/completions", body)
                assert status == 200, out
    echo_only, zero = _choices(api)
    assert echo_only["echo"] == 1 and echo_only["top_logprobs"] == 3
    assert "prompt_logprobs" not in echo_only
    assert zero["prompt_logprobs"] == 0


async def test_a_chat_records_the_template_fields_it_sent() -> None:
    """``chat_template_kwargs`` (its keys, a scalar's value beside its key, text only by
    its key), ``add_generation_prompt`` and ``continue_final_message`` as the client
    sent them, over HTTP and the WebSocket API; a chat that sent none records none."""
    kwargs = {"enable_thinking": False, "persona": "my secret persona", "depth": 2}
    fields = {"chat_template_kwargs": kwargs, "add_generation_prompt": False}
    fields["continue_final_message"] = True
    async with serve_vocab() as api:
        status, out = await api.post("/v1/chat/completions", {"messages": MESSAGES, **fields})
        assert status == 200, out
        async with api.client.ws_connect("/ws") as ws:
            await ws.send_json({"id": "w", "messages": MESSAGES, **fields})
            assert (await collect(ws, {"w"}))["w"][-1]["type"] == "final"
        body = {"messages": MESSAGES, "add_generation_prompt": True}
        status, out = await api.post("/v1/chat/completions", body)
        assert status == 200, out
        status, out = await api.post("/v1/chat/completions", {"messages": MESSAGES})
        assert status == 200, out
    *sent, header_only, plain = _choices(api)
    for p in sent:
        assert p["chat_template_kwargs"] == "3: enable_thinking=false, persona, depth=2"
        assert p["add_generation_prompt"] == 0 and p["continue_final_message"] == 1
        assert "my secret" not in str(p)
    assert header_only["add_generation_prompt"] == 1
    assert not {"chat_template_kwargs", "continue_final_message"} & set(header_only)
    template = {"chat_template_kwargs", "add_generation_prompt", "continue_final_message"}
    assert not template & set(plain), plain


async def test_a_plain_request_records_no_optional_parameter() -> None:
    async with serve_vocab() as api:
        status, _ = await api.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    assert status == 200
    (p,) = _choices(api)
    optional = {"n", "best_of", "echo", "logprobs", "prompt_logprobs", "logit_bias"}
    optional |= {"min_tokens", "stop_token_ids", "allowed_token_ids", "bad_words", "tools"}
    optional |= {"grammar", "parent", "choice", "seed"}
    assert not optional & set(p), p
    assert p["max_tokens"] == 2


async def test_a_chat_records_its_tools_and_grammar() -> None:
    body = {
        "messages": MESSAGES,
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "book"}},
        "parallel_tool_calls": False,
        "logprobs": True,
        "top_logprobs": 3,
    }
    async with serve_vocab() as api:
        status, out = await api.post("/v1/chat/completions", body)
        assert status == 200, out
        fmt = {"response_format": {"type": "json_object"}, "n": 2}
        status, out = await api.post("/v1/chat/completions", {"messages": MESSAGES, **fmt})
        assert status == 200, out
    tools, *structured = _choices(api)
    assert tools["api"] == "chat" and tools["messages"] == 1
    assert tools["tools"] == 5 and tools["tool_choice"] == "named"
    assert tools["tool_names"] == "get_weather, get_time, book, call, …"
    assert tools["tool_choice_name"] == "book" and tools["parallel_tool_calls"] == 0
    assert tools["grammar"] == "tool_call" and tools["grammar_from"] == "tool_choice"
    assert tools["logprobs"] == 1 and tools["top_logprobs"] == 3
    assert [p["choice"] for p in structured] == [0, 1]
    for p in structured:
        assert p["grammar"] == "json_object" and p["grammar_from"] == "response_format"
        assert p["parent"] == out["id"] and p["n"] == 2 and "best_of" not in p


async def test_a_websocket_request_records_its_parameters() -> None:
    frame = {"id": "w", "messages": MESSAGES, "n": 2, "tools": TOOLS[:2], "min_tokens": 1}
    async with serve_vocab() as api, api.client.ws_connect("/ws") as ws:
        await ws.send_json(frame)
        assert (await collect(ws, {"w"}))["w"][-1]["type"] == "final"
    choices = _choices(api)
    assert [p["choice"] for p in choices] == [0, 1]
    parent = choices[0]["parent"]
    assert parent.startswith("ws-") and api.engine.requests[1].rid == f"{parent}-1"
    for p in choices:
        assert p["n"] == 2 and p["tools"] == 2 and p["tool_choice"] == "auto"
        assert p["tool_names"] == "get_weather, get_time" and p["min_tokens"] == 1


class _Events:
    """A telemetry emitter that keeps its events."""

    def __init__(self) -> None:
        self.events: list[LifecycleEvent] = []

    def event(self, rid: str, kind: str, t: float, **data: float | int | str) -> None:
        self.events.append(LifecycleEvent(rid, kind, t, "gateway", data))


async def test_tool_names_and_stop_strings_only_with_prompt_previews() -> None:
    async with serve_vocab() as api:
        # "auto": a forced call (required / named) drops its stop strings, which the
        # grammar overrides (``request_parts.sampling_params``)
        body = {"messages": MESSAGES, "tools": TOOLS, "tool_choice": "auto", "stop": "zz"}
        status, _ = await api.post("/v1/chat/completions", body)
    assert status == 200
    req, record = api.engine.requests[0], api.engine.records[0]
    for previews in (True, False):
        ev = _Events()
        RequestObserver(ev, None, record_previews=previews).arrived(req, record)
        data = ev.events[0].data
        assert data["tools"] == 5 and data["tool_choice"] == "auto"
        assert ("tool_names" in data) is previews
        assert ("stop" in data) is previews
        assert ("my secret" in data["preview"]) is previews


#: A chat's template fields, as the request view shows them.
TEMPLATE_FIELDS = {
    "chat_template_kwargs": {"enable_thinking": False},
    "add_generation_prompt": False,
    "continue_final_message": True,
}


async def _recorded(db_path: Path) -> tuple[Engine, str, str]:
    """A database holding the "arrived" events of an ``n=2`` completion with a logit
    bias, of a plain one and of a chat with ``TEMPLATE_FIELDS``, served by the gateway
    in front of the fake engine; the ``n=2`` request's id and the chat's."""
    body = {"prompt": "Hi", "n": 2, "seed": 1, "logit_bias": {"5": -100}}
    async with serve_vocab() as api:
        status, out = await api.post("/v1/completions", body)
        assert status == 200
        status, _ = await api.post("/v1/completions", {"prompt": "alone"})
        assert status == 200
        status, chat = await api.post(
            "/v1/chat/completions", {"messages": MESSAGES, **TEMPLATE_FIELDS}
        )
        assert status == 200
    ev = _Events()
    observer = RequestObserver(ev, None)
    for req, record in zip(api.engine.requests, api.engine.records, strict=True):
        observer.arrived(req, record)
    engine = open_db(f"sqlite:///{db_path}")
    with Session(engine) as s, s.begin():
        ingest(s, [TelemetryBatch(actor="gateway", events=ev.events)])
    return engine, out["id"], chat["id"]


async def test_the_request_view_links_the_choices_to_their_parent(tmp_path) -> None:
    engine, parent, chat = await _recorded(tmp_path / "d.db")
    rows = recent_requests(engine, time.time())
    linked = [r for r in rows if r["choice"] is not None]
    assert [r["rid"] for r in linked] == [f"{parent}-0", f"{parent}-1"]
    for i, r in enumerate(linked):
        assert r["choice"] == {"parent": parent, "index": i, "of": 2, "n": 2}
        assert r["params"]["seed"] == 1 + i and r["params"]["logit_bias"] == "1: 5=-100"
    alone = next(r for r in rows if r["choice"] is None)
    assert request_detail(engine, alone["rid"], time.time())["choice"] is None
    params = request_detail(engine, chat, time.time())["params"]
    assert params["chat_template_kwargs"] == "1: enable_thinking=false"
    assert params["add_generation_prompt"] == 0 and params["continue_final_message"] == 1
    engine.dispose()


class _StatsEngine(FakeEngine):
    async def stats(self) -> dict[str, float | int | str]:
        return {"model": "fake", "num_running": 0, "num_waiting": 0}


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed")
def test_the_request_view_in_a_browser_labels_choices_and_shows_params(tmp_path) -> None:
    engine, parent, chat = asyncio.run(_recorded(tmp_path / "d.db"))
    store = DashboardStore(engine)
    app = make_app(_StatsEngine(), model_name="fake", max_context=512, store=store)
    try:
        with dashboard_page(app) as (page, errors):
            page.wait_for_function("Timeline.rows().length === 4")
            labels = page.evaluate("document.getElementById('timeline').layout.yaxis.categoryarray")
            assert sum("#0/2" in x for x in labels) == 1 and sum("#1/2" in x for x in labels) == 1
            page.evaluate(f"Timeline.show({parent + '-1'!r})")
            page.wait_for_selector(f"#detail[data-rid='{parent}-1']")
            line = page.inner_text("#detail .choice-of")
            assert f"choice #1 of 2 of {parent}" in line
            assert page.locator("#detail .choice-link").all_inner_texts() == ["#0"]
            bias = page.inner_text("#detail [data-param=logit_bias]")
            assert "logit_bias" in bias and "1: 5=-100" in bias
            assert page.inner_text("#detail [data-param=n]").split() == ["n", "2"]
            assert page.locator("#detail [data-param=parent]").count() == 0
            page.click("#detail .choice-link")  # to the other choice
            page.wait_for_selector(f"#detail[data-rid='{parent}-0']")
            page.evaluate(f"Timeline.show({chat!r})")  # a chat's template fields
            page.wait_for_selector(f"#detail[data-rid='{chat}']")
            for name, value in (
                ("chat_template_kwargs", "1: enable_thinking=false"),
                ("add_generation_prompt", "0"),
                ("continue_final_message", "1"),
            ):
                shown = page.inner_text(f"#detail [data-param={name}]")
                assert name in shown and value in shown, shown
            assert not errors, errors
    finally:
        store.close()
