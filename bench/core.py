"""One benchmark: build the workload, warm up, run, summarize — the record that is printed,
saved as JSON and stored in the database.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass
from typing import Any

from houchu.bench.backends.base import Backend, GenParams
from houchu.bench.driver import RunConfig, run_sessions
from houchu.bench.metrics import summarize
from houchu.bench.prompts import PromptBuilder
from houchu.bench.workloads import WorkloadConfig, build_sessions

#: Warm-up seeds are offset so warm-up prompts differ from measured ones.
WARMUP_SEED_OFFSET = 1_000_003


@dataclass(frozen=True)
class BenchSpec:
    """Everything that defines a benchmark apart from its target.

    Attributes:
        workload: what to send.
        run: how to send it.
        params: request settings.
        warmup: requests sent first and not measured.
        slo_ms: goodput objectives in milliseconds (``ttft``/``tpot``/``e2el``).
    """

    workload: WorkloadConfig
    run: RunConfig
    params: GenParams
    warmup: int = 1
    slo_ms: dict[str, float] | None = None

    def settings(self) -> dict[str, Any]:
        """JSON-ready settings (the workload, arrival, request settings, warm-up)."""
        return {
            **self.workload.settings(),
            **self.run.settings(),
            **{k: v for k, v in asdict(self.params).items() if k != "extra"},
            "extra_body": dict(self.params.extra),
            "warmup": self.warmup,
            "goodput_slo_ms": dict(self.slo_ms or {}),
        }


async def benchmark(
    backend: Backend, spec: BenchSpec, builder: PromptBuilder, name: str
) -> dict[str, Any]:
    """Run ``spec`` against ``backend`` (started and closed here).

    Returns:
        ``{"name", "date", "settings", "results", "by_tag", "requests"}``: ``results``
        holds the metrics of :func:`houchu.bench.metrics.summarize` plus ``not_sent``;
        ``by_tag`` the same per request class; ``requests`` one record per request.
    """
    sessions = build_sessions(spec.workload, builder, spec.run.seed)
    warm_cfg = WorkloadConfig(**{**spec.workload.__dict__, "num_requests": max(1, spec.warmup)})
    warm = (
        build_sessions(warm_cfg, builder, spec.run.seed + WARMUP_SEED_OFFSET) if spec.warmup else []
    )
    await backend.start()
    try:
        if warm:
            conc = min(spec.warmup, spec.run.concurrency or spec.warmup)
            await run_sessions(backend, warm, RunConfig(concurrency=conc, progress=False))
        outcome = await run_sessions(backend, sessions, spec.run, desc=name)
    finally:
        await backend.close()
    results = summarize(outcome.results, outcome.duration_s, spec.slo_ms, outcome.incomplete)
    results["not_sent"] = outcome.not_sent
    tags = sorted({r.tag for r in outcome.results})
    by_tag = {}
    if len(tags) > 1:
        for tag in tags:
            sub = [r for r in outcome.results if r.tag == tag]
            by_tag[tag] = summarize(sub, outcome.duration_s, spec.slo_ms)
    return {
        "name": name,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "settings": {**spec.settings(), **backend.info(), "prompt_tokens_exact": builder.exact},
        "results": results,
        "by_tag": by_tag,
        "requests": [r.to_json() for r in outcome.results],
    }
