"""MTP speculation (``--speculative mtp``): a tiny random DeepSeek-V3 with one
next-token-prediction module written into its safetensors (``add_mtp_layer``: transformers
writes none), proposing inside the model runner (``houchu.speculative.mtp.MTPDrafter``, from the
runner's own final hidden states) and verified by the target through the scheduler."""

from __future__ import annotations

import json

import pytest
import torch

from houchu.actors.launcher import active_actors
from houchu.devtools.tiny_models import (
    add_mtp_layer,
    make_mtp_exact,
    make_tiny_llama,
    make_tiny_model,
)
from houchu.model.llama import LlamaModel
from houchu.model.mtp import MTPUnavailable, load_mtp_tensors, mtp_layer_index
from houchu.options.batching_options import BatchingOptions
from houchu.options.serve_config import ServeConfig
from houchu.options.speculation_options import SpeculativeOptions
from houchu.runner.model_runner import ModelRunner
from houchu.scheduler.core import SchedulerCore
from houchu.scheduler.telemetry_sink import NullTelemetry
from houchu.speculative.mtp import attach_mtp
from houchu.transport.messages import SamplingParams, SeqInit, SeqWork, StepPlan
from houchu.transport.telemetry import LeverSample
from tests.support.deepseek_families import FAMILIES, MLA, runner_greedy
from tests.support.families import prompt, serve_with_drafts
from tests.support.runner_options import exact

pytestmark = pytest.mark.slow

CFG = {**MLA, **FAMILIES["deepseek_v3"], "num_hidden_layers": 2}
N_NEW = 12
GREEDY = SamplingParams(temperature=0.0, max_tokens=N_NEW, ignore_eos=True)


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory):
    """A tiny DeepSeek-V3 folder with a random MTP module as layer 2."""
    path = make_tiny_model(tmp_path_factory.mktemp("dsv3-mtp"), "deepseek_v3", seed=11, **CFG)
    return add_mtp_layer(path, seed=11, **CFG)


@pytest.fixture(scope="module")
def bigram_model(tmp_path_factory, mtp_model):
    """The same model made a bigram model whose MTP module predicts the target's own
    next token (``make_mtp_exact``): every greedy proposal is the target's token."""
    return make_mtp_exact(mtp_model, tmp_path_factory.mktemp("dsv3-mtp-bigram"))


def mtp_runner(path, k: int = 3, num_pages: int = 64) -> ModelRunner:
    """An exact runner of ``path`` with its MTP proposer attached (``k`` at most)."""
    runner = ModelRunner(str(path), exact(num_pages=num_pages, page_size=4), quiet=True)
    attach_mtp(runner, str(path), k)
    return runner


class Levers(NullTelemetry):
    """Keeps the scheduler's lever samples."""

    def __init__(self) -> None:
        self.samples: list[LeverSample] = []

    def lever(self, sample: LeverSample) -> None:
        self.samples.append(sample)


def speculate(path, prompts: dict[str, list[int]], k: int = 3):
    """Serve ``prompts`` greedily through the scheduler with in-runner MTP proposals (k
    per step), prefill chunked by 4: (tokens per request, the scheduler's speculation
    stats, the runner, the scheduler's lever samples)."""
    runner = mtp_runner(path, k)
    spec = SpeculativeOptions(speculative="mtp", num_speculative_tokens=k)
    levers = Levers()
    batching = BatchingOptions(max_batch_tokens=48, chunked_prefill_size=4)
    core = SchedulerCore(runner.info(), batching, telemetry=levers, spec=spec)
    core.spec.controller.choose_k = lambda batch, alpha, cap, probe=False: min(cap, k)
    out = serve_with_drafts(core, runner, None, prompts, GREEDY)
    return out, core.stats(), runner, levers.samples


PROMPTS = {"a": prompt(51, 9), "b": prompt(52, 5), "rep": [5, 6, 7, 8, 9] * 3}


