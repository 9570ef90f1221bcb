"""``POST /tokenize`` and ``POST /detokenize``, as vLLM serves them.

``/tokenize`` takes a completion ``prompt`` or chat ``messages`` (rendered with the
model's chat template, as the engine renders them) and answers
``{"tokens", "count", "max_model_len", "token_strs"}``; ``/detokenize`` takes ``tokens``
and answers ``{"prompt"}`` (special tokens skipped, as in generated text). The ids are
the ones the engine would see for the same prompt, so a client can count a prompt
against the context window before it sends it.

The gateway holds its own copy of the model's tokenizer (``GatewayTokenizer``), loaded
on the first call (a few seconds) in a worker thread, so these calls never reach the
engine and never wait behind generation. Bad input (both or neither of ``prompt`` and
``messages``, a role the template refuses, a token id outside the vocabulary, another
model's name) is a 400.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from houchu.api.errors import ApiError, json_response
from houchu.api.requests.chat_template import refuse_on_prompt, template_options
from houchu.api.requests.parse import ParsedRequest, chat_messages, check_model, decode_body
from houchu.api.requests.tools import refuse_tools_on_prompt, tool_setup
from houchu.api.schema.bodies import DetokenizeRequest, TokenizeRequest
from houchu.api.schema.errors import validation_error
from houchu.api.state import STATE_KEY
from houchu.text.fim import fim_prompt
from houchu.text.tokenizer.core import TextTokenizer, TokenizerError, load_tokenizer
from houchu.transport.failures import UNAVAILABLE


class GatewayTokenizer:
    """The model's tokenizer in the gateway process: given, or loaded from ``path``
    on first use (in a worker thread, once), with ``chat_template`` (``--chat-template``)
    as the tokenizer actor loads it."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        tokenizer: TextTokenizer | None = None,
        chat_template: str | None = None,
    ) -> None:
        if (path is None) == (tokenizer is None):
            raise ValueError("give exactly one of path and tokenizer")
        self._path = path
        self._chat_template = chat_template
        self._tokenizer = tokenizer
        self._lock = asyncio.Lock()

    async def get(self) -> TextTokenizer:
        """The tokenizer.

        Raises:
            ApiError: (503) it cannot be loaded (the model has no usable tokenizer).
        """
        if self._tokenizer is None:
            async with self._lock:
                if self._tokenizer is None:
                    try:
                        self._tokenizer = await asyncio.to_thread(
                            load_tokenizer, self._path, self._chat_template
                        )
                    except (OSError, TokenizerError) as exc:
                        raise ApiError(
                            f"the model's tokenizer cannot be loaded: {exc}",
                            status=503,
                            code=UNAVAILABLE,
                        ) from None
        return self._tokenizer


TOKENIZER_KEY: web.AppKey[GatewayTokenizer] = web.AppKey("houchu_tokenizer", GatewayTokenizer)


T = TypeVar("T")


def _decode(body: dict[str, Any], kind: type[T]) -> T:
    """``body`` as a ``kind``: unknown keys and nulls dropped, as in generation requests.
    Raises ``ApiError`` (400)."""
    known = set(kind.__struct_fields__)  # type: ignore[attr-defined]
    given = {k: v for k, v in body.items() if k in known and v is not None}
    try:
        return msgspec.convert(given, kind, strict=True)
    except msgspec.ValidationError as exc:
        raise validation_error(exc, kind, given) from None


async def _tokenizer(request: web.Request) -> TextTokenizer:
    holder = request.app.get(TOKENIZER_KEY)
    if holder is None:
        raise ApiError("this server has no tokenizer", status=503, code=UNAVAILABLE)
    return await holder.get()


def tokenize_ids(tok: TextTokenizer, req: TokenizeRequest) -> list[int]:
    """The token ids of ``req``'s prompt or messages, as the engine would encode them.

    Raises:
        ApiError: (400) both or neither of ``prompt`` and ``messages`` are given, a chat
            field beside a ``prompt``, ``tools`` a chat request would refuse (``[]``
            among them), or the chat template refuses the messages.
    """
    if (req.prompt is None) == (req.messages is None):
        raise ApiError(
            "give exactly one of 'prompt' and 'messages'",
            param="prompt" if req.prompt is None else "messages",
            code="missing_required_parameter" if req.prompt is None else "invalid_value",
        )
    if req.prompt is not None:
        refuse_tools_on_prompt(req)
        refuse_on_prompt(req)
        special = True if req.add_special_tokens is None else req.add_special_tokens
        return tok.encode(req.prompt) if special else tok.encode_plain(req.prompt)
    assert req.messages is not None
    setup = tool_setup(req)
    try:
        options = template_options(
            req.chat_template_kwargs, req.add_generation_prompt, req.continue_final_message
        )
        tools = None if setup is None else setup.template_tools
        text = tok.render_chat(chat_messages(req.messages), tools, **options)
    except TokenizerError as exc:
        raise ApiError(str(exc), param="messages", code="invalid_value") from None
    return tok.encode(text) if req.add_special_tokens else tok.encode_plain(text)


async def tokenize(request: web.Request) -> web.Response:
    """``POST /tokenize``."""
    state = request.app[STATE_KEY]
    req = _decode(decode_body(await request.read()), TokenizeRequest)
    check_model(req.model, state.model_name)
    tok = await _tokenizer(request)
    ids = await asyncio.to_thread(tokenize_ids, tok, req)
    limits = await state.runner_limits()
    strs = [tok.token_text(i) for i in ids] if req.return_token_strs else None
    return json_response(
        {"tokens": ids, "count": len(ids), "max_model_len": limits.max_context, "token_strs": strs}
    )


async def detokenize(request: web.Request) -> web.Response:
    """``POST /detokenize``."""
    state = request.app[STATE_KEY]
    req = _decode(decode_body(await request.read()), DetokenizeRequest)
    check_model(req.model, state.model_name)
    tok = await _tokenizer(request)
    bad = [i for i, t in enumerate(req.tokens) if t >= tok.vocab_size]
    if bad:
        raise ApiError(
            f"'tokens' names token id {req.tokens[bad[0]]} (at index {bad[0]}), outside "
            f"this model's vocabulary [0, {tok.vocab_size})",
            param="tokens",
            code="invalid_value",
        )
    return json_response({"prompt": tok.decode(req.tokens)})


async def with_suffix(app: web.Application, parsed: ParsedRequest) -> ParsedRequest:
    """``parsed`` with its prompt and ``suffix`` written as a fill-in-the-middle prompt
    (``houchu.text.fim``) in token ids; unchanged without a suffix.

    Raises:
        ApiError: (400) the model has no fill-in-the-middle tokens; (503) its tokenizer
            cannot be loaded.
    """
    if not parsed.suffix:
        return parsed
    holder = app.get(TOKENIZER_KEY)
    tok = await holder.get() if holder is not None else None
    prompt = parsed.prompt if parsed.prompt is not None else parsed.prompt_ids
    assert prompt is not None  # a completion has one
    ids = None if tok is None else fim_prompt(tok, prompt, parsed.suffix)
    if ids is None:
        name = app[STATE_KEY].model_name
        raise ApiError(
            f"'suffix' (fill-in-the-middle) is not supported by the model '{name}': its "
            "tokenizer has no fill-in-the-middle tokens",
            param="suffix",
            code="unsupported_value",
        )
    return dataclasses.replace(parsed, prompt=None, prompt_ids=ids, suffix=None)


def add_routes(app: web.Application) -> None:
    """Register ``POST /tokenize`` and ``POST /detokenize``."""
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
