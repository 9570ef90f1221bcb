"""The lever catalog: every lever the ledger knows, its verb, and what it saves and spends.

One owner for lever names (docs/architecture.md, "The lever ledger"). ``Lever`` holds the
names ``LeverSample``s carry on the wire (a lever with variants the engine reports apart
has one member per variant: ``KV_TIER_HOST``, ``KV_QUANT_INT8``), ``Verb`` the six verbs,
``Unit`` the physical units of the amounts. ``CATALOG`` says, per lever, the verbs it
reports under, the units of what it saves and spends, and in one sentence each what it
saves and what it costs in serving. The emitters (scheduler, runner, speculation) build
their samples from these enums; the dashboard (``houchu.dashboard.lever_catalog``) and the
lever sweep read the same catalog.

A lever whose cost no counter measures has no ``spent_units``: it emits its spent amount
as 0 in ``Unit.NONE`` and the dashboard says "not measured", never "0 B".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class _Names(str, enum.Enum):
    """A string enum (``enum.StrEnum`` from Python 3.11): members are their values, in
    ``str()`` and f-strings too."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return self.value.__format__(spec)


class Verb(_Names):
    """The six verbs (docs/architecture.md), cheapest first."""

    SKIP = "skip"
    COMPUTE_LESS = "compute_less"
    MOVE_LESS = "move_less"
    OCCUPY_LESS = "occupy_less"
    FILL = "fill"
    BREAK_SERIAL = "break_serial"


@dataclass(frozen=True)
class VerbInfo:
    """What the dashboard says about one verb.

    Attributes:
        verb: the verb.
        title: its name in words.
        what: what it does, in a few words.
        bottleneck: the bottleneck it targets.
    """

    verb: Verb
    title: str
    what: str
    bottleneck: str


#: The verbs in order, cheapest first, with their words.
VERBS: tuple[VerbInfo, ...] = (
    VerbInfo(Verb.SKIP, "Skip", "reuse a result instead of recomputing it", "compute"),
    VerbInfo(Verb.COMPUTE_LESS, "Compute less", "cheaper arithmetic when compute-bound", "compute"),
    VerbInfo(
        Verb.MOVE_LESS, "Move less", "fewer bytes per step when bandwidth-bound", "memory bandwidth"
    ),
    VerbInfo(
        Verb.OCCUPY_LESS,
        "Occupy less",
        "less memory per request, so bigger batches",
        "memory capacity",
    ),
    VerbInfo(Verb.FILL, "Fill", "keep the hardware busy", "idle hardware"),
    VerbInfo(Verb.BREAK_SERIAL, "Break serial", "fewer sequential steps", "serial decoding"),
)


class Unit(_Names):
    """Physical units of a lever's saved and spent amounts. ``NONE`` (""): no amount (a
    cost no counter measures)."""

    TOKENS = "tokens"
    FLOPS = "flops"
    BYTES = "bytes"
    FORWARD_PASSES = "forward_passes"
    SECONDS = "seconds"
    PAGES = "pages"
    PAGE_TABLE_ENTRIES = "page_table_entries"
    STEPS = "steps"
    REQUESTS = "requests"
    RELATIVE_RMS_ERROR = "relative_rms_error"
    NONE = ""


class Lever(_Names):
    """Every lever name a ``LeverSample`` may carry (the strings on the wire and in the
    database)."""

    # skip
    KV_CACHE = "kv_cache"
    RADIX_PREFIX_CACHE = "radix_prefix_cache"
    KV_TIER_HOST = "kv_tier_host"
    KV_TIER_SSD = "kv_tier_ssd"
    PARALLEL_SAMPLING = "parallel_sampling"
    # compute less
    MOE_ROUTED_EXPERTS = "moe_routed_experts"
    # move less
    WEIGHT_QUANT_INT4 = "weight_quant_int4"
    WEIGHT_QUANT_INT8 = "weight_quant_int8"
    WEIGHT_QUANT_W8A8 = "weight_quant_w8a8"
    KV_QUANT_INT8 = "kv_quant_int8"
    KV_QUANT_FP8 = "kv_quant_fp8"
    HALF_PRECISION_BF16 = "half_precision_bf16"
    HALF_PRECISION_FP16 = "half_precision_fp16"
    FUSED_KERNELS = "fused_kernels"
    FLASH_ATTENTION = "flash_attention"
    SLIDING_WINDOW_ATTENTION = "sliding_window_attention"
    # occupy less
    PAGED_KV = "paged_kv"
    SLIDING_WINDOW_PAGES = "sliding_window_pages"
    MLA = "mla"
    GQA = "gqa"
    # fill
    CONTINUOUS_BATCHING = "continuous_batching"
    CHUNKED_PREFILL = "chunked_prefill"
    COMPILED_DECODE = "compiled_decode"
    CUDA_GRAPH = "cuda_graph"
    OVERLAP_SCHEDULER = "overlap_scheduler"
    STRUCTURED_OUTPUT_MASK = "structured_output_mask"
    TENSOR_PARALLEL = "tensor_parallel"
    # break serial
    SPECULATIVE_DECODING = "speculative_decoding"
    MTP = "mtp"
    JUMP_FORWARD = "jump_forward"