def test_mtp_speculation_gives_the_plain_greedy_tokens(mtp_model):
    """Random MTP weights: proposals are mostly rejected, the tokens are the plain
    path's, and every proposal is counted (accepted + rejected = proposed)."""
    out, stats, runner, _ = speculate(mtp_model, PROMPTS)
    for rid, p in PROMPTS.items():
        assert out[rid] == runner_greedy(mtp_model, p, N_NEW), rid
    assert stats["speculative"] == "mtp"
    assert stats["spec_proposed_tokens"] > 0
    assert stats["spec_verify_steps"] > 0
    assert (
        stats["spec_accepted_tokens"] + stats["spec_rejected_tokens"]
        == stats["spec_proposed_tokens"]
    )
    assert stats["spec_draft_s"] > 0  # the runner's MTP passes, the ledger's spent side
    assert runner.mtp.pending == {} and runner.mtp.num_passes > 0


def test_mtp_proposals_of_a_bigram_model_are_all_accepted(bigram_model):
    """An MTP module that computes the target's own next-token distribution: every
    proposal is accepted (this fails if the MTP layer pairs the wrong hidden state with
    the wrong token, or its concatenation order, norms or chaining are off)."""
    out, stats, _, samples = speculate(bigram_model, PROMPTS)
    for rid, p in PROMPTS.items():
        assert out[rid] == runner_greedy(bigram_model, p, N_NEW), rid
    assert stats["spec_proposed_tokens"] > 0
    assert stats["spec_accepted_tokens"] == stats["spec_proposed_tokens"]
    # the ledger counts them under the MTP lever: forward passes saved per request
    saved = [s for s in samples if s.lever == "mtp" and s.saved_unit == "forward_passes"]
    assert {s.rid for s in saved} == set(PROMPTS)
    assert sum(s.saved for s in saved) == stats["spec_forward_passes_saved"] > 0
    assert stats["spec_verify_steps"] < len(PROMPTS) * N_NEW / 2  # fewer target passes


def _step(runner: ModelRunner, step_id: int, work: list[SeqWork], init=()) -> dict:
    """Execute one plan; the result's proposals (rid -> tokens) and emitted tokens."""
    res = runner.execute(StepPlan(step_id=step_id, work=work, init=list(init)))
    assert res.error is None
    return {"proposals": res.proposals, "tokens": [o.token_id for o in res.outputs]}


def _mtp_kv(runner: ModelRunner, n: int) -> torch.Tensor:
    """The MTP layer's latent KV of positions ``0 .. n - 1`` (pages 0, 1, ... in order):
    ``[n, latent]``."""
    kv = runner.mtp.pool.kv[0]  # [pages, page_size, latent]
    return kv.reshape(-1, kv.shape[-1])[:n]


def _fresh(path, ids: list[int]) -> tuple[dict, torch.Tensor]:
    """A fresh MTP runner's proposals (k = 3) after prefilling ``ids`` in one step, and
    its MTP KV of the positions of ``ids`` (each paired with the token after it)."""
    runner = mtp_runner(path, num_pages=32)
    init = [SeqInit(rid="r", sampling=GREEDY, prompt_ids=ids)]
    w = SeqWork(rid="r", token_ids=ids, start_pos=0, page_table=list(range(8)), sample=True)
    w.num_propose = 3
    return _step(runner, 1, [w], init), _mtp_kv(runner, len(ids))


def _assert_same(runner: ModelRunner, got: dict, path, ids: list[int]) -> None:
    """``got`` (a step's proposals) and ``runner``'s MTP KV are a fresh runner's."""
    want, kv = _fresh(path, ids)
    assert got["proposals"] == want["proposals"]
    torch.testing.assert_close(_mtp_kv(runner, len(ids)), kv, rtol=1e-5, atol=1e-6)


