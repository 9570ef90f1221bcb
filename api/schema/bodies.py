"""The request bodies of the HTTP and WebSocket APIs: one msgspec type per body, each
field with its type and bounds (``Meta``). This is the one definition of the request
contract: the validator decodes bodies into these types (``validation``) and the
OpenAPI document's schemas are generated from them (``openapi``).

``None`` (JSON ``null``, or the key left out) means "not given": the server's default
applies (``SamplingParams``'s, and ``DEFAULT_*_MAX_TOKENS`` here). Keys the gateway does
not know (``metadata``, ...) are ignored; known OpenAI features
it does not implement are fields marked ``unsupported``: they are refused unless absent
or at their neutral value (``n: 1``, ``tools: []``, ...).

The sampling parameters' bounds are the wire's (``houchu.transport.request_fields``:
``Temperature``, ``Unit``, ``Penalty``, ...), declared once there: a body is checked
against them as it decodes, and so is the ``SamplingParams`` built from it wherever it is
decoded again. Where the OpenAI API's contract differs, the type here says how:
``temperature`` has OpenAI's top of 2.0, ``top_p`` admits 0 (sent as ``top_k`` 1) and
``top_k`` admits -1 (off).

What a field's type cannot say is checked by the validator (and added to the generated
schema where JSON Schema can say it): the served model's name, ``max_tokens`` at most
the context window, the seed's unsigned 64-bit top, a batch of one prompt
(``["text"]``), token ids within the vocabulary (``logit_bias``, ``allowed_token_ids``),
and the rules across fields (``stream_options`` needs ``stream``, ``top_logprobs`` needs
``logprobs``, a WebSocket frame has ``prompt`` or ``messages``, ``min_tokens`` at most
``max_tokens``, ``best_of`` at least ``n`` and, above ``n``, not streamed).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from houchu.api.schema.refusals import (
    CHAT_ONLY,
    CHAT_ONLY_ONE,
    WS_STREAM_OPTIONS,
    WS_STREAMS,
    VllmUnserved,
    unsupported,
)
from houchu.api.schema.structured import (
    Choices,
    GrammarText,
    JsonSchema,
    StructuredOutputs,
    WhitespacePattern,
)
from houchu.api.schema.tools import ToolCallIn, ToolChoice, Tools
from houchu.transport.messages import CHAT_ROLES, ROLE_ALIASES
from houchu.transport.request_fields import (
    LogitBiasValue,
    MinTokens,
    Penalty,
    RepetitionPenalty,
    TokenId,
    TokenIds,
    TopLogprobs,
    Unit,
)
from houchu.transport.request_fields import Temperature as WireTemperature

DEFAULT_COMPLETION_MAX_TOKENS = 16
#: The OpenAI chat API defaults to "until the context is full"; 512 bounds a forgotten
#: limit (both capped at the context window).
DEFAULT_CHAT_MAX_TOKENS = 512
MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 1024  # per stop string: each is searched in every new piece of text
MAX_COMPLETION_LOGPROBS = 5
MAX_CHOICES = 128  # the most choices per request (``n``, ``best_of``), OpenAI's bound
#: Largest ``top_k`` (any value above the vocabulary size keeps every token).
MAX_TOP_K = 2**31 - 1
#: int64 or uint64; msgspec's bounds hold int64 only, so the validator checks the top.
SEED_RANGE = (-(2**63), 2**64 - 1)

#: ``Meta.extra`` key of a string pattern said in words (error messages show these, not
#: the regex): "must be <words>".
PATTERN_WORDS = "pattern_words"


PositiveInt = Annotated[int, Meta(ge=1)]
#: The wire's temperature under OpenAI's top.
Temperature = Annotated[WireTemperature, Meta(le=2.0)]
TopP = Annotated[float, Meta(ge=0.0, le=1.0, description="0: only the most likely token")]
TopK = Annotated[int, Meta(ge=-1, le=MAX_TOP_K, description="-1 or 0: off")]
ChoiceCount = Annotated[int, Meta(ge=1, le=MAX_CHOICES)]
LogitBias = Annotated[
    dict[Annotated[str, Meta(pattern=r"^[0-9]{1,10}$")], LogitBiasValue],
    Meta(
        description="token id (a string of digits) -> bias added to its logit; "
        "-100 bans the token, 100 selects it exclusively"
    ),
]
BadWord = Annotated[str, Meta(min_length=1, max_length=MAX_STOP_CHARS)]
Seed = Annotated[int, Meta(ge=SEED_RANGE[0])]  # the top: see SEED_RANGE
StopString = Annotated[str, Meta(min_length=1, max_length=MAX_STOP_CHARS)]
Stop = StopString | Annotated[list[StopString], Meta(max_length=MAX_STOP_STRINGS)]
#: One prompt: text, or token ids (a batch of one, ``["text"]`` or ``[[ids]]``, is
#: unwrapped by the validator first: msgspec types cannot hold two array types).
Prompt = Annotated[str, Meta(min_length=1)] | Annotated[list[TokenId], Meta(min_length=1)]
Role = Literal[(*CHAT_ROLES, *ROLE_ALIASES)]  # type: ignore[valid-type]
#: A completion's (``POST /v1/completions``, a WebSocket prompt frame) ``echo``.
Echo = Annotated[bool, Meta(description="the prompt (and, with logprobs, its logprobs) first")]
EchoMaxTokens = Annotated[
    int, Meta(ge=0, description="0 only with echo: the prompt (and its logprobs)")
]
#: vLLM's chat-template fields (chat requests; ``houchu.api.requests.chat_template``).
TemplateKwargs = Annotated[
    dict[str, Any], Meta(description="extra chat template variables, e.g. enable_thinking")
]
GenerationPrompt = Annotated[bool, Meta(description="end with the assistant's header (true)")]
ContinueFinal = Annotated[bool, Meta(description="continue the last message (no header)")]


class StreamOptions(Struct, omit_defaults=True):
    """``stream_options`` (only with ``stream: true``); vLLM's
    ``continuous_usage_stats`` (with ``include_usage``): every chunk's ``usage``."""

    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class ResponseFormatText(Struct, tag_field="type", tag="text"):
    """``response_format: {"type": "text"}``: free text (the default)."""


