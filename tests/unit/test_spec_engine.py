"""Speculative decoding end to end in one process (scheduler core, runner, proposer; no
sockets) on tiny random models: greedy output is the same with speculation off, with
n-gram proposals, with the target as its own draft (everything accepted) and with a
draft that is always wrong; the draft model's KV is rolled back correctly."""

from __future__ import annotations

import pytest

from houchu.devtools.tiny_models import make_tiny_llama
from houchu.options.batching_options import BatchingOptions
from houchu.options.speculation_options import SpeculativeOptions
from houchu.runner.model_runner import ModelRunner
from houchu.scheduler.core import SchedulerCore
from houchu.speculative.draft_model import DraftModelProposer
from houchu.speculative.proposers import NgramProposer
from houchu.text.stop import stop_ids
from houchu.transport.messages import SamplingParams, TokenizedRequest
from houchu.transport.spec_messages import DraftProposal, DraftReply, DraftSeq
from tests.support.runner_options import exact
from tests.support.scheduler import check_page_tables

VOCAB = 128
PROMPTS = {
    "rep": [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6],
    "mix": [1, 17, 33, 90, 4, 4, 61],
    "long": [3 + (i * 7) % 100 for i in range(40)],
    "short": [42],
}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("target"), seed=3)


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("other"), seed=99)


def new_runner(path, num_pages: int = 64) -> ModelRunner:
    return ModelRunner(str(path), exact(page_size=4, num_pages=num_pages), quiet=True)


def serve(target, proposer, num_pages: int = 64, max_tokens: int = 24):
    """Run every prompt to completion, all in one batch; returns (tokens, core)."""
    runner = new_runner(target, num_pages)
    spec = (
        SpeculativeOptions(speculative="draft", num_speculative_tokens=4)
        if proposer is not None
        else None
    )
    batch = BatchingOptions(max_batch_tokens=48, chunked_prefill_size=16, max_running_requests=8)
    core = SchedulerCore(runner.info(), batch, spec=spec)
    if spec is not None:  # always the most proposals: the costs of a tiny model are noise
        core.spec.controller.choose_k = lambda batch, alpha, cap, probe=False: min(cap, 4)
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for rid, p in PROMPTS.items():
        stops = stop_ids(greedy, [2])  # ignore_eos: none
        core.add(TokenizedRequest(rid=rid, prompt_ids=p, sampling=greedy, stop_ids=stops))
    out: dict[str, list[int]] = {rid: [] for rid in PROMPTS}
    for _ in range(500):
        if not core.has_work:
            break
        if (dr := core.draft_request()) is not None:
            proposer.release(dr.release)
            props = proposer.propose(dr.seqs)
            reply = [DraftProposal(r, ids) for r, ids in props.items()]
            core.attach_drafts(DraftReply(query_id=dr.query_id, proposals=reply), 0.0)
        plan = core.next_plan()
        if plan is not None:
            for ev in core.apply(runner.execute(plan)):
                out[ev.rid] += ev.token_ids
        check_page_tables(core)
        if proposer is not None and (rel := core.spec.release_request()) is not None:
            proposer.release(rel.release)
    assert not core.has_work
    return out, core


@pytest.fixture(scope="module")
def plain(target):
    out, _ = serve(target, None)
    assert all(len(t) == 24 for t in out.values())
    return out


def test_ngram_proposals_keep_greedy_output(target, plain):
    proposer = NgramProposer()
    out, core = serve(target, proposer)
    assert out == plain
    assert core.stats()["spec_accepted_tokens"] > 0
    assert proposer.num_seqs == 0


def test_target_as_its_own_draft_accepts_everything(target, plain):
    proposer = DraftModelProposer(new_runner(target), VOCAB)
    out, core = serve(target, proposer)
    assert out == plain
    st = core.stats()
    assert st["spec_proposed_tokens"] > 20 and st["spec_acceptance_rate"] == 1.0
    assert st["spec_mean_acceptance_length"] > 3
    assert proposer.num_seqs == 0 and proposer.pool_usage()[0] == 0


def test_a_bad_draft_is_rejected_and_changes_nothing(target, other, plain):
    proposer = DraftModelProposer(new_runner(other), VOCAB)
    out, core = serve(target, proposer)
    assert out == plain
    st = core.stats()
    assert st["spec_proposed_tokens"] > 20 and st["spec_acceptance_rate"] < 0.3
    assert proposer.pool_usage()[0] == 0


def test_preemption_under_page_pressure_keeps_output(target, plain):
    proposer = DraftModelProposer(new_runner(target, num_pages=12), VOCAB)
    out, core = serve(target, proposer, num_pages=30)
    assert out == plain and core.batcher.num_preemptions > 0


def greedy_continuation(path, tokens: list[int], k: int) -> list[int]:
    fresh = DraftModelProposer(new_runner(path), VOCAB)
    return fresh.propose([DraftSeq("x", 0, tokens, k)])["x"]


def test_draft_kv_is_rolled_back_on_rejection(target):
    prompt = PROMPTS["mix"]
    p = DraftModelProposer(new_runner(target), VOCAB)
    g = p.propose([DraftSeq("a", 0, prompt, 3)])["a"]
    assert g == greedy_continuation(target, prompt, 3)
    seq = p.seqs["a"]
    assert seq.num_computed == len(prompt) + 2 and len(seq.tokens) == len(prompt) + 3
    x = (g[1] + 1) % VOCAB  # the target took g[0], then something else
    again = p.propose([DraftSeq("a", len(prompt), [g[0], x], 3)])["a"]
    assert again == greedy_continuation(target, [*prompt, g[0], x], 3)
    p.release(["a"])
    assert p.pool_usage()[0] == 0 and p.num_seqs == 0


def test_full_draft_pool_evicts_the_least_recently_used(target):
    p = DraftModelProposer(new_runner(target, num_pages=6), VOCAB)  # 24 positions
    a, b = PROMPTS["mix"], PROMPTS["rep"]
    p.propose([DraftSeq("a", 0, a, 2)])
    out = p.propose([DraftSeq("b", 0, b, 3)])  # needs 5 pages: "a" loses its KV
    assert out["b"] == greedy_continuation(target, b, 3)
    assert p.seqs["a"].num_computed == 0 and p.seqs["a"].pages == []
    out = p.propose([DraftSeq("a", len(a), [], 2)])  # recomputed from its tokens
    assert out["a"] == greedy_continuation(target, a, 2)
    used, total = p.pool_usage()
    assert used <= total == 6
