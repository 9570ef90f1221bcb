"""``/tokenize`` and ``/detokenize`` with the default model's tokenizer: the ids are the
engine's for the same prompt or conversation, the text round-trips, bad input is a 400."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from houchu.api.tokenize import GatewayTokenizer
from houchu.text.tokenizer import TextTokenizer, load_tokenizer
from houchu.transport.messages import ChatMessage

from .test_api_basics import MAX_CONTEXT, MODEL, Api, assert_openai_error, serve

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


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": CONVERSATION}, "messages"),
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {"prompt": "a", "add_generation_prompt": True}, "add_generation_prompt"),
        ("/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ("/tokenize", {"messages": []}, "messages"),
        ("/tokenize", {"prompt": "a", "model": "other"}, "model"),
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


async def test_without_a_tokenizer_it_is_a_503() -> None:
    async with serve() as api:
        status, body = await api.post("/tokenize", {"prompt": "a"})
    assert status == 503
    assert_openai_error(body)
