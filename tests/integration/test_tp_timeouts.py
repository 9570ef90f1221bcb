"""Tensor parallel's timeouts (gloo, 2 ranks of 1 thread, a tiny random Llama), with
the collectives' timeout cut to ``SHORT_S`` seconds (``$HOUCHU_TP_TIMEOUT_S``, which
rank 1 inherits): an idle wait longer than it between two steps leaves both ranks
serving (the other ranks wait for the next plan as long as rank 0 lives); a rank that
hangs or dies is still noticed, within the timeout or at once, with a plain
``TPRankLost`` ("a tensor-parallel rank stopped: ..."), and the group is marked broken.
The failure messages' wording is checked on gloo's own errors."""

from __future__ import annotations

import os
import signal
import time

import pytest

from houchu.devtools.tiny_models import make_tiny_llama
from houchu.runner.model_runner import ModelRunner
from houchu.runner.tensor_parallel.group import TIMEOUT_ENV, TPRankLost, rank_lost
from houchu.transport.messages import SamplingParams, SeqInit, SeqWork, StepPlan
from tests.support.runner_options import exact

pytestmark = pytest.mark.slow

#: the collectives' timeout in these tests, seconds
SHORT_S = 2.0
SP = SamplingParams(temperature=0.0, max_tokens=16)
PROMPT = [5, 17, 99, 3, 42]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("tp_idle"), seed=5, intermediate_size=128)


@pytest.fixture
def tp2(tiny_dir, monkeypatch):
    """A tp 2 runner whose collectives time out after ``SHORT_S`` seconds; closed (its
    rank 1 ended) after the test."""
    monkeypatch.setenv(TIMEOUT_ENV, str(SHORT_S))
    opts = exact(page_size=4, num_pages=16, threads=1, tensor_parallel_size=2)
    runner = ModelRunner(str(tiny_dir), opts, quiet=True)
    assert runner.tp is not None and runner.tp.timeout_s == SHORT_S
    (rank1,) = runner.tp.procs
    yield runner, rank1
    if rank1.poll() is None:
        os.kill(rank1.pid, signal.SIGCONT)  # a test may have stopped it
    runner.close()
    assert rank1.poll() is not None


def _prefill(runner: ModelRunner) -> int:
    plan = StepPlan(
        step_id=0,
        init=[SeqInit(rid="a", sampling=SP, prompt_ids=PROMPT)],
        work=[SeqWork(rid="a", token_ids=PROMPT, start_pos=0, page_table=[0, 1], sample=True)],
    )
    out = runner.execute(plan)
    assert out.error is None, out.error
    return out.outputs[0].token_id


def _decode(runner: ModelRunner, token: int, step_id: int = 1) -> StepPlan:
    w = SeqWork(rid="a", token_ids=[token], start_pos=len(PROMPT), page_table=[0, 1], sample=True)
    return StepPlan(step_id=step_id, work=[w])


def test_an_idle_wait_beyond_the_collective_timeout_keeps_the_ranks(tiny_dir, tp2):
    runner, rank1 = tp2
    token = _prefill(runner)
    time.sleep(2.5 * SHORT_S)  # idle: rank 1 waits for the next plan all this time
    assert rank1.poll() is None, "rank 1 died while idle"
    got = runner.execute(_decode(runner, token))
    assert got.error is None and not runner.tp.broken
    one = ModelRunner(str(tiny_dir), exact(page_size=4, num_pages=16, threads=1), quiet=True)
    ref = one.execute(_decode(one, _prefill(one)))
    assert [o.token_id for o in got.outputs] == [o.token_id for o in ref.outputs]


def test_a_hung_rank_is_noticed_within_the_collective_timeout(tp2):
    runner, rank1 = tp2
    token = _prefill(runner)
    os.kill(rank1.pid, signal.SIGSTOP)  # alive, connection open, never answers
    t0 = time.monotonic()
    with pytest.raises(TPRankLost, match=r"^a tensor-parallel rank stopped: no answer within 2 s$"):
        runner.execute(_decode(runner, token))
    assert time.monotonic() - t0 < SHORT_S + 10
    assert runner.tp.broken


def test_a_dead_rank_is_noticed_at_once(tp2):
    runner, rank1 = tp2
    token = _prefill(runner)
    rank1.kill()
    rank1.wait(10)
    t0 = time.monotonic()
    with pytest.raises(
        TPRankLost, match=r"^a tensor-parallel rank stopped: its connection closed$"
    ):
        runner.execute(_decode(runner, token))
    assert time.monotonic() - t0 < SHORT_S  # the closed connection, not the timeout
    assert runner.tp.broken


@pytest.mark.parametrize(
    ("gloo", "plain"),
    [
        (
            "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read "
            "error [127.0.0.1]:15071: Connection reset by peer. This is typically caused by "
            "a remote worker hanging or bugs in the application. GLHF!",
            "its connection closed",
        ),
        (
            "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
            "Timed out waiting 300000ms for recv operation to complete",
            "no answer within 300 s",
        ),
        ("[/x/gloo/y.cc:1] Something odd happened. More detail", "Something odd happened"),
    ],
)
def test_gloo_errors_read_plainly(gloo, plain):
    lost = rank_lost(RuntimeError(gloo), 300.0)
    assert str(lost) == f"a tensor-parallel rank stopped: {plain}"


def test_a_rank_dead_between_steps_is_named_and_a_hung_one_is_killed(tp2):
    """``dead_rank`` names a rank whose process exited (the runner actor checks it while
    idle); ``kill_ranks`` ends a stopped rank, which no message would reach."""
    from houchu.runner.tensor_parallel.ranks import dead_rank, kill_ranks

    runner, rank1 = tp2
    assert dead_rank(runner.tp) is None
    os.kill(rank1.pid, signal.SIGSTOP)
    assert dead_rank(runner.tp) is None  # stopped is not dead
    kill_ranks(runner.tp)
    assert rank1.poll() == -signal.SIGKILL
    assert dead_rank(runner.tp) == "tensor-parallel rank 1 exited (status -9)"
