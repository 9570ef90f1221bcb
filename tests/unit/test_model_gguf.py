"""GGUF loading: dequantization, name mapping, llama.cpp's q/k permutation undone."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from houchu.devtools.gguf_writers import permute_qk, write_llama_gguf
from houchu.devtools.tiny_models import make_tiny_llama
from houchu.model.config.core import ModelLoadError
from houchu.model.config.load import load_model_config
from houchu.model.weights.gguf import dequantize_tensor, load_gguf, unpermute_qk
from houchu.model.weights.hf import load_hf
from houchu.model.weights.loader import load_model
from houchu.runner.model_runner import ModelRunner
from houchu.transport.messages import SamplingParams, SeqInit, SeqWork, StepPlan
from tests.support.runner_options import exact

Q = gguf.GGMLQuantizationType
QUANTIZABLE = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]
K_QUANTS = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("gguf")
    return {
        "untied": make_tiny_llama(base / "untied", seed=1),
        "tied": make_tiny_llama(base / "tied", seed=2, tie_word_embeddings=True),
    }


def test_dequantize_matches_gguf_library(tmp_path):
    rng = np.random.default_rng(0)
    original = rng.normal(0, 0.5, size=(8, 256)).astype(np.float32)
    path = tmp_path / "types.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    stored: dict[str, tuple[np.ndarray, Q]] = {}
    for name in QUANTIZABLE:
        qt = Q[name]
        data = gguf.quants.quantize(original, qt)
        stored[name] = (data, qt)
        w.add_tensor(name, data, raw_dtype=None if name in ("F32", "F16") else qt)
    for name in K_QUANTS:  # no quantizer in Python: random blocks with finite fp16 scales
        qt = Q[name]
        block, size = gguf.GGML_QUANT_SIZES[qt]
        data = rng.integers(0, 256, size=(8, 256 // block * size), dtype=np.uint8)
        data.view(np.uint8)[:, -4:] = np.frombuffer(np.float16([0.01, 0.02]).tobytes(), np.uint8)
        stored[name] = (data, qt)
        w.add_tensor(name, data, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    reader = gguf.GGUFReader(str(path))
    for t in reader.tensors:
        data, qt = stored[t.name]
        got = dequantize_tensor(t)
        assert got.shape == (8, 256) and got.dtype == np.float32, t.name
        want = gguf.quants.dequantize(data, qt).reshape(8, 256)
        np.testing.assert_array_equal(got, want, err_msg=t.name)
        if t.name in QUANTIZABLE:
            tol = {"F32": 0, "F16": 1e-3, "BF16": 1e-2, "Q8_0": 0.02}.get(t.name, 0.3)
            assert np.abs(got - original).max() <= tol, t.name


@pytest.mark.parametrize(("n_head", "n_kv"), [(4, 4), (4, 2), (9, 3)])
def test_unpermute_matches_transformers(n_head, n_kv):
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    d, hidden = 16, 48
    q = np.random.default_rng(1).normal(size=(n_head * d, hidden)).astype(np.float32)
    k = q[: n_kv * d]
    proc = LlamaTensorProcessor()
    for w, heads in ((q, n_head), (k, n_kv)):
        theirs = proc._reverse_permute_weights(
            permute_qk(w, heads), n_head, n_kv if w is k else n_head
        )
        ours = unpermute_qk(torch.from_numpy(permute_qk(w, heads)), heads).numpy()
        np.testing.assert_array_equal(ours, theirs)
        np.testing.assert_array_equal(ours, w)


@pytest.mark.parametrize("kind", ["untied", "tied"])
def test_f32_gguf_logits_match_hf(tiny_dirs, tmp_path, kind):
    from transformers import LlamaForCausalLM

    hf_dir = tiny_dirs[kind]
    path = write_llama_gguf(hf_dir, tmp_path / "m.gguf")
    cfg = load_model_config(path)
    assert cfg.tie_word_embeddings == (kind == "tied")
    assert cfg.source == "gguf" and cfg.num_kv_heads == 2
    hf = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    ids = [5, 17, 99, 3, 64, 8, 127, 40, 41, 42, 7]
    runner = ModelRunner(str(path), exact(num_pages=8, page_size=4), quiet=True)
    init = SeqInit(rid="a", sampling=SamplingParams(temperature=0, logprobs=True), prompt_ids=ids)
    out = runner.execute(
        StepPlan(
            step_id=0,
            init=[init],
            work=[SeqWork(rid="a", token_ids=ids, start_pos=0, page_table=[6, 2, 4], sample=True)],
        )
    ).outputs[0]
    with torch.no_grad():
        want = torch.log_softmax(hf(torch.tensor([ids])).logits[0, -1], -1)
    assert out.token_id == int(want.argmax())
    assert abs(out.logprob - float(want.max())) < 1e-4


@pytest.mark.parametrize("qtype", ["F16", "Q8_0", "Q4_0", "Q4_1"])
def test_quantized_gguf_weights(tiny_dirs, tmp_path, qtype):
    path = write_llama_gguf(tiny_dirs["untied"], tmp_path / f"m-{qtype}.gguf", qtype=qtype)
    _, ours = load_gguf(path)
    _, ref = load_hf(tiny_dirs["untied"])
    assert set(ours) == set(ref)
    reader = gguf.GGUFReader(str(path))
    by_name = {t.name: t for t in reader.tensors}
    # exact: our q_proj is the library's dequantization, rows un-permuted
    raw_q = gguf.quants.dequantize(by_name["blk.1.attn_q.weight"].data, Q[qtype]).reshape(64, 64)
    exact = unpermute_qk(torch.from_numpy(raw_q.copy()), 4)
    torch.testing.assert_close(
        ours["model.layers.1.self_attn.q_proj.weight"], exact, atol=0, rtol=0
    )
    # close to the original weights within the format's error
    tol = {"F16": 1e-3, "Q8_0": 5e-3}.get(qtype, 0.06)
    for name, t in ref.items():
        assert (ours[name] - t).abs().max() <= tol, name


def test_unsupported_architecture_is_rejected(tiny_dirs, tmp_path):
    path = write_llama_gguf(tiny_dirs["untied"], tmp_path / "falcon.gguf", arch="falcon")
    with pytest.raises(ModelLoadError, match="falcon"):
        load_model_config(path)
    with pytest.raises(ModelLoadError, match="falcon"):
        load_model(path)


def test_missing_output_means_tied(tiny_dirs, tmp_path):
    path = write_llama_gguf(tiny_dirs["untied"], tmp_path / "t.gguf", drop_output=True)
    assert load_model_config(path).tie_word_embeddings
    model = load_model(path)
    assert model.tied and model.lm_head.weight is model.embed


def test_bad_paths(tmp_path):
    with pytest.raises(ModelLoadError):
        load_model_config(tmp_path / "nope.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelLoadError):
        load_model_config(bad)


@pytest.mark.parametrize(
    "qtype,want", [("Q4_0", "int4"), ("Q4_1", "int4"), ("Q8_0", "int4"), ("F16", "none")]
)
def test_auto_quantization_serves_gguf_as_stored(tiny_dirs, tmp_path, qtype, want):
    """auto: a file whose block matrices all have a stored form (Q8_0 as two int4
    planes) is served as stored; a float file is dense."""
    from houchu.model.quant.mode import resolve_quant_mode

    path = write_llama_gguf(tiny_dirs["untied"], tmp_path / f"m-{qtype}.gguf", qtype=qtype)
    assert resolve_quant_mode("auto", path) == want
    assert resolve_quant_mode("w8a8", path) == "w8a8"  # an explicit mode is kept
    assert resolve_quant_mode("auto", tiny_dirs["untied"]) == "none"  # safetensors: dense
    runner = ModelRunner(path, exact(quantization="auto", num_pages=8), quiet=True)
    assert runner.levers.cost.weight_label == ("int4-g32" if want == "int4" else "none")
    with pytest.raises(ValueError, match="quantization must be"):
        resolve_quant_mode("int3", path)
