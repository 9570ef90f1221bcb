"""The load generator against a real ``houchu serve``: every workload completes, timings
are consistent, token counts match the server's usage, the record is saved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from houchu.bench.backends.base import GenParams
from houchu.bench.backends.openai import OpenAIBackend
from houchu.bench.backends.ws import HouchuWsBackend
from houchu.bench.core import BenchSpec, benchmark
from houchu.bench.dist import parse_dist
from houchu.bench.driver import RunConfig
from houchu.bench.prompts import PromptBuilder
from houchu.bench.workloads import WorkloadConfig
from houchu.cli.main import main
from tests.support.server import Server

pytestmark = pytest.mark.slow

OUT = 6  # output tokens per request: small, the machine is shared


def _workload(kind: str, replay: Path) -> WorkloadConfig:
    return WorkloadConfig(
        kind=kind,
        num_requests=4,
        input_len=parse_dist("16" if kind == "multi-turn" else "uniform:8:24"),
        output_len=parse_dist(str(OUT)),
        num_prefixes=2,
        prefix_len=48,
        turns=2,
        long_len=300,
        long_every=2,
        long_output=OUT,
        replay_path=str(replay),
    )


def _check_requests(record: dict, n: int) -> None:
    reqs = record["requests"]
    assert len(reqs) == n
    for r in reqs:
        assert r["ok"], r["error_message"]
        assert r["usage_reported"]
        assert r["output_tokens"] == OUT  # ignore_eos: exactly max_tokens
        assert r["counted_tokens"] == r["output_tokens"]  # ids streamed == usage
        assert r["input_tokens"] > 0
        assert 0 < r["ttft_s"] <= r["e2el_s"]
        assert all(g >= 0 for g in r["itl_s"])
    res = record["results"]
    assert res["completed"] == n and res["failed"] == 0
    assert res["total_output_tokens"] == n * OUT
    assert res["median_ttft_ms"] <= res["median_e2el_ms"]


@pytest.mark.parametrize("kind", ["random", "shared-prefix", "multi-turn", "long-prompt", "replay"])
async def test_every_workload_over_websocket(server: Server, tmp_path: Path, kind: str) -> None:
    replay = tmp_path / "r.jsonl"
    replay.write_text(
        "\n".join(
            [
                json.dumps({"prompt": "The capital of France is"}),
                json.dumps({"messages": [{"role": "user", "content": "Name a river."}]}),
                json.dumps({"user": "Say hi.", "system": "Be brief."}),
                json.dumps({"prompt": "One two three", "max_tokens": OUT}),
            ]
        )
    )
    spec = BenchSpec(
        _workload(kind, replay),
        RunConfig(concurrency=2, progress=False),
        GenParams(api="chat" if kind == "multi-turn" else "completions", timeout_s=120),
        warmup=0,
    )
    rec = await benchmark(
        HouchuWsBackend(server.ws_url, spec.params, 2), spec, PromptBuilder(None), kind
    )
    _check_requests(rec, 4)
    if kind == "multi-turn":  # the second turn resends the first exchange
        inputs = {
            t: [r["input_tokens"] for r in rec["requests"] if r["tag"] == t]
            for t in ("turn0", "turn1")
        }
        assert min(inputs["turn1"]) > max(inputs["turn0"]) + OUT
    if kind == "long-prompt":
        assert set(rec["by_tag"]) == {"short", "long"}


@pytest.mark.parametrize("api", ["completions", "chat"])
async def test_openai_backend_against_houchu(server: Server, api: str) -> None:
    spec = BenchSpec(
        _workload("shared-prefix", Path("unused")),
        RunConfig(concurrency=4, progress=False),
        GenParams(api=api, timeout_s=120),
        warmup=0,
        slo_ms={"ttft": 600_000.0, "tpot": 600_000.0},
    )
    backend = OpenAIBackend(f"{server.url}/v1", spec.params)
    rec = await benchmark(backend, spec, PromptBuilder(None), f"openai-{api}")
    _check_requests(rec, 4)
    assert rec["settings"]["model"] == "SmolLM2-135M-Instruct"
    assert rec["results"]["request_goodput"] == pytest.approx(rec["results"]["request_throughput"])


def test_cli_writes_json_and_database(server: Server, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run.json"
    db = f"sqlite:///{tmp_path / 'bench.db'}"
    argv = ["bench", "--url", server.ws_url, "--num-requests", "3", "--concurrency", "3"]
    argv += ["--input-len", "16", "--output-len", str(OUT), "--tokenizer", "none", "--no-progress"]
    argv += ["--warmup", "1", "--output", str(out), "--db", db, "--name", "cli-test"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "Serving Benchmark Result" in text and "Median TTFT (ms)" in text
    rec = json.loads(out.read_text())
    _check_requests(rec, 3)
    assert rec["settings"]["warmup"] == 1 and rec["settings"]["backend"] == "houchu-ws"
    from houchu.storage.bench_runs import list_bench_runs
    from houchu.storage.db import open_db

    engine = open_db(db)
    try:
        runs = list_bench_runs(engine)
    finally:
        engine.dispose()
    assert [r["name"] for r in runs] == ["cli-test"]
    assert runs[0]["results"]["total_output_tokens"] == 3 * OUT
    assert runs[0]["settings"]["workload"] == "random"
