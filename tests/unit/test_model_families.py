"""Qwen2 (q/k/v bias), Qwen3 (QK-norm) and Qwen3-MoE (routed experts) against
transformers' own classes: tiny random models from ``AutoModelForCausalLM.from_config``,
loaded by houchu from the Hugging Face directory and from the GGUF that llama.cpp's
converter would write (``qwen2``, ``qwen3``, ``qwen3moe`` with stacked experts)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from houchu.model.config.core import num_parameters
from houchu.model.config.load import load_model_config
from houchu.model.weights.loader import load_model
from houchu.runner.model_runner import ModelRunner
from houchu.transport.messages import SamplingParams, SeqInit, SeqWork, StepPlan
from tests.support.families import (
    Runner,
    assert_chunked_logits_match,
    assert_scheduled_waves_equal_hf,
    hf_greedy,
    prompt,
    runner_greedy_tokens,
    tiny_family,
)
from tests.support.qwen_families import FAMILIES
from tests.support.runner_options import exact


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(family, HF dir, GGUF path, transformers model) for each family."""
    name = request.param
    return tiny_family(tmp_path_factory, name, seed=7, gguf=True, **FAMILIES[name])


def test_config_and_param_count(family):
    kind, path, gguf_path, hf = family
    for p in (path, gguf_path) if gguf_path else (path,):
        cfg = load_model_config(p)
        assert cfg.architecture == kind
        c = hf.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        assert cfg.attention_bias == (kind == "qwen2" or bool(getattr(c, "attention_bias", 0)))
        assert cfg.qk_norm == kind.startswith("qwen3")
        assert cfg.head_dim == head_dim
        assert not cfg.plain_llama_layers
        assert num_parameters(cfg).total == sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_prefill_and_decode_logits_match_transformers(family, source):
    _, path, gguf_path, hf = family
    with torch.inference_mode():
        model = load_model(path if source == "hf" else gguf_path)
    assert_chunked_logits_match(Runner(model, seed=1), hf)


def test_gguf_config_equals_the_folders(family):
    """The GGUF twin's config is the Hugging Face folder's (a ``qwen3moe`` file's expert
    counts, widths, normalisation and dense layers included), but for what GGUF names
    differently or does not store."""
    _, path, gguf_path, _ = family
    hf_cfg, cfg = load_model_config(path), load_model_config(gguf_path)
    other = ["name", "source", "bos_token_id", "eos_token_ids", "rope_original_max_position"]
    other += ["rope_low_freq_factor", "rope_high_freq_factor"]
    got = dataclasses.replace(cfg, **{f: getattr(hf_cfg, f) for f in other + ["rms_norm_eps"]})
    assert got == hf_cfg
    assert cfg.rms_norm_eps == pytest.approx(hf_cfg.rms_norm_eps, rel=1e-6)


@pytest.mark.parametrize("qtype", ["F32", "Q4_0"])
def test_gguf_twin_gives_the_same_tokens(family, tmp_path, qtype):
    """Through ``ModelRunner``: an F32 GGUF twin gives the safetensors folder's greedy
    tokens. A Q4_0 twin (the stacked experts quantized too) under ``--quantization
    auto`` keeps its projections and routed experts int4 (converted losslessly, as
    llama.cpp computes on them; the router dense), and gives the tokens of the same
    file dequantized whole (``--quantization none``): the same rounded weights. Experts
    48 wide: the file keeps their down projections F32 (not whole blocks of 32), so auto
    serves it dense (the dequantized file's tokens), and ``--quantization int4`` is
    refused (its groups of 32 do not divide them either)."""
    from houchu.devtools.gguf_writers import write_llama_gguf
    from houchu.model.linear.quantized import Int4Linear
    from houchu.model.moe import MoEMLP

    kind, path, gguf_path, _ = family
    ids = prompt(13, 9)
    if qtype == "F32":
        folder, twin = path, gguf_path
        quant = "none"
    else:
        folder = twin = write_llama_gguf(path, tmp_path / "q4.gguf", qtype="Q4_0")
        quant = "auto"
    opts = exact(num_pages=16, page_size=4, quantization=quant)
    if qtype == "Q4_0" and load_model_config(twin).moe_intermediate_size % 32:
        # auto serves such a file dense (an F32 block matrix has no stored form);
        # --quantization int4 would round it onto groups of 32, which do not divide it
        with pytest.raises(ValueError, match="group size 32 does not divide the input width"):
            ModelRunner(
                str(twin), exact(num_pages=16, page_size=4, quantization="int4"), quiet=True
            )
        runner = ModelRunner(str(twin), opts, quiet=True)
        assert runner.model.quant.mode == "none"
        want = ModelRunner(str(folder), exact(num_pages=16, page_size=4), quiet=True)
        assert runner_greedy_tokens(runner, ids, 6) == runner_greedy_tokens(want, ids, 6)
        return
    want = ModelRunner(str(folder), exact(num_pages=16, page_size=4), quiet=True)
    runner = ModelRunner(str(twin), opts, quiet=True)
    if qtype == "Q4_0":
        assert any(isinstance(m, Int4Linear) for m in runner.model.modules())
        moes = [m for m in runner.model.modules() if isinstance(m, MoEMLP)]
        assert bool(moes) == ("moe" in kind)
        for m in moes:
            assert all(type(x) is Int4Linear for x in m.expert_linears())
            assert m.router.dtype == runner.dtype
    assert runner_greedy_tokens(runner, ids, 6) == runner_greedy_tokens(want, ids, 6)


