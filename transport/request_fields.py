"""The request's own fields on the wire: its sampling parameters, its chat turns, and
why it failed (``Failure``). Re-exported by ``houchu.transport.messages``.

The sampling parameters' bounds are declared once, here, as msgspec constraints
(``Temperature``, ``TopP``, ...): a ``GenerateRequest`` or ``StepPlan`` decoded by any
actor is checked as it decodes, the request bodies of ``houchu.api.schema.bodies`` are
built from the same types, and a ``SamplingParams`` built in-process (the runner's
tests, benches, proposers) is checked by ``sampling_problem``, which decodes it again.
"""

from __future__ import annotations

import sys
from typing import Annotated, Literal, get_args

import msgspec
from msgspec import Meta, Struct, field

from houchu.transport.structured import StructuredOutput

#: The most ``top_logprobs`` (and ``prompt_logprobs``) a request may ask for.
MAX_TOP_LOGPROBS = 20
#: ``logit_bias`` values: OpenAI's range (the ends ban or force the token).
MAX_LOGIT_BIAS = 100.0
#: Largest token id on the wire (the vocabulary's own top is checked where it is known).
MAX_TOKEN_ID = 2**31 - 1

TokenId = Annotated[int, Meta(ge=0, le=MAX_TOKEN_ID)]
#: 0: greedy (the HTTP API also caps it at 2.0, OpenAI's top).
Temperature = Annotated[float, Meta(ge=0.0)]
#: Nucleus mass, 1: off (the HTTP API also takes 0, sent as ``top_k`` 1).
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
#: ``min_p``: a fraction of the top token's probability, 0: off.
Unit = Annotated[float, Meta(ge=0.0, le=1.0)]
#: vLLM's: any finite value above 0 (1: off); only infinity is above the top.
RepetitionPenalty = Annotated[float, Meta(gt=0.0, le=sys.float_info.max)]
#: Frequency and presence penalties (OpenAI's range).
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
TopLogprobs = Annotated[int, Meta(ge=0, le=MAX_TOP_LOGPROBS)]
LogitBiasValue = Annotated[float, Meta(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)]
MinTokens = Annotated[int, Meta(ge=0)]
MaxTokens = Annotated[int, Meta(ge=0)]
#: A token id sequence that is never empty (``allowed_token_ids``, a bad word's ids).
TokenIds = Annotated[list[TokenId], Meta(min_length=1)]


class SamplingParams(Struct, frozen=True, kw_only=True):
    """Per-request decoding parameters, as the OpenAI API names them.

    ``temperature == 0`` means greedy. ``top_k <= 0`` disables top-k; ``top_p == 1``
    disables nucleus sampling; ``min_p == 0`` disables min-p. Penalties follow the
    OpenAI / vLLM definitions (``repetition_penalty`` is the CTRL multiplicative penalty,
    Keskar et al. 2019). ``seed`` makes a sampled request reproducible whatever else is in
    the batch. ``max_tokens`` counts generated tokens; ``max_tokens_is_default``: the
    client did not ask for a number (``max_tokens`` is the API's default), so the
    tokenizer lowers it to what the context window leaves after the prompt, as vLLM does.
    ``top_logprobs`` is only meaningful when ``logprobs`` is true (0..20).
    ``structured``: the grammar the output must follow (structured output), or None.

    Logits processors (``houchu.model.sampling.logits_processors``), applied before penalties:
    ``logit_bias`` (token id -> bias in [-100, 100], OpenAI's: added to the logit; -100
    bans the token, 100 selects among the tokens biased by 100 only), ``allowed_token_ids``
    (vLLM: only these may be sampled; None: all), ``bad_words`` (vLLM: strings never
    generated; the tokenizer actor encodes them into ``bad_words_ids``), ``min_tokens``
    (vLLM: the stop ids cannot end the request before this many tokens, and stop strings
    are not matched before then).

    ``prompt_logprobs`` (vLLM's extension; None: off): the log-probability of every prompt
    token after the first, with that many alternatives (0..20), from the raw logits; such
    a request computes its whole prompt (its prefix is not taken from the cache).
    ``echo``: the tokenizer sends the prompt's text with the first delta.
    ``include_stop_str_in_output`` (vLLM): the stop string that ends the output is part of
    it (by default it is cut).
    """

    temperature: Temperature = 1.0
    top_k: int = 0
    top_p: TopP = 1.0
    min_p: Unit = 0.0
    repetition_penalty: RepetitionPenalty = 1.0
    frequency_penalty: Penalty = 0.0
    presence_penalty: Penalty = 0.0
    seed: int | None = None
    max_tokens: MaxTokens = 16
    max_tokens_is_default: bool = False
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[TokenId] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: TopLogprobs = 0
    structured: StructuredOutput | None = None
    logit_bias: dict[TokenId, LogitBiasValue] = field(default_factory=dict)
    allowed_token_ids: TokenIds | None = None
    bad_words: list[str] = field(default_factory=list)
    bad_words_ids: list[TokenIds] = field(default_factory=list)
    min_tokens: MinTokens = 0
    prompt_logprobs: TopLogprobs | None = None
    echo: bool = False
    include_stop_str_in_output: bool = False


def sampling_problem(params: SamplingParams) -> str | None:
    """What is out of bounds in ``params`` (None: nothing), checked as decoding checks
    it: for parameters built in-process, which msgspec does not check (the first bound
    broken, e.g. "top_p = 2.0: expected `float` <= 1.0")."""
    try:
        msgspec.msgpack.decode(msgspec.msgpack.encode(params), type=SamplingParams)
    except msgspec.ValidationError as e:
        text, _, at = str(e).partition(" - at `$.")
        name = at.rstrip("`")
        plain = name.isidentifier()  # not an item: ``logit_bias[...]``, ``stop[0]``
        shown = f"{name} = {getattr(params, name)!r}: " if plain else f"{name}: " if name else ""
        return f"{shown}{text[:1].lower()}{text[1:]}"
    return None


#: The roles a chat turn may have on the wire ("tool": a tool's result).
ChatRole = Literal["system", "user", "assistant", "tool"]
CHAT_ROLES: tuple[str, ...] = get_args(ChatRole)
#: Other names clients use for a role: newer OpenAI clients send "developer" for "system".
ROLE_ALIASES = {"developer": "system"}


class ToolCallMessage(Struct, frozen=True, kw_only=True):
    """A tool call an assistant turn made: ``arguments`` as the client sent it (JSON
    text, decoded for the chat template when it parses)."""

    id: str
    name: str
    arguments: str


class ChatMessage(Struct, frozen=True):
    """One chat turn: ``role`` is one of ``CHAT_ROLES`` (aliases already resolved).
    An assistant turn may carry the ``tool_calls`` it made; a ``tool`` turn the
    ``tool_call_id`` it answers (and the tool's ``name``)."""

    role: ChatRole
    content: str
    tool_calls: list[ToolCallMessage] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class Failure(Struct, frozen=True, kw_only=True):
    """Why a request failed, as its client is told.

    Made where the error happens (the gateway's validator, the tokenizer, the scheduler,
    the runner) and carried unchanged to the gateway, which turns it into the HTTP error
    or the WebSocket error frame in one place (``houchu.api.errors``).

    ``status``: the HTTP status (400 the request is at fault, 429 retry later, 500 the
    engine failed, 503 an actor is restarting, retry). ``code``: a short machine-readable
    code, OpenAI's where it has one (``houchu.transport.failures`` names them).
    ``param``: the request parameter at fault, or None.
    """

    message: str
    status: int = 400
    code: str | None = None
    param: str | None = None
