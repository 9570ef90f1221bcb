"""Load generator: metric math, length distributions, workloads, prompts, arrivals."""

from __future__ import annotations

import random

import pytest

from houchu.bench.compare import comparison_table
from houchu.bench.dist import parse_dist
from houchu.bench.driver import arrival_offsets
from houchu.bench.metrics import (
    RequestResult,
    meets_slo,
    parse_slo,
    percentile,
    stats_ms,
    summarize,
)
from houchu.bench.prompts import PromptBuilder
from houchu.bench.workloads import RequestSpec, WorkloadConfig, build_sessions


def _req(
    start: float, times: list[float], end: float, out: int, inp: int = 10, tag: str = "t"
) -> RequestResult:
    return RequestResult(
        tag, start, end, list(times), out, inp, counted_tokens=out, usage_reported=True
    )


def test_percentile_matches_linear_interpolation() -> None:
    v = [1.0, 2.0, 3.0, 4.0]
    assert percentile(v, 50) == pytest.approx(2.5)
    assert percentile(v, 90) == pytest.approx(3.7)
    assert percentile(v, 99) == pytest.approx(3.97)
    assert percentile([5.0], 99) == 5.0
    assert percentile([], 50) is None


def test_stats_in_milliseconds() -> None:
    s = stats_ms([0.1, 0.2, 0.3])
    assert s["mean"] == pytest.approx(200.0)
    assert s["median"] == pytest.approx(200.0)
    assert stats_ms([]) == {"mean": None, "median": None, "p90": None, "p99": None}


def test_request_ttft_tpot_itl_e2el() -> None:
    r = _req(10.0, [10.5, 10.7, 11.0, 11.5], 11.5, out=4)
    assert r.ttft == pytest.approx(0.5)
    assert r.e2el == pytest.approx(1.5)
    assert r.tpot == pytest.approx((1.5 - 0.5) / 3)
    assert r.itls == pytest.approx([0.2, 0.3, 0.5])
    one = _req(0.0, [0.3], 0.3, out=1)
    assert one.tpot is None and one.itls == []
    none = _req(0.0, [], 0.2, out=0)
    assert none.ttft is None and none.tpot is None


def test_tpot_uses_token_count_not_chunks() -> None:
    """A chunk holding several tokens: TPOT divides by tokens, ITL has one gap per chunk."""
    r = _req(0.0, [1.0, 2.0], 2.0, out=5)
    assert r.tpot == pytest.approx(1.0 / 4)
    assert r.itls == pytest.approx([1.0])


def test_summarize_throughput_and_pooled_itl() -> None:
    a = _req(0.0, [0.1, 0.2, 0.3], 0.3, out=3, inp=5)
    b = _req(0.0, [0.2, 0.6], 0.6, out=2, inp=7)
    bad = RequestResult("t", 0.0, 0.4, error="timeout")
    s = summarize([a, b, bad], duration_s=2.0)
    assert s["completed"] == 2 and s["failed"] == 1 and s["errors"] == {"timeout": 1}
    assert s["total_input_tokens"] == 12 and s["total_output_tokens"] == 5
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["output_throughput"] == pytest.approx(2.5)
    assert s["total_token_throughput"] == pytest.approx(8.5)
    # ITL pools every gap of every request: 100, 100, 400 ms
    assert s["mean_itl_ms"] == pytest.approx(200.0)
    assert s["median_itl_ms"] == pytest.approx(100.0)
    assert s["mean_ttft_ms"] == pytest.approx(150.0)
    assert s["median_e2el_ms"] == pytest.approx(450.0)
    assert s["request_goodput"] is None


def test_goodput_counts_requests_meeting_every_objective() -> None:
    fast = _req(0.0, [0.1, 0.15, 0.2], 0.2, out=3)  # ttft 100 ms, tpot 50 ms
    slow_start = _req(0.0, [0.9, 0.95], 0.95, out=2)  # ttft 900 ms
    slow_tokens = _req(0.0, [0.1, 0.5], 0.5, out=2)  # tpot 400 ms
    single = _req(0.0, [0.2], 0.2, out=1)  # no TPOT: meets a TPOT objective
    slo = {"ttft": 500.0, "tpot": 100.0}
    assert [meets_slo(r, slo) for r in (fast, slow_start, slow_tokens, single)] == [
        True,
        False,
        False,
        True,
    ]
    failed = RequestResult("t", 0.0, 0.1, error="http_500")
    assert not meets_slo(failed, slo)
    s = summarize([fast, slow_start, slow_tokens, single, failed], 2.0, slo)
    assert s["request_goodput"] == pytest.approx(1.0)
    assert summarize([fast], 1.0, {"e2el": 100.0})["request_goodput"] == 0.0


def test_parse_slo() -> None:
    assert parse_slo(["ttft:500", "tpot:50.5"]) == {"ttft": 500.0, "tpot": 50.5}
    for bad in (["itl:5"], ["ttft"], ["ttft:-1"], ["ttft:x"]):
        with pytest.raises(ValueError):
            parse_slo(bad)


def test_length_distributions() -> None:
    rng = random.Random(0)
    assert parse_dist("64").sample(rng) == 64
    u = parse_dist("uniform:10:20")
    assert all(10 <= u.sample(rng) <= 20 for _ in range(200))
    assert u.mean == 15
    n = [parse_dist("normal:100:10").sample(rng) for _ in range(500)]
    assert 95 < sum(n) / len(n) < 105
    e = [parse_dist("exp:50").sample(rng) for _ in range(2000)]
    assert min(e) >= 1 and 40 < sum(e) / len(e) < 60
    assert str(parse_dist("uniform:1:5")) == "uniform:1:5"
    for bad in ("0", "uniform:5", "uniform:9:3", "gamma:1:2", "x", "normal:10:-1"):
        with pytest.raises(ValueError):
            parse_dist(bad)