class ResponseFormatJsonObject(Struct, tag_field="type", tag="json_object"):
    """``response_format: {"type": "json_object"}``: any JSON object."""


class JsonSchemaFormat(Struct, kw_only=True):
    """``response_format.json_schema``: the schema the output follows (none: any JSON
    object, as ``json_object``); ``name`` as OpenAI's (letters, digits, ``_`` and ``-``,
    up to 64). ``strict``: refuse a schema with keywords the grammar engine cannot enforce
    (else they are ignored)."""

    #: ``(?!\n)``: Python's ``$`` also matches before a final newline ("abc\n")
    name: Annotated[
        str,
        Meta(
            pattern=r"^[a-zA-Z0-9_-]{1,64}$(?!\n)",
            extra={PATTERN_WORDS: "1-64 characters of a-z, A-Z, 0-9, _ or -"},
        ),
    ]
    schema: JsonSchema | None = None
    strict: bool | None = None
    description: str | None = None


class ResponseFormatJsonSchema(Struct, tag_field="type", tag="json_schema"):
    """``response_format: {"type": "json_schema", "json_schema": {...}}``."""

    json_schema: JsonSchemaFormat


ResponseFormat = ResponseFormatText | ResponseFormatJsonObject | ResponseFormatJsonSchema


class TextPart(Struct):
    """One part of a message's content (only text is supported)."""

    type: Annotated[Literal["text"], unsupported("must be 'text' (only text content is supported)")]
    text: str


