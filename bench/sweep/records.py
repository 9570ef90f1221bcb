"""What one run of a lever sweep measured, as plain JSON-ready records.

A :class:`CellRun` is one configuration at one load level, one repeat: the load
generator's metrics (``houchu.bench.metrics.summarize``), what the engine's counters
say each lever saved and spent during exactly that run (the ledger's samples between
its start and end), and its forward steps (count, seconds, tokens). A
:class:`ServerFacts` is what one started server reported about itself. The analysis
(``houchu.bench.sweep.analysis``) works on these alone, so it can be tested on recorded
data.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

#: Metrics kept from a run's summary (milliseconds, per second).
CELL_METRICS = (
    "median_ttft_ms",
    "median_tpot_ms",
    "p90_ttft_ms",
    "p90_tpot_ms",
    "median_e2el_ms",
    "output_throughput",
    "request_throughput",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
)


@dataclass
class StepTotals:
    """The forward steps of one run, from the runner's step records.

    Attributes:
        steps: forward steps.
        seconds: their summed duration, s.
        prefill_tokens: prompt tokens computed.
        decode_tokens: decode tokens computed.
    """

    steps: int = 0
    seconds: float = 0.0
    prefill_tokens: int = 0
    decode_tokens: int = 0


@dataclass
class CellRun:
    """One configuration at one load, one repeat.

    Attributes:
        config: the configuration's name (``baseline``, ``int4``, ``int4+int8-kv``).
        load: the load level's value (concurrency, or requests per second).
        repeat: 0, 1, ...
        metrics: :data:`CELL_METRICS` of the run (None where not measured).
        ledger: ``{ledger lever: {"saved UNIT" | "spent UNIT": amount}}`` over the run.
        steps: its forward steps.
        preemptions: requests preempted during the run.
    """

    config: str
    load: float
    repeat: int
    metrics: dict[str, float | None]
    ledger: dict[str, dict[str, float]] = field(default_factory=dict)
    steps: StepTotals = field(default_factory=StepTotals)
    preemptions: int = 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``from_json`` reads it back)."""
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> CellRun:
        """The record ``to_json`` wrote."""
        return CellRun(
            d["config"],
            float(d["load"]),
            int(d["repeat"]),
            dict(d["metrics"]),
            {k: dict(v) for k, v in d.get("ledger", {}).items()},
            StepTotals(**d.get("steps", {})),
            int(d.get("preemptions", 0)),
        )


@dataclass
class ServerFacts:
    """What a started server reported about its model runner (its start-up line).

    Attributes:
        startup_s: seconds from start to serving.
        params: model parameters.
        weight_bytes_per_step: matmul weight bytes one step reads, as stored.
        kv_bytes_per_token: KV bytes per token (all layers).
        kv_pool_tokens: tokens the KV pool holds.
        dtype: the model dtype (float32, bfloat16).
        weights: the weight format (``none``, ``int4-g32``, ``int8``, ``w8a8``).
        matmul_params: weights one token's forward multiplies, the LM head left out
            (0: not on the line, an older record).
        lm_head_params: the LM head's weights (vocabulary x hidden), multiplied only by
            the rows that sample.
    """

    startup_s: float
    params: float = 0.0
    weight_bytes_per_step: float = 0.0
    kv_bytes_per_token: float = 0.0
    kv_pool_tokens: int = 0
    dtype: str = ""
    weights: str = "none"
    matmul_params: float = 0.0
    lm_head_params: float = 0.0


_PARAMS = re.compile(
    r"([\d.]+)M params(?: \(matmul ([\d.]+)M/token, LM head ([\d.]+)M\))?, (\w+) on"
)
_POOL = re.compile(r"= (\d+) tokens, [\d.]+ MiB \((\d+) B/token\)")
_WEIGHTS = re.compile(r"weights ([\w-]+): ([\d.]+) MiB/step")


def summary_line(lines: list[str]) -> str:
    """The runner's start-up summary among its ``houchu runner:`` lines (others come
    before it: ``--compile auto skipped: ...``, a thread count kept), or ""."""
    return next((ln for ln in lines if _PARAMS.search(ln)), "")


def parse_runner_line(line: str, startup_s: float) -> ServerFacts:
    """The facts of the runner's start-up line (``ModelRunner.summary``): parameters,
    dtype, KV pool, and weight bytes per step (with unquantized weights, the parameters
    at the dtype's size). Fields the line lacks stay 0.

    Example line: ``houchu runner: llama 'X', 134.5M params (matmul 77.9M/token, LM head
    28.3M), float32 on cpu, 30 layers,
    KV pool 91 pages x 16 = 1456 tokens, 64.0 MiB (46080 B/token), ...; weights
    int4-g32: 90.4 MiB/step (0.35x the bytes of bf16); ...``
    """
    facts = ServerFacts(startup_s)
    if m := _PARAMS.search(line):
        facts.params, facts.dtype = float(m.group(1)) * 1e6, m.group(4)
        if m.group(2):
            facts.matmul_params = float(m.group(2)) * 1e6
            facts.lm_head_params = float(m.group(3)) * 1e6
    if m := _POOL.search(line):
        facts.kv_pool_tokens, facts.kv_bytes_per_token = int(m.group(1)), float(m.group(2))
    if m := _WEIGHTS.search(line):
        facts.weights = m.group(1)
        facts.weight_bytes_per_step = float(m.group(2)) * 2**20
    elif facts.params:
        facts.weight_bytes_per_step = facts.params * (4 if facts.dtype == "float32" else 2)
    return facts


@dataclass
class SweepResult:
    """Everything a sweep measured (with a resumed sweep: the earlier sessions' too).

    Attributes:
        runs: one per (configuration, load, repeat) measured.
        facts: ``{configuration: ServerFacts}`` of its first server.
        failures: ``{configuration: why}`` for configurations whose server or run failed.
        seconds: the sweep's wall time, s (every session's).
    """

    runs: list[CellRun]
    facts: dict[str, ServerFacts]
    failures: dict[str, str]
    seconds: float

    @staticmethod
    def from_record(record: dict[str, Any]) -> SweepResult:
        """The measurements of a stored sweep record (its failures are left out: a
        resumed sweep tries those configurations again)."""
        runs = [CellRun.from_json(r) for r in record.get("runs", [])]
        facts = {k: ServerFacts(**v) for k, v in record.get("facts", {}).items()}
        return SweepResult(runs, facts, {}, float(record.get("seconds") or 0.0))
