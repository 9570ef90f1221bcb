"""DeepSeek-V2 / V3 (multi-head latent attention, DeepSeekMoE, YaRN) against
transformers' ``DeepseekV2ForCausalLM`` / ``DeepseekV3ForCausalLM``: tiny random models
from ``AutoModelForCausalLM.from_config``, loaded by houchu from the Hugging Face folder,
run over the latent KV pool (absorbed decode) and through the scheduler."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from houchu.devtools.gguf_writers import write_deepseek_gguf
from houchu.devtools.tiny_models import make_tiny_model
from houchu.model.config.core import num_parameters
from houchu.model.config.load import load_model_config
from houchu.model.kv.mla_pool import LatentKVPool, full_mha_bytes_per_token
from houchu.model.kv.pool import KVPool
from houchu.model.quant.functions import QuantSpec
from houchu.model.quant.quality import agreement, text_logprobs
from houchu.model.weights.loader import load_model
from houchu.options.batching_options import BatchingOptions
from houchu.runner.model_runner import ModelRunner
from houchu.scheduler.core import SchedulerCore
from houchu.transport.messages import SamplingParams
from tests.support.deepseek_families import FAMILIES, MLA, runner_greedy
from tests.support.families import (
    ATOL,
    Runner,
    assert_chunked_logits_match,
    assert_scheduled_waves_equal_hf,
    hf_greedy,
    hf_logits,
    prompt,
    runner_greedy_tokens,
    serve_with_drafts,
)
from tests.support.runner_options import exact


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(family, HF dir, transformers model) for each DeepSeek variant."""
    from transformers import AutoModelForCausalLM

    name = request.param
    kind = name.split("-")[0]
    path = make_tiny_model(
        tmp_path_factory.mktemp(name), kind, seed=11, **{**MLA, **FAMILIES[name]}
    )
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return kind, path, hf


def mla_runner(model, seed: int = 0) -> Runner:
    """The test driver of test_model_llama, over the model's own pool (latents)."""
    r = Runner(model, seed=seed)
    r.pool = KVPool.for_model(model.cfg, page_size=4, dtype=model.dtype, num_pages=64)
    return r


def test_config_and_param_count(family):
    kind, path, hf = family
    cfg = load_model_config(path)
    c = hf.config
    assert cfg.architecture == kind and cfg.mla is not None
    assert cfg.mla.kv_lora_rank == c.kv_lora_rank and cfg.mla.q_lora_rank == (c.q_lora_rank or 0)
    assert cfg.moe_layers == tuple(range(c.first_k_dense_replace, c.num_hidden_layers))
    assert cfg.n_shared_experts == c.n_shared_experts
    assert not cfg.plain_llama_layers
    assert num_parameters(cfg).total == sum(p.numel() for p in hf.parameters())
    # the latent and the RoPE key per layer, against every head's K and V
    assert cfg.kv_bytes_per_token(4) == c.num_hidden_layers * (c.kv_lora_rank + 8) * 4
    full = c.num_hidden_layers * c.num_attention_heads * (16 + 8 + c.v_head_dim) * 4
    assert full_mha_bytes_per_token(cfg, 4) == full


def test_prefill_and_decode_logits_match_transformers(family):
    _, path, hf = family
    with torch.inference_mode():
        model = load_model(path)
    # prefill chunks over cached latents, then decode steps
    assert_chunked_logits_match(mla_runner(model, seed=1), hf)