class ChatMessageIn(Struct, kw_only=True):
    """One chat turn (``developer`` is read as ``system``); parts are joined by newlines.
    ``content`` may be null in an assistant turn that made ``tool_calls``; a ``tool``
    turn answers the call ``tool_call_id``."""

    role: Role
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None


Messages = Annotated[list[ChatMessageIn], Meta(min_length=1)]


class SamplingFields(VllmUnserved, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """Parameters every generation request accepts. (The server ignores keys it does
    not know; the document lists only the ones it reads.)"""

    model: str | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: Unit | None = None
    repetition_penalty: RepetitionPenalty | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    seed: Seed | None = None
    stop: Stop | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool | None = None
    n: Annotated[ChoiceCount, Meta(description="choices; the prompt is prefilled once")] | None = (
        None
    )
    logit_bias: LogitBias | None = None
    allowed_token_ids: Annotated[TokenIds, Meta(description="only these may be sampled")] | None = (
        None
    )
    bad_words: Annotated[list[BadWord], Meta(description="words never generated (vLLM)")] | None = (
        None
    )
    min_tokens: (
        Annotated[MinTokens, Meta(description="no stop before this many tokens (vLLM)")] | None
    ) = None
    prompt_logprobs: (
        Annotated[
            TopLogprobs,
            Meta(
                description="every prompt token's logprob, with this many alternatives "
                "(vLLM; beside echo, also those of the echoed prompt's tokens)"
            ),
        ]
        | None
    ) = None
    functions: Annotated[list[Any], unsupported("are not supported", max_length=0)] | None = None
    include_stop_str_in_output: (
        Annotated[bool, Meta(description="the matched stop string ends the output (vLLM)")] | None
    ) = None
    use_beam_search: (
        Annotated[Literal[False], unsupported("is not supported: choices are sampled")] | None
    ) = None
    response_format: ResponseFormat | None = None
    # structured output: vLLM's fields, then SGLang's
    structured_outputs: StructuredOutputs | None = None
    guided_json: JsonSchema | str | None = None
    guided_regex: GrammarText | None = None
    guided_choice: Choices | None = None
    guided_grammar: GrammarText | None = None
    regex: GrammarText | None = None
    ebnf: GrammarText | None = None
    guided_whitespace_pattern: WhitespacePattern | None = None
    user: str | None = None


class HttpFields(SamplingFields, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """What the HTTP routes add: server-sent events."""

    stream: bool | None = None
    stream_options: StreamOptions | None = None


#: a chat request's field on a completion: only null admitted
ChatOnly = Annotated[None, unsupported(CHAT_ONLY_ONE + " (with 'messages')")]


class CompletionRequest(HttpFields, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """``POST /v1/completions``: one prompt (text, or token ids), up to ``max_tokens``
    tokens (default 16, at most the context window; 0 with ``echo``: the prompt alone,
    as evaluation harnesses score it)."""

    prompt: Prompt
    max_tokens: EchoMaxTokens | None = None
    logprobs: Annotated[int, Meta(ge=0, le=MAX_COMPLETION_LOGPROBS)] | None = None
    tools: Annotated[list[Any], unsupported(CHAT_ONLY, max_length=0)] | None = None
    #: any value is refused by the request check (``validation``), with ``CHAT_ONLY_ONE``
    tool_choice: Annotated[Any, Meta(description=CHAT_ONLY_ONE)] | None = None
    echo: Echo | None = None
    #: the chat requests' fields: null only (any value is a 400)
    chat_template_kwargs: ChatOnly = None
    add_generation_prompt: ChatOnly = None
    continue_final_message: ChatOnly = None
    parallel_tool_calls: ChatOnly = None
    top_logprobs: ChatOnly = None
    max_completion_tokens: ChatOnly = None
    best_of: (
        Annotated[ChoiceCount, Meta(description="choices generated; the n most likely returned")]
        | None
    ) = None
    suffix: (
        Annotated[
            str,
            Meta(
                description="fill-in-the-middle: the text after the completion (only for "
                "a model with fill-in-the-middle tokens; a 400 otherwise)"
            ),
        ]
        | None
    ) = None


#: the completions API's fields on the other APIs: refused unless at their neutral value
#: (as OpenAI refuses them, rather than ignored)
NoSuffix = Annotated[Literal[""], unsupported("is served on POST /v1/completions only")]
NoEcho = Annotated[
    Literal[False],
    unsupported("is served on completions only (POST /v1/completions, WebSocket prompt frames)"),
]


class ChatCompletionRequest(
    HttpFields, kw_only=True, omit_defaults=True, forbid_unknown_fields=True
):
    """``POST /v1/chat/completions``: the conversation so far; the answer is at most
    ``max_completion_tokens`` (or ``max_tokens``; default 512) tokens. ``top_logprobs``
    needs ``logprobs: true``."""

    messages: Messages
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None
    tools: Tools | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: TemplateKwargs | None = None
    add_generation_prompt: GenerationPrompt | None = None
    continue_final_message: ContinueFinal | None = None
    suffix: NoSuffix | None = None
    echo: NoEcho | None = None
    best_of: (
        Annotated[Literal[1], unsupported("is served on POST /v1/completions only (chat: use 'n')")]
        | None
    ) = None


class WsGenerateRequest(
    SamplingFields, kw_only=True, omit_defaults=True, forbid_unknown_fields=True
):
    """A WebSocket generate frame (without its ``id`` and ``type``): ``prompt`` or
    ``messages``; ``logprobs`` is a boolean, or the number of alternatives per token
    (which ``top_logprobs`` may also give). ``echo`` (a prompt frame) as on
    ``POST /v1/completions``: the prompt first, and ``max_tokens`` 0 the prompt alone.
    ``max_completion_tokens`` as on chat completions (given, it is the limit).

    Every field of the HTTP request bodies is a field here, served or refused (a
    frame never drops one: ``stream`` is always true, ``stream_options`` refused)."""

    prompt: Prompt | None = None
    messages: Messages | None = None
    max_tokens: EchoMaxTokens | None = None
    max_completion_tokens: (
        Annotated[PositiveInt, Meta(description="as on chat completions: wins over max_tokens")]
        | None
    ) = None
    logprobs: bool | TopLogprobs | None = None
    top_logprobs: TopLogprobs | None = None
    tools: Tools | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: TemplateKwargs | None = None
    add_generation_prompt: GenerationPrompt | None = None
    continue_final_message: ContinueFinal | None = None
    suffix: NoSuffix | None = None
    echo: Echo | None = None  # on a prompt frame only
    best_of: (
        Annotated[Literal[1], unsupported("is served on POST /v1/completions only (use 'n')")]
        | None
    ) = None
    #: the HTTP API's streaming fields: a frame always streams, its final frame has usage
    stream: Annotated[Literal[True], unsupported(WS_STREAMS)] | None = None
    stream_options: (
        Annotated[dict[str, Any], unsupported(WS_STREAM_OPTIONS, max_length=0)] | None
    ) = None


class TokenizeRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /tokenize`` (vLLM's): ``prompt`` or chat ``messages``, not both.
    ``add_special_tokens`` (default true for a prompt, false for messages: the chat
    template writes its own) adds the BOS the model's tokenizer asks for;
    ``add_generation_prompt`` (default true, false with ``continue_final_message``),
    ``continue_final_message``, ``chat_template_kwargs`` and ``tools`` (given to the
    chat template) as on chat completions; ``return_token_strs`` adds each token's
    text."""

    model: str | None = None
    prompt: str | None = None
    messages: Messages | None = None
    tools: Tools | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: GenerationPrompt | None = None
    continue_final_message: ContinueFinal | None = None
    chat_template_kwargs: TemplateKwargs | None = None
    return_token_strs: bool | None = None


class DetokenizeRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /detokenize`` (vLLM's): the text of token ids (special tokens skipped)."""

    tokens: list[TokenId]
    model: str | None = None
