"""The per-token breakdown (``houchu.api.token_path``): its arithmetic on made-up stamps
(the cycle's components sum to the time between two step ends, whichever way the next
plan reached the runner), the window's summary, the stamps' trip through the codec and
the table."""

from __future__ import annotations

import msgspec
import pytest

from houchu.api.token_path import (
    CYCLE,
    DELIVERY,
    FIELDS,
    TokenPathStats,
    breakdown,
    format_table,
    summarize,
)
from houchu.transport.messages import TextDelta, TokenBatch, TokenEvent, TokenizerInbox
from houchu.transport.token_path import StepStamps

T = 1_700_000_000.0  # a wall-clock origin, seconds


def _step(step_id: int, start: float, plan_sent: float, plan_received: float) -> StepStamps:
    """Stamps of one step started at ``T + start`` (ms offsets), run 6 ms (5 forward, 0.25
    sampling), then handed on at fixed gaps to the client."""
    ms = 1e-3
    s = StepStamps(
        step_id=step_id,
        plan_sent=T + plan_sent * ms,
        plan_received=T + plan_received * ms,
        step_started=T + start * ms,
        step_s=6 * ms,
        forward_s=5 * ms,
        sample_s=0.25 * ms,
    )
    end = start + 6
    s.result_sent = T + (end + 0.1) * ms
    s.result_received = T + (end + 0.4) * ms
    s.tokens_sent = T + (end + 0.5) * ms
    s.tokenizer_received = T + (end + 0.8) * ms
    s.tokenizer_sent = T + (end + 0.9) * ms
    s.gateway_received = T + (end + 1.2) * ms
    s.written = T + (end + 1.5) * ms
    return s


def _ms(sample: dict[str, float]) -> dict[str, float]:
    """Milliseconds to the microsecond (wall-clock floats near T hold about 0.2 µs)."""
    return {k: round(v * 1e3, 3) for k, v in sample.items()}


def test_serial_cycle_is_every_part_in_turn() -> None:
    """Planned after the result came back: step 1 ends at 6 ms; the result leaves at 6.1,
    reaches the scheduler at 6.4, its tokens leave at 6.5; the next plan leaves at 6.8,
    reaches the runner at 7.0 and starts at 7.2."""
    prev = _step(1, 0.0, -1.0, -0.5)
    cur = _step(2, 7.2, 6.8, 7.0)
    got = _ms(breakdown(prev, cur))
    assert got["forward"] == 5.0 and got["sampling"] == 0.25 and got["step_other"] == 0.75
    assert got["runner_out"] == 0.1 and got["hop_runner_scheduler"] == 0.3
    assert got["scheduler_apply"] == 0.1 and got["scheduler_plan"] == 0.3
    assert got["hop_scheduler_runner"] == 0.2 and got["runner_in"] == 0.2
    assert got["cycle"] == 7.2  # 13.2 - 6.0
    assert sum(got[k] for k in CYCLE) == pytest.approx(got["cycle"])
    assert got["itl"] == 7.2  # the writes are as far apart as the step ends
    assert got["latency"] == 1.5
    before = got["runner_out"] + got["hop_runner_scheduler"] + got["scheduler_apply"]
    assert sum(got[k] for k in DELIVERY) + before == pytest.approx(got["latency"])


def test_planned_ahead_puts_the_scheduler_off_the_cycle() -> None:
    """The next plan left at 3 ms, while step 1 ran; the runner took it at 6.3 ms (after
    sending step 1's result at 6.1) and started it at 6.4."""
    prev = _step(1, 0.0, -1.0, -0.5)
    cur = _step(2, 6.4, 3.0, 6.3)
    got = _ms(breakdown(prev, cur))
    assert got["runner_out"] == 0.1
    assert got["hop_scheduler_runner"] == 0.2  # result sent -> the waiting plan taken
    assert got["runner_in"] == 0.1
    for k in ("hop_runner_scheduler", "scheduler_apply", "scheduler_plan"):
        assert got[k] == 0.0
    assert sum(got[k] for k in CYCLE) == pytest.approx(got["cycle"]) and got["cycle"] == 6.4


