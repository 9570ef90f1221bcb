"""houchu's Llama over paged KV against Hugging Face's LlamaForCausalLM (tiny random model)."""

from __future__ import annotations

import pytest
import torch

from houchu.devtools.tiny_models import make_tiny_llama
from houchu.model.config.core import num_parameters
from houchu.model.config.load import load_model_config
from houchu.model.weights.loader import load_model
from tests.support.families import ATOL, Runner, hf_logits, prompt


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def tiny(request, tmp_path_factory):
    """(path, HF model, houchu model) for a tiny random Llama, untied and tied heads."""
    from transformers import LlamaForCausalLM

    path = make_tiny_llama(tmp_path_factory.mktemp("tiny"), tie_word_embeddings=request.param)
    hf = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        model = load_model(path)
    return path, hf, model


def test_config_and_param_count(tiny):
    path, hf, model = tiny
    cfg = load_model_config(path)
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (2, 4, 2, 16)
    assert cfg.tie_word_embeddings == hf.config.tie_word_embeddings
    counted = sum(p.numel() for p in hf.parameters())
    assert num_parameters(cfg).total == counted == model.num_params()


@pytest.mark.parametrize("prepack", [True, False], ids=["onednn", "dense"])
def test_single_prefill(tiny, prepack):
    path, hf, _ = tiny
    with torch.inference_mode():
        model = load_model(path, prepack=prepack)
    ids = prompt(1, 23)
    got = Runner(model).step([("a", ids, 0)])[0]
    torch.testing.assert_close(got, hf_logits(hf, ids)[-1], atol=ATOL, rtol=0)


def test_chunked_prefill_scattered_pages(tiny):
    _, hf, model = tiny
    ids = prompt(2, 41)
    want = hf_logits(hf, ids)
    r = Runner(model, seed=3)
    pos = 0
    for n in [5, 11, 1, 3, 13, 1, 7]:
        got = r.step([("a", ids[pos : pos + n], pos)])[0]
        pos += n
        torch.testing.assert_close(got, want[pos - 1], atol=ATOL, rtol=0)
    assert r.tables["a"] != sorted(r.tables["a"])  # pages really were scattered


def test_mixed_batch_decode_and_prefill_chunks(tiny):
    _, hf, model = tiny
    seqs = {rid: prompt(10 + i, 30 + 3 * i) for i, rid in enumerate("abcd")}
    want = {rid: hf_logits(hf, ids) for rid, ids in seqs.items()}
    r = Runner(model, seed=5)
    # a and b are prefilled up to some point first
    r.step([("a", seqs["a"][:20], 0), ("b", seqs["b"][:9], 0)])
    done = {"a": 20, "b": 9, "c": 0, "d": 0}
    plans = [
        {"a": 1, "b": 12, "c": 7},  # decode a; chunk of b at start 9; fresh prefill of c
        {"a": 1, "b": 1, "c": 10, "d": 1},
        {"a": 1, "b": 5, "c": 1, "d": 17},
        {"a": 1, "b": 1, "c": 1, "d": 1},  # all-decode batch
    ]
    for plan in plans:
        items = [(rid, seqs[rid][done[rid] : done[rid] + n], done[rid]) for rid, n in plan.items()]
        got = r.step(items)
        for row, (rid, n) in enumerate(plan.items()):
            done[rid] += n
            torch.testing.assert_close(got[row], want[rid][done[rid] - 1], atol=ATOL, rtol=0)


def test_bf16_agrees_on_top1(tiny):
    path, hf, _ = tiny
    with torch.inference_mode():
        model = load_model(path, torch.bfloat16)
    ids = prompt(7, 17)
    got = Runner(model).step([("a", ids, 0)])[0]
    assert got.dtype == torch.float32
    want = hf_logits(hf, ids)[-1]
    assert (got - want).abs().max() < 0.1 * want.abs().max()


def test_sharded_checkpoint_and_llama3_rope(tmp_path):
    """Sharded safetensors (index json) and Llama 3.1 RoPE scaling, against HF."""
    from transformers import LlamaForCausalLM

    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    }
    path = make_tiny_llama(tmp_path / "src", seed=4, rope_parameters=rope)
    hf = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    cfg = load_model_config(tmp_path / "sharded")
    assert cfg.rope_type == "llama3" and cfg.rope_factor == 8.0
    with torch.inference_mode():
        model = load_model(tmp_path / "sharded")
    ids = prompt(9, 45)
    got = Runner(model).step([("a", ids, 0)])[0]
    torch.testing.assert_close(got, hf_logits(hf, ids)[-1], atol=ATOL, rtol=0)


@pytest.mark.parametrize("d", [16, 64, 80])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_table_equals_computed(d, dtype):
    """The decode step's RoPE table lookup gives exactly the computed cos and sin."""
    from houchu.model.rope import RopeTable, rope_cos_sin

    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    table = RopeTable(inv, dtype, 4096)
    for pos in (torch.tensor([7]), torch.tensor([0, 4095]), torch.randint(0, 4096, (37,))):
        cos, sin = rope_cos_sin(pos, inv, dtype)
        assert all(map(torch.equal, (cos, sin), table.lookup(pos)))
    with pytest.raises(IndexError):
        table.lookup(torch.tensor([4096]))
