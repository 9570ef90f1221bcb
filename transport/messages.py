"""The wire contract: every message that travels between houchu's actors.

Each message is a tagged msgspec ``Struct`` (``tag=True`` uses the class name), so a
receiver decodes into a union of the messages it accepts and dispatches with ``match``.
Bulk data (KV pages, weights) never travels here; token ids travel as msgpack integer
arrays (1-3 bytes per id for this vocabulary size).

Flow (see docs/architecture.md)::

    gateway --GenerateRequest/AbortRequest--> tokenizer
    tokenizer --TokenizedRequest/AbortRequest/FinishRequest--> scheduler
    scheduler --StepPlan--> runner --StepResult--> scheduler --TokenBatch--> tokenizer
    runner --RunnerInfo--> scheduler, tokenizer, gateway    (the runner's limits)
    tokenizer --TextDelta/RequestFailed--> gateway
    gateway --StatsQuery--> scheduler --StatsReply--> gateway
    every actor --ActorReady/ActorFailed/Heartbeat--> launcher
    launcher --ActorDown/ActorUp/Shutdown--> every actor    (houchu.actors.supervisor)
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import msgspec
from msgspec import Struct, field

from houchu.transport.structured import StructuredOutput
from houchu.transport.tier_messages import HostSlotGrant, TierLookupResult, TierStats


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

    Logits processors (``houchu.model.logits_processors``), applied before penalties:
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

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int = 16
    max_tokens_is_default: bool = False
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    structured: StructuredOutput | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] = field(default_factory=list)
    bad_words_ids: list[list[int]] = field(default_factory=list)
    min_tokens: int = 0
    prompt_logprobs: int | None = None
    echo: bool = False
    include_stop_str_in_output: bool = False


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


# ---------------------------------------------------------------- gateway -> tokenizer


class GenerateRequest(Struct, tag=True, kw_only=True):
    """A validated client request. Exactly one of ``prompt`` / ``messages`` is set.

    ``prompt_ids`` may be given instead of text (an OpenAI completions prompt of token ids).
    ``prefill_group``: the client request this one is a choice of (``n > 1``), "" when
    alone: the choices of one group share one prompt, which the scheduler prefills once
    (``houchu.scheduler.groups``).
    """

    rid: str
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    messages: list[ChatMessage] | None = None
    sampling: SamplingParams = SamplingParams()
    arrival_time: float = 0.0
    #: the tools a chat template is given (OpenAI ``tools`` entries), or None
    tools: list[dict[str, Any]] | None = None
    prefill_group: str = ""


class AbortRequest(Struct, tag=True):
    """Drop a request: its client went away (the gateway), or nobody can receive its text
    any more (the tokenizer, when the gateway restarted)."""

    rid: str


# ---------------------------------------------------------------- tokenizer -> scheduler


class TokenizedRequest(Struct, tag=True, kw_only=True):
    """A request ready to schedule. ``prompt_ids``: list[int] of length prompt_len.

    ``stop_ids``: the ids that end it when sampled (its ``stop_token_ids``, plus the
    model's EOS ids unless ``ignore_eos``), computed once by the tokenizer
    (``houchu.text.stop.stop_ids``). ``prefill_group``: as ``GenerateRequest``'s.
    """

    rid: str
    prompt_ids: list[int]
    sampling: SamplingParams
    stop_ids: list[int]
    arrival_time: float = 0.0
    prefill_group: str = ""


class FinishRequest(Struct, tag=True):
    """A stop string matched in the request's text: it is finished (``finish_reason``
    "stop"), and the scheduler frees it as it does a request that ended by itself."""

    rid: str


# ---------------------------------------------------------------- scheduler <-> runner


class SeqInit(Struct, kw_only=True):
    """Registers a request's sampling state in the runner before its first step.

    ``prompt_ids`` (list[int], prompt_len) seeds the repetition / presence penalties.
    ``stop_ids``: the ids that end the request (``TokenizedRequest.stop_ids``), which
    ``min_tokens`` keeps from being sampled too early.
    """

    rid: str
    sampling: SamplingParams
    prompt_ids: list[int]
    stop_ids: list[int] = field(default_factory=list)


class SeqWork(Struct, kw_only=True, array_like=True):
    """One request's slice of a step.

    ``token_ids``: list[int] of length n_new, the tokens whose KV this step computes, at
    positions ``start_pos .. start_pos + n_new - 1``. ``page_table``: list[int], the page
    indices holding positions ``0 .. start_pos + n_new - 1`` (page ``i`` holds positions
    ``i*page_size .. (i+1)*page_size - 1``). ``sample``: draw a token after the last
    position (true for decode and for the last prefill chunk). ``num_draft``: the last
    ``num_draft`` of ``token_ids`` are speculative proposals to verify (``sample`` must be
    set): the runner scores all of them in this pass and returns one ``SeqOutput`` per
    accepted proposal plus one for the token after them (``houchu.model.verify``).
    ``use_last_sampled`` (overlap scheduler): ``token_ids`` is ``[-1]``, a placeholder for
    the token the runner sampled for this rid in its previous step, which the scheduler
    has not seen yet; the runner puts that token in its place (an error if that step
    sampled nothing for the rid).
    """

    rid: str
    token_ids: list[int]
    start_pos: int
    page_table: list[int]
    sample: bool
    num_draft: int = 0
    use_last_sampled: bool = False


class PageCopy(Struct, array_like=True):
    """Copy one KV page between the device pool and the shared host pool."""

    device_page: int
    host_slot: int


class StepPlan(Struct, tag=True, kw_only=True):
    """Everything the runner needs for one forward pass.

    ``init`` registers new requests; ``release`` drops the runner's per-request state of
    finished or aborted requests (their pages are the scheduler's to free). Before the
    forward pass the runner copies ``kv_saves`` (device page -> host slot), then
    ``kv_loads`` (host slot -> device page).
    """

    step_id: int
    work: list[SeqWork]
    init: list[SeqInit] = field(default_factory=list)
    release: list[str] = field(default_factory=list)
    kv_saves: list[PageCopy] = field(default_factory=list)
    kv_loads: list[PageCopy] = field(default_factory=list)


class SeqOutput(Struct, kw_only=True, array_like=True):
    """A sampled token. ``logprob``: its log-probability from log_softmax of the raw model
    logits (of the processed distribution if the runner is configured so);
    ``top_logprobs``: list of (token_id, logprob), best first. A verified request
    (``SeqWork.num_draft > 0``) has several, in order: the accepted proposals, then the
    target's own token after them."""

    rid: str
    token_id: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None


class PromptLogprobs(Struct, kw_only=True, array_like=True):
    """Log-probabilities of consecutive prompt tokens (``SamplingParams.prompt_logprobs``),
    from the raw logits of the positions before them.

    ``start``: the position of the first token scored (>= 1: the first prompt token has
    no logprob); ``logprobs``, ``ranks`` (1: the most likely token) and ``top`` (each a
    list of ``(token_id, logprob)``, best first) have one entry per token, positions
    ``start ..``.
    """

    rid: str
    start: int
    logprobs: list[float]
    ranks: list[int]
    top: list[list[tuple[int, float]]]

    def extend(self, more: PromptLogprobs) -> None:
        """Append ``more``, which must start where this one ends."""
        self.logprobs.extend(more.logprobs)
        self.ranks.extend(more.ranks)
        self.top.extend(more.top)


class StepResult(Struct, tag=True, kw_only=True):
    """The runner's answer to a StepPlan. ``duration_s``: forward + sampling seconds;
    ``started_at``: wall-clock seconds (time.time()) when the runner began the step (0:
    unknown). ``error``: the step failed (a bad plan, a kernel error); every request in
    it fails with this. ``prompt_logprobs``: the prompt tokens scored in this step, for
    the requests that asked (``SamplingParams.prompt_logprobs``). ``allreduce_s``: of
    ``duration_s``, the seconds a tensor-parallel runner spent in its collectives (the
    all-reduces and the logits' all-gather; 0 at tp 1). ``failures``: requests this step
    failed on their own (rid -> why: a structured-output grammar the engine could not
    compile or follow); each ends with its failure, its ``outputs`` of this step are
    discarded, and the rest of the batch goes on."""

    step_id: int
    outputs: list[SeqOutput]
    duration_s: float
    num_tokens: int
    error: Failure | None = None
    started_at: float = 0.0
    prompt_logprobs: list[PromptLogprobs] = field(default_factory=list)
    allreduce_s: float = 0.0
    failures: dict[str, Failure] = field(default_factory=dict)


class RunnerInfo(Struct, tag=True, kw_only=True):
    """Sent by the runner once its weights and KV pool are ready, to the scheduler, the
    tokenizer and the gateway (again to one that restarted): the one source of the
    runner's limits (``houchu.transport.limits``).

    ``num_pages`` pages of ``page_size`` tokens; ``max_context``: tokens per request
    (prompt + completion); ``vocab_size``: token ids are in ``[0, vocab_size)`` (0:
    unknown);
    ``kv_bytes_per_token``: bytes of K and V over all layers; ``num_nonembed_params``:
    parameters outside the embedding and LM head; ``attn_flops_per_pair``: attention
    FLOPs per (query, key) position pair over all layers (``4 * layers * heads * head_dim``).
    """

    num_pages: int
    page_size: int
    max_context: int
    kv_bytes_per_token: int
    num_params: int
    model_name: str
    num_nonembed_params: int = 0
    attn_flops_per_pair: int = 0
    vocab_size: int = 0
    device_type: str = "cpu"  # "cpu" or "cuda": where the model runs
    num_threads: int = 0  # the runner's CPU compute threads (0: unknown)
    cpu_isa: str = ""  # ISA level of the CPU kernels (houchu.model.cpu_isa); "" off the CPU
    decode_paths: str = ""  # the measured decode path per batch bucket, with its times
    #: tokens every layer attends at most (a sliding window in all layers: KV older than
    #: that is never read again); 0: some layer reads the whole context
    sliding_window: int = 0


# ---------------------------------------------------------------- scheduler -> tokenizer


class TokenEvent(Struct, kw_only=True, array_like=True):
    """New tokens for one request, and the reason it finished if it did.

    ``finish_reason``: None while running, else "stop" (EOS / stop token), "length"
    (max_tokens or context), "abort" or "error". ``cached_tokens``: prompt tokens whose KV
    was reused (sent with the first event). ``failure``: why, when finish_reason is
    "error". ``prompt_logprobs``: the whole prompt's, with the first event (when asked).
    """

    rid: str
    token_ids: list[int]
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    failure: Failure | None = None
    prompt_logprobs: PromptLogprobs | None = None


class TokenBatch(Struct, tag=True):
    """All token events of one step, in one message."""

    events: list[TokenEvent]


# ---------------------------------------------------------------- tokenizer -> gateway


class TokenLogprob(Struct, array_like=True):
    """One generated token's text and log-probability, with its top alternatives."""

    token: str
    token_id: int
    logprob: float
    bytes_: list[int]
    top: list[tuple[str, int, float]] = field(default_factory=list)


class PromptTokenLogprob(Struct, array_like=True):
    """One prompt token's text and log-probability (None for the first token), its rank
    among all tokens (None for the first), and the top alternatives."""

    token: str
    token_id: int
    logprob: float | None
    rank: int | None
    bytes_: list[int]
    top: list[tuple[str, int, float]] = field(default_factory=list)


class TextDelta(Struct, tag=True, kw_only=True):
    """Text released for a request. The last one for a request has ``finish_reason`` set.

    ``text`` is never half a UTF-8 character and never part of a stop string.
    ``token_ids``: the ids generated since the previous delta (a token whose text is held
    back travels with the delta that releases it; the EOS / stop token that ends the
    request is not included).
    ``completion_tokens`` counts tokens emitted so far (EOS/stop tokens excluded).
    The first delta carries ``prompt_text`` (``SamplingParams.echo``: the prompt as text)
    and ``prompt_logprobs`` (``SamplingParams.prompt_logprobs``: every prompt token).
    """

    rid: str
    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    prompt_text: str | None = None
    prompt_logprobs: list[PromptTokenLogprob] | None = None


class RequestFailed(Struct, tag=True, kw_only=True):
    """A request rejected or failed, and why (the ``Failure`` its client gets)."""

    rid: str
    failure: Failure


# ---------------------------------------------------------------- stats


class StatsQuery(Struct, tag=True):
    """Ask the scheduler for its counters; the reply goes to the gateway. With ``rid``,
    the reply's ``request_known`` says whether the scheduler holds that request (1) or
    not (0)."""

    query_id: int
    rid: str | None = None


class StatsReply(Struct, tag=True, kw_only=True):
    """Scheduler counters. Pages are KV pages of ``page_size`` tokens."""

    query_id: int
    stats: dict[str, float | int | str]


# ---------------------------------------------------------------- lifecycle


class ActorReady(Struct, tag=True, kw_only=True):
    """An actor finished starting; ``info`` is a short human-readable summary."""

    name: str
    pid: int
    info: str = ""


class ActorFailed(Struct, tag=True, kw_only=True):
    """An actor could not start or crashed; ``error`` explains why."""

    name: str
    error: str


class Shutdown(Struct, tag=True):
    """Ask an actor to stop its loop and exit."""

    reason: str = ""


# ---------------------------------------------------------------- supervision


class Heartbeat(Struct, tag=True, kw_only=True):
    """An actor's event loop is alive (sent to the launcher about once a second).

    ``busy_s``: seconds the actor's current blocking unit of work (a model step) has run
    so far, 0 when idle; the launcher treats a long ``busy_s`` like a missing heartbeat.
    """

    name: str
    pid: int
    busy_s: float = 0.0


class ActorStuck(Struct, tag=True, kw_only=True):
    """A peer waited too long on actor ``name`` (e.g. the scheduler on a step result);
    the launcher restarts that actor. ``reason`` says who waited on what."""

    name: str
    reason: str


class ActorDown(Struct, tag=True, kw_only=True):
    """The launcher to every other actor: ``name`` died; ``generation`` is the number of
    its replacement (0 was the first process). Receivers drop what they hold for it,
    fail or abort the requests it was handling, and reconnect their outbox to it, so
    that nothing meant for the dead process reaches its replacement."""

    name: str
    generation: int


class ActorUp(Struct, tag=True, kw_only=True):
    """The launcher to every other actor: generation ``generation`` of ``name`` is ready."""

    name: str
    generation: int


GatewayInbox = TextDelta | RequestFailed | StatsReply | RunnerInfo | Shutdown | ActorDown | ActorUp
TokenizerInbox = (
    GenerateRequest | AbortRequest | TokenBatch | RunnerInfo | Shutdown | ActorDown | ActorUp
)
SchedulerInbox = (
    TokenizedRequest
    | AbortRequest
    | FinishRequest
    | StepResult
    | RunnerInfo
    | StatsQuery
    | Shutdown
    | HostSlotGrant
    | TierLookupResult
    | TierStats
    | ActorDown
    | ActorUp
)
RunnerInbox = StepPlan | Shutdown | ActorDown | ActorUp
LauncherInbox = ActorReady | ActorFailed | Heartbeat | ActorStuck


def encoder() -> msgspec.msgpack.Encoder:
    """The one encoder every channel uses (msgpack, no pickle)."""
    return msgspec.msgpack.Encoder()
