"""Which bottleneck was binding in a run: its measured step time against the roofline.

Per step, ``time ≈ max(FLOPs / compute peak, bytes / bandwidth)`` (docs/architecture.md).
Over a run's forward steps (``StepTotals``):

- FLOPs: ``2 × matmul weights per token × tokens computed + 2 × LM head weights × rows
  sampled`` (every decode token, and one row per request's prefill); the embedding is
  a lookup, and attention is small at the short contexts of a bench workload: both
  are left out. A record without the matmul split (older runner lines) counts
  ``2 × parameters × tokens``;
- bytes: ``weight bytes per step × steps`` (matmul weights as stored, from the runner's
  start-up line) ``+ KV bytes per token × (tokens written + decode tokens × mean
  context)``, the mean context being the run's mean prompt plus half its mean output;
- the limits are measured in the sweep's own process (``houchu.bench.model.limits``):
  memory copy bandwidth and the matmul peak of the format the steps compute in.

The run is ``compute``-bound or ``bandwidth``-bound by whichever ideal time is larger,
unless that time is under half the measured step time: then neither unit was busy and
the binding constraint is ``overhead`` (idle time: scheduling, kernel launches, threads
waiting). A run that preempted requests was short of KV pages: ``capacity``.
"""

from __future__ import annotations

from dataclasses import dataclass

from houchu.bench.model.limits import Limits
from houchu.bench.sweep.records import CellRun, ServerFacts

#: Below this fraction of the measured time, neither compute nor bandwidth was binding.
BUSY_FRACTION = 0.5


@dataclass(frozen=True)
class Binding:
    """The binding constraint of a run.

    Attributes:
        kind: ``compute``, ``bandwidth``, ``overhead``, ``capacity`` or ``unknown``.
        compute_frac: ideal compute time / measured step time.
        bandwidth_frac: ideal memory time / measured step time.
        step_ms: mean measured step time, ms.
    """

    kind: str
    compute_frac: float = 0.0
    bandwidth_frac: float = 0.0
    step_ms: float = 0.0


def compute_format(facts: ServerFacts, native: frozenset[str]) -> str:
    """The format a server's matmuls compute in: fp32 for unquantized float32 weights;
    quantized weights in bf16 where the CPU has native bf16, else fp32; w8a8 in int8
    where the CPU has int8 dot products."""
    if facts.weights.startswith("w8a8") and "int8" in native:
        return "int8"
    if facts.weights == "none":
        return "fp32" if facts.dtype == "float32" else "bf16"
    return "bf16" if "bf16" in native else "fp32"


def _flops(facts: ServerFacts, tokens: int, sampled: int) -> float:
    """Matmul FLOPs of ``tokens`` computed tokens of which ``sampled`` rows reached the
    LM head (see the module docstring)."""
    if not facts.matmul_params:
        return 2.0 * facts.params * tokens
    return 2.0 * (facts.matmul_params * tokens + facts.lm_head_params * sampled)


def binding(run: CellRun, facts: ServerFacts, lim: Limits, fmt: str) -> Binding:
    """The binding constraint of ``run`` on a server with ``facts`` (see the module
    docstring); ``fmt``: the format its matmuls compute in (:func:`compute_format`)."""
    st = run.steps
    if st.steps == 0 or st.seconds <= 0 or not facts.params:
        return Binding("unknown")
    done = run.metrics.get("completed") or 0
    mean_prompt = (run.metrics.get("total_input_tokens") or 0) / max(done, 1)
    mean_out = (run.metrics.get("total_output_tokens") or 0) / max(done, 1)
    tokens = st.prefill_tokens + st.decode_tokens
    flops = _flops(facts, tokens, st.decode_tokens + done)
    kv = facts.kv_bytes_per_token * (tokens + st.decode_tokens * (mean_prompt + mean_out / 2))
    nbytes = facts.weight_bytes_per_step * st.steps + kv
    t_compute = flops / lim.compute_peak(fmt)
    t_memory = nbytes / (lim.copy_gbs * 1e9)
    cf, bf = t_compute / st.seconds, t_memory / st.seconds
    step_ms = 1e3 * st.seconds / st.steps
    if run.preemptions:
        kind = "capacity"
    elif max(cf, bf) < BUSY_FRACTION:
        kind = "overhead"
    else:
        kind = "compute" if cf >= bf else "bandwidth"
    return Binding(kind, cf, bf, step_ms)
