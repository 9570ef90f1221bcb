"""Mistral (sliding window) and Gemma 2/3 (local and global layers, (1 + w) norms,
scaled embedding, soft-capping, QK-norm, a RoPE base per layer type) against
transformers' own classes, with prompts longer than the window: tiny random models from
``AutoModelForCausalLM.from_config``, loaded from the Hugging Face directory and from the
GGUF llama.cpp's converter would write; greedy tokens through the scheduler core and the
runner's CPU kernels with batching, chunked prefill and a prefix-cache hit; pages outside
the window released; quantized top-1 agreement."""

from __future__ import annotations

import pytest
import torch

from houchu.bench.texts import QUALITY_EN
from houchu.model.config.core import num_parameters
from houchu.model.config.load import load_model_config
from houchu.model.quant.functions import QuantSpec
from houchu.model.quant.quality import agreement, text_logprobs
from houchu.model.weights.loader import load_model
from houchu.options.batching_options import BatchingOptions
from houchu.runner.model_runner import ModelRunner
from houchu.scheduler.core import SchedulerCore
from houchu.transport.messages import SamplingParams, TokenizedRequest
from tests.support.families import (
    ATOL,
    Runner,
    assert_chunked_logits_match,
    hf_greedy,
    hf_logits,
    prompt,
    tiny_family,
)
from tests.support.overlap import drive
from tests.support.runner_options import exact
from tests.support.sliding_families import FAMILIES, WINDOW