@dataclass(frozen=True)
class LeverSpec:
    """What one lever is, saves and spends.

    Attributes:
        lever: the lever.
        verbs: the verbs its samples report under (the first is its main one).
        title: its name in words.
        line: the bottleneck it targets and what it trades, in one sentence.
        saves: what it saves, in words.
        saved_units: the units its samples' saved amounts come in; empty: no counter
            reports it (the catalog lists it so the ledger shows what exists).
        spends: what it costs in serving, in words (the seed's ledger's "spent" column).
        spent_units: the units its samples' spent amounts come in; empty: the cost is
            not measured (samples carry ``Unit.NONE``).
        headline: which aggregate of its samples is its headline number: "sum" for
            amounts that add up, "mean" for per-step figures, "max" for worst cases.
    """

    lever: Lever
    verbs: tuple[Verb, ...]
    title: str
    line: str
    saves: str
    saved_units: tuple[Unit, ...]
    spends: str
    spent_units: tuple[Unit, ...]
    headline: str = "sum"

    @property
    def verb(self) -> Verb:
        """Its main verb."""
        return self.verbs[0]

    @property
    def reported(self) -> bool:
        """Whether a counter of the engine reports it."""
        return bool(self.saved_units)

    @property
    def spent_measured(self) -> bool:
        """Whether its samples measure what it spends."""
        return bool(self.spent_units)


_S, _C, _M, _O, _F, _B = (
    Verb.SKIP,
    Verb.COMPUTE_LESS,
    Verb.MOVE_LESS,
    Verb.OCCUPY_LESS,
    Verb.FILL,
    Verb.BREAK_SERIAL,
)
_U = Unit


def _weight_quant(lever: Lever, bits: str, spends: str) -> LeverSpec:
    return LeverSpec(
        lever,
        (_M,),
        f"Weight-only {bits}" if bits != "W8A8" else "W8A8 (int8 weights and activations)",
        f"Decode is bandwidth-bound: reading {bits} weights instead of bfloat16 moves fewer "
        "bytes per step.",
        "weight bytes not read per step (vs bfloat16)",
        (_U.BYTES,),
        spends,
        (),
    )


def _kv_quant(lever: Lever, fmt: str) -> LeverSpec:
    return LeverSpec(
        lever,
        (_M, _O),
        f"KV-cache {fmt}",
        f"Stores keys and values in {fmt}: fewer bytes read per decode step (move less) and "
        "fewer held per request (occupy less).",
        "KV bytes not read / not stored (vs bfloat16)",
        (_U.BYTES,),
        "quantization error: the relative RMS error of quantized K/V, measured at startup "
        "(the per-token quantize and dequantize work is not measured)",
        (_U.RELATIVE_RMS_ERROR,),
    )


def _half(lever: Lever, fmt: str, mantissa: int) -> LeverSpec:
    return LeverSpec(
        lever,
        (_M, _O),
        f"16-bit compute ({fmt})",
        f"Weights, activations and KV in {fmt} instead of float32 (--dtype; auto is bf16 on a "
        "GPU): half the bytes read per step and held per token, and the GPU's tensor cores.",
        "weight and KV bytes not read / not stored (vs float32)",
        (_U.BYTES,),
        f"precision: a {mantissa}-bit mantissa instead of float32's 24 (not measured per step)",
        (),
    )


