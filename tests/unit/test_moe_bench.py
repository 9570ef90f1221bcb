"""The MoE benchmark's reference forms (``houchu.bench.moe_bench``): the per-expert and
per-token loops compute what houchu's grouped experts do, with idle experts."""

from __future__ import annotations

import argparse

import torch

from houchu.bench.moe_bench import build, per_expert_loop, per_token_loop, silu_mul


def test_loops_equal_the_grouped_experts():
    args = argparse.Namespace(experts=8, top_k=2, hidden=32, expert_width=16, dtype="float32")
    moe = build(args)
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(1))  # [T, hidden]
    with torch.inference_mode():
        want = moe(x, silu_mul)
        assert int((moe.last_load == 0).sum()) >= 2  # 3 tokens x top-2 of 8: idle experts
        torch.testing.assert_close(per_expert_loop(moe, x), want)
        torch.testing.assert_close(per_token_loop(moe, x), want)