class _CharTokenizer:
    """One token per character: words are never single tokens except one-letter ones."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]


class _SpaceWordTokenizer:
    """One token per space-led word, plus a BOS; the first word without a space is 2."""

    def encode(self, text: str) -> list[int]:
        ids = [1]
        for i, w in enumerate(text.split(" ")):
            if w:
                ids += [2] if i > 0 else [2, 3]
        return ids


def test_prompt_builder_exact_with_tokenizer() -> None:
    b = PromptBuilder(_SpaceWordTokenizer())
    rng = random.Random(1)
    for n in (1, 7, 100):
        assert b.count(b.text(rng, n)) == n
    with pytest.raises(ValueError):
        PromptBuilder(_CharTokenizer())


def test_prompt_builder_counts_words_without_tokenizer() -> None:
    b = PromptBuilder(None)
    t = b.text(random.Random(0), 42)
    assert len(t.split()) == 42 and not b.exact


def _words(cfg: WorkloadConfig, seed: int = 0) -> list[list[RequestSpec]]:
    return [s.turns for s in build_sessions(cfg, PromptBuilder(None), seed)]


def test_workloads_are_repeatable_and_bounded() -> None:
    for kind in ("random", "shared-prefix", "multi-turn", "long-prompt"):
        cfg = WorkloadConfig(kind=kind, num_requests=10, input_len=parse_dist("uniform:3:9"))
        a, b = _words(cfg, 3), _words(cfg, 3)
        assert a == b, kind
        assert sum(len(t) for t in a) == 10, kind
        assert a != _words(cfg, 4), kind


def test_shared_prefix_reuses_system_prompts() -> None:
    cfg = WorkloadConfig(kind="shared-prefix", num_requests=12, num_prefixes=3, prefix_len=20)
    specs = [t[0] for t in _words(cfg)]
    systems = {s.system for s in specs}
    assert len(systems) == 3 and all(len(s.split()) == 20 for s in systems)
    assert len({s.user for s in specs}) == 12


def test_multi_turn_and_long_prompt_shapes() -> None:
    mt = _words(WorkloadConfig(kind="multi-turn", num_requests=7, turns=3))
    assert [len(t) for t in mt] == [3, 3, 1]
    lp = [
        t[0]
        for t in _words(
            WorkloadConfig(
                kind="long-prompt", num_requests=8, long_every=4, long_len=50, long_output=5
            )
        )
    ]
    assert [s.tag for s in lp] == ["short", "short", "short", "long"] * 2
    assert len(lp[3].user.split()) == 50 and lp[3].max_tokens == 5


def test_chat_and_completion_rendering() -> None:
    s = RequestSpec("question", "system text", 8)
    hist = [{"role": "user", "content": "q0"}, {"role": "assistant", "content": "a0"}]
    assert [m["role"] for m in s.chat(hist)] == ["system", "user", "assistant", "user"]
    assert s.completion([]) == "system text\n\nquestion"


def test_replay_reads_jsonl(tmp_path) -> None:
    p = tmp_path / "r.jsonl"
    p.write_text(
        '{"prompt": "hello", "max_tokens": 3}\n\n{"messages": [{"role": "user", "content": "hi"}], "tag": "m"}\n{"user": "u", "system": "s"}\n'
    )
    specs = [
        t[0] for t in _words(WorkloadConfig(kind="replay", num_requests=10, replay_path=str(p)))
    ]
    assert [s.tag for s in specs] == ["replay", "m", "replay"]
    assert specs[0].prompt == "hello" and specs[0].max_tokens == 3
    assert specs[1].messages == ({"role": "user", "content": "hi"},)
    p.write_text('{"nothing": 1}\n')
    with pytest.raises(ValueError, match="r.jsonl:1"):
        _words(WorkloadConfig(kind="replay", replay_path=str(p)))


def test_poisson_arrivals_repeatable() -> None:
    a = arrival_offsets(2000, 10.0, seed=1)
    assert a == arrival_offsets(2000, 10.0, seed=1) and a != arrival_offsets(2000, 10.0, seed=2)
    assert a[0] == 0.0 and all(x <= y for x, y in zip(a, a[1:], strict=False))
    assert 180 < a[-1] < 220  # 2000 arrivals at 10/s take about 200 s
    assert arrival_offsets(3, None, 0) == [0.0, 0.0, 0.0]


def test_comparison_table_ratios() -> None:
    fast = summarize([_req(0.0, [0.1, 0.2], 0.2, out=2)], 1.0)
    slow = summarize([_req(0.0, [0.4, 0.8], 0.8, out=2)], 2.0)
    table = comparison_table({"houchu": {"results": fast}, "llama.cpp": {"results": slow}})
    lines = {line[:30].strip(): line for line in table.splitlines()}
    assert "houchu/llama.cpp" in table.splitlines()[0]
    assert lines["output tokens/s"].endswith("2.00x")  # 2 tok/s vs 1 tok/s
    assert lines["median TTFT (ms)"].endswith("0.25x")  # 100 ms vs 400 ms
    assert "request goodput" not in table  # no objectives: the row is left out