def test_runner_greedy_equals_transformers(family):
    """Through ModelRunner and its CPU kernels: greedy tokens equal transformers'
    ``generate``."""
    _, path, _, hf = family
    runner = ModelRunner(str(path), exact(num_pages=32, page_size=4), quiet=True)
    ids = prompt(5, 11)
    assert runner_greedy_tokens(runner, ids, 8) == hf_greedy(hf, ids, 8)


def test_scheduled_batches_prefix_hits_and_chunks_equal_transformers(family):
    """Through the scheduler and the runner's CPU kernels: a batch of requests with
    chunked prefill (chunks of 8), then requests sharing their prefix (a radix-cache
    hit): every request's greedy tokens equal transformers'. A MoE model's batched
    decode steps leave some experts without tokens (3 tokens x top-k of E)."""
    kind, path, _, hf = family
    runner = ModelRunner(str(path), exact(num_pages=64, page_size=4), quiet=True)
    moes = [m.moe for m in runner.model.layers if m.moe is not None]
    idle_steps = []
    if moes:  # count, per MoE forward, the experts that got no token
        forward = moes[-1].forward

        def counting(x, silu_mul):
            y = forward(x, silu_mul)
            idle_steps.append(int((moes[-1].last_load == 0).sum()))
            return y

        moes[-1].forward = counting
    assert_scheduled_waves_equal_hf(runner, hf)
    if moes:
        assert any(idle_steps), "no step left an expert idle"


def test_moe_counts_active_params_and_skips_idle_experts(family):
    """The MoE's parameter counts (total against active per token) and expert load: a
    step of one token touches top_k experts, the rest get no tokens."""
    kind, path, _, _ = family
    if "moe" not in kind:
        pytest.skip("a dense family")
    cfg = load_model_config(path)
    mi, h = cfg.moe_intermediate_size, cfg.hidden_size
    idle = len(cfg.moe_layers) * (cfg.num_experts - cfg.num_experts_per_tok) * 3 * h * mi
    every_expert = dataclasses.replace(cfg, num_experts_per_tok=cfg.num_experts)
    active, dense = num_parameters(cfg), num_parameters(every_expert)
    assert idle > 0 and dense.matmul_per_token - active.matmul_per_token == idle
    assert dense.total == active.total
    with torch.inference_mode():
        model = load_model(path)
    moes = [m.moe for m in model.layers if m.moe is not None]
    assert len(moes) == len(cfg.moe_layers) > 0
    Runner(model).step([("a", [5], 0)])
    for moe in moes:
        assert int(moe.last_load.sum()) == cfg.num_experts_per_tok
        assert int((moe.last_load == 0).sum()) == cfg.num_experts - cfg.num_experts_per_tok


def test_moe_lever_counts_flops_not_computed(family):
    """The runner's ledger: FLOPs of the experts each token skipped, against the router's."""
    kind, path, _, _ = family
    if "moe" not in kind:
        pytest.skip("a dense family")
    cfg = load_model_config(path)
    runner = ModelRunner(str(path), exact(num_pages=32, page_size=4), quiet=True)
    runner.lever_samples()  # whatever start-up reported
    ids = prompt(9, 10)
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    work = SeqWork(rid="a", token_ids=ids, start_pos=0, page_table=[0, 1, 2], sample=True)
    init = [SeqInit(rid="a", sampling=greedy, prompt_ids=ids)]
    assert runner.execute(StepPlan(step_id=0, work=[work], init=init)).error is None
    (moe,) = [s for s in runner.lever_samples() if s.lever == "moe_routed_experts"]
    per_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
    skipped = cfg.num_experts - cfg.num_experts_per_tok
    # the prefill's tokens through each MoE layer; the last layer's MLP runs the sampled row
    last = cfg.num_layers - 1
    tokens = sum(1 if i == last else len(ids) for i in cfg.moe_layers)
    assert moe.verb == "compute_less" and moe.saved_unit == moe.spent_unit == "flops"
    assert moe.saved == 2 * tokens * skipped * per_expert
    assert moe.spent == 2 * tokens * cfg.num_experts * cfg.hidden_size
    assert not [s for s in runner.lever_samples() if s.lever == "moe_routed_experts"]


def test_quantized_moe_says_the_experts_are_quantized(family, capsys):
    """``--quantization int8`` on a MoE model: the start-up lines say the routed experts
    are quantized and the routers stay dense, and so they are (a dense family says
    nothing of experts)."""
    from houchu.model.linear.quantized import Int8Linear
    from houchu.model.moe import MoEMLP

    kind, path, _, _ = family
    runner = ModelRunner(str(path), exact(num_pages=8, page_size=4, quantization="int8"))
    out = capsys.readouterr().out
    said = (
        "--quantization int8: the routed experts are quantized" in out
        and "the routers stay dense (model dtype)" in out
    )
    assert said == ("moe" in kind)
    moes = [m for m in runner.model.modules() if isinstance(m, MoEMLP)]
    assert bool(moes) == ("moe" in kind)
    for m in moes:
        assert len(m.gate_up) == len(m.down) == m.num_experts
        assert all(type(x) is Int8Linear for x in m.expert_linears())
        assert isinstance(m.router, torch.nn.Parameter) and m.router.dtype == runner.dtype
