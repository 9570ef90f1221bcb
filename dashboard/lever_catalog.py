"""The six verbs and the known levers, in plain language, for the ledger view.

A lever is known by the ``lever`` name its samples carry; the dashboard shows every lever
that reports samples, known or not, under the verb its samples name. Known levers with
no samples yet are listed too (greyed), so the ledger shows what exists. ``headline``
says which aggregate of a lever's samples is its headline number: "sum" for amounts
that add up (tokens not computed), "mean" for per-step figures (tokens per pass), "max"
for worst cases (longest inter-token gap).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: The six verbs (docs/architecture.md), cheapest first: (id, title, what it does, bottleneck).
VERBS: tuple[tuple[str, str, str, str], ...] = (
    ("skip", "Skip", "reuse a result instead of recomputing it", "compute"),
    ("compute_less", "Compute less", "cheaper arithmetic when compute-bound", "compute"),
    ("move_less", "Move less", "fewer bytes per step when bandwidth-bound", "memory bandwidth"),
    ("occupy_less", "Occupy less", "less memory per request, so bigger batches", "memory capacity"),
    ("fill", "Fill", "keep the hardware busy", "idle hardware"),
    ("break_serial", "Break serial", "fewer sequential steps", "serial decoding"),
)
VERB_IDS = tuple(v[0] for v in VERBS)


@dataclass(frozen=True)
class LeverInfo:
    """What the dashboard says about one lever."""

    lever: str
    verb: str
    title: str
    line: str  # the bottleneck it targets and what it trades, in one sentence
    saves: str
    spends: str
    headline: str = "sum"


def _l(lever: str, verb: str, title: str, line: str, saves: str, spends: str, headline="sum"):
    return LeverInfo(lever, verb, title, line, saves, spends, headline)


KNOWN_LEVERS: tuple[LeverInfo, ...] = (
    # skip
    _l(
        "kv_cache",
        "skip",
        "KV cache",
        "Keeps each token's keys and values so a decode step computes one new token, not the whole sequence again.",
        "attention inputs not recomputed",
        "KV memory",
    ),
    _l(
        "radix_prefix_cache",
        "skip",
        "Radix prefix cache",
        "A prompt that starts like an earlier one reuses that prefix's KV instead of prefilling it again — compute saved, memory spent holding the prefix.",
        "prefill tokens not computed, their FLOPs",
        "KV pages held by cached prefixes",
    ),
    _l(
        "kv_tiers",
        "skip",
        "KV tiers (host / SSD)",
        "A prefix evicted from the GPU is reloaded from host memory or SSD instead of recomputed — trades a copy for a prefill.",
        "tokens reloaded instead of recomputed",
        "bytes moved, load time",
    ),
    _l(
        "parallel_sampling",
        "skip",
        "Parallel sampling (n > 1)",
        "The choices of one request share its prompt: one prefills it, the others start from its cached pages and compute only the last partial page.",
        "prefill tokens not recomputed, their FLOPs",
        "prompt tokens each choice still computes",
    ),
    # compute less
    _l(
        "w8a8",
        "compute_less",
        "W8A8 / FP8 matmuls",
        "Multiplies in 8-bit when the step is compute-bound: twice the arithmetic rate for a small accuracy cost.",
        "matmul time",
        "quantization error",
    ),
    _l(
        "moe",
        "compute_less",
        "Mixture of experts",
        "Each token runs through a few experts, not every weight: fewer FLOPs per token.",
        "FLOPs per token",
        "memory for all experts",
    ),
    _l(
        "sliding_window_attention",
        "move_less",
        "Sliding-window / sparse attention",
        "Attends to a window of recent tokens instead of all of them: attention cost stops growing with context.",
        "KV bytes not read (positions outside each layer's window)",
        "long-range recall",
    ),
    _l(
        "sliding_window_pages",
        "occupy_less",
        "Sliding-window page release",
        "Where every layer attends a window, a request's pages older than the window are released (freed, or left to the radix cache): its KV stops growing with context.",
        "KV bytes released",
        "pages released (never read again)",
    ),
    # move less
    _l(
        "weight_quant",
        "move_less",
        "Weight-only int4 / int8",
        "Decode is bandwidth-bound: reading 4- or 8-bit weights instead of 16-bit moves fewer bytes per step.",
        "weight bytes not read per step",
        "dequantization work",
    ),
    _l(
        "kv_quant",
        "move_less",
        "KV-cache int8 / fp8",
        "Stores keys and values in 8 bits: fewer bytes read per decode step and fewer held per request.",
        "KV bytes not stored / read",
        "quantization error",
    ),
    _l(
        "half_precision",
        "move_less",
        "16-bit compute (bf16 / fp16)",
        "Weights, activations and KV in 16 bits instead of float32 (--dtype; auto is bf16 on a GPU): half the bytes read per step and held per token, and the GPU's tensor cores.",
        "weight and KV bytes not read / stored (vs float32)",
        "precision (8- or 11-bit mantissa)",
    ),
    _l(
        "fused_kernels",
        "move_less",
        "Fused kernels",
        "Does several operations in one pass over memory, so intermediates never travel to and from DRAM.",
        "bytes not moved",
        "kernel complexity",
    ),
    _l(
        "flash_attention",
        "move_less",
        "FlashAttention",
        "Computes attention in on-chip tiles without writing the score matrix to memory.",
        "attention bytes not moved",
        "recompute in the backward pass",
    ),
    # occupy less
    _l(
        "paged_kv",
        "occupy_less",
        "Paged KV",
        "Gives each request KV pages as it grows instead of reserving its maximum length up front — more requests fit in memory.",
        "KV bytes not reserved",
        "page-table bookkeeping",
    ),
    _l(
        "gqa",
        "occupy_less",
        "GQA / MLA",
        "Shares (or compresses) keys and values across query heads: less KV per token, so bigger batches.",
        "KV bytes per token",
        "model architecture",
    ),
    # fill
    _l(
        "continuous_batching",
        "fill",
        "Continuous batching",
        "Runs many requests in one forward pass, so each weight read from memory serves all of them; requests join and leave every step.",
        "forward passes shared",
        "queueing delay",
        "sum",
    ),
    _l(
        "chunked_prefill",
        "fill",
        "Chunked prefill",
        "Splits a long prompt across steps so running streams keep decoding instead of stalling behind it.",
        "decode stall avoided",
        "extra steps for long prompts",
    ),
    _l(
        "compiled_step",
        "fill",
        "Compiled step / CUDA graph",
        "Replays a captured or compiled step instead of launching each kernel from Python.",
        "launch and interpreter overhead per step",
        "startup time, fixed shapes",
    ),
    _l(
        "overlap_scheduler",
        "fill",
        "Overlap scheduler",
        "Plans step N+1 on the CPU while step N runs on the accelerator.",
        "scheduler time hidden",
        "one step of speculative planning: tokens computed for requests already finished",
    ),
    _l(
        "structured_output_mask",
        "fill",
        "Grammar masks beside the forward pass",
        "Structured output computes each constrained request's allowed-token mask on the CPU while the model runs, so the sampler rarely waits for it.",
        "mask time hidden behind the forward pass",
        "time the sampler waited for masks",
    ),
    _l(
        "tensor_parallel",
        "fill",
        "Tensor parallel",
        "Splits each layer across devices (ranks) so all of them work on every token, each reading only its share of the weights.",
        "weight bytes each rank did not read (the other ranks' shards)",
        "seconds in all-reduces and the logits' all-gather",
    ),
    # break serial
    _l(
        "speculative_decoding",
        "break_serial",
        "Speculative decoding",
        "A cheap draft proposes several tokens and the model checks them in one pass: fewer sequential steps per token.",
        "forward passes saved (accepted tokens)",
        "draft compute, rejected tokens",
    ),
    _l(
        "jump_forward",
        "break_serial",
        "Structured-output jump-forward",
        "Where a request's grammar allows only one continuation (a JSON key, punctuation), its tokens are appended at once and computed in the next step's one forward pass.",
        "forward passes saved (tokens forced)",
        "seconds computing the forced tokens after the sampler",
    ),
    _l(
        "mtp",
        "break_serial",
        "Multi-token prediction",
        "Extra heads predict several next tokens at once, verified like a draft.",
        "forward passes saved",
        "extra heads, rejected tokens",
    ),
)

#: Other names a lever may report under.
#: Other names a lever may report under. A reported name may also extend a known one
#: with a variant (``kv_tier_host``, ``weight_quant_int4-g32``, ``kv_quant_int8``): see
#: ``PREFIXES``.
ALIASES = {
    "prefix_cache": "radix_prefix_cache",
    "cuda_graph": "compiled_step",
    "compiled_decode": "compiled_step",
    "torch_compile": "compiled_step",
    "fp8": "w8a8",
    "mla": "gqa",
    "moe_routed_experts": "moe",
    "sparse_attention": "sliding_window_attention",
    "spec_decode": "speculative_decoding",
    "draft_model": "speculative_decoding",
}
#: Name prefix -> known lever (variants: one row each, the known lever's description).
PREFIXES = {
    "kv_tier": "kv_tiers",
    "weight_quant": "weight_quant",
    "kv_quant": "kv_quant",
    "half_precision": "half_precision",
    "w8a8": "w8a8",
    "speculative_decoding": "speculative_decoding",
}
_BY_NAME = {info.lever: info for info in KNOWN_LEVERS}


def canonical(lever: str) -> str:
    """The known lever a reported name belongs to (itself when unknown)."""
    if lever in ALIASES:
        return ALIASES[lever]
    for prefix, known in PREFIXES.items():
        if lever.startswith(prefix):
            return known
    return lever


def lever_info(lever: str, verb: str) -> LeverInfo:
    """What to say about ``lever`` (a generic line for unknown levers)."""
    info = _BY_NAME.get(canonical(lever))
    if info is not None:
        return info
    title = lever.replace("_", " ").capitalize()
    return LeverInfo(lever, verb, title, "A lever reported by the engine.", "", "")


def ledger_by_verb(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Group ledger rows (``storage.ledger_view``) by verb, then by lever.

    Each reported lever name gets its ``saved`` and ``spent`` amounts per unit, its
    plain-language description, and ``active``. Known levers that reported nothing are
    listed inactive, unless a variant of theirs reported under that verb. Verbs come in
    the order of docs/architecture.md; a verb outside the six is listed after them.
    """
    levers: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        key = (r["verb"], r["lever"])
        entry = levers.get(key)
        if entry is None:
            info = lever_info(r["lever"], r["verb"])
            entry = levers[key] = {**_lever_entry(info, active=True), "verb": r["verb"]}
            entry["lever"] = r["lever"]
        entry["samples"] += r["samples"]
        entry["last_t"] = max(entry["last_t"] or 0.0, r["last_t"] or 0.0)
        for kind in ("saved", "spent"):
            unit = r[f"{kind}_unit"]
            if not unit:
                continue
            agg = entry[kind].setdefault(unit, {"sum": 0.0, "mean": 0.0, "max": 0.0, "n": 0})
            agg["sum"] += r[kind]
            agg["max"] = max(agg["max"], r[f"{kind}_max"])
            agg["n"] += r["samples"]
            agg["mean"] = agg["sum"] / max(agg["n"], 1)
    reported = {(v, canonical(name)) for v, name in levers}
    for info in KNOWN_LEVERS:
        if (info.verb, info.lever) not in reported:
            levers[(info.verb, info.lever)] = _lever_entry(info, active=False)
    verbs = list(VERB_IDS) + sorted({v for v, _ in levers} - set(VERB_IDS))
    titles = {v[0]: v for v in VERBS}
    out = []
    for verb in verbs:
        vid, title, what, bottleneck = titles.get(verb, (verb, verb, "", ""))
        entries = [e for (v, _), e in levers.items() if v == verb]
        entries.sort(key=lambda e: (not e["active"], e["title"], e["lever"]))
        out.append(
            {"verb": vid, "title": title, "what": what, "bottleneck": bottleneck, "levers": entries}
        )
    return out


def _lever_entry(info: LeverInfo, active: bool) -> dict[str, Any]:
    return {
        **asdict(info),
        "active": active,
        "samples": 0,
        "last_t": None,
        "saved": {},
        "spent": {},
    }