def _compiled(lever: Lever, title: str, how: str) -> LeverSpec:
    return LeverSpec(
        lever,
        (_F,),
        title,
        f"{how} instead of launching each kernel from Python.",
        "launch and interpreter overhead per step (eager vs accelerated warm-up step, per "
        "accelerated step)",
        (_U.SECONDS,),
        "startup seconds building it (reported once), and fixed shapes: a batch outside its "
        "buckets runs eagerly",
        (_U.SECONDS,),
    )


def _spec(lever: Lever, title: str, line: str, spends: str) -> LeverSpec:
    return LeverSpec(
        lever,
        (_B,),
        title,
        line,
        "target forward passes saved (accepted tokens)",
        (_U.FORWARD_PASSES,),
        spends,
        (_U.SECONDS, _U.TOKENS),
    )


def _tier(lever: Lever, where: str) -> LeverSpec:
    return LeverSpec(
        lever,
        (_S,),
        f"KV tier: {where}",
        f"A prefix evicted from the device is reloaded from {where} instead of recomputed — "
        "trades a copy for a prefill.",
        "prompt tokens reloaded instead of recomputed",
        (_U.TOKENS,),
        f"KV bytes copied back from {where} to the device (per request; the tier's load "
        "seconds are in /stats, not per sample)",
        (_U.BYTES,),
    )


