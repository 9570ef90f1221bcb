"""MoE benchmark: houchu's grouped experts against the per-expert loop and the per-token
loop, on one MoE layer of random weights (by default Qwen3-30B-A3B's widths, hidden
2048 and experts of 768, top-8, with 32 of its 128 experts: 600 MB in float32).

    python -m houchu.bench.moe_bench [--tokens 1,16,256] [--experts 32] [--top-k 8]
        [--hidden 2048] [--expert-width 768] [--dtype float32] [--reps 5]

Three ways to compute the same layer (the routing is ``MoEMLP.route`` for all three):

- **grouped** (``MoEMLP.forward``, what houchu runs): the (token, expert) pairs sorted
  by expert once, one ``[n, hidden] @ [hidden, 2·I]`` and one ``[n, I] @ [I, hidden]``
  matmul per expert that has tokens, one ``index_add_``; experts with no tokens cost
  nothing;
- **per-expert loop** (transformers' eager ``Qwen3MoeSparseMoeBlock`` / Mixtral form):
  for every one of the ``E`` experts a ``torch.where`` over the routing to find its
  tokens, then its matmuls on them and an ``index_add_``;
- **per-token loop**: for every token, for each of its ``top_k`` experts, a
  matrix-vector product (what "no per-token Python loop" rules out).

Prints, per token count, each form's layer time (the fastest of ``--reps``), the
grouped form's speed-up, and the experts with tokens. Printed, not asserted; the three
outputs are checked equal first.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from houchu.model.moe import MoEMLP


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``[n, 2I]`` (gate, up halves) -> ``[n, I]`` ``silu(gate) * up``."""
    g, u = gate_up.chunk(2, dim=-1)
    return F.silu(g) * u


def per_expert_loop(moe: MoEMLP, x: torch.Tensor) -> torch.Tensor:
    """x ``[T, hidden]`` -> ``[T, hidden]``: a ``torch.where`` per expert, all ``E``."""
    weights, experts = moe.route(x)  # [T, k] each
    out = torch.zeros_like(x)
    for e in range(moe.num_experts):
        rows, slots = torch.where(experts == e)  # [n] each
        if rows.numel() == 0:
            continue
        y = silu_mul(x[rows] @ moe.gate_up[e].T) @ moe.down[e].T  # [n, hidden]
        out.index_add_(0, rows, y * weights[rows, slots, None])
    return out


def per_token_loop(moe: MoEMLP, x: torch.Tensor) -> torch.Tensor:
    """x ``[T, hidden]`` -> ``[T, hidden]``: a matrix-vector product per (token, expert)."""
    weights, experts = moe.route(x)  # [T, k] each
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(moe.top_k):
            e = int(experts[t, j])
            y = silu_mul(moe.gate_up[e] @ x[t]) @ moe.down[e].T  # [hidden]
            out[t] += weights[t, j] * y
    return out


def best_time(fn: Callable[[], torch.Tensor], reps: int) -> float:
    """The fastest of ``reps`` calls of ``fn``, seconds (after one warm-up call)."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def build(args: argparse.Namespace) -> MoEMLP:
    """A MoE layer of random weights (N(0, 0.02²)) at the given widths and dtype."""
    g = torch.Generator().manual_seed(0)
    e, h, i = args.experts, args.hidden, args.expert_width
    dtype = getattr(torch, args.dtype)
    router = (0.02 * torch.randn(e, h, generator=g)).to(dtype)  # [E, hidden]
    gate_up = (0.02 * torch.randn(e, 2 * i, h, generator=g)).to(dtype)  # [E, 2I, hidden]
    down = (0.02 * torch.randn(e, h, i, generator=g)).to(dtype)  # [E, hidden, I]
    return MoEMLP(router, gate_up, down, args.top_k, True).eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="1,16,256")
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--expert-width", type=int, default=768)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    moe = build(args)
    print(
        f"MoE layer: {args.experts} experts of {args.expert_width}, top-{args.top_k}, "
        f"hidden {args.hidden}, {args.dtype}, {torch.get_num_threads()} threads"
    )
    print(
        f"{'tokens':>6} {'experts hit':>11} {'grouped ms':>11} {'per-expert ms':>14} "
        f"{'per-token ms':>13} {'vs per-expert':>13} {'vs per-token':>12}"
    )
    with torch.inference_mode():
        for t in (int(n) for n in args.tokens.split(",")):
            g = torch.Generator().manual_seed(t)
            x = torch.randn(t, args.hidden, generator=g).to(moe.gate_up.dtype)  # [T, hidden]
            want = moe(x, silu_mul)
            for other in (per_expert_loop, per_token_loop):
                torch.testing.assert_close(other(moe, x), want, atol=1e-3, rtol=1e-3)
            hit = int((moe.last_load > 0).sum())
            grouped = best_time(lambda x=x: moe(x, silu_mul), args.reps)
            loop_e = best_time(lambda x=x: per_expert_loop(moe, x), args.reps)
            loop_t = best_time(lambda x=x: per_token_loop(moe, x), max(1, args.reps // 2))
            print(
                f"{t:>6} {hit:>11} {grouped * 1e3:>11.2f} {loop_e * 1e3:>14.2f} "
                f"{loop_t * 1e3:>13.2f} {loop_e / grouped:>12.2f}x {loop_t / grouped:>11.2f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
