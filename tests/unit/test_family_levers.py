"""The overlap scheduler and n-gram speculative decoding on every model family beyond
Llama (one variant each; DeepSeek's speculation is in test_model_deepseek.py): greedy
tokens through the scheduler core and ``ModelRunner`` equal transformers' with the
lever on, and the lever really ran (steps planned ahead; drafts proposed and accepted)."""

from __future__ import annotations

import pytest

from houchu.options.batching_options import BatchingOptions
from houchu.options.speculation_options import SpeculativeOptions
from houchu.runner.model_runner import ModelRunner
from houchu.scheduler.core import SchedulerCore
from houchu.speculative.proposers import NgramProposer
from houchu.transport.messages import SamplingParams, TokenizedRequest
from tests.support.deepseek_families import FAMILIES as DEEPSEEK
from tests.support.deepseek_families import MLA
from tests.support.families import hf_greedy, prompt, serve_with_drafts, tiny_family
from tests.support.overlap import drive
from tests.support.qwen_families import FAMILIES as QWEN
from tests.support.runner_options import exact
from tests.support.sliding_families import FAMILIES as SLIDING

MODELS = {
    "qwen2": (QWEN["qwen2"], 7),
    "qwen3_moe": (QWEN["qwen3_moe"], 7),
    "mistral": (SLIDING["mistral"], 5),
    "gemma2": (SLIDING["gemma2"], 5),
    "gemma3_text": ({"tie_word_embeddings": True, **SLIDING["gemma3_text"]}, 5),
    "deepseek_v3": ({**MLA, **DEEPSEEK["deepseek_v3"]}, 11),
}
N = 8  # tokens per request


@pytest.fixture(scope="module", params=list(MODELS))
def family(request, tmp_path_factory):
    """(family, HF dir, GGUF path (None), transformers model) of each family."""
    overrides, seed = MODELS[request.param]
    return tiny_family(tmp_path_factory, request.param, seed=seed, gguf=False, **overrides)


def test_overlapped_scheduling_equals_transformers(family):
    """With the overlap scheduler (the next step planned while one runs), batched and
    chunked, past the sliding windows (8 tokens): transformers' greedy tokens."""
    _, path, _, hf = family
    runner = ModelRunner(str(path), exact(num_pages=64, page_size=4), quiet=True)
    core = SchedulerCore(
        runner.info(), BatchingOptions(max_batch_tokens=12, chunked_prefill_size=5), overlap=True
    )
    greedy = SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True)
    prompts = {"a": prompt(61, 13), "b": prompt(62, 4), "c": prompt(63, 9)}
    for rid, ids in prompts.items():
        core.add(TokenizedRequest(rid=rid, prompt_ids=ids, sampling=greedy, stop_ids=[]))
    got = drive(core, runner, overlap=True)
    for rid, ids in prompts.items():
        assert got[rid][0] == hf_greedy(hf, ids, N), rid
    assert core.overlap.steps_ahead > 0


def test_speculative_ngram_equals_transformers(family):
    """n-gram drafts verified by the target in one pass (windowed, soft-capped, MoE and
    MLA attention over cached KV): transformers' greedy tokens, drafts counted."""
    kind, path, _, hf = family
    if kind.startswith("deepseek"):
        pytest.skip("DeepSeek's speculation: test_model_deepseek.py")
    runner = ModelRunner(str(path), exact(num_pages=96, page_size=4), quiet=True)
    spec = SpeculativeOptions(speculative="ngram", num_speculative_tokens=3)
    core = SchedulerCore(runner.info(), BatchingOptions(max_batch_tokens=48), spec=spec)
    core.spec.controller.choose_k = lambda batch, alpha, cap, probe=False: min(cap, 3)
    greedy = SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True)
    # every id of the vocabulary once: whatever the model decodes, its last token was
    # seen before, so a 1-gram match proposes from the first decode step on
    prompts = {"all": list(range(3, 128)), "mix": prompt(64, 9)}
    out = serve_with_drafts(core, runner, NgramProposer(min_n=1), prompts, greedy)
    for rid, ids in prompts.items():
        assert out[rid] == hf_greedy(hf, ids, N), rid
    stats = core.stats()
    assert stats["spec_proposed_tokens"] > 0, stats
