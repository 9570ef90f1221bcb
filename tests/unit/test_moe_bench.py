"""The MoE benchmark's reference forms (``houchu.bench.model.moe``): the per-expert and
per-token loops compute what houchu's grouped experts do, with idle experts."""

from __future__ import annotations

import argparse

import torch

from houchu.bench.model.moe import build, check_equal, per_expert_loop, per_token_loop, silu_mul
from houchu.model.linear.quantized import quant_act_dtype


def test_loops_equal_the_grouped_experts():
    args = argparse.Namespace(experts=8, top_k=2, hidden=32, expert_width=16, dtype="float32")
    moe = build(args)
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(1))  # [T, hidden]
    with torch.inference_mode():
        want = moe(x, silu_mul)
        assert int((moe.last_load == 0).sum()) >= 2  # 3 tokens x top-2 of 8: idle experts
        torch.testing.assert_close(per_expert_loop(moe, x), want)
        torch.testing.assert_close(per_token_loop(moe, x), want)


def test_loops_equal_the_grouped_int4_experts():
    """With int4 experts (as ``--quant int4`` times them) the three forms agree too, and
    a token's expert bytes are int4's (codes and group headers), not float32's."""
    args = argparse.Namespace(experts=8, top_k=2, hidden=64, expert_width=32, dtype="float32")
    moe, dense = build(args, "int4"), build(args)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(1))  # [T, hidden]
    with torch.inference_mode():
        want = moe(x, silu_mul)
        check_equal(per_expert_loop(moe, x), want, "int4")
        check_equal(per_token_loop(moe, x), want, "int4")
        exact = dense(x, silu_mul)  # the same weights unrounded: int4's error, not more
    assert 0 < float((want - exact).abs().max()) <= 0.2 * float(exact.abs().max())
    # one token reads top_k experts' weights (gate and up [2I, hidden], down [hidden, I])
    # and the float32 router: as int4, half a byte a weight and a scale and zero point
    # per group of 32 in the activation dtype (bfloat16 where the CPU level computes in
    # it natively, else float32); as float32, 4 bytes a weight
    weights = args.top_k * 3 * args.expert_width * args.hidden
    router = args.experts * args.hidden * 4
    headers = weights // 32 * 2 * quant_act_dtype("cpu").itemsize
    assert moe.weight_bytes()[0] == weights // 2 + headers + router
    assert dense.weight_bytes()[0] == 4 * weights + router
