"""The default model's stand-in (``houchu.devtools.gpu.model``): a skeleton of a GGUF rebuilt
with random data is the same model to houchu (shapes, types, tokenizer, quantization) and
runs; its weights differ."""

from __future__ import annotations

import json

import pytest

from houchu.devtools.gguf_writers import write_llama_gguf
from houchu.devtools.gpu import model as gpu_model
from houchu.devtools.tiny_models import make_tiny_llama, write_tiny_tokenizer
from houchu.options.runner_options import RunnerOptions
from houchu.runner.model_runner import ModelRunner
from houchu.transport.messages import SamplingParams, SeqInit, SeqWork, StepPlan


def first_token(path) -> tuple[int, ModelRunner]:
    opts = RunnerOptions(device="cpu", num_pages=8, page_size=16, compile="off")
    r = ModelRunner(str(path), opts, quiet=True)
    g = SamplingParams(temperature=0.0, ignore_eos=True)
    prompt = list(range(3, 20))
    plan = StepPlan(
        step_id=1,
        init=[SeqInit(rid="a", sampling=g, prompt_ids=prompt)],
        work=[SeqWork(rid="a", token_ids=prompt, start_pos=0, page_table=[0, 1], sample=True)],
    )
    return r.execute(plan).outputs[0].token_id, r


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_standin_is_the_same_model_with_other_weights(tmp_path, qtype):
    hf = make_tiny_llama(tmp_path / "hf", seed=5)
    write_tiny_tokenizer(hf)
    real = write_llama_gguf(hf, tmp_path / "real.gguf", qtype=qtype)
    meta_path = gpu_model.write_skeleton(real, tmp_path / "wheels")
    meta = json.loads(meta_path.read_text())
    assert meta["file_size"] == real.stat().st_size and meta["source"] == "real.gguf"
    assert {t[1] for t in meta["tensors"]} == {qtype, "F32"}
    skel = (tmp_path / "wheels" / gpu_model.SKELETON).read_bytes()
    assert len(skel) == meta["header_bytes"] < meta["file_size"]
    assert gpu_model.skeleton_in(tmp_path / "wheels") == meta_path
    assert gpu_model.skeleton_in(tmp_path) is None
    name = gpu_model.standin_name(tmp_path / "wheels")
    assert name == "real.standin.gguf"
    out = gpu_model.build_standin(tmp_path / "wheels", tmp_path / "work" / name)
    data = out.read_bytes()
    assert len(data) == meta["file_size"] and data.startswith(skel)
    assert data != real.read_bytes()
    tok_real, r_real = first_token(real)
    tok_standin, r_standin = first_token(out)
    assert r_standin.config == r_real.config
    assert r_standin.levers.summary() == r_real.levers.summary()  # same quantization path
    assert 0 <= tok_standin < r_standin.config.vocab_size
    mtime = out.stat().st_mtime_ns  # a second build keeps the file
    assert gpu_model.build_standin(tmp_path / "wheels", out) == out
    assert out.stat().st_mtime_ns == mtime


def test_a_type_a_standin_cannot_hold_is_refused(tmp_path):
    hf = make_tiny_llama(tmp_path / "hf", seed=5)
    real = write_llama_gguf(hf, tmp_path / "real.gguf", qtype="Q5_0")
    with pytest.raises(ValueError, match="Q5_0"):
        gpu_model.write_skeleton(real, tmp_path / "wheels")
