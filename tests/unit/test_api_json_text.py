"""A body or WebSocket frame holding a lone UTF-16 surrogate escape (``"\\ud800x"``) is
a 400 that says so, and where (``houchu.api.requests.json_text``), not msgspec's "Input data was
truncated"; a surrogate pair is text like any other."""

from __future__ import annotations

import pytest

from houchu.api.errors import ApiError
from houchu.api.requests.parse import decode_body
from tests.support.fake_api import assert_openai_error, recv, serve

#: The issue's body: a choice that starts with a lone high surrogate.
LONE = b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"guided_choice":["\\ud800x"]}'
WHY = "which is not valid Unicode text"


@pytest.mark.parametrize(
    ("raw", "escape", "where", "param"),
    [
        (LONE, "\\ud800", "in 'guided_choice[0]'", "guided_choice"),
        (b'{"prompt": "a\\udc00"}', "\\udc00", "in 'prompt'", "prompt"),
        (b'{"stop": ["x", "\\ud83d"]}', "\\ud83d", "in 'stop[1]'", "stop"),
        (b'{"a": {"b": ["\\ud800\\u0041"]}}', "\\ud800", "in 'a.b[0]'", "a"),
        (b'{"a": {"k\\udfff": 1}}', "\\udfff", "in a key of 'a'", "a"),
        (b'{"\\ud800": 1}', "\\ud800", "in a top-level key", None),
        (b'{"ok": "\\ud83d\\ude00", "bad": "\\udbff"}', "\\udbff", "in 'bad'", "bad"),
    ],
)
def test_a_lone_surrogate_escape_is_named(
    raw: bytes, escape: str, where: str, param: str | None
) -> None:
    with pytest.raises(ApiError) as e:
        decode_body(raw)
    err = e.value
    assert (err.status, err.code, err.param) == (400, "invalid_json", param)
    assert err.message.startswith(
        f"request body holds a lone surrogate escape ({escape}) {where}, {WHY}"
    )
    assert "truncated" not in err.message


def test_a_surrogate_pair_is_text_and_other_bad_json_keeps_its_message() -> None:
    assert decode_body(b'{"prompt": "\\ud83d\\ude00"}') == {"prompt": "\U0001f600"}
    with pytest.raises(ApiError) as e:
        decode_body(b'{"prompt": "\\ud800", }')  # the comma, not the escape, is read first
    assert e.value.message.startswith("request body is not valid JSON: ")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/tokenize"])
async def test_over_http_it_is_a_400_and_the_server_goes_on(path: str) -> None:
    async with serve() as api:
        headers = {"Content-Type": "application/json"}
        async with api.client.post(path, data=LONE, headers=headers) as r:
            assert r.status == 400
            err = assert_openai_error(await r.json(), "guided_choice")
        assert err["code"] == "invalid_json" and WHY in err["message"]
        assert "(\\ud800) in 'guided_choice[0]'" in err["message"]
        status, body = await api.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2})
        assert status == 200, body


async def test_over_websocket_the_error_frame_names_the_frame_id() -> None:
    """The frame cannot be decoded, but Python's reading of it gives its ``id``, so the
    error frame names the request it answers; the socket stays usable."""
    async with serve() as api, api.client.ws_connect("/ws") as ws:
        await ws.send_str('{"id": "s", "prompt": "hi", "stop": ["\\ud800"]}')
        err = await recv(ws)
        assert (err["type"], err["id"], err["status"]) == ("error", "s", 400)
        assert err["error"]["param"] == "stop" and WHY in err["error"]["message"]
        assert err["error"]["message"].startswith("frame holds a lone surrogate escape (\\ud800)")
        await ws.send_str('{"prompt": "hi", "guided_choice": ["\\udc00"]}')  # no id
        assert (await recv(ws))["id"] is None
        await ws.send_json({"id": "ok", "prompt": "Hello"})
        frames = []
        while not frames or frames[-1]["type"] not in ("final", "error"):
            frames.append(await recv(ws))
        assert frames[-1]["type"] == "final"


@pytest.mark.parametrize(
    ("raw", "offset", "shown", "cesu"),
    [
        (b'{"prompt": "a\xed\xa0\x80b"}', 13, "ed a0 80", True),  # no escape in the text
        (b'{"prompt": "a\xffb"}', 13, "ff 62 22", False),
        (b'{"prompt": "a\xc3"}', 13, "c3 22 7d", False),
    ],
)
def test_invalid_utf8_bytes_are_named_as_bytes_not_as_an_escape(
    raw: bytes, offset: int, shown: str, cesu: bool
) -> None:
    """Python's ``json`` reads ``ed a0 80`` as a lone surrogate ("surrogatepass"): the
    body holds no escape, so the message names the bytes and where they are."""
    with pytest.raises(ApiError) as e:
        decode_body(raw)
    err = e.value
    assert (err.status, err.code) == (400, "invalid_json")
    assert err.message.startswith(
        f"request body holds bytes that are not valid UTF-8 at byte offset {offset}: {shown}"
    ), err.message
    assert ("CESU-8" in err.message) == cesu
    assert "escape" not in err.message and "Input data" not in err.message