def test_batched_decode_prefill_and_verification_match(family):
    """Sequences batched together: prefill chunks beside absorbed decode rows, and two
    sequences with a few tokens after cached latents (the verification path)."""
    _, path, hf = family
    with torch.inference_mode():
        model = load_model(path)
    ids = {"a": prompt(4, 20), "b": prompt(5, 16), "c": prompt(6, 12)}
    want = {k: hf_logits(hf, v) for k, v in ids.items()}
    r = mla_runner(model, seed=2)
    steps = [
        [("a", 0, 9), ("b", 0, 6)],  # two prefills
        [("a", 9, 1), ("b", 6, 3), ("c", 0, 7)],  # decode, a few after cache, prefill
        [("a", 10, 3), ("b", 9, 3), ("c", 7, 1)],  # two verification-like groups, decode
        [("a", 13, 1), ("b", 12, 1), ("c", 8, 1)],  # all decode
    ]
    for step in steps:
        got = r.step([(rid, ids[rid][s : s + n], s) for rid, s, n in step])
        for row, (rid, s, n) in enumerate(step):
            torch.testing.assert_close(got[row], want[rid][s + n - 1], atol=ATOL, rtol=0)


def test_absorbed_decode_equals_expanded(family):
    """The absorbed form (W_UK in the query, W_UV after) and the expanded one (the
    context up-projected to full K/V) give the same logits."""
    _, path, _ = family
    with torch.inference_mode():
        model = load_model(path)
    ids = prompt(8, 14)
    out = {}
    for absorb in (True, False):
        for layer in model.layers:
            layer.mla.absorb = absorb
        r = mla_runner(model)
        r.step([("a", ids[:12], 0), ("b", ids[:5], 0)])
        out[absorb] = r.step([("a", ids[12:13], 12), ("b", ids[5:6], 5)])
    torch.testing.assert_close(out[True], out[False], atol=ATOL, rtol=0)


def test_pool_stores_the_latent_and_the_rope_key_only(family):
    _, path, _ = family
    runner = ModelRunner(str(path), exact(num_pages=16, page_size=4), quiet=True)
    cfg, pool = runner.config, runner.pool
    assert isinstance(pool, LatentKVPool)
    m = cfg.mla
    assert tuple(pool.kv.shape) == (cfg.num_layers, 16, 4, m.kv_lora_rank + m.qk_rope_head_dim)
    assert pool.page_tensors() == [pool.kv]
    assert runner.info().kv_bytes_per_token == cfg.num_layers * m.latent_dim * 4
    assert pool.full_kv_bytes > pool.bytes_per_token
    assert "MLA latent KV" in runner.summary() and "full multi-head K/V" in runner.summary()


def test_runner_greedy_equals_transformers_and_reports_mla_lever(family):
    _, path, hf = family
    runner = ModelRunner(str(path), exact(num_pages=32, page_size=4), quiet=True)
    first = {s.saved_unit: s for s in runner.lever_samples() if s.lever == "mla"}
    pool = runner.pool
    assert first["tokens"].verb == "occupy_less"
    full_tokens = pool.num_bytes // pool.full_kv_bytes
    assert first["tokens"].saved == pool.num_tokens - full_tokens > 0
    ctx = runner.max_context
    assert first["requests"].saved == pool.num_tokens // ctx - full_tokens // ctx
    ids = prompt(5, 11)
    assert runner_greedy_tokens(runner, ids, 8) == hf_greedy(hf, ids, 8)
    (stored,) = [s for s in runner.lever_samples() if s.lever == "mla"]
    assert stored.saved_unit == "bytes"
    assert stored.saved == (pool.full_kv_bytes - pool.bytes_per_token) * (len(ids) + 7)


def test_scheduled_batches_prefix_hits_and_chunks_equal_transformers(family):
    """Through the scheduler: a batch of requests with chunked prefill (chunks of 8),
    then requests sharing their prefix (a radix-cache hit): every request's greedy
    tokens equal transformers'."""
    _, path, hf = family
    runner = ModelRunner(str(path), exact(num_pages=64, page_size=4), quiet=True)
    assert_scheduled_waves_equal_hf(runner, hf)


