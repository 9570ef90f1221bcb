"""Synthetic telemetry for storage and dashboard tests: a few requests through every stage,
steps, lever samples of several verbs, and two benchmark runs."""

from __future__ import annotations

import time

from sqlalchemy import Engine

from houchu.storage.bench_runs import insert_bench_run
from houchu.storage.writer import TelemetryWriter
from houchu.transport.telemetry import (
    LeverSample,
    LifecycleEvent,
    StepRecord,
    TelemetryBatch,
)


def request_batches(
    rid: str, t0: float, cached: int = 0, done: bool = True
) -> list[TelemetryBatch]:
    """One request's telemetry as the gateway, tokenizer and scheduler would send it."""
    ev = LifecycleEvent
    gateway = TelemetryBatch(
        actor="gateway",
        events=[
            ev(
                rid,
                "arrived",
                t0,
                "gateway",
                {"max_tokens": 16, "temperature": 0.0, "preview": f"prompt of {rid}"},
            )
        ],
    )
    tok = [ev(rid, "tokenized", t0 + 0.002, "tokenizer", {"prompt_tokens": 40})]
    sched = [
        ev(rid, "queued", t0 + 0.003, "scheduler", {"prompt_tokens": 40}),
        ev(rid, "scheduled", t0 + 0.05, "scheduler", {}),
        ev(rid, "prefill_chunk", t0 + 0.2, "scheduler", {"start": cached, "tokens": 40 - cached}),
        ev(rid, "first_token", t0 + 0.2, "scheduler", {}),
    ]
    levers = [
        LeverSample(
            "paged_kv", "occupy_less", 4096.0 * 30, "bytes", 3, "page_table_entries", t0 + 0.6, rid
        )
    ]
    if cached:
        sched.insert(
            1,
            ev(
                rid,
                "prefix_matched",
                t0 + 0.04,
                "scheduler",
                {"cached_tokens": cached, "tier": "device"},
            ),
        )
        levers.append(
            LeverSample(
                "radix_prefix_cache", "skip", float(cached), "tokens", 2.0, "pages", t0 + 0.05, rid
            )
        )
        levers.append(
            LeverSample(
                "radix_prefix_cache", "skip", 2.7e8 * cached, "flops", 0.0, "", t0 + 0.05, rid
            )
        )
    if done:
        sched.append(
            ev(
                rid,
                "finished",
                t0 + 0.6,
                "scheduler",
                {"finish_reason": "length", "completion_tokens": 16},
            )
        )
        tok.append(
            ev(
                rid,
                "finished",
                t0 + 0.61,
                "tokenizer",
                {
                    "finish_reason": "length",
                    "prompt_tokens": 40,
                    "completion_tokens": 16,
                    "cached_tokens": cached,
                    "first_token_t": t0 + 0.21,
                },
            )
        )
    return [
        gateway,
        TelemetryBatch(actor="tokenizer", events=tok),
        TelemetryBatch(actor="scheduler", events=sched, levers=levers),
    ]


def step_batches(t0: float, n: int = 30) -> list[TelemetryBatch]:
    """``n`` steps from the runner, 50 ms apart, with the scheduler's batching samples."""
    runner = [
        StepRecord(
            i,
            t0 + 0.05 * i,
            0.03,
            4,
            40 if i % 10 == 0 else 0,
            4,
            "mixed" if i % 10 == 0 else "decode",
        )
        for i in range(n)
    ]
    levers = [
        LeverSample(
            "continuous_batching", "fill", 3.0, "forward_passes", 0.0, "seconds", t0 + 0.05 * i
        )
        for i in range(n)
    ]
    return [
        TelemetryBatch(actor="runner", steps=runner),
        TelemetryBatch(actor="scheduler", levers=levers),
    ]


BENCH_SETTINGS = {"workload": "random", "concurrency": 16, "num_prompts": 64, "seed": 0}


def bench_results(scale: float) -> dict:
    """vLLM-style results, scaled (a faster engine has a bigger ``scale``)."""
    out = {
        "completed": 64,
        "failed": 0,
        "duration_s": 30 / scale,
        "output_throughput": 120.0 * scale,
        "request_throughput": 2.1 * scale,
        "input_throughput": 800.0 * scale,
    }
    for metric, base in (("ttft", 400.0), ("tpot", 60.0), ("itl", 58.0), ("e2el", 4000.0)):
        for stat, k in (("mean", 1.0), ("median", 0.9), ("p90", 1.6), ("p99", 2.2)):
            out[f"{stat}_{metric}_ms"] = base * k / scale
    return out


def fill(engine: Engine, now: float | None = None, n_requests: int = 6) -> float:
    """Write synthetic telemetry for ``n_requests`` (the last still running) and two
    benchmark runs; returns the base time used."""
    t0 = (now or time.time()) - 5.0
    writer = TelemetryWriter(engine)
    writer.start()
    for i in range(n_requests):
        last = i == n_requests - 1
        for b in request_batches(
            f"cmpl-{i:04d}abcdef", t0 + 0.4 * i, cached=32 if i % 2 else 0, done=not last
        ):
            writer.submit(b)
    for b in step_batches(t0):
        writer.submit(b)
    assert writer.flush(20.0), "synthetic telemetry was not written in time"
    writer.close()
    insert_bench_run(engine, "baseline", BENCH_SETTINGS, bench_results(1.0), created=t0 - 3600)
    insert_bench_run(
        engine,
        "radix cache",
        {**BENCH_SETTINGS, "radix_cache": True},
        bench_results(1.6),
        created=t0 - 60,
    )
    return t0
