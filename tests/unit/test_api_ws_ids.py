"""Every WebSocket error frame answering a frame carries that frame's ``id`` whenever the
frame had a readable one (issue 20): a frame too deep to decode, one that is not JSON
after its ``id``, a binary frame, an id refused as an id, and a failure inside the
server (500); ``null`` only when the frame had none."""

from __future__ import annotations

from typing import Any

import pytest

from houchu.api.ws import routes as ws_api
from houchu.api.ws.ids import MAX_ID_CHARS, MAX_SCAN_STEPS, answer_id, id_in_text
from tests.support.fake_api import collect, recv, serve

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ('{"id": "a", "prompt": "x"}', "a"),
        ('  {"prompt": "x", "id": 7}', 7),
        ('{"id": -1.5e3}', -1500.0),
        ('{"n": [1, {"id": "no"}], "s": "}\\"{[", "t": true, "id": "yes"}', "yes"),
        ('{"guided_json": ' + DEEP + ', "id": "after"}', "after"),
        ('{"id": "before", "guided_json": ' + DEEP + "}", "before"),
        ('{"id": "j", "prompt": oops', "j"),  # not JSON after the id
        ('{"prompt": oops, "id": "j"}', "j"),  # values before it are skipped, not read
        ('{"id": "\\ud800x"}', "\ud800x"),  # read; answer_id refuses it
        ('{"id": {"x": 1}}', None),
        ('{"id": true}', None),
        ('["id", "a"]', None),
        ('{"a": 1}', None),
        ('{"a": "unterminated, "id": "x"}', None),
        ("", None),
        ("{" + '"a": [], ' * (MAX_SCAN_STEPS + 1) + '"id": "far"}', None),  # gave up
        ("{" + '"a": [], ' * 1000 + '"id": "near"}', "near"),
    ],
)
def test_id_in_text(text: str, found: Any) -> None:
    assert id_in_text(text) == found
    assert id_in_text(text.encode()) == found


def test_answer_id() -> None:
    assert [answer_id(v) for v in ("a", "", 3, 1.5, "x" * 500)] == ["a", "", 3, 1.5, "x" * 500]
    assert [answer_id(v) for v in (None, True, [1], {"a": 1}, "\udc00")] == [None] * 5


async def test_every_error_frame_carries_a_readable_id() -> None:
    long_id = "x" * (MAX_ID_CHARS + 1)
    async with serve() as api, api.client.ws_connect("/ws") as ws:
        await ws.send_str('{"id": "deep", "prompt": "x", "guided_json": ' + DEEP + "}")
        err = await recv(ws)
        assert (err["id"], err["type"], err["status"]) == ("deep", "error", 400), err
        assert err["error"] | {"message": ""} == {
            "message": "",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_json",
        }
        assert err["error"]["message"] == "frame is nested too deeply"

        await ws.send_str('{"id": "j", "prompt": oops}')
        err = await recv(ws)
        assert (err["id"], err["error"]["code"]) == ("j", "invalid_json"), err

        await ws.send_bytes(b'{"id": "b", "prompt": "x"}')
        err = await recv(ws)
        assert (err["id"], err["error"]["code"]) == ("b", "invalid_frame"), err

        for bad_id, code in (
            (long_id, "invalid_value"),
            ("", "invalid_value"),
            (1.5, "invalid_type"),
        ):
            await ws.send_json({"id": bad_id, "prompt": "x"})
            err = await recv(ws)
            assert (err["id"], err["error"]["param"], err["error"]["code"]) == (bad_id, "id", code)

        for no_id in ('{"prompt": oops}', '{"id": [1], "prompt": "x"}', "[1]"):
            await ws.send_str(no_id)
            assert (await recv(ws))["id"] is None

        await ws.send_json({"id": "ok", "prompt": "Hello"})  # the socket still serves
        assert (await collect(ws, {"ok"}))["ok"][-1]["type"] == "final"


async def test_a_failure_inside_the_server_answers_with_the_frames_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An unexpected exception while a frame is handled (a bug: the deep schemas of issue
    20 were one) is a 500 error frame naming the frame's id, not ``null``."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in the request check")

    async with serve() as api, api.client.ws_connect("/ws") as ws:
        monkeypatch.setattr(ws_api, "parse_ws_generate", broken)
        await ws.send_json({"id": "deep", "prompt": "x"})
        err = await recv(ws)
        assert (err["id"], err["type"], err["status"]) == ("deep", "error", 500), err
        assert (err["error"]["type"], err["error"]["code"]) == (
            "internal_server_error",
            "internal_error",
        )
        await ws.send_json({"prompt": "x"})  # no id: the one the server assigned
        err = await recv(ws)
        assert err["status"] == 500 and isinstance(err["id"], str) and len(err["id"]) == 32
