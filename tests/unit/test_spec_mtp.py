"""MTP speculation (``--speculative mtp``): a tiny random DeepSeek-V3 with one
next-token-prediction module written into its safetensors (``add_mtp_layer``: transformers
writes none), proposing through ``houchu.spec.mtp.MTPProposer`` and verified by the
target through the scheduler."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from houchu.model.model_runner import ModelRunner
from houchu.model.mtp import MTPUnavailable, mtp_layer_index
from houchu.model.testing import add_mtp_layer, make_tiny_llama, make_tiny_model
from houchu.options.batching_options import BatchingOptions
from houchu.options.speculation_options import SpeculativeOptions
from houchu.scheduler.core import SchedulerCore
from houchu.scheduler.telemetry_sink import NullTelemetry
from houchu.spec.mtp import make_mtp_proposer
from houchu.transport.messages import SamplingParams
from houchu.transport.spec_messages import DraftSeq
from houchu.transport.telemetry import LeverSample
from tests.family_helpers import prompt, serve_with_drafts
from tests.runner_options import exact
from tests.unit.test_model_deepseek import FAMILIES, MLA, runner_greedy

CFG = {**MLA, **FAMILIES["deepseek_v3"], "num_hidden_layers": 2}
N_NEW = 12


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory):
    """A tiny DeepSeek-V3 folder with a random MTP module as layer 2."""
    path = make_tiny_model(tmp_path_factory.mktemp("dsv3-mtp"), "deepseek_v3", seed=11, **CFG)
    return add_mtp_layer(path, seed=11, **CFG)


@pytest.fixture(scope="module")
def bigram_model(tmp_path_factory, mtp_model):
    """The same model made a bigram model: every block's attention output and MLP
    (dense, routed and shared experts) zeroed, so the target's final hidden state at i is
    norm(embed(t_i)); its MTP module is made to compute exactly that for the next token
    (``eh_proj`` = [I, 0] keeps the token half, a zeroed block passes it through, its
    head norm is the target's final norm), so every proposal is the target's greedy
    token."""
    out = tmp_path_factory.mktemp("dsv3-mtp-bigram")
    for f in ("config.json",):
        (out / f).write_text((mtp_model / f).read_text())
    w = load_file(str(mtp_model / "model.safetensors"))
    for name, t in w.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            w[name] = torch.zeros_like(t)
    n, h = CFG["num_hidden_layers"], CFG.get("hidden_size", 64)
    p = f"model.layers.{n}."
    w[f"{p}enorm.weight"] = torch.ones(h)
    w[f"{p}eh_proj.weight"] = torch.cat([torch.eye(h), torch.zeros(h, h)], 1)
    w[f"{p}shared_head.norm.weight"] = w["model.norm.weight"].clone()
    save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


class Levers(NullTelemetry):
    """Keeps the scheduler's lever samples."""

    def __init__(self) -> None:
        self.samples: list[LeverSample] = []

    def lever(self, sample: LeverSample) -> None:
        self.samples.append(sample)


def speculate(path, prompts: dict[str, list[int]], k: int = 3):
    """Serve ``prompts`` greedily through the scheduler with MTP proposals (k per step):
    (tokens per request, the scheduler's speculation stats, the proposer, the
    scheduler's lever samples)."""
    runner = ModelRunner(str(path), exact(num_pages=64, page_size=4), quiet=True)
    proposer, _ = make_mtp_proposer(str(path), exact(num_pages=64, page_size=4))
    spec = SpeculativeOptions(speculative="mtp", num_speculative_tokens=k)
    levers = Levers()
    core = SchedulerCore(
        runner.info(), BatchingOptions(max_batch_tokens=48), telemetry=levers, spec=spec
    )
    core.spec.controller.choose_k = lambda batch, alpha, cap, probe=False: min(cap, k)
    greedy = SamplingParams(temperature=0.0, max_tokens=N_NEW, ignore_eos=True)
    out = serve_with_drafts(core, runner, proposer, prompts, greedy)
    return out, core.stats(), proposer, levers.samples


PROMPTS = {"a": prompt(51, 9), "b": prompt(52, 5), "rep": [5, 6, 7, 8, 9] * 3}


def test_mtp_speculation_gives_the_plain_greedy_tokens(mtp_model):
    """Random MTP weights: proposals are mostly rejected, the tokens are the plain
    path's, and every proposal is counted (accepted + rejected = proposed)."""
    out, stats, proposer, _ = speculate(mtp_model, PROMPTS)
    for rid, p in PROMPTS.items():
        assert out[rid] == runner_greedy(mtp_model, p, N_NEW), rid
    assert stats["speculative"] == "mtp"
    assert stats["spec_proposed_tokens"] > 0
    assert stats["spec_verify_steps"] > 0
    assert (
        stats["spec_accepted_tokens"] + stats["spec_rejected_tokens"]
        == stats["spec_proposed_tokens"]
    )
    assert proposer.num_seqs == 0 and proposer.pool_usage()[0] == 0  # all released


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


def test_incremental_proposals_equal_proposals_from_scratch(mtp_model):
    """A proposer fed a sequence a few tokens at a time (its own KV and saved hidden
    state reused, chained rows overwritten) proposes what a fresh one proposes from the
    whole sequence at once; a rewrite of computed tokens starts that request over."""
    opts = exact(num_pages=32, page_size=4)
    kept, _ = make_mtp_proposer(str(mtp_model), opts)
    ids = prompt(61, 7) + prompt(62, 9)
    for end in (7, 8, 11, 16):
        start = len(kept.seqs["r"].tokens) if "r" in kept.seqs else 0
        got = kept.propose([DraftSeq("r", start, ids[start:end], 3)])["r"]
        fresh, _ = make_mtp_proposer(str(mtp_model), opts)
        assert got == fresh.propose([DraftSeq("r", 0, ids[:end], 3)])["r"], end
        assert len(got) == 3
    other = ids[:10] + [7, 7, 7]  # tokens 10.. rewritten: recomputed from scratch
    got = kept.propose([DraftSeq("r", 10, other[10:], 2)])["r"]
    fresh, _ = make_mtp_proposer(str(mtp_model), opts)
    assert got == fresh.propose([DraftSeq("r", 0, other, 2)])["r"]


def test_checkpoints_without_mtp_layers_fail_at_startup(tmp_path, mtp_model):
    """No MTP module: a clear error naming what is missing, before any weight loads."""
    llama = make_tiny_llama(tmp_path / "llama")
    with pytest.raises(MTPUnavailable, match="declares no num_nextn_predict_layers"):
        make_mtp_proposer(str(llama), exact())
    # DeepSeek-V3 as transformers saves it: the config declares one, the weights lack it
    dsv3 = make_tiny_model(tmp_path / "dsv3", "deepseek_v3", **CFG)
    assert json.loads((dsv3 / "config.json").read_text())["num_nextn_predict_layers"] == 1
    with pytest.raises(MTPUnavailable, match="model.layers.2.eh_proj.weight"):
        make_mtp_proposer(str(dsv3), exact())
    assert mtp_layer_index(mtp_model) == 2
