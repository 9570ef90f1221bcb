"""Fuzzing and security on a real server (every actor running, an API key set):

- the API key is required on every API route, a wrong one gets 401;
- the actor sockets live in a private run directory (mode 0700);
- schemathesis, driven by ``/openapi.json``, finds no 500 and no crash;
- hypothesis-generated garbage frames (and one oversized frame) sent straight to every
  actor's inbox are logged and dropped: no actor dies, and the server still answers.
"""

from __future__ import annotations

import asyncio
import re
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import psutil
import pytest
import requests
import schemathesis
import zmq
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from houchu.transport.channel import MAX_MESSAGE_BYTES
from tests.support.garbage_frames import garbage
from tests.support.server import Server, start_server, stop_server

pytestmark = pytest.mark.slow

KEY = "fuzz-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
#: Generated cases per generation operation (each may run the model: keep it modest).
EXAMPLES_PER_OPERATION = 40


@pytest.fixture(scope="module")
def srv(real_model_path: Path) -> Iterator[Server]:
    s = start_server(
        real_model_path,
        "--api-key",
        KEY,
        "--max-context",
        "64",
        "--kv-cache-mb",
        "64",
        "--host-kv-mb",
        "16",  # the KV tier actor runs too
        "--speculative",
        "ngram",  # and the draft actor
    )
    yield s
    stop_server(s)


def run_dir(srv: Server) -> Path:
    m = re.search(r"houchu: actor sockets in (\S+)", srv.output())
    assert m, srv.output()
    return Path(m.group(1))


def actor_pids(srv: Server) -> dict[str, int]:
    found = re.findall(r"houchu: (\w+) ready \(pid (\d+)\)", srv.output())
    return {name: int(pid) for name, pid in found}


def completes(srv: Server) -> bool:
    r = requests.post(
        f"{srv.url}/v1/completions",
        json={"prompt": "Hello", "max_tokens": 3},
        headers=AUTH,
        timeout=120,
    )
    return r.status_code == 200 and r.json()["choices"][0]["finish_reason"] is not None


def test_actor_sockets_are_in_a_private_directory(srv: Server) -> None:
    d = run_dir(srv)
    st_ = d.stat()
    assert stat.S_IMODE(st_.st_mode) == 0o700
    assert st_.st_uid == psutil.Process().uids().real
    socks = sorted(p.stem for p in d.glob("*.sock"))
    assert {"gateway", "tokenizer", "scheduler", "runner", "recorder"} <= set(socks), socks


def test_api_key_is_required_on_every_api_route(srv: Server) -> None:
    routes = [
        ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}),
        ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("GET", "/v1/models", None),
        ("GET", "/stats", None),
        ("GET", "/metrics", None),
        ("POST", "/dashboard/api/bench", {"name": "x", "settings": {}, "results": {}}),
    ]
    wrong = [{}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {KEY}"}]
    for method, path, body in routes:
        for headers in wrong:
            r = requests.request(method, srv.url + path, json=body, headers=headers, timeout=30)
            assert r.status_code == 401, (method, path, headers)
            assert r.json()["error"]["code"] == "invalid_api_key"
        body = {"max_tokens": 2, **body} if path == "/v1/chat/completions" else body
        r = requests.request(method, srv.url + path, json=body, headers=AUTH, timeout=120)
        assert r.status_code in (200, 201), (method, path, r.text)
    for path in ("/health", "/openapi.json", "/dashboard", "/dashboard/api/live"):
        assert requests.get(srv.url + path, timeout=30).status_code == 200, path

    async def ws() -> None:
        async with aiohttp.ClientSession() as s:
            with pytest.raises(aiohttp.WSServerHandshakeError) as e:
                await s.ws_connect(srv.ws_url)
            assert e.value.status == 401
            async with s.ws_connect(srv.ws_url, headers=AUTH) as sock:
                await sock.send_json({"id": 1, "prompt": "hi", "max_tokens": 2})
                while (frame := await sock.receive_json(timeout=120))["type"] == "delta":
                    pass
                assert frame["type"] == "final"

    asyncio.run(ws())


def _fuzz_operation(srv: Server, op, tried: dict[str, int], failures: list[str]) -> None:
    """Call ``op`` with hypothesis-generated cases; record 5xx answers in ``failures``."""
    name = f"{op.method.upper()} {op.path}"
    tried[name] = 0

    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=op.as_strategy())
    def check(case) -> None:
        tried[name] += 1
        resp = case.call(base_url=srv.url, headers=AUTH, timeout=300)
        if resp.status_code >= 500:
            failures.append(f"{name} {case.body!r} -> {resp.status_code} {resp.text[:300]}")
        elif resp.status_code >= 400:
            assert set(resp.json()) == {"error"}, resp.text

    check()


def test_schemathesis_finds_no_server_error(srv: Server) -> None:
    schema = schemathesis.openapi.from_url(f"{srv.url}/openapi.json")
    tried: dict[str, int] = {}
    failures: list[str] = []
    for result in schema.get_all_operations():
        _fuzz_operation(srv, result.ok(), tried, failures)
    total = sum(tried.values())
    print(f"schemathesis: {total} cases over {len(tried)} operations: {tried}")
    assert not failures, failures
    assert total >= EXAMPLES_PER_OPERATION
    assert requests.get(f"{srv.url}/health", timeout=30).status_code == 200
    assert completes(srv)


def _fire(sock: zmq.Socket, name: str, sent: dict[str, int]) -> None:
    """Send hypothesis-generated garbage frames through ``sock``; count them."""

    @settings(
        max_examples=25,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(frames=st.lists(garbage, min_size=1, max_size=5))
    def fire(frames: list[bytes]) -> None:
        for f in frames:
            sock.send(f)
            sent[name] += 1

    fire()


def test_garbage_frames_to_every_actor_are_dropped(srv: Server) -> None:
    d = run_dir(srv)
    pids = actor_pids(srv)
    targets = sorted(p.stem for p in d.glob("*.sock"))
    assert {"launcher", "gateway", "tokenizer", "scheduler", "runner", "recorder"} <= set(targets)
    assert {"kv_tiers", "draft"} <= set(targets)
    ctx = zmq.Context()
    sent: dict[str, int] = dict.fromkeys(targets, 0)
    try:
        for name in targets:
            sock = ctx.socket(zmq.PUSH)
            sock.linger = 2000
            sock.connect(f"ipc://{d / name}.sock")
            _fire(sock, name, sent)
            sock.send(b"\x00" * (MAX_MESSAGE_BYTES + 1), copy=False)  # oversized
            sent[name] += 1
            sock.close()
    finally:
        ctx.term()
    print(f"garbage frames: {sum(sent.values())} sent: {sent}")
    time.sleep(2.0)  # let the last frames arrive
    for name, pid in pids.items():
        assert psutil.pid_exists(pid), f"actor {name} (pid {pid}) died"
        assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE, name
    assert actor_pids(srv) == pids, "an actor was restarted"
    out = srv.output()
    for name in targets:
        who = "houchu:" if name == "launcher" else f"houchu {name}:"
        assert f"{who} dropped a bad message" in out, f"{name} logged no bad frame"
    assert requests.get(f"{srv.url}/health", timeout=30).status_code == 200
    assert requests.get(f"{srv.url}/stats", headers=AUTH, timeout=30).status_code == 200
    assert completes(srv)
