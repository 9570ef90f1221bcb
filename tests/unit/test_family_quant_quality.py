"""Quantized weights (int8, W8A8, int4 in groups of 32) and the int8 KV cache of every
model family against its exact path: top-1 next-token agreement and the mean |Δ log p| on
the fixed English text (its first 600 ASCII bytes as token ids, past every sliding
window), on each family's tiny model (one variant per family, as its own test module
builds it) *trained* at test time (``houchu.devtools.tiny_models.train_tiny_model``: 120 AdamW
steps of 2 x 300 tokens on the rest of quality_en.txt and quality_code.txt, 6,151 bytes,
never the evaluated 600), so that its next-token distributions are peaked as a language
model's rather than nearly flat as a random one's. Each figure is printed (``-s``);
docs/benchmarks.md, "Quantized families on tiny trained models", has the table.

What the trained models learnt: 3.07-3.47 bits per byte on the evaluated text (uniform:
7; a unigram model of the training text: 4.27; its add-0.1 bigram model: 3.45), against
2.2-3.4 on their last training batches, so they learnt English byte statistics (bigram
level and a little more), memorizing some of the small training text (Gemma most).

int4 rounds these float weights with ``quantize_int4``'s default "mse" method (each
group's scale and offset searched to minimise its squared error, ``houchu.model.quant.int4_mse``:
6.9-7.0% relative weight error in groups of 32 where min/max gave 7.8%). Measured over
these models and the same families drawn with five other seeds (seed + 100, ..., + 500):
mean top-1 +0.005 against min/max (31 of 54 draws better, 23 worse), mean |Δ log p| 10%
lower; the lowest of each family's six draws rose by 0.013-0.014 (Gemma 2 / 3) and
0.036-0.037 (Qwen3-MoE, DeepSeek-V2), stayed at 0.953 in DeepSeek-V3 and moved by -0.012
to +0.013 in the dense four (docs/benchmarks.md, "Quantized families on tiny trained
models").

Held (``FLOOR`` / ``CEILING``): the issue's 0.95 top-1 bar for int8, W8A8 and the int8 KV
cache in every family (measured 0.978-1.000 over these models and the same families
drawn with two other seeds), and for int4 in the dense Llama, Qwen2, Qwen3 and Mistral
(0.950-0.993 over six seeds, 0.978-0.993 at the test's) and in DeepSeek-V2 / V3
(0.953-0.995 over six seeds, 0.985-0.988 at the test's; min/max gave 0.943 at
DeepSeek-V2's). Where int4 does not hold it:

- Gemma 2 / 3 (0.918-0.950 over six seeds, 0.930 / 0.927 at the test's; floor 0.90, was
  0.88 for min/max's 0.905-0.948): int4 moves their last hidden state (before the final
  norm) more, 7.8% / 9.7% relative against 5.5-5.9% for Llama / Mistral (measured with
  min/max), at the same relative weight error of groups of 32 on these near-Gaussian
  weights. That fits their post-norms (not isolated further): each block's output gets
  unit size against the residual, so its rounding error is less diluted. The median
  shift of the exact path's top-2 logit gap is 0.10 / 0.14 nats (Llama 0.08, Qwen
  0.04-0.07) and 8.5-10.5% of positions have a gap below 0.1 nats, so 52-53 of 599
  positions flipped with min/max (42 / 44 now).
- Qwen3-MoE (0.938-0.990 over six seeds, 0.957 at the test's, with experts 48 wide and
  kept dense then; floor 0.93, was 0.92 for min/max's 0.902-0.978): its exact path has
  more near-ties (13% of positions with a top-2 gap under 0.1 nats at the test's seed,
  against 5-9% in Llama, Qwen2/3 and Mistral). Routing flips are not the cause: int4
  (min/max) changed a token's routed experts at 0.7% of token-layers, and those
  positions held none of the 36 top-1 flips.

The routed experts are quantized as every other projection (the routers stay dense), so
Qwen3-MoE's experts are 64 wide here (test_model_families' 48 is not a multiple of int4's
groups of 32). On these models the experts move the figures little: at the test's seeds,
with the experts kept dense against quantized, Qwen3-MoE int8 0.987 / 0.0105 -> 0.985 /
0.0104, W8A8 0.987 / 0.0108 -> 0.987 / 0.0071, int4 0.977 / 0.0364 -> 0.972 / 0.0360;
DeepSeek-V2 int8 0.978 / 0.0099 -> 0.978 / 0.0100, W8A8 0.988 / 0.0066 -> 0.992 / 0.0066,
int4 0.988 / 0.0324 -> 0.983 / 0.0320; DeepSeek-V3 int8 0.997 / 0.0096 -> 0.998 / 0.0098,
W8A8 1.000 / 0.0068 -> 1.000 / 0.0068, int4 0.985 / 0.0239 -> 0.988 / 0.0242 (top-1 /
mean |Δ log p|).

int4 by GPTQ (``houchu.model.quant.gptq``: act order, static groups, calibrated on the
training text, never the evaluated one; the "int4-gptq" cases) holds the issue's 0.95 in
every family, Gemma and Qwen3-MoE included: 0.965-1.000 at the test's seeds (Gemma 2
0.965, Gemma 3 0.967, Qwen3-MoE 0.975) and at least 0.953 over two other seeds (+100,
+200) per family, with the mean |Δ log p| at about half of the plain int4's (0.013-0.061
against 0.024-0.102; ceiling 0.08, 1.3x the highest). GPTQ places each column's rounding
error where the layer's calibration inputs do not look, so the outputs move less than the
weights (tests/integration/test_gptq.py); docs/benchmarks.md, "GPTQ", has the table.

A character-level model of 64 wide rows is a hard case for a 4-bit rounding: its best
guess is right 29-39% of the time, so many positions are near-ties. The real model's int4
figure (SmolLM2-135M, tests/integration/test_quant_quality.py) does not compare: its
projections are Q4_1 in the file and int4 keeps them losslessly.

Top-1 agreement alone is coarse: with layer 0's ``o_proj`` output rows 0 and 1
exchanged, int8 still agrees at 0.952-0.995 in 7 of the 9 families, but moves log p by
0.025-0.063 nats against at most 0.0146 for int8's rounding, so each case also holds a
ceiling on the mean |Δ log p| (``CEILING``, about 1.4x the highest measured over the
three seeds; a change smaller than that, such as one row of every ``o_proj`` reversed in
DeepSeek-V3, at 0.016, passes unseen).
``test_broken_path_fails`` shows both checks fail a deliberately broken quantized path.
int8 of Mistral / Gemma stays held at 0.95 on the random models in test_model_sliding.py,
int8 and int4 of every DeepSeek variant (lower floors, random) in test_model_deepseek.py.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from houchu.devtools.tiny_models import train_tiny_model
from houchu.model.linear.w8a8 import W8A8_MIN_ROWS
from houchu.model.quant.functions import QuantSpec
from houchu.model.quant.gptq import quantize_model_gptq
from houchu.model.quant.quality import Agreement, agreement, text_logprobs
from houchu.model.weights.loader import load_model
from tests.support.deepseek_families import FAMILIES as DEEPSEEK
from tests.support.deepseek_families import MLA
from tests.support.quality_texts import EN, EVAL, TRAIN
from tests.support.qwen_families import FAMILIES as QWEN
from tests.support.sliding_families import FAMILIES as SLIDING

#: family variant -> (config overrides, seed), as each family's own test builds it
MODELS = {
    "llama": ({}, 7),
    "qwen2": (QWEN["qwen2"], 7),
    "qwen3": (QWEN["qwen3"], 7),
    # experts 64 wide (test_model_families' 48): int4 quantizes the experts, in groups
    # of 32 that must divide their down projection's input width
    "qwen3_moe": ({**QWEN["qwen3_moe"], "moe_intermediate_size": 64}, 7),
    "mistral": (SLIDING["mistral"], 5),
    "gemma2": (SLIDING["gemma2"], 5),
    "gemma3_text": ({"tie_word_embeddings": True, **SLIDING["gemma3_text"]}, 5),  # tied, as there
    "deepseek_v2": ({**MLA, **DEEPSEEK["deepseek_v2"]}, 11),
    "deepseek_v3": ({**MLA, **DEEPSEEK["deepseek_v3"]}, 11),
}
GEMMA = {"gemma2", "gemma3_text"}
#: lowest top-1 agreement held: the issue's 0.95, int4 lower where it does not hold
FLOOR = {"int8": 0.95, "w8a8": 0.95, "kv-int8": 0.95, "int4": 0.95, "int4-gptq": 0.95}
FLOOR_INT4 = {**dict.fromkeys(GEMMA, 0.90), "qwen3_moe": 0.93}
#: highest mean |Δ log p| held (nats); measured at most 0.0146, 0.0138, 0.0074, 0.050
#: (int4 over six seeds: 0.057)
CEILING = {"int8": 0.02, "w8a8": 0.02, "kv-int8": 0.01, "int4": 0.07, "int4-gptq": 0.08}
CEILING_INT4_GEMMA = 0.14  #: measured at most 0.102 (over six seeds: 0.111)
#: bits per byte the exact path must beat on the evaluated text (a unigram model: 4.27)
MAX_BPB = 3.7
CASES = [(m, q) for m in MODELS for q in ("int8", "w8a8", "int4", "int4-gptq")]
#: int8 KV (exact weights); MLA's latent pool stays in the model dtype (said at start-up:
#: test_model_deepseek.py::test_levers_that_do_not_apply_say_so)
CASES += [(m, "kv-int8") for m in MODELS if not m.startswith("deepseek")]


def bounds(name: str, quant: str) -> tuple[float, float]:
    """(top-1 floor, mean |Δ log p| ceiling) held for ``name`` under ``quant``."""
    if quant == "int4":
        return FLOOR_INT4.get(name, FLOOR[quant]), (
            CEILING_INT4_GEMMA if name in GEMMA else CEILING[quant]
        )
    return FLOOR[quant], CEILING[quant]


def passes(a: Agreement, name: str, quant: str) -> bool:
    """Whether ``a`` meets the floor and the ceiling held for ``name`` under ``quant``."""
    floor, ceiling = bounds(name, quant)
    return a.top1 >= floor and a.mean_abs_dlogp <= ceiling


def measure(path: Path, ref: torch.Tensor, ids: list[int], quant: str) -> Agreement:
    """The model at ``path`` under ``quant`` ("int8", "w8a8", "int4" in groups of 32,
    "int4-gptq": int4 by GPTQ over the training text, or "kv-int8": exact weights over an
    int8 KV pool) against the exact path's ``ref``, fed
    16 tokens a step (the weight-only kernels' row counts) or, for W8A8,
    ``W8A8_MIN_ROWS`` (its int8 GEMM: weight-only int8 below that, and on CPUs whose
    ``torch._int_mm`` saturates)."""
    chunk = W8A8_MIN_ROWS if quant == "w8a8" else 16
    kv = "int8" if quant == "kv-int8" else "auto"
    with torch.inference_mode():
        if quant == "int4-gptq":  # calibrated on the training text (never the evaluated)
            model = load_model(path, prepack=False)
            quantize_model_gptq(model, TRAIN, QuantSpec("int4", 32, int4_method="gptq"))
        else:
            model = load_model(path, quant=QuantSpec("none" if kv == "int8" else quant, 32))
        got = text_logprobs(model, ids, chunk=chunk, page_size=4, kv_dtype=kv)
    return agreement(ref, got, ids)


@pytest.fixture(scope="module")
def ids() -> list[int]:
    """The evaluated ids: the fixed English text's first 600 ASCII bytes."""
    return EN[:EVAL]


@pytest.fixture(scope="module")
def exact(tmp_path_factory, ids):
    """family variant -> (trained HF dir, ``[600, V]`` exact-path log-probabilities),
    trained and measured once; prints the bits per byte on the evaluated text."""
    out: dict[str, tuple[Path, torch.Tensor]] = {}

    def get(name: str) -> tuple[Path, torch.Tensor]:
        if name not in out:
            overrides, seed = MODELS[name]
            trained = train_tiny_model(
                tmp_path_factory.mktemp(name) / "hf", name, TRAIN, seed=seed, **overrides
            )
            with torch.inference_mode():
                ref = text_logprobs(load_model(trained.path), ids, chunk=16, page_size=4)
            nxt = torch.tensor(ids[1:])[:, None]
            bpb = -ref[:-1].gather(1, nxt).mean().item() / math.log(2)
            print(
                f"\n[quality] {name} exact: {bpb:.3f} bits/byte on the evaluated text, "
                f"{trained.train_bpb:.3f} on the last training batches"
            )
            assert bpb < MAX_BPB, f"{name} learnt too little: {bpb:.3f} bits/byte"
            out[name] = trained.path, ref
        return out[name]

    return get


@pytest.mark.parametrize(("name", "quant"), CASES, ids=lambda v: str(v))
def test_quantized_family_keeps_top1(exact, ids, name, quant):
    """The quantized path keeps the top-1 agreement floor and the mean |Δ log p|
    ceiling (``bounds``) against the exact path of the trained model."""
    path, ref = exact(name)
    a = measure(path, ref, ids, quant)
    floor, ceiling = bounds(name, quant)
    print(
        f"\n[quality] {name} {quant}: top-1 {a.top1:.3f} (floor {floor}), "
        f"mean |dlogp| {a.mean_abs_dlogp:.4f} (ceiling {ceiling})"
    )
    assert a.positions == len(ids) - 1
    assert passes(a, name, quant), a


def halves_swapped(w: dict[str, torch.Tensor]) -> None:
    """Layer 0's ``o_proj`` with the two 16-wide halves of every group of 32 inputs
    exchanged: an int4 nibble-order mix-up (ggml's low nibbles hold elements 0-15, the
    high ones 16-31)."""
    name = "model.layers.0.self_attn.o_proj.weight"
    n, k = w[name].shape
    w[name] = w[name].reshape(n, k // 32, 2, 16).flip(2).reshape(n, k).contiguous()


def rows_swapped(w: dict[str, torch.Tensor]) -> None:
    """Layer 0's ``o_proj`` with output rows 0 and 1 exchanged (a wrong row order)."""
    name = "model.layers.0.self_attn.o_proj.weight"
    w[name] = w[name][[1, 0, *range(2, w[name].shape[0])]].contiguous()


def bias_dropped(w: dict[str, torch.Tensor]) -> None:
    """Every q/k/v bias zeroed: a path that drops Qwen2's attention biases."""
    for name in [n for n in w if n.endswith("_proj.bias")]:
        w[name] = torch.zeros_like(w[name])


#: (family, quantization, how the path is broken)
BROKEN: list[tuple[str, str, Callable[[dict[str, torch.Tensor]], None]]] = [
    ("gemma3_text", "int4", halves_swapped),  # the lowest floor held
    ("gemma3_text", "int4-gptq", halves_swapped),
    ("llama", "int4", halves_swapped),
    ("llama", "int8", rows_swapped),  # top-1 about 0.99: caught by the ceiling
    ("qwen2", "int8", bias_dropped),
]


@pytest.mark.parametrize(
    ("name", "quant", "breaking"), BROKEN, ids=lambda v: getattr(v, "__name__", str(v))
)
def test_broken_path_fails(exact, ids, tmp_path, name, quant, breaking):
    """A quantized path broken on purpose (its weights edited here, in a copy of the
    trained folder, before houchu quantizes them) fails the floor or the ceiling the
    working path clears, so the check above can fail."""
    path, ref = exact(name)
    broken = tmp_path / "broken"
    shutil.copytree(path, broken)
    weights = load_file(str(broken / "model.safetensors"))
    breaking(weights)
    save_file(weights, str(broken / "model.safetensors"), metadata={"format": "pt"})
    a = measure(broken, ref, ids, quant)
    print(
        f"\n[quality] {name} {quant} broken ({breaking.__name__}): top-1 {a.top1:.3f}, "
        f"mean |dlogp| {a.mean_abs_dlogp:.4f}"
    )
    assert not passes(a, name, quant), a
