"""Lossy levers against the exact path on the real model (SmolLM2-135M-Instruct GGUF):
quantized weights, quantized KV and both, on a fixed English text of over 1,000 tokens,
a Chinese text and a code sample. Top-1 next-token agreement must be at least 95% on the
English text (the issue's bar); every figure, with the mean absolute log-probability
difference, is printed (run with ``-s`` to see it). Every configuration runs once per ISA
level of houchu's C++ kernels this CPU executes (the ``cpu_isa`` fixture: the packed
weights are the same at every level, so each level computes on the same models)."""

from __future__ import annotations

import pytest
import torch

from houchu.bench.texts import DATA_DIR
from houchu.cpu import isa
from houchu.model.linear.w8a8 import W8A8_MIN_ROWS
from houchu.model.quant.functions import QuantSpec
from houchu.model.quant.quality import agreement, text_logprobs
from houchu.model.weights.loader import load_model
from houchu.text.tokenizer.core import load_tokenizer

pytestmark = pytest.mark.slow

DATA = DATA_DIR
TEXTS = ("en", "zh", "code")
CONFIGS = [  # (weights, model dtype, KV dtype); int4-a8: int4 weights x int8 activations
    ("int4", "bfloat16", "auto"),
    ("int4-a8", "float32", "auto"),
    ("int8", "bfloat16", "auto"),
    ("w8a8", "bfloat16", "auto"),
    ("none", "float32", "int8"),
    ("none", "float32", "fp8"),
    ("int4", "bfloat16", "int8"),
]
CHUNK = 48  # tokens per step: the int4/int8 weight-only kernels (< 64 rows)
CHUNK_W8A8 = W8A8_MIN_ROWS  # W8A8's int8 GEMM (it runs from W8A8_MIN_ROWS rows)
# per format; default 0.95 (W8A8 measured 0.953 in bf16: model.w8a8.W8A8_OUTLIER_SHARE). int4 x int8 activations are checked
# on a float32 model, where `--int4-activations auto` considers them (0.956 measured here
# with bf16 layer inputs, 0.965 with float32 ones, torch held to AVX2;
# 0.947 in bf16, where auto keeps float activations: model.autotune.a8_candidate)
MIN_TOP1_EN: dict[str, float] = {}


def spec(quant: str) -> QuantSpec:
    """The ``QuantSpec`` of a config's weights ("int4-a8": int4 with int8 activations)."""
    if quant == "int4-a8":
        return QuantSpec("int4", int4_activations="int8")
    return QuantSpec(quant)


@pytest.fixture(scope="module")
def texts(real_model_path):
    tok = load_tokenizer(real_model_path)
    ids = {name: tok.encode((DATA / f"quality_{name}.txt").read_text()) for name in TEXTS}
    assert len(ids["en"]) >= 1000
    return ids


@pytest.fixture(scope="module")
def models(real_model_path):
    """Each weight format loaded once (the exact float32 model serves the KV configs),
    with the kernels a CPU server uses (houchu's C++ ones where they build), whatever
    other tests this process ran."""
    from houchu.cpu import kernels as cpu_kernels

    cpu_kernels.available()
    out = {("none", "float32"): load_model(real_model_path, torch.float32)}
    for quant, dtype, _ in CONFIGS:
        if (quant, dtype) not in out:
            out[quant, dtype] = load_model(
                real_model_path, getattr(torch, dtype), quant=spec(quant)
            )
    return out


@pytest.fixture(scope="module")
def exact(models, texts):
    model = models["none", "float32"]
    return {name: text_logprobs(model, ids, chunk=CHUNK) for name, ids in texts.items()}


@pytest.mark.parametrize(("quant", "dtype", "kv"), CONFIGS, ids=lambda v: str(v))
def test_agreement_with_exact_path(cpu_isa, models, texts, exact, quant, dtype, kv):
    """The English text's bar on every level; the Chinese and code texts on the CPU's
    best level and the AVX2 one (the other levels run the same layouts with other
    instructions: the English text alone tells them apart, at a third of the time).
    int8 activations (what `--int4-activations auto` picks where they are faster, on
    CPUs without native bf16) are checked on those two levels."""
    full = cpu_isa in (isa.usable()[0], "avx2")
    if quant == "w8a8" and "int8" not in isa.native_units(isa.usable()[0]):
        # torch's int8 GEMM is exact integer arithmetic on every CPU, so W8A8's figures
        # are the same here as on a CPU with int8 dot products, where it is checked;
        # here it runs at ~2 GOP/s (126 s for this test), and auto never picks it
        pytest.skip("W8A8 is checked on CPUs with int8 dot products (VNNI / AMX)")
    if quant == "int4-a8" and not full:
        pytest.skip(f"int8 activations are checked at {isa.usable()[0]} and avx2")
    model = models[quant, dtype]
    results = {}
    for name, ids in texts.items():
        if name != "en" and not full:
            continue
        chunk = CHUNK_W8A8 if quant == "w8a8" else CHUNK
        got = text_logprobs(model, ids, kv_dtype=kv, chunk=chunk)
        results[name] = a = agreement(exact[name], got, ids)
        print(
            f"\n[quality] {cpu_isa} weights={quant} dtype={dtype} kv={kv} text={name}: top-1 "
            f"{a.top1:.3f} over {a.positions} positions, mean |dlogp| {a.mean_abs_dlogp:.4f}"
        )
    assert results["en"].top1 >= MIN_TOP1_EN.get(quant, 0.95)
    if full:
        assert results["code"].top1 >= 0.85 and results["zh"].top1 >= 0.80