def test_routing_is_group_limited(family):
    """Each token's experts lie within ``topk_group`` groups; V3's correction bias moves
    the choice, never the weights (the unbiased sigmoid scores, normalised, scaled)."""
    _, path, _ = family
    with torch.inference_mode():
        model = load_model(path)
        cfg = model.cfg
        moe = next(layer.moe for layer in model.layers if layer.moe is not None)
        x = torch.randn(64, cfg.hidden_size)
        weights, experts = moe.route(x)  # [64, k] each
        per_group = cfg.num_experts // cfg.n_group
        groups = {tuple(sorted(set((experts[t] // per_group).tolist()))) for t in range(64)}
        if cfg.topk_method != "greedy":
            assert all(len(g) <= cfg.topk_group for g in groups)
        if cfg.topk_method == "noaux_tc":
            scores = (x @ moe.router.T).sigmoid().gather(1, experts)
            if cfg.norm_topk_prob:
                scores = scores / scores.sum(-1, keepdim=True)
            torch.testing.assert_close(weights, scores * cfg.routed_scaling_factor)
        assert moe.shared is not None


@pytest.mark.parametrize(("quant", "floor"), [("int8", 0.93), ("int4", 0.5)])
def test_quantized_keeps_top1(family, quant, floor):
    """int8 / int4 weights (the MLA projections, shared and routed experts; ``kv_b_proj``
    and the routers stay dense) against the exact path, on a fixed token sequence.

    A random 64-wide model has near-ties everywhere, and a rounding that flips one
    token's routed experts changes its output wholesale: int8 measured 0.937-0.976
    top-1 over these variants with the routed experts quantized (0.945-0.976 with them
    dense; floor 0.93); int4 (groups of 32, no structure to keep) 0.567-0.732 (dense
    experts: 0.567-0.740), printed, with a floor that only catches a broken path."""
    _, path, _ = family
    ids = prompt(31, 128)
    with torch.inference_mode():
        ref = text_logprobs(load_model(path), ids, page_size=4)
        got = text_logprobs(load_model(path, quant=QuantSpec(quant, 32)), ids, page_size=4)
    a = agreement(ref, got, ids)
    print(f"{path.name} {quant}: top-1 {a.top1:.3f}, mean |dlogp| {a.mean_abs_dlogp:.4f}")
    assert a.top1 >= floor


def test_levers_that_do_not_apply_say_so(family, capsys):
    """int8 KV on the latent, the fused C++ layers and the compiled step do not apply to
    MLA: the runner says so at start-up and stores the latent in the model dtype."""
    _, path, _ = family
    opts = exact(num_pages=8, page_size=4, kv_cache_dtype="int8", compile="auto")
    runner = ModelRunner(str(path), opts, quiet=True)
    err = capsys.readouterr().out
    assert "--kv-cache-dtype int8 does not apply to the latent KV cache" in err
    assert "decode eagerly" in err
    # the fused layers being off: said by the structure notes, as for every family whose
    # blocks are not plain Llama blocks (printed at start-up unless quiet)
    assert any("fused decode layers off" in n for n in runner.notes)
    assert runner.pool.kv.dtype == torch.float32 and not runner.pool.quantized
    assert not [s for s in runner.lever_samples() if s.lever.startswith("kv_quant")]


def test_quantized_mla_says_what_stays_dense(family):
    """``--quantization int4`` on MLA + DeepSeekMoE: the start-up notes say that
    ``kv_b_proj`` and the float32 routers stay dense and the routed experts are
    quantized."""
    from houchu.runner.structure_levers import structure_notes

    _, path, _ = family
    cfg = load_model_config(path)
    notes = structure_notes(cfg, (), "cpu", True, "int4")
    assert any("MLA's kv_b_proj stays dense" in n for n in notes)
    assert any(
        "routed experts are quantized" in n and "routers stay dense (float32)" in n for n in notes
    )
    assert not [n for n in structure_notes(cfg, (), "cpu", True, "none") if "--quant" in n]


def test_gguf_twin_gives_the_same_tokens(family, tmp_path):
    """A GGUF ``deepseek2`` written as llama.cpp's converter does (stacked experts, split
    and transposed ``kv_b``, one MQA head of latent width) loads to the same config and
    gives the safetensors twin's greedy tokens."""
    kind, path, _ = family
    hf_cfg = load_model_config(path)
    if not hf_cfg.mla.rope_interleave:
        pytest.skip("llama.cpp's deepseek2 rotates adjacent pairs: no GGUF of rotate-half RoPE")
    gguf_path = write_deepseek_gguf(path, tmp_path / "model.gguf")
    cfg = load_model_config(gguf_path)
    other = ["name", "source", "bos_token_id", "eos_token_ids", "rope_original_max_position"]
    other.append("mtp_layers")  # the MTP modules config.json declares; GGUF holds none
    floats = ["rms_norm_eps", "rope_mscale", "rope_mscale_all_dim"]  # stored as float32
    if hf_cfg.rope_type == "yarn":
        other.remove("rope_original_max_position")
    assert dataclasses.replace(cfg, **{f: getattr(hf_cfg, f) for f in other + floats}) == hf_cfg
    for f in floats:
        assert getattr(cfg, f) == pytest.approx(getattr(hf_cfg, f), rel=1e-6)
    ids = prompt(12, 13)
    assert runner_greedy(gguf_path, ids, 6) == runner_greedy(path, ids, 6)


def test_latent_pages_round_trip_through_the_host_tier(family):
    """A page of latents saved to the shared host pool and loaded back into another page
    (the KV tiers copy ``page_tensors()``); the launcher sizes a host slot as one page
    of latents (``kv_page_bytes``, which ``--kv-cache-dtype`` does not change: the runner
    stores latents in the model dtype whatever it says)."""
    import os

    from houchu.cache_tiers.host_pool import HostPool
    from houchu.model.kv.page_pool import kv_page_bytes
    from houchu.model.kv.transfer import HostKVMirror
    from houchu.transport.messages import PageCopy

    _, path, _ = family
    cfg = load_model_config(path)
    pool = KVPool.for_model(cfg, page_size=4, dtype=torch.float32, num_pages=4)
    pool.kv.copy_(torch.randn_like(pool.kv))
    slot = kv_page_bytes(cfg, 4, torch.float32, "int8")
    assert slot == 4 * cfg.kv_bytes_per_token(4) == 4 * pool.bytes_per_token
    host = HostPool(f"houchu-test-mla-{os.getpid()}", 2, slot, create=True)
    try:
        mirror = HostKVMirror(pool, host)
        assert mirror.page_bytes == slot
        page = pool.kv[:, 1].clone()
        mirror.save([PageCopy(1, 0)])
        mirror.load([PageCopy(3, 0)])
        assert torch.equal(pool.kv[:, 3], page)
    finally:
        del mirror
        host.close()


def test_speculative_ngram_keeps_greedy_output(family):
    """n-gram speculation on an MLA model: proposals verified in one pass (the absorbed
    multi-query path over cached latents) keep transformers' greedy tokens."""
    from houchu.options.speculation_options import SpeculativeOptions
    from houchu.speculative.proposers import NgramProposer

    _, path, hf = family
    if "-" in path.name:
        pytest.skip("the V2 and V3 models cover verification; the variants change no part of it")
    runner = ModelRunner(str(path), exact(num_pages=64, page_size=4), quiet=True)
    spec = SpeculativeOptions(speculative="ngram", num_speculative_tokens=3)
    core = SchedulerCore(runner.info(), BatchingOptions(max_batch_tokens=48), spec=spec)
    core.spec.controller.choose_k = lambda batch, alpha, cap, probe=False: min(cap, 3)
    greedy = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    prompts = {"rep": [5, 6, 7, 8, 9] * 4, "mix": prompt(51, 9)}
    out = serve_with_drafts(core, runner, NgramProposer(), prompts, greedy)
    for rid, p in prompts.items():
        assert out[rid] == hf_greedy(hf, p, 10), rid
    assert core.stats()["spec_proposed_tokens"] > 0