TIED = {"gemma3_text"}
TEXT = QUALITY_EN.read_text()


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(family, HF dir, GGUF path or None, transformers model)."""
    name = request.param
    config = {"tie_word_embeddings": name in TIED, **FAMILIES[name]}
    return tiny_family(tmp_path_factory, name, seed=5, gguf=name != "gemma2", **config)


def test_config_and_param_count(family):
    kind, path, gguf_path, hf = family
    c = hf.config
    for p in (path, gguf_path) if gguf_path else (path,):
        cfg = load_model_config(p)
        assert cfg.architecture == kind
        assert cfg.sliding_window == WINDOW
        kinds = getattr(c, "layer_types", None) or ["sliding_attention"] * c.num_hidden_layers
        assert cfg.sliding_layers == tuple(
            i for i, t in enumerate(kinds) if t == "sliding_attention"
        )
        assert cfg.every_layer_windowed == (kind == "mistral")
        assert cfg.gemma_blocks == kind.startswith("gemma")
        assert cfg.tie_word_embeddings == c.tie_word_embeddings
        if kind.startswith("gemma"):
            assert cfg.attn_scale == pytest.approx(c.query_pre_attn_scalar**-0.5)
            assert cfg.attn_softcap == (c.attn_logit_softcapping or 0.0)
            assert cfg.final_softcap == (c.final_logit_softcapping or 0.0)
        assert num_parameters(cfg).total == sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_prefill_and_decode_logits_match_transformers(family, source):
    """29 tokens over a window of 8: prefill chunks, then decode steps (torch backend)."""
    _, path, gguf_path, hf = family
    if source == "gguf" and gguf_path is None:
        pytest.skip("GGUF has no query_pre_attn_scalar (llama.cpp scales by head_dim)")
    with torch.inference_mode():
        model = load_model(path if source == "hf" else gguf_path)
    assert_chunked_logits_match(Runner(model, seed=1), hf)


def test_batched_logits_match_transformers(family):
    """Sequences of different lengths in one step: decode rows past and within the
    window, beside a prefill chunk."""
    _, path, _, hf = family
    with torch.inference_mode():
        model = load_model(path)
    seqs = {"a": prompt(1, 23), "b": prompt(2, 6), "c": prompt(4, 15)}
    want = {rid: hf_logits(hf, ids) for rid, ids in seqs.items()}
    r = Runner(model, seed=2)
    r.step([("a", seqs["a"][:22], 0), ("b", seqs["b"][:5], 0)])
    got = r.step([("a", seqs["a"][22:], 22), ("b", seqs["b"][5:], 5), ("c", seqs["c"], 0)])
    for i, rid in enumerate(seqs):
        torch.testing.assert_close(got[i], want[rid][-1], atol=ATOL, rtol=0)


def _serve(runner: ModelRunner, batches: list[dict[str, list[int]]], n: int, **batching):
    """Drive a scheduler core over ``runner``: each dict of requests is queued and run
    to the end before the next (so the later ones can hit the prefix cache)."""
    core = SchedulerCore(
        runner.info(),
        BatchingOptions(max_batch_tokens=12, chunked_prefill_size=5, **batching),
    )
    out = {}
    greedy = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    for reqs in batches:
        for rid, ids in reqs.items():
            core.add(TokenizedRequest(rid=rid, prompt_ids=ids, sampling=greedy, stop_ids=[]))
        out |= {rid: toks for rid, (toks, _) in drive(core, runner, overlap=False).items()}
    return out, core


def test_scheduler_over_cpu_kernels_equals_transformers(family):
    """Greedy tokens through the scheduler core and the runner's C++ kernels, batched,
    chunked (5-token chunks), with a prefix-cache hit past the window."""
    _, path, _, hf = family
    runner = ModelRunner(str(path), exact(num_pages=64, page_size=4), quiet=True)
    assert runner.backend.name == "cpu"
    shared = prompt(7, 18)  # longer than the window: the hit covers 16 tokens
    first = {"a": shared + [9, 10], "b": prompt(8, 11)}
    second = {"c": shared + [11, 12, 13], "d": prompt(9, 3)}
    got, core = _serve(runner, [first, second], n=10)
    for rid, ids in (first | second).items():
        assert got[rid] == hf_greedy(hf, ids, 10), rid
    assert core.ledger.prefix_tokens_reused >= 16


def test_pages_outside_the_window_are_released(family, tmp_path):
    """Mistral (every layer windowed): a request's pages before its window go back to
    the pool (radix cache off) or stay in the tree (on); tokens do not change, nothing
    leaks, and the ledger counts the pages."""
    kind, path, _, hf = family
    runner = ModelRunner(str(path), exact(num_pages=64, page_size=4), quiet=True)
    if kind != "mistral":
        assert runner.info().sliding_window == 0  # global layers read everything
        pytest.skip("a model with global layers releases no pages")
    assert runner.info().sliding_window == WINDOW
    reqs = {"a": prompt(11, 21), "b": prompt(12, 6)}
    want = {rid: hf_greedy(hf, ids, 12) for rid, ids in reqs.items()}
    for radix in (False, True):
        runner = ModelRunner(str(path), exact(num_pages=64, page_size=4), quiet=True)
        got, core = _serve(runner, [reqs], n=12, disable_radix_cache=not radix)
        assert got == want
        st = core.stats()
        # a: 32 positions computed, the next attends from 32 - 8 + 1 = 25: the 6 pages
        # before 24 are released; b: 17 computed, the next attends from 10: 2 pages
        assert st["window_pages_released"] == 8
        if radix:
            assert st["window_pages_cached"] == 8  # the tree holds them as prefixes
        else:
            assert st["window_pages_freed"] == 8
        cached = core.tree.num_pages if core.tree else 0
        assert core.allocator.num_free + cached == core.allocator.num_pages


def test_kv_bytes_not_read_are_counted(family):
    """The runner's ledger: per windowed layer, the positions before each sequence's
    window, at the pool's bytes per position and layer."""
    kind, path, _, _ = family
    runner = ModelRunner(str(path), exact(num_pages=32, page_size=4), quiet=True)
    cfg = runner.config
    runner.lever_samples()
    greedy = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    from houchu.transport.messages import SeqInit, SeqWork, StepPlan

    ids = prompt(3, 20)
    init = [SeqInit(rid="a", sampling=greedy, prompt_ids=ids)]
    table = list(range(8))
    chunk = SeqWork(rid="a", token_ids=ids[:12], start_pos=0, page_table=table, sample=False)
    rest = SeqWork(rid="a", token_ids=ids[12:], start_pos=12, page_table=table, sample=True)
    for i, w in enumerate([chunk, rest]):
        assert (
            runner.execute(StepPlan(step_id=i, work=[w], init=init if i == 0 else [])).error is None
        )
    (s,) = [x for x in runner.lever_samples() if x.lever == "sliding_window_attention"]
    per_layer = runner.pool.bytes_per_token // cfg.num_layers
    # the second chunk's first query (position 12) attends 5..12: 5 positions skipped
    assert s.verb == "move_less" and s.saved_unit == "bytes"
    assert s.saved == len(cfg.sliding_layers) * 5 * per_layer