_SPECS: tuple[LeverSpec, ...] = (
    # skip
    LeverSpec(
        Lever.KV_CACHE,
        (_S,),
        "KV cache",
        "Keeps each token's keys and values so a decode step computes one new token, not the "
        "whole sequence again.",
        "attention inputs not recomputed (always on: no counter)",
        (),
        "KV memory per token held (the pool's size, in /stats)",
        (),
    ),
    LeverSpec(
        Lever.RADIX_PREFIX_CACHE,
        (_S,),
        "Radix prefix cache",
        "A prompt that starts like an earlier one reuses that prefix's KV instead of "
        "prefilling it again — compute saved, memory spent holding the prefix.",
        "prefill tokens not computed, their FLOPs (2 × params × tokens + attention)",
        (_U.TOKENS, _U.FLOPS),
        "KV pages held by the cached prefix (capacity other requests cannot use until it is "
        "evicted)",
        (_U.PAGES,),
    ),
    _tier(Lever.KV_TIER_HOST, "host memory"),
    _tier(Lever.KV_TIER_SSD, "SSD"),
    LeverSpec(
        Lever.PARALLEL_SAMPLING,
        (_S,),
        "Parallel sampling (n > 1)",
        "The choices of one request share its prompt: one prefills it, the others start from "
        "its cached pages and compute only the last partial page.",
        "prefill tokens not recomputed, their FLOPs",
        (_U.TOKENS, _U.FLOPS),
        "prompt tokens each choice still computes (its last partial page)",
        (_U.TOKENS,),
    ),
    # compute less
    LeverSpec(
        Lever.MOE_ROUTED_EXPERTS,
        (_C,),
        "Mixture of experts",
        "Each token runs through a few experts, not every weight: fewer FLOPs per token.",
        "FLOPs of the experts each token skipped",
        (_U.FLOPS,),
        "the routers' FLOPs (measured); memory holding every expert (the model's own size)",
        (_U.FLOPS,),
    ),
    # move less
    _weight_quant(
        Lever.WEIGHT_QUANT_INT4,
        "int4",
        "dequantization work: every int4 weight read is turned back into a float "
        "(q × scale + offset) at least once per forward pass, and its quantization error "
        "(measured offline by houchu levers); not measured per step",
    ),
    _weight_quant(
        Lever.WEIGHT_QUANT_INT8,
        "int8",
        "dequantization work: every int8 weight read is scaled back to a float at least once "
        "per forward pass, and its quantization error (measured offline by houchu levers); "
        "not measured per step",
    ),
    _weight_quant(
        Lever.WEIGHT_QUANT_W8A8,
        "W8A8",
        "quantizing each step's activations to int8 and rescaling the integer products, and "
        "the quantization error (measured offline by houchu levers); not measured per step. "
        "Its compute-less side (int8 dot products) is in the step time, not reported apart",
    ),
    _kv_quant(Lever.KV_QUANT_INT8, "int8"),
    _kv_quant(Lever.KV_QUANT_FP8, "fp8"),
    _half(Lever.HALF_PRECISION_BF16, "bf16", 8),
    _half(Lever.HALF_PRECISION_FP16, "fp16", 11),
    LeverSpec(
        Lever.FUSED_KERNELS,
        (_M,),
        "Fused kernels",
        "Does several operations in one pass over memory, so intermediates never travel to "
        "and from DRAM (--disable-fused-layers turns them off).",
        "bytes not moved (no counter: measured by houchu levers as step time)",
        (),
        "nothing per step; a kernel per layer shape and instruction set to build and keep exact",
        (),
    ),
    LeverSpec(
        Lever.FLASH_ATTENTION,
        (_M,),
        "FlashAttention (tiled attention)",
        "Computes attention in on-chip tiles with an online softmax, so the score matrix "
        "never reaches memory.",
        "score bytes not written and read back (8 B per query-key pair, layer and head)",
        (_U.BYTES,),
        "no extra work in serving (the tiles' recompute is a training backward-pass cost); "
        "it needs a CUDA GPU (flash-attn or Triton backend), and flash-attn a KV page size "
        "that is a multiple of its block (256)",
        (),
    ),
    LeverSpec(
        Lever.SLIDING_WINDOW_ATTENTION,
        (_M,),
        "Sliding-window attention",
        "Layers that attend to a window of recent tokens read only that window's KV: "
        "attention cost stops growing with context.",
        "KV bytes not read (positions outside each layer's window)",
        (_U.BYTES,),
        "long-range recall: the model's own structure (nothing measured)",
        (),
    ),
    # occupy less
    LeverSpec(
        Lever.PAGED_KV,
        (_O,),
        "Paged KV",
        "Gives each request KV pages as it grows instead of reserving its maximum length up "
        "front — more requests fit in memory.",
        "KV bytes not reserved (vs a max-length reservation)",
        (_U.BYTES,),
        "page-table entries kept per request",
        (_U.PAGE_TABLE_ENTRIES,),
    ),
    LeverSpec(
        Lever.SLIDING_WINDOW_PAGES,
        (_O,),
        "Sliding-window page release",
        "Where every layer attends a window, a request's pages older than the window are "
        "released (freed, or left to the radix cache): its KV stops growing with context.",
        "KV bytes released",
        (_U.BYTES,),
        "pages released: never read again, so a longer prefix cannot reuse them",
        (_U.PAGES,),
    ),
    LeverSpec(
        Lever.MLA,
        (_O,),
        "Multi-head latent attention (MLA)",
        "Stores one compressed latent per token instead of full per-head keys and values: "
        "less KV per token, so more tokens and requests fit.",
        "KV bytes not stored, extra token slots and requests the pool holds (vs full "
        "multi-head K/V)",
        (_U.TOKENS, _U.REQUESTS, _U.BYTES),
        "the absorbed decode's extra query-side matmuls (inside the step time, not measured apart)",
        (),
    ),
    LeverSpec(
        Lever.GQA,
        (_O,),
        "Grouped-query attention (GQA)",
        "Shares keys and values across groups of query heads: less KV per token, so bigger "
        "batches.",
        "KV bytes per token (the model's own structure: no counter)",
        (),
        "nothing in serving (the model was trained so)",
        (),
    ),
    # fill
    LeverSpec(
        Lever.CONTINUOUS_BATCHING,
        (_F,),
        "Continuous batching",
        "Runs many requests in one forward pass, so each weight read from memory serves all "
        "of them; requests join and leave every step.",
        "forward passes shared (requests per step - 1)",
        (_U.FORWARD_PASSES,),
        "queueing delay: a request may wait for a step to join (on each request's timeline, "
        "not measured as a lever)",
        (),
    ),
    LeverSpec(
        Lever.CHUNKED_PREFILL,
        (_F,),
        "Chunked prefill",
        "Splits a long prompt across steps so running streams keep decoding instead of "
        "stalling behind it.",
        "prompt tokens moved out of one long step",
        (_U.TOKENS,),
        "extra steps for long prompts",
        (_U.STEPS,),
    ),
    _compiled(Lever.COMPILED_DECODE, "Compiled decode step", "Runs a torch.compile'd decode step"),
    _compiled(Lever.CUDA_GRAPH, "CUDA graphs", "Replays a captured CUDA graph of the decode step"),
    LeverSpec(
        Lever.OVERLAP_SCHEDULER,
        (_F,),
        "Overlap scheduler",
        "Plans step N+1 on the CPU while step N runs on the accelerator.",
        "scheduler seconds hidden behind the forward pass",
        (_U.SECONDS,),
        "one step of speculative planning: tokens computed for requests already finished",
        (_U.TOKENS,),
    ),
    LeverSpec(
        Lever.STRUCTURED_OUTPUT_MASK,
        (_F,),
        "Grammar masks beside the forward pass",
        "Structured output computes each constrained request's allowed-token mask on the CPU "
        "while the model runs, so the sampler rarely waits for it.",
        "mask seconds hidden behind the forward pass",
        (_U.SECONDS,),
        "seconds the sampler waited for masks",
        (_U.SECONDS,),
    ),
    LeverSpec(
        Lever.TENSOR_PARALLEL,
        (_F,),
        "Tensor parallel",
        "Splits each layer across devices (ranks) so all of them work on every token, each "
        "reading only its share of the weights.",
        "weight bytes each rank did not read (the other ranks' shards)",
        (_U.BYTES,),
        "seconds in all-reduces and the logits' all-gather",
        (_U.SECONDS,),
    ),
    # break serial
    _spec(
        Lever.SPECULATIVE_DECODING,
        "Speculative decoding",
        "A cheap draft proposes several tokens and the model checks them in one pass: fewer "
        "sequential steps per token.",
        "the draft's compute (seconds waiting for the draft actor) and the rejected tokens "
        "the target verified for nothing",
    ),
    _spec(
        Lever.MTP,
        "Multi-token prediction",
        "The checkpoint's MTP layer proposes the next tokens, verified like a draft.",
        "the MTP layer's compute (seconds) and the rejected tokens",
    ),
    LeverSpec(
        Lever.JUMP_FORWARD,
        (_B,),
        "Structured-output jump-forward",
        "Where a request's grammar allows only one continuation (a JSON key, punctuation), "
        "its tokens are appended at once and computed in the next step's one forward pass.",
        "forward passes saved (tokens forced, less passes their catch-up took alone)",
        (_U.FORWARD_PASSES,),
        "seconds computing the forced tokens after the sampler",
        (_U.SECONDS,),
    ),
)

