"""Quantized routed experts (``houchu.model.moe``): under ``--quantization int4 / int8 /
w8a8`` each expert's gate_up and down are quantized linear layers (the router stays
dense), the grouped forward runs only the experts with tokens and agrees with the dense
experts, the ledger charges a decode token only its ``top_k`` experts' stored bytes, and
a GGUF's Q4_0 stacked experts stay int4 without loss."""

from __future__ import annotations

import pytest
import torch

from houchu.bench.model.moe import silu_mul
from houchu.devtools.gguf_writers import write_llama_gguf
from houchu.devtools.tiny_models import make_tiny_model
from houchu.model.linear.dense import Linear
from houchu.model.linear.factory import make_linear
from houchu.model.linear.quantized import Int4Linear, Int8Linear
from houchu.model.linear.w8a8 import W8A8Linear
from houchu.model.moe import MoEMLP
from houchu.model.quant.functions import Int4Weight, QuantSpec
from houchu.model.weights.gguf import load_gguf
from houchu.model.weights.loader import load_model

#: 8 experts of 32 (a width int4's groups of 32 divide), top-2, layer 0 dense
MOE = {
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "mlp_only_layers": [0],
    "norm_topk_prob": True,
}
KINDS = {"int4": Int4Linear, "int8": Int8Linear, "w8a8": W8A8Linear}


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    """A tiny random Qwen3-MoE's Hugging Face folder."""
    return make_tiny_model(tmp_path_factory.mktemp("moe") / "hf", "qwen3_moe", seed=5, **MOE)


def moes(model) -> list[MoEMLP]:
    return [m for m in model.modules() if isinstance(m, MoEMLP)]


@pytest.mark.parametrize("mode", list(KINDS))
def test_quantized_experts_are_quantized_and_the_ledger_counts_top_k(tiny_moe, mode):
    """Every expert projection is the mode's layer, the router a dense parameter; one
    decode token's bytes (``weight_bytes``) hold the router and ``top_k`` experts as
    stored, not all ``E``; int4 experts store fewer bytes than int8 ones, int8 fewer
    than dense."""
    with torch.inference_mode():
        model = load_model(tiny_moe, quant=QuantSpec(mode, 32))
    layers = moes(model)
    assert len(layers) == 1
    (moe,) = layers
    e, k = moe.num_experts, moe.top_k
    assert all(type(x) is KINDS[mode] for x in moe.expert_linears())
    assert len(moe.expert_linears()) == 2 * e
    assert type(moe.router) is torch.nn.Parameter and moe.router.dtype == model.dtype
    expert = [
        g.weight_bytes() + d.weight_bytes() for g, d in zip(moe.gate_up, moe.down, strict=True)
    ]
    assert len(set(expert)) == 1  # one shape and format: every expert costs the same
    router = moe.router.numel() * moe.router.element_size()
    assert moe.weight_bytes()[0] == k * expert[0] + router
    assert moe.weight_bytes()[1] == k * 2 * moe.expert_params + 2 * moe.router.numel()
    everything = sum(m.weight_bytes() for m in model.linears())
    assert everything - model.weight_bytes()[0] == (e - k) * expert[0] - router
    # a one-token step reads the router and top_k experts (at their one-row copies)
    one_row = moe.gate_up[0].weight_bytes_at(1) + moe.down[0].weight_bytes_at(1)
    assert moe.weight_bytes_at(1) == k * one_row + router
    # a step of many tokens reads (about) every expert
    assert moe.weight_bytes_at(64) > (e - 1) * (moe.gate_up[0].weight_bytes_at(16))
    dense = 4 * moe.expert_params  # float32 bytes of one expert
    limit = {"int4": 0.2, "int8": 0.3, "w8a8": 0.3}[mode]  # codes + scales, of float32
    assert expert[0] <= limit * dense
    # the quantized experts' parameters still count
    assert model.num_params() == load_model(tiny_moe).num_params()


def stacked_moe(e: int = 8, k: int = 2, h: int = 64, i: int = 32, seed: int = 0) -> MoEMLP:
    """A MoE layer of random dense experts (float32), router scaled so routing is sharp."""
    g = torch.Generator().manual_seed(seed)
    router = torch.randn(e, h, generator=g)  # [E, hidden]
    gate_up = 0.1 * torch.randn(e, 2 * i, h, generator=g)  # [E, 2I, hidden]
    down = 0.1 * torch.randn(e, h, i, generator=g)  # [E, hidden, I]
    return MoEMLP.from_stacked(router, gate_up, down, top_k=k, norm_topk_prob=True)


def quantized_twin(moe: MoEMLP, mode: str) -> MoEMLP:
    """``moe`` with each expert's weights rebuilt by ``make_linear`` under ``mode``."""
    spec = QuantSpec(mode, 32)

    def q(layer: Linear) -> torch.nn.Module:
        return make_linear(layer.weight.data, spec)

    return MoEMLP(
        moe.router.data, [q(x) for x in moe.gate_up], [q(x) for x in moe.down], moe.top_k, True
    )


