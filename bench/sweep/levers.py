"""The levers ``houchu levers`` can switch: one entry per lever, easy to extend.

Each :class:`Lever` says how ``houchu serve`` turns it on and off (its flags), which
ledger counters report what it saved (catalog levers, ``houchu.transport.levers.Lever``:
the ``lever`` of its ``LeverSample``s), its verb (and so the bottleneck it targets, from
``transport.levers.VERBS``), whether it is lossy (then the weight format and
KV dtype whose accuracy is measured against the exact path), and when it cannot apply on
this machine (:class:`Machine`), with the reason. A lever whose flag this build of
``houchu serve`` does not know is not applicable either, with that reason, so entries
for levers still being built become applicable as soon as their flag lands.

:data:`INTERACTING_PAIRS` names the pairs the sweep measures by default (those whose
gains may add, overlap or cancel), beside any pair given with ``--pairs``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from houchu.transport.levers import VERBS
from houchu.transport.levers import Lever as LedgerLever


@dataclass(frozen=True)
class Machine:
    """What decides whether a lever applies here.

    Attributes:
        device: "cpu" or "cuda" (where the model runs).
        cpu_features: the CPU's flags (``houchu.cpu.isa.cpu_features``).
        serve_flags: every flag ``houchu serve`` accepts (``--page-size`` ...).
        draft_model: the draft model given to ``houchu levers``, if any.
        tp_refusal: why ``--tensor-parallel-size 2`` cannot serve the swept model here
            (its heads or MLP width not divisible by 2, MoE or MLA: the runner's own
            check, ``houchu.runner.tensor_parallel.ranks.check_model``), or None when it can.
        structured: the workload's requests carry a grammar (``--structured``).
    """

    device: str
    cpu_features: frozenset[str]
    serve_flags: frozenset[str]
    draft_model: str | None = None
    tp_refusal: str | None = None
    structured: bool = False  # the workload's requests carry a grammar (--structured)


@dataclass(frozen=True)
class Lever:
    """One switchable lever.

    Attributes:
        name: its name on the command line (``radix-cache``).
        title: a few words for tables.
        verb: one of the catalog's verbs (``transport.levers.Verb``); gives the bottleneck it targets.
        on: ``houchu serve`` flags that turn it on (``{draft_model}`` is replaced).
        off: flags that turn it off (the baseline of a sweep has every lever off).
        ledger: the catalog levers its savings report as.
        lossy: ``(weights, kv_dtype)`` whose top-1 agreement and Δlogprob against the
            exact path are measured (``houchu.model.quant.quality``); None for exact levers.
        why_not: the reason it cannot apply on a machine, or None when it can.
        requires: levers that must be on for it to run at all (the host KV tier sits
            below the radix cache): a configuration with it has them on too, and its
            gains are measured against those levers alone, not the baseline.
    """

    name: str
    title: str
    verb: str
    on: tuple[str, ...]
    off: tuple[str, ...]
    ledger: tuple[LedgerLever, ...]
    lossy: tuple[str, str] | None = None
    why_not: Callable[[Machine], str | None] = field(default=lambda m: None)
    requires: tuple[str, ...] = ()

    @property
    def bottleneck(self) -> str:
        """The bottleneck its verb targets (compute, memory bandwidth, ...)."""
        return next(v.bottleneck for v in VERBS if v.verb == self.verb)

    def flags(self, state: bool, machine: Machine) -> tuple[str, ...]:
        """Its flags when on (``state``) or off, with ``{draft_model}`` filled in."""
        raw = self.on if state else self.off
        return tuple(machine.draft_model or "" if a == "{draft_model}" else a for a in raw)

    def flag_names(self) -> frozenset[str]:
        """The ``--flags`` it sets, on or off (two levers sharing one cannot pair)."""
        return frozenset(a for a in (*self.on, *self.off) if a.startswith("--"))

    def applicable(self, machine: Machine) -> str | None:
        """None if it can run here, else why not (a flag this build lacks, or its own
        condition)."""
        missing = sorted(self.flag_names() - machine.serve_flags)
        if missing:
            return f"houchu serve has no {', '.join(missing)} in this build"
        return self.why_not(machine)


def _cuda_only(m: Machine) -> str | None:
    return None if m.device == "cuda" else "needs a CUDA device (the model runs on the CPU)"


def _int8_dot(m: Machine) -> str | None:
    if m.device == "cuda":
        return None
    if m.cpu_features & {"avx512_vnni", "avx_vnni", "amx_int8"}:
        return None
    return (
        "no int8 dot products on this CPU (no AVX512-VNNI, AVX-VNNI or AMX): W8A8 runs weight-only"
    )


def _tp2(m: Machine) -> str | None:
    return m.tp_refusal


def _draft(m: Machine) -> str | None:
    return None if m.draft_model else "no draft model given (houchu levers --draft-model PATH)"


def _structure(what: str) -> Callable[[Machine], str | None]:
    def why(m: Machine) -> str:
        return f"{what} is the model's own structure, not a serve flag: sweep a model that has it against one that does not"

    return why


LEVERS: tuple[Lever, ...] = (
    Lever(
        "radix-cache",
        "radix prefix cache",
        "skip",
        (),
        ("--disable-radix-cache",),
        (LedgerLever.RADIX_PREFIX_CACHE,),
    ),
    Lever(
        "kv-tiers",
        "host KV tier",
        "skip",
        ("--host-kv-mb", "512"),
        ("--host-kv-mb", "0"),
        (LedgerLever.KV_TIER_HOST, LedgerLever.KV_TIER_SSD),
        requires=("radix-cache",),
    ),
    Lever(
        "chunked-prefill",
        "chunked prefill",
        "fill",
        ("--chunked-prefill-size", "512", "--max-batch-tokens", "512"),
        ("--chunked-prefill-size", "0", "--max-batch-tokens", "4096"),
        (LedgerLever.CHUNKED_PREFILL,),
    ),
    Lever(
        "int4",
        "int4 weights",
        "move_less",
        ("--quantization", "int4"),
        ("--quantization", "none"),
        (LedgerLever.WEIGHT_QUANT_INT4,),
        lossy=("int4", "auto"),
    ),
    Lever(
        "int8",
        "int8 weights",
        "move_less",
        ("--quantization", "int8"),
        ("--quantization", "none"),
        (LedgerLever.WEIGHT_QUANT_INT8,),
        lossy=("int8", "auto"),
    ),
    Lever(
        "w8a8",
        "W8A8 matmuls",
        "compute_less",
        ("--quantization", "w8a8"),
        ("--quantization", "none"),
        (LedgerLever.WEIGHT_QUANT_W8A8,),
        lossy=("w8a8", "auto"),
        why_not=_int8_dot,
    ),
    Lever(
        "int8-kv",
        "int8 KV cache",
        "move_less",
        ("--kv-cache-dtype", "int8"),
        ("--kv-cache-dtype", "auto"),
        (LedgerLever.KV_QUANT_INT8,),
        lossy=("none", "int8"),
    ),
    Lever(
        "fp8-kv",
        "fp8 KV cache",
        "move_less",
        ("--kv-cache-dtype", "fp8"),
        ("--kv-cache-dtype", "auto"),
        (LedgerLever.KV_QUANT_FP8,),
        lossy=("none", "fp8"),
    ),
    Lever(
        "fused-layers",
        "fused decode layers",
        "move_less",
        (),
        ("--disable-fused-layers",),
        (LedgerLever.FUSED_KERNELS,),
    ),
    Lever(
        "compile",
        "compiled decode step",
        "fill",
        ("--compile", "on"),
        ("--compile", "off"),
        (LedgerLever.COMPILED_DECODE,),
    ),
    Lever(
        "cuda-graph",
        "CUDA graphs",
        "fill",
        (),
        ("--disable-cuda-graph",),
        (LedgerLever.CUDA_GRAPH,),
        why_not=_cuda_only,
    ),
    Lever(
        "overlap",
        "overlap scheduler",
        "fill",
        ("--overlap-schedule", "on"),
        ("--overlap-schedule", "off"),
        (LedgerLever.OVERLAP_SCHEDULER,),
    ),
    Lever(
        "spec-ngram",
        "n-gram speculation",
        "break_serial",
        ("--speculative", "ngram"),
        (),
        (LedgerLever.SPECULATIVE_DECODING,),
    ),
    Lever(
        "spec-draft",
        "draft-model speculation",
        "break_serial",
        ("--draft-model", "{draft_model}"),
        (),
        (LedgerLever.SPECULATIVE_DECODING,),
        why_not=_draft,
    ),
    Lever(
        "data-parallel",
        "data parallel (2 replicas)",
        "fill",
        ("--data-parallel-size", "2"),
        ("--data-parallel-size", "1"),
        (),  # no ledger lever: replicas are measured by replicas_bench
        why_not=lambda m: (
            "the sweep drives one engine's WebSocket API and reads its /stats and database; "
            "with --data-parallel-size 2 the port is smg's HTTP router: measured by "
            "python -m houchu.bench.served.replicas"
        ),
    ),
    Lever(
        "tensor-parallel",
        "tensor parallel (2 ranks)",
        "fill",
        ("--tensor-parallel-size", "2"),
        ("--tensor-parallel-size", "1"),
        (LedgerLever.TENSOR_PARALLEL,),
        why_not=_tp2,
    ),
    Lever(
        "moe",
        "MoE routed experts",
        "compute_less",
        (),
        (),
        (LedgerLever.MOE_ROUTED_EXPERTS,),
        why_not=_structure("MoE"),
    ),
    Lever(
        "mla", "MLA latent KV", "occupy_less", (), (), (LedgerLever.MLA,), why_not=_structure("MLA")
    ),
    Lever(
        "sliding-window",
        "sliding-window attention",
        "compute_less",
        (),
        (),
        (LedgerLever.SLIDING_WINDOW_ATTENTION, LedgerLever.SLIDING_WINDOW_PAGES),
        why_not=_structure("a sliding attention window"),
    ),
    Lever(
        "jump-forward",
        "structured-output jump-forward",
        "break_serial",
        ("--jump-forward", "on"),
        ("--jump-forward", "off"),
        (LedgerLever.JUMP_FORWARD,),
        why_not=lambda m: (
            None
            if m.structured
            else "acts only on structured-output requests: give the workload --structured"
        ),
    ),
)

#: Pairs whose gains may add, overlap or cancel: measured by default with their singles.
INTERACTING_PAIRS: tuple[tuple[str, str], ...] = (
    ("radix-cache", "chunked-prefill"),  # both change what a prefill step computes
    ("radix-cache", "kv-tiers"),  # tiers only pay for prefixes the cache evicted
    ("int4", "int8-kv"),  # both cut bytes per decode step: the second saves less
    ("int8", "int8-kv"),
    ("int4", "fused-layers"),  # the fused layers run on quantized weights
    ("int4", "compile"),
    ("compile", "overlap"),  # both hide per-step overhead
    ("overlap", "spec-ngram"),  # verify steps are not overlapped
    ("spec-ngram", "chunked-prefill"),
    ("spec-draft", "overlap"),
    ("int4", "spec-ngram"),  # speculation pays less when steps are cheaper
)

BY_NAME: dict[str, Lever] = {lv.name: lv for lv in LEVERS}


def lever(name: str) -> Lever:
    """The lever of that name.

    Raises:
        ValueError: no such lever (the message lists them).
    """
    if name not in BY_NAME:
        raise ValueError(f"unknown lever {name!r}; levers: {', '.join(BY_NAME)}")
    return BY_NAME[name]


def can_pair(a: Lever, b: Lever) -> bool:
    """Whether two levers can be on together (they set no flag in common)."""
    return a.name != b.name and not (a.flag_names() & b.flag_names())