#: Every lever's spec, in ledger order (by verb, then as listed).
CATALOG: dict[Lever, LeverSpec] = {s.lever: s for s in _SPECS}


def lever_spec(lever: Lever | str) -> LeverSpec:
    """The catalog's spec of ``lever`` (its enum or its wire name).

    Raises:
        ValueError: not a catalog lever.
    """
    return CATALOG[Lever(lever)]


def check_sample_names(lever: Lever | str, verb: Verb | str) -> tuple[Lever, Verb]:
    """``(lever, verb)`` as enums, checked against the catalog.

    Raises:
        ValueError: an unknown lever or verb, or a verb the lever does not report under.
    """
    lv, vb = Lever(lever), Verb(verb)
    if vb not in CATALOG[lv].verbs:
        raise ValueError(f"lever {lv.value!r} reports under {CATALOG[lv].verbs}, not {vb.value!r}")
    return lv, vb


#: The KV tier lever of each lower tier a prefix is reloaded from.
TIER_LEVERS: dict[str, Lever] = {"host": Lever.KV_TIER_HOST, "ssd": Lever.KV_TIER_SSD}
#: The weight quantization lever of each ``--quantization`` mode (its label's first part:
#: "int4-g32" -> "int4").
WEIGHT_QUANT_LEVERS: dict[str, Lever] = {
    "int4": Lever.WEIGHT_QUANT_INT4,
    "int8": Lever.WEIGHT_QUANT_INT8,
    "w8a8": Lever.WEIGHT_QUANT_W8A8,
}
#: The KV quantization lever of each ``--kv-cache-dtype`` other than "auto".
KV_QUANT_LEVERS: dict[str, Lever] = {"int8": Lever.KV_QUANT_INT8, "fp8": Lever.KV_QUANT_FP8}
#: The 16-bit compute lever of each half-precision model dtype.
HALF_PRECISION_LEVERS: dict[str, Lever] = {
    "bf16": Lever.HALF_PRECISION_BF16,
    "fp16": Lever.HALF_PRECISION_FP16,
}
#: The accelerated decode step's lever, by ``DecodeAccelerator.kind``.
ACCEL_LEVERS: dict[str, Lever] = {
    "compiled_decode": Lever.COMPILED_DECODE,
    "cuda_graph": Lever.CUDA_GRAPH,
}