def test_incremental_proposals_equal_proposals_from_scratch(mtp_model):
    """The MTP layer's KV built step by step in the runner (prefill chunks that carry
    their last row over to the next chunk, a decode step, a verify step with one proposal
    accepted and one rejected) gives the proposals a fresh runner makes from the whole
    sequence in one pass, and the same MTP KV at every true position: no row is missing,
    paired wrongly or left stale."""
    ids = prompt(61, 11)
    ref = runner_greedy(mtp_model, ids, 4)
    runner, pages = mtp_runner(mtp_model, num_pages=32), list(range(8))
    init = [SeqInit(rid="r", sampling=GREEDY, prompt_ids=ids)]
    chunks = [(0, 4), (4, 8), (8, 11)]
    for step_id, (a, b) in enumerate(chunks, 1):
        w = SeqWork(rid="r", token_ids=ids[a:b], start_pos=a, page_table=pages, sample=b == 11)
        w.num_propose = 3 if b == 11 else 0
        got = _step(runner, step_id, [w], init if a == 0 else ())
    assert got["tokens"] == ref[:1]
    assert len(got["proposals"]["r"]) == 3
    _assert_same(runner, got, mtp_model, ids)
    # a decode step
    w = SeqWork(rid="r", token_ids=ref[:1], start_pos=11, page_table=pages, sample=True)
    w.num_propose = 3
    got = _step(runner, 4, [w])
    _assert_same(runner, got, mtp_model, ids + ref[:1])
    # a verify step: ref[2] accepted, a wrong proposal rejected, ref[3] emitted instead
    wrong = (ref[3] + 1) % 128
    w = SeqWork(
        rid="r", token_ids=[ref[1], ref[2], wrong], start_pos=12, page_table=pages, sample=True
    )
    w.num_draft, w.num_propose = 2, 3
    got = _step(runner, 5, [w])
    assert got["tokens"] == ref[2:4]
    _assert_same(runner, got, mtp_model, ids + ref[:3])


def test_mtp_runs_in_the_runner_without_a_second_target(mtp_model):
    """No draft actor is started for "mtp" (it is for "ngram"), and the runner's MTP
    proposer holds no model of its own: it runs the runner's model, and the weights it
    adds are no more than the checkpoint's MTP module (one block and a head)."""
    spec = SpeculativeOptions(speculative="mtp")
    assert "draft" not in active_actors(ServeConfig(model=str(mtp_model), speculation=spec))
    ngram = SpeculativeOptions(speculative="ngram")
    assert "draft" in active_actors(ServeConfig(model=str(mtp_model), speculation=ngram))
    runner = mtp_runner(mtp_model)
    drafter = runner.mtp
    assert drafter.model is runner.model
    assert not any(isinstance(m, LlamaModel) for m in drafter.mtp.modules())
    shared = {p.data_ptr() for p in runner.model.parameters()}
    own = sum(p.numel() for p in drafter.mtp.parameters() if p.data_ptr() not in shared)
    module = load_mtp_tensors(mtp_model, 2, torch.float32)  # the checkpoint's layer 2
    assert 0 < own <= sum(t.numel() for t in module.values()) < runner.num_params
    assert drafter.pool.num_layers == 1


def test_checkpoints_without_mtp_layers_fail_at_startup(tmp_path, mtp_model):
    """No MTP module: a clear error naming what is missing."""
    llama = make_tiny_llama(tmp_path / "llama")
    runner = ModelRunner(str(llama), exact(), quiet=True)
    with pytest.raises(MTPUnavailable, match="declares no num_nextn_predict_layers"):
        attach_mtp(runner, str(llama), 2)
    # DeepSeek-V3 as transformers saves it: the config declares one, the weights lack it
    dsv3 = make_tiny_model(tmp_path / "dsv3", "deepseek_v3", **CFG)
    assert json.loads((dsv3 / "config.json").read_text())["num_nextn_predict_layers"] == 1
    with pytest.raises(MTPUnavailable, match="model.layers.2.eh_proj.weight"):
        attach_mtp(ModelRunner(str(dsv3), exact(), quiet=True), str(dsv3), 2)
    assert mtp_layer_index(mtp_model) == 2
    assert runner.mtp is None


@pytest.mark.parametrize("kind", ["gguf", "no-mtp-folder"])
def test_serve_refuses_mtp_without_mtp_layers_before_loading(tmp_path, kind):
    """``houchu serve --speculative mtp`` on a GGUF file or a checkpoint without MTP
    layers: one line and exit 2 before any actor starts (it loaded the whole model and
    ended in a traceback before)."""
    import subprocess
    import sys

    if kind == "gguf":
        model = tmp_path / "m.gguf"
        model.touch()
    else:
        model = make_tiny_llama(tmp_path / "llama")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "houchu.cli",
            "serve",
            "--model",
            str(model),
            "--speculative",
            "mtp",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "mtp" in out.stderr.lower()
    assert out.stdout == ""  # no actor was started
