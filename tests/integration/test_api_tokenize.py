"""``/tokenize`` and ``/detokenize`` with the default model's tokenizer: the ids are the
engine's for the same prompt or conversation, the text round-trips, bad input is a 400."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from houchu.api.requests.tools import NO_PARAMETERS
from houchu.api.tokenize import GatewayTokenizer
from houchu.text.fim import fim_tokens
from houchu.text.tokenizer.core import TextTokenizer, load_tokenizer
from houchu.transport.messages import ChatMessage
from tests.support.fake_api import MAX_CONTEXT, MODEL, Api, assert_openai_error, serve

pytestmark = pytest.mark.slow

TEXT = "Hello, world! Ünïcödé 漢字 and <|im_start|>"
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there"},
]


@pytest.fixture(scope="module")
def tok(real_model_path: Path) -> TextTokenizer:
    return load_tokenizer(real_model_path)


@pytest.fixture
async def api(real_model_path: Path) -> AsyncIterator[Api]:
    async with serve(tokenizer=GatewayTokenizer(real_model_path)) as a:  # loads on first use
        yield a


def turns() -> list[ChatMessage]:
    return [ChatMessage(m["role"], m["content"]) for m in CONVERSATION]


async def test_prompt_tokens_are_the_engines(api: Api, tok: TextTokenizer) -> None:
    status, body = await api.post("/tokenize", {"prompt": TEXT, "model": MODEL, "metadata": {}})
    assert status == 200, body
    assert body["tokens"] == tok.encode(TEXT) and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == MAX_CONTEXT and body["token_strs"] is None
    status, plain = await api.post("/tokenize", {"prompt": TEXT, "add_special_tokens": False})
    assert plain["tokens"] == tok.encode_plain(TEXT)
    status, back = await api.post("/detokenize", {"tokens": plain["tokens"]})
    assert status == 200 and back == {"prompt": tok.decode(plain["tokens"])}
    assert back["prompt"] == TEXT.removesuffix("<|im_start|>")  # special tokens skipped


async def test_token_strs(api: Api, tok: TextTokenizer) -> None:
    _, body = await api.post("/tokenize", {"prompt": TEXT, "return_token_strs": True})
    assert body["token_strs"] == [tok.token_text(i) for i in body["tokens"]]


async def test_messages_tokens_are_the_chat_templates(api: Api, tok: TextTokenizer) -> None:
    status, body = await api.post("/tokenize", {"messages": CONVERSATION})
    assert status == 200, body
    assert body["tokens"] == tok.apply_chat_template(turns())
    _, bare = await api.post(
        "/tokenize", {"messages": CONVERSATION, "add_generation_prompt": False}
    )
    rendered = tok.render_chat(turns(), add_generation_prompt=False)
    assert bare["tokens"] == tok.encode_plain(rendered)
    assert bare["count"] < body["count"]  # the assistant's opening is left out


TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {}}}


async def test_tools_are_checked_as_chat_completions_check_them(
    api: Api, tok: TextTokenizer
) -> None:
    """``tools: []`` is the 400 chat completions give it (the same check, the same
    words), ``tools`` beside a ``prompt`` the completions API's 400, and valid tools go
    to the chat template as the engine gives them."""
    not_object = {"name": "f", "parameters": {"type": "string"}}
    for bad in (
        [],
        [{"type": "function", "function": {"name": "no spaces"}}],
        [{"type": "function", "function": not_object}],
    ):
        status, chat = await api.post(
            "/v1/chat/completions", {"messages": CONVERSATION, "tools": bad}
        )
        assert status == 400, chat
        status, body = await api.post("/tokenize", {"messages": CONVERSATION, "tools": bad})
        assert status == 400, body
        assert body["error"] == chat["error"]
    for name, value in (("tools", [TOOL]), ("add_generation_prompt", False)):
        status, body = await api.post("/tokenize", {"prompt": "a", name: value})
        assert status == 400  # as a completion (tools) or a WebSocket prompt frame
        err = assert_openai_error(body, name)
        assert err["code"] == "unsupported_value" and "chat requests only" in err["message"]
    status, body = await api.post("/tokenize", {"messages": CONVERSATION, "tools": [TOOL]})
    assert status == 200, body
    template_tools = [
        {"type": "function", "function": {"name": "get_time", "parameters": NO_PARAMETERS}}
    ]
    assert body["tokens"] == tok.apply_chat_template(turns(), template_tools)


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": CONVERSATION}, "messages"),
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {"prompt": "a", "add_generation_prompt": True}, "add_generation_prompt"),
        ("/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ("/tokenize", {"messages": []}, "messages"),
        ("/detokenize", {}, "tokens"),
        ("/detokenize", {"tokens": [1, -1]}, "tokens"),
        ("/detokenize", {"tokens": [1, 10**9]}, "tokens"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
    ],
)
async def test_bad_input_is_a_400(api: Api, path: str, body: dict[str, Any], param: str) -> None:
    status, answer = await api.post(path, body)
    assert status == 400, answer
    assert_openai_error(answer, param)
    status, _ = await api.post("/tokenize", {"prompt": "still serving"})
    assert status == 200


@pytest.mark.parametrize(
    "path,body", [("/tokenize", {"prompt": "a"}), ("/detokenize", {"tokens": [1]})]
)
async def test_a_model_not_served_is_a_404(api: Api, path: str, body: dict[str, Any]) -> None:
    status, answer = await api.post(path, {**body, "model": "gpt-4o"})
    assert status == 404, answer
    err = assert_openai_error(answer, "model")
    assert (err["type"], err["code"]) == ("invalid_request_error", "model_not_found")


async def test_without_a_tokenizer_it_is_a_503() -> None:
    async with serve() as api:
        status, body = await api.post("/tokenize", {"prompt": "a"})
    assert status == 503
    assert_openai_error(body)


# ------------------------------------------------------------------ suffix (FIM)


def fim_tokenizer(tok: TextTokenizer) -> TextTokenizer:
    """The default tokenizer plus StarCoder's fill-in-the-middle tokens."""
    hf = copy.deepcopy(tok.hf_tokenizer)
    hf.add_special_tokens(
        {"additional_special_tokens": ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"]}
    )
    return TextTokenizer(hf, name="fim", add_bos=tok.add_bos, eos_token_ids=tok.eos_token_ids)


async def test_suffix_is_a_400_for_a_model_without_fim_tokens(api: Api, tok: TextTokenizer) -> None:
    assert fim_tokens(tok) is None
    body = {"prompt": "def add(a, b):", "suffix": "\n    return c", "max_tokens": 4}
    status, answer = await api.post("/v1/completions", body)
    assert status == 400
    assert "fill-in-the-middle" in assert_openai_error(answer, "suffix")["message"]
    assert api.engine.requests == []
    status, _ = await api.post("/v1/completions", {**body, "suffix": ""})  # no suffix
    assert status == 200 and api.engine.requests[0].prompt == body["prompt"]


@pytest.mark.parametrize("prompt", ["def add(a, b):", [1, 2, 3]])
async def test_suffix_builds_a_fim_prompt(tok: TextTokenizer, prompt: str | list[int]) -> None:
    fim = fim_tokenizer(tok)
    ids = fim_tokens(fim)
    assert ids is not None
    async with serve(tokenizer=GatewayTokenizer(tokenizer=fim)) as api:
        body = {"prompt": prompt, "suffix": "    return c", "max_tokens": 4}
        status, answer = await api.post("/v1/completions", body)
        assert status == 200, answer
        (req,) = api.engine.requests
    head = fim.encode_plain(prompt) if isinstance(prompt, str) else prompt
    want = [ids.prefix, *head, ids.suffix, *fim.encode_plain("    return c"), ids.middle]
    if isinstance(prompt, str) and fim.add_bos and fim.bos_token_id is not None:
        want.insert(0, fim.bos_token_id)
    assert req.prompt is None and req.prompt_ids == want
