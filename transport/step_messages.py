"""The scheduler <-> runner messages: each step's plan (``StepPlan``), its result
(``StepResult``) and the runner's limits (``RunnerInfo``). Re-exported by
``houchu.transport.messages``."""

from __future__ import annotations

from enum import IntEnum

from msgspec import Struct, field

from houchu.transport.request_fields import Failure, SamplingParams


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


class Phase(IntEnum):
    """What a work item computes: prompt or recomputed tokens (``PREFILL``), or one new
    token, possibly with proposals to verify (``DECODE``). The scheduler sets it; the
    runner reports its steps by it (``StepRecord``)."""

    PREFILL = 0
    DECODE = 1


class SeqWork(Struct, kw_only=True, array_like=True):
    """One request's slice of a step.

    ``token_ids``: list[int] of length n_new, the tokens whose KV this step computes, at
    positions ``start_pos .. start_pos + n_new - 1``. The request's page table (page
    indices holding positions ``0 .. start_pos + n_new - 1``; page ``i`` holds positions
    ``i*page_size .. (i+1)*page_size - 1``) is kept by the runner between steps and
    travels only as far as the runner lacks it (vLLM v1's ``new_block_ids``):
    ``page_table`` (list[int]) replaces the runner's table whole — a request's first
    work, after a preemption, or after pages were taken back; None: the runner's table
    for ``rid`` grows by ``new_pages`` (list[int], often empty). ``sample``: draw a token
    after the last position (true for decode and for the last prefill chunk).
    ``num_draft``: the last ``num_draft`` of ``token_ids`` are speculative proposals to
    verify (``sample`` must be set): the runner scores all of them in this pass and
    returns one ``SeqOutput`` per accepted proposal plus one for the token after them
    (``houchu.model.sampling.verify``). ``use_last_sampled`` (overlap scheduler):
    ``token_ids`` is ``[-1]``, a placeholder for the token the runner sampled for this
    rid in its previous step, which the scheduler has not seen yet; the runner puts that
    token in its place (an error if that step sampled nothing for the rid).
    ``num_propose`` (``--speculative mtp``): up to this many proposals for the tokens
    after the one this step samples, made by the runner's MTP layer and returned in
    ``StepResult.proposals`` (0: none; ignored without one). ``phase``: prefill or decode
    (``Phase``).
    """

    rid: str
    token_ids: list[int]
    start_pos: int
    page_table: list[int] | None = None
    sample: bool
    num_draft: int = 0
    use_last_sampled: bool = False
    num_propose: int = 0
    new_pages: list[int] = field(default_factory=list)
    phase: Phase = Phase.PREFILL


class PageCopy(Struct, array_like=True):
    """Copy one KV page between the device pool and the shared host pool."""

    device_page: int
    host_slot: int


class StepPlan(Struct, tag=True, kw_only=True):
    """Everything the runner needs for one forward pass.

    ``init`` registers new requests; ``release`` drops the runner's per-request state of
    finished or aborted requests (their pages are the scheduler's to free). Before the
    forward pass the runner copies ``kv_saves`` (device page -> host slot), then
    ``kv_loads`` (host slot -> device page). ``sent_at``: wall-clock seconds
    (``time.time()``) when the scheduler handed it to its outbox (0: unknown), which the
    runner echoes in its ``StepResult`` for the token path's timings
    (``houchu.transport.token_path``).
    """

    step_id: int
    work: list[SeqWork]
    init: list[SeqInit] = field(default_factory=list)
    release: list[str] = field(default_factory=list)
    kv_saves: list[PageCopy] = field(default_factory=list)
    kv_loads: list[PageCopy] = field(default_factory=list)
    sent_at: float = 0.0


class SeqOutput(Struct, kw_only=True, array_like=True):
    """A sampled token. ``logprob``: its log-probability from log_softmax of the raw model
    logits (of the processed distribution if the runner is configured so);
    ``top_logprobs``: list of (token_id, logprob), best first. A verified request
    (``SeqWork.num_draft > 0``) has several, in order: the accepted proposals, then the
    target's own token after them. ``forced``: a token the request's grammar allows as
    the only continuation (structured-output jump-forward, ``houchu.model.grammar.jump_forward``),
    appended after the sampled ones without a forward pass: its KV is not computed yet
    (the scheduler feeds it in the request's next step) and it has no logprob."""

    rid: str
    token_id: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    forced: bool = False


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
    discarded, and the rest of the batch goes on. ``proposals`` (the runner's MTP layer,
    ``SeqWork.num_propose``): rid -> up to ``num_propose`` tokens proposed after the last
    token the step emitted for it, to verify in the next step; ``draft_s``: of
    ``duration_s``, the seconds spent on them (the MTP passes). The token path's
    timings (``houchu.transport.token_path``): ``forward_s`` and ``sample_s``, of
    ``duration_s``, the seconds of the model's forward passes and of sampling;
    ``plan_sent_at``: the plan's ``sent_at``; ``received_at`` and ``sent_at``:
    wall-clock seconds when the runner's loop took the plan and handed this result to
    its outbox (0: unknown)."""

    step_id: int
    outputs: list[SeqOutput]
    duration_s: float
    num_tokens: int
    error: Failure | None = None
    started_at: float = 0.0
    prompt_logprobs: list[PromptLogprobs] = field(default_factory=list)
    allreduce_s: float = 0.0
    failures: dict[str, Failure] = field(default_factory=dict)
    proposals: dict[str, list[int]] = field(default_factory=dict)
    draft_s: float = 0.0
    forward_s: float = 0.0
    sample_s: float = 0.0
    plan_sent_at: float = 0.0
    received_at: float = 0.0
    sent_at: float = 0.0


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
    cpu_isa: str = ""  # ISA level of the CPU kernels (houchu.cpu.isa); "" off the CPU
    decode_paths: str = ""  # the measured decode path per batch bucket, with its times
    deterministic: str = ""  # what batch-invariant mode pinned ("" when off)
    #: tokens every layer attends at most (a sliding window in all layers: KV older than
    #: that is never read again); 0: some layer reads the whole context
    sliding_window: int = 0