@pytest.mark.parametrize(("mode", "tol"), [("int8", 0.03), ("w8a8", 0.04), ("int4", 0.15)])
def test_quantized_experts_agree_and_skip_idle_experts(mode, tol):
    """A batch of 3 tokens, top-2 of 8 experts (at least 2 experts idle): the quantized
    layer routes as the dense one (same router) and runs each expert with tokens once,
    the idle ones never; its output, on that batch and on one of 256 tokens, stays
    within ``tol`` (relative to the largest value) of the dense experts'."""
    dense = stacked_moe()
    quant = quantized_twin(dense, mode)
    calls: dict[int, int] = {}
    for e, layer in enumerate(quant.gate_up):
        layer.register_forward_hook(lambda *_, e=e: calls.__setitem__(e, calls.get(e, 0) + 1))
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))  # [T, hidden]
    with torch.inference_mode():
        want = dense(x, silu_mul)
        got = quant(x, silu_mul)
    assert torch.equal(quant.last_load, dense.last_load)
    idle = {e for e, n in enumerate(quant.last_load.tolist()) if n == 0}
    assert len(idle) >= 2 and sum(quant.last_load.tolist()) == 3 * 2
    assert calls == {e: 1 for e in range(8) if e not in idle}
    # and a batch of 256 tokens: 64 rows an expert on average (W8A8's int8 GEMM)
    xs = torch.randn(256, 64, generator=torch.Generator().manual_seed(2))  # [T, hidden]
    with torch.inference_mode():
        want, got = torch.cat([want, dense(xs, silu_mul)]), torch.cat([got, quant(xs, silu_mul)])
    err = float((got - want).abs().max()) / float(want.abs().max())
    print(f"{mode} experts: max error {err:.4f} of the largest output")
    assert 0 < err <= tol


@pytest.mark.parametrize("qtype", ["Q4_0", "Q5_0", "Q8_0"])
def test_gguf_experts_stay_as_stored(tmp_path, tiny_moe, qtype):
    """A Q4_0 (Q5_0, Q8_0) GGUF's stacked experts come out as one ``Int4Weight`` per
    expert (one plane, or two) whose values are exactly the dequantized file's, the
    router dense; ``--quantization int4`` builds the experts from those codes
    (Int4Linear, groups of 32), the router a dense float32 parameter."""
    gguf_path = write_llama_gguf(tiny_moe, tmp_path / "q.gguf", qtype=qtype)
    cfg, q4 = load_gguf(gguf_path, keep_q4=True)
    _, dense = load_gguf(gguf_path)
    name = "model.layers.1.mlp.experts.{}.{}_proj.weight"
    for e in range(cfg.num_experts):
        for proj in ("gate", "up", "down"):
            w = q4[name.format(e, proj)]
            assert isinstance(w, Int4Weight) and w.group_size == 32 and w.kind == qtype
            got, want = w.dequantize(torch.float32), dense[name.format(e, proj)]
            torch.testing.assert_close(got, want, rtol=0, atol=2**-22 * float(want.abs().max()))
    assert isinstance(q4["model.layers.1.mlp.gate.weight"], torch.Tensor)
    with torch.inference_mode():
        model = load_model(gguf_path, quant=QuantSpec("int4", 32))
    (moe,) = moes(model)
    assert all(type(x) is Int4Linear and x.group_size == 32 for x in moe.expert_linears())
    assert type(moe.router) is torch.nn.Parameter and moe.router.dtype == torch.float32
    # the int4 layer holds the file's codes: its dequantized weight is the file's, but
    # for its scales' rounding to the activation dtype (bfloat16 here: 2^-8 relative);
    # requantizing would move it by several % (int4's step is 1/15 of a group's range)
    for layer, proj in ((moe.gate_up[3], ("gate", "up")), (moe.down[3], ("down",))):
        want = torch.cat([dense[name.format(3, p)] for p in proj])  # [N, K]
        err = (layer.dequantize().float() - want).abs().max()
        assert err <= 2**-7 * want.abs().max()
        assert layer.planes == (1 if qtype == "Q4_0" else 2)


@pytest.mark.parametrize("mode", ["none", "int4"])
def test_tensor_parallel_still_refuses_moe(tiny_moe, mode):
    """Quantized experts do not make MoE layers shardable: ``--tensor-parallel-size 2``
    is refused at start-up, in one line."""
    from houchu.model.config.load import load_model_config
    from houchu.runner.tensor_parallel.shards import TensorParallelError, check_shardable

    with pytest.raises(TensorParallelError, match="MoE layers are not sharded"):
        check_shardable(load_model_config(tiny_moe), 2, QuantSpec(mode, 32))


@pytest.mark.parametrize(
    ("width", "group", "hint"),
    [
        (40, 32, "no int4 group size (32, 64, 128) divides it: use --quantization int8"),
        (96, 64, "use --quant-group-size 32"),
    ],
)
def test_an_int4_group_that_cannot_fit_says_what_can(width, group, hint):
    """An expert (or any) width the int4 group does not divide: a ``QuantShapeError``
    (one line at start-up) naming a group size that fits, or int8 where none does."""
    from houchu.model.quant.functions import QuantShapeError, check_group_size

    with pytest.raises(QuantShapeError) as e:
        check_group_size(width, group)
    assert str(e.value).endswith(hint)