def test_quantized_top1_agreement(family):
    """int8 weights keep top-1 agreement of at least 95% with the exact path on the fixed
    English text (ASCII bytes as token ids, within the tiny vocabulary), past the window."""
    _, path, _, _ = family
    ids = [b for b in TEXT.encode("ascii", "ignore") if b < 128][:600]
    with torch.inference_mode():
        ref = text_logprobs(load_model(path), ids, chunk=16)
        got = text_logprobs(load_model(path, quant=QuantSpec("int8")), ids, chunk=16)
    a = agreement(ref, got, ids)
    assert a.positions == len(ids) - 1
    assert a.top1 >= 0.95, a


def test_fused_decode_layers_only_within_the_window(family):
    """Mistral with int8 weights on the CPU: the fused C++ decode layers (which attend the
    whole context) run while sequences fit in the window, and the per-op path after; the
    tokens equal the per-op path's throughout."""
    kind, path, _, _ = family
    if kind != "mistral":
        pytest.skip("the fused layers compute plain Llama blocks only")

    def run(disable: bool) -> tuple[list[int], int]:
        opts = exact(num_pages=32, page_size=4, quantization="int8", disable_fused_layers=disable)
        runner = ModelRunner(str(path), opts, quiet=True)
        assert (runner.model.fused is None) == disable
        got, _ = _serve(runner, [{"a": prompt(21, 3)}], n=14)
        return got["a"], runner.model.fused.steps if runner.model.fused else 0

    fused, steps = run(False)
    plain, _ = run(True)
    assert fused == plain
    assert 0 < steps < 13  # fused while the context fits in the window of 8, not after


def test_cached_pages_behind_the_window_are_freed_for_a_newcomer(family):
    """Mistral, radix cache on, a pool of 10 pages: a running request's pages behind its
    window are cached in the tree only until another request needs room; then the tree
    frees them (hollowed nodes) while it still runs, so the newcomer is admitted beside
    it instead of waiting for it to finish. A later request matching the long prompt
    resumes where its window's KV is intact. Tokens equal transformers' throughout and
    every page is accounted for after each step."""
    kind, path, _, hf = family
    if kind != "mistral":
        pytest.skip("only a model whose every layer is windowed frees cached pages")
    runner = ModelRunner(str(path), exact(num_pages=10, page_size=4), quiet=True)
    core = SchedulerCore(runner.info(), BatchingOptions(max_batch_tokens=32))
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    reqs = {"a": prompt(21, 21), "b": prompt(22, 20)}

    def add(rid: str, ids: list[int]) -> None:
        core.add(TokenizedRequest(rid=rid, prompt_ids=ids, sampling=greedy, stop_ids=[]))

    add("a", reqs["a"])
    together = []

    def hook(core: SchedulerCore, n: int) -> None:
        if n == 1:  # a prefilled: the tree holds its 5 full pages, a only the last 3
            add("b", reqs["b"])  # 5 pages wanted, 4 free
        together.append({"a", "b"} <= set(core.batcher.running))

    got = {rid: toks for rid, (toks, _) in drive(core, runner, False, hook).items()}
    assert any(together), "b waited for a to finish"
    assert core.stats()["num_pages_hollowed"] > 0
    c = reqs["a"][:20] + [9, 10, 11]
    add("c", c)
    got |= {rid: toks for rid, (toks, _) in drive(core, runner, overlap=False).items()}
    for rid, ids in (reqs | {"c": c}).items():
        assert got[rid] == hf_greedy(hf, ids, 12), rid


def test_int4_by_rounding_on_gemma_is_said_at_startup(family):
    """Gemma 2/3 lose more to int4 by rounding (top-1 0.93 in
    test_family_quant_quality.py): ``--quantization int4`` says so at startup and points
    at GPTQ; ``--int4-method gptq``, int8 and the other families say nothing of it."""
    from houchu.runner.structure_levers import structure_notes

    kind, path, _, _ = family
    cfg = load_model_config(path)

    def said(quant: str, method: str = "mse") -> bool:
        notes = structure_notes(cfg, (), "cpu", True, quant, method)
        return any("--int4-method gptq held" in n for n in notes)

    assert said("int4") == kind.startswith("gemma")
    assert not said("int4", "gptq") and not said("int8") and not said("none")
