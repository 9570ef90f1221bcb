"""vLLM's chat-template fields (``chat_template_kwargs``, ``add_generation_prompt``,
``continue_final_message``) over HTTP chat, WebSocket chat frames and ``/tokenize``:
they reach the engine's request (and the template), bad values are a 400."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from houchu.api.tokenize import GatewayTokenizer
from houchu.text.tokenizer.core import load_tokenizer
from houchu.transport.messages import ChatMessage, GenerateRequest
from tests.support.fake_api import Api, assert_openai_error, collect, serve

pytestmark = pytest.mark.slow

MESSAGES = [
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "The colour is"},
]
CONTINUE = {"continue_final_message": True, "add_generation_prompt": False}
KWARGS = {"enable_thinking": False, "style": {"tone": "dry"}}


async def _request(api: Api, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """POST ``body`` (or send it as a WebSocket frame): (status, error or None)."""
    if path != "/ws":
        status, out = await api.post(path, body)
        return status, out.get("error")
    async with api.client.ws_connect("/ws") as ws:
        await ws.send_json({"id": "c", **body})
        frames = (await collect(ws, {"c"}))["c"]
    last = frames[-1]
    return (last["status"], last["error"]) if last["type"] == "error" else (200, None)


def _options(req: GenerateRequest) -> tuple[Any, bool, bool]:
    return req.chat_template_kwargs, req.add_generation_prompt, req.continue_final_message


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/ws"])
async def test_the_fields_reach_the_engines_request(path: str) -> None:
    async with serve() as api:
        for extra in (
            {},
            CONTINUE,
            {"continue_final_message": True},
            {"chat_template_kwargs": KWARGS},
        ):
            status, err = await _request(api, path, {"messages": MESSAGES, **extra})
            assert status == 200, err
        status, err = await _request(
            api, path, {"messages": MESSAGES, "add_generation_prompt": False}
        )
        assert status == 200, err
        got = [_options(r) for r in api.engine.requests]
    assert got == [
        (None, True, False),  # the defaults: a new assistant turn
        (None, False, True),
        (None, False, True),  # continuing: no generation prompt unless asked (then a 400)
        (KWARGS, True, False),
        (None, False, False),
    ]


BAD = [
    ({"chat_template_kwargs": 5}, "chat_template_kwargs", "must be an object"),
    ({"chat_template_kwargs": ["a"]}, "chat_template_kwargs", "must be an object"),
    ({"add_generation_prompt": "no"}, "add_generation_prompt", "must be a boolean"),
    ({"continue_final_message": 1}, "continue_final_message", "must be a boolean"),
    (
        {"continue_final_message": True, "add_generation_prompt": True},
        "continue_final_message",
        "cannot both be true",
    ),
    (
        {"chat_template_kwargs": {"tokenize": False}},
        "chat_template_kwargs",
        "'tokenize' is reserved",
    ),
    (
        {"chat_template_kwargs": {"add_generation_prompt": False}},
        "chat_template_kwargs",
        "give 'add_generation_prompt' as a request field",
    ),
    ({"chat_template_kwargs": {"chat_template": "{{ 1 }}"}}, "chat_template_kwargs", "reserved"),
    ({"chat_template_kwargs": {"n": 2**64}}, "chat_template_kwargs", "outside the 64-bit"),
    ({"chat_template_kwargs": {"a": [{"b": -(2**63) - 1}]}}, "chat_template_kwargs", "64-bit"),
]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/ws"])
@pytest.mark.parametrize(("extra", "param", "says"), BAD)
async def test_bad_values_are_a_400(path: str, extra: dict, param: str, says: str) -> None:
    async with serve() as api:
        status, err = await _request(api, path, {"messages": MESSAGES, **extra})
        assert status == 400
        assert_openai_error({"error": err}, param)
        assert says in err["message"], err
        assert api.engine.requests == []


@pytest.mark.parametrize("field", ["chat_template_kwargs", "continue_final_message"])
async def test_a_prompt_frame_refuses_them(field: str) -> None:
    value = {} if field == "chat_template_kwargs" else True
    async with serve() as api:
        status, err = await _request(api, "/ws", {"prompt": "Hi", field: value})
    assert status == 400 and err["param"] == field and err["code"] == "unsupported_value"


@pytest.fixture
async def tok_api(real_model_path: Path):
    async with serve(tokenizer=GatewayTokenizer(real_model_path)) as a:
        yield a


async def test_tokenize_renders_them_as_the_engine_does(
    tok_api: Api, real_model_path: Path
) -> None:
    """``/tokenize`` gives the ids the engine's tokenizer gets for the same fields: the
    continued message is left open (no end of turn, no assistant header)."""
    tok = load_tokenizer(real_model_path)
    turns = [ChatMessage(m["role"], m["content"]) for m in MESSAGES]
    status, body = await tok_api.post("/tokenize", {"messages": MESSAGES, **CONTINUE})
    assert status == 200, body
    want = tok.apply_chat_template(turns, add_generation_prompt=False, continue_final_message=True)
    assert body["tokens"] == want
    assert tok.decode(want).endswith("The colour is")
    _, default = await tok_api.post("/tokenize", {"messages": MESSAGES})
    assert default["tokens"] == tok.apply_chat_template(turns) != want
    status, body = await tok_api.post(
        "/tokenize",
        {"messages": MESSAGES, "continue_final_message": True, "add_generation_prompt": True},
    )
    assert status == 400 and body["error"]["param"] == "continue_final_message"
    status, body = await tok_api.post("/tokenize", {"prompt": "Hi", "chat_template_kwargs": {}})
    assert status == 400 and body["error"]["param"] == "chat_template_kwargs"
