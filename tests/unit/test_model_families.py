"""Qwen2 (q/k/v bias) and Qwen3 (QK-norm) against transformers' own classes: tiny random
models from ``AutoModelForCausalLM.from_config``, loaded by houchu from the Hugging Face
directory and from the GGUF that llama.cpp's converter would write."""

from __future__ import annotations

import pytest
import torch

from houchu.gpu.config import load_model_config, num_parameters
from houchu.gpu.loader import load_model
from houchu.gpu.runner import ModelRunner
from houchu.gpu.testing import make_tiny_model, write_llama_gguf
from houchu.transport.messages import SamplingParams, SeqInit, SeqWork, StepPlan
from tests.unit.test_gpu_model import ATOL, Runner, hf_logits, prompt

FAMILIES = {
    "qwen2": {},
    "qwen3": {"head_dim": 24},  # Qwen3 sets head_dim apart from hidden / heads
    "qwen3-bias": {"head_dim": 16, "attention_bias": True},
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(family, HF dir, GGUF path, transformers model) for each family."""
    from transformers import AutoModelForCausalLM

    name = request.param
    kind = name.split("-")[0]
    base = tmp_path_factory.mktemp(name)
    path = make_tiny_model(base / "hf", kind, seed=7, **FAMILIES[name])
    gguf_path = write_llama_gguf(path, base / "model.gguf")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return kind, path, gguf_path, hf


def test_config_and_param_count(family):
    kind, path, gguf_path, hf = family
    for p in (path, gguf_path):
        cfg = load_model_config(p)
        assert cfg.architecture == kind
        c = hf.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        assert cfg.attention_bias == (kind == "qwen2" or bool(getattr(c, "attention_bias", 0)))
        assert cfg.qk_norm == (kind == "qwen3")
        assert cfg.head_dim == head_dim
        assert not cfg.plain_llama_layers
        assert num_parameters(cfg).total == sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_prefill_and_decode_logits_match_transformers(family, source):
    _, path, gguf_path, hf = family
    with torch.inference_mode():
        model = load_model(path if source == "hf" else gguf_path)
    ids = prompt(3, 29)
    want = hf_logits(hf, ids)  # [29, V]
    r = Runner(model, seed=1)
    pos = 0
    for n in [17, 5, 1, 1, 4, 1]:  # prefill chunks, then decode steps
        got = r.step([("a", ids[pos : pos + n], pos)])[0]
        pos += n
        torch.testing.assert_close(got, want[pos - 1], atol=ATOL, rtol=0)


def test_runner_greedy_equals_transformers(family):
    """Through ModelRunner and its CPU kernels: greedy tokens equal transformers'
    ``generate``."""
    _, path, _, hf = family
    runner = ModelRunner(str(path), num_pages=32, page_size=4, quiet=True)
    ids = prompt(5, 11)
    with torch.no_grad():
        want = hf.generate(
            torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=None
        )[0, len(ids) :].tolist()
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    init = [SeqInit(rid="a", sampling=greedy, prompt_ids=ids)]
    table = list(range(8))
    got: list[int] = []
    work = SeqWork(rid="a", token_ids=ids, start_pos=0, page_table=table, sample=True)
    for step in range(8):
        res = runner.execute(StepPlan(step_id=step, work=[work], init=init if step == 0 else []))
        assert res.error is None, res.error
        got.append(res.outputs[0].token_id)
        pos = len(ids) + step
        work = SeqWork(rid="a", token_ids=[got[-1]], start_pos=pos, page_table=table, sample=True)
    assert got == want