def test_plan_taken_during_the_step_is_all_runner_in() -> None:
    """The runner took the next plan at 4 ms, while step 1 ran (a pipelined runner):
    the gap from step 1's end (6 ms) to step 2's start (6.05) is the runner's alone."""
    prev = _step(1, 0.0, -1.0, -0.5)
    cur = _step(2, 6.05, 3.0, 4.0)
    got = _ms(breakdown(prev, cur))
    assert got["runner_in"] == 0.05
    assert all(
        got[k] == 0.0 for k in CYCLE if k not in ("forward", "sampling", "step_other", "runner_in")
    )
    assert sum(got[k] for k in CYCLE) == pytest.approx(got["cycle"])


def test_no_sample_across_a_gap_or_without_stamps() -> None:
    prev = _step(1, 0.0, -1.0, -0.5)
    assert breakdown(prev, _step(3, 14.0, 13.0, 13.5)) is None  # step 2 released no text
    cur = _step(2, 7.2, 6.8, 7.0)
    cur.written = 0.0  # never written
    assert breakdown(prev, cur) is None


def test_window_pairs_each_request_and_summarizes_after_a_mark() -> None:
    stats = TokenPathStats(window=3)
    steps = [_step(i, 7.2 * i, 7.2 * i - 0.4, 7.2 * i - 0.2) for i in range(1, 6)]
    stats.written("a", steps[0])  # a request's first delta: nothing to pair with
    assert stats.stats()["samples"] == 0
    for s in steps[1:]:
        stats.written("a", s)
    st = stats.stats()
    assert st["samples"] == 3 and st["last_sample"] == 4  # the window keeps the latest 3
    comps = st["components"]
    assert set(comps) == set(FIELDS)
    assert comps["itl"]["share"] == pytest.approx(1.0)
    assert comps["forward"]["mean_ms"] == pytest.approx(5.0)
    assert comps["forward"]["share"] == pytest.approx(5.0 / 7.2)
    assert stats.stats(since=3)["samples"] == 1  # only sample 4
    stats.written("b", _step(9, 0.0, -1.0, -0.5))
    stats.written("b", _step(11, 9.0, 8.0, 8.5))  # not the next step: unpaired
    assert stats.stats()["unpaired"] == 1
    stats.forget("a")
    stats.written("a", steps[0])  # starts afresh: no pair with step 5
    assert stats.stats()["last_sample"] == 4


def test_summary_quantiles() -> None:
    rows = [dict.fromkeys(FIELDS, 0.0) | {"forward": f, "itl": 0.01} for f in (1e-3, 2e-3, 3e-3)]
    got = summarize(rows)["forward"]
    assert got["mean_ms"] == pytest.approx(2.0) and got["p50_ms"] == pytest.approx(2.0)
    assert got["p90_ms"] == pytest.approx(2.8) and got["share"] == pytest.approx(0.2)
    assert summarize([]) == {}


def test_stamps_travel_with_tokens_and_deltas() -> None:
    stamps = _step(3, 1.0, 0.5, 0.7)
    batch = TokenBatch([TokenEvent(rid="r", token_ids=[1])], stamps)
    assert msgspec.msgpack.Decoder(TokenizerInbox).decode(msgspec.msgpack.encode(batch)) == batch
    delta = TextDelta(rid="r", text="x", stamps=stamps)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(delta), type=TextDelta) == delta
    old = TokenBatch([TokenEvent(rid="r", token_ids=[1])])  # a batch of no step: no stamps
    assert msgspec.msgpack.Decoder(TokenizerInbox).decode(msgspec.msgpack.encode(old)) == old


def test_table_has_a_row_per_field() -> None:
    stats = TokenPathStats()
    stats.written("a", _step(1, 0.0, -1.0, -0.5))
    stats.written("a", _step(2, 7.2, 6.8, 7.0))
    table = format_table(stats.stats()["components"])
    assert "model forward (runner)" in table and "hop scheduler -> tokenizer" in table
    assert len(table.splitlines()) == 2 + 2 + len(FIELDS)  # header, rule, 2 group titles
