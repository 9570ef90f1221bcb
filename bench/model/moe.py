"""MoE benchmark: houchu's grouped experts against the per-expert loop and the per-token
loop, with dense and quantized experts, on one MoE layer of random weights (by default
Qwen3-30B-A3B's widths, hidden 2048 and experts of 768, top-8, with 32 of its 128
experts: 600 MB in float32).

    python -m houchu.bench.model.moe [--tokens 1,16,256] [--experts 32] [--top-k 8]
        [--hidden 2048] [--expert-width 768] [--dtype float32] [--reps 5]
        [--quant none,int4]

Three ways to compute the same layer (the routing is ``MoEMLP.route`` for all three, and
each expert's projections are the same ``LinearBase`` layers in all three, so only the
grouping differs):

- **grouped** (``MoEMLP.forward``, what houchu runs): the (token, expert) pairs sorted
  by expert once, one gate_up ``[n, hidden] -> [n, 2·I]`` and one down
  ``[n, I] -> [n, hidden]`` call per expert that has tokens, one ``index_add_``;
  experts with no tokens cost nothing;
- **per-expert loop** (transformers' eager ``Qwen3MoeSparseMoeBlock`` / Mixtral form):
  for every one of the ``E`` experts a ``torch.where`` over the routing to find its
  tokens, then its projections on them and an ``index_add_``;
- **per-token loop**: for every token, for each of its ``top_k`` experts, its
  projections on that one row (what "no per-token Python loop" rules out).

``--quant`` lists the expert weights to time (``none``: dense ``Linear`` in ``--dtype``;
``int4`` in groups of 32, ``int8``, ``w8a8``: built by ``make_linear`` from the same
weights, as ``--quantization`` builds a model's experts; houchu's C++ CPU kernels are
loaded first where they build). Prints, per weight format and token count, each form's
layer time (the fastest of ``--reps``), the grouped form's speed-up, the experts with
tokens, the expert bytes one token reads (``MoEMLP.weight_bytes``) and the grouped
time against the dense experts'. Printed, not asserted; the three forms' outputs are
checked equal first.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from houchu.cpu import kernels as cpu_kernels
from houchu.model.linear.dense import Linear, onednn_available
from houchu.model.linear.factory import make_linear
from houchu.model.moe import MoEMLP
from houchu.model.quant.functions import QuantSpec


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``[n, 2I]`` (gate, up halves) -> ``[n, I]`` ``silu(gate) * up``."""
    g, u = gate_up.chunk(2, dim=-1)
    return F.silu(g) * u


def expert(moe: MoEMLP, e: int, x: torch.Tensor) -> torch.Tensor:
    """Expert ``e`` of ``moe`` on x ``[n, hidden]`` -> ``[n, hidden]``, x's dtype."""
    return moe.down[e](moe.gate_up[e].forward_silu_mul(x, silu_mul))


def per_expert_loop(moe: MoEMLP, x: torch.Tensor) -> torch.Tensor:
    """x ``[T, hidden]`` -> ``[T, hidden]``: a ``torch.where`` per expert, all ``E``."""
    weights, experts = moe.route(x)  # [T, k] each
    out = torch.zeros_like(x)
    for e in range(moe.num_experts):
        rows, slots = torch.where(experts == e)  # [n] each
        if rows.numel() == 0:
            continue
        y = expert(moe, e, x[rows])  # [n, hidden]
        out.index_add_(0, rows, y * weights[rows, slots, None])
    return out


def per_token_loop(moe: MoEMLP, x: torch.Tensor) -> torch.Tensor:
    """x ``[T, hidden]`` -> ``[T, hidden]``: one row through each (token, expert) pair."""
    weights, experts = moe.route(x)  # [T, k] each
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(moe.top_k):
            y = expert(moe, int(experts[t, j]), x[t : t + 1])  # [1, hidden]
            out[t] += weights[t, j] * y[0]
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


def build(args: argparse.Namespace, quant: str = "none") -> MoEMLP:
    """A MoE layer of random weights (N(0, 0.02²), the same for every ``quant``) at the
    given widths and dtype; its experts dense (``quant`` "none": oneDNN-prepacked where
    oneDNN takes the dtype, as a model's dense layers on CPU) or as ``make_linear``
    builds them under ``QuantSpec(quant, 32)``; the router stays dense."""
    g = torch.Generator().manual_seed(0)
    e, h, i = args.experts, args.hidden, args.expert_width
    dtype = getattr(torch, args.dtype)
    router = (0.02 * torch.randn(e, h, generator=g)).to(dtype)  # [E, hidden]
    gate_up = (0.02 * torch.randn(e, 2 * i, h, generator=g)).to(dtype)  # [E, 2I, hidden]
    down = (0.02 * torch.randn(e, h, i, generator=g)).to(dtype)  # [E, hidden, I]
    if quant == "none":
        moe = MoEMLP.from_stacked(router, gate_up, down, top_k=args.top_k, norm_topk_prob=True)
        if onednn_available(dtype):  # as ``LlamaModel`` prepacks its dense layers on CPU
            for m in moe.expert_linears():
                if isinstance(m, Linear):
                    m.prepack_onednn()
        return moe
    spec = QuantSpec(quant, 32)
    gu = [make_linear(w, spec, dtype=dtype) for w in gate_up]
    dn = [make_linear(w, spec, dtype=dtype) for w in down]
    return MoEMLP(router, gu, dn, args.top_k, True)


def load_kernels() -> str:
    """Load houchu's C++ CPU kernels (the quantized experts' GEMV) where they build:
    a word for the header."""
    try:
        cpu_kernels.load()
    except cpu_kernels.CpuKernelsUnavailable as e:
        return f"C++ kernels unavailable ({e})"
    return f"C++ kernels {cpu_kernels.active_level()}"


def check_equal(got: torch.Tensor, want: torch.Tensor, quant: str) -> None:
    """The loops' output against the grouped one: within 1e-3 of its largest value for
    dense experts, 3e-2 for quantized ones (a one-row call may take another kernel,
    with bfloat16 activations).

    Raises:
        AssertionError: they differ by more.
    """
    tol = (1e-3 if quant == "none" else 3e-2) * float(want.abs().max())
    err = float((got - want).abs().max())
    assert err <= tol, f"{quant}: the loops differ from the grouped experts by {err:.3g}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="1,16,256")
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--expert-width", type=int, default=768)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quant", default="none,int4", help="expert weights: none,int4,int8,w8a8")
    args = ap.parse_args()
    quants = args.quant.split(",")
    kernels = load_kernels() if any(q != "none" for q in quants) else "dense only"
    print(
        f"MoE layer: {args.experts} experts of {args.expert_width}, top-{args.top_k}, "
        f"hidden {args.hidden}, {args.dtype}, {torch.get_num_threads()} threads, {kernels}"
    )
    print(
        f"{'experts':>7} {'MB/token':>8} {'tokens':>6} {'hit':>4} {'grouped ms':>11} "
        f"{'per-expert ms':>14} {'per-token ms':>13} {'vs per-expert':>13} "
        f"{'vs per-token':>12} {'vs dense':>9}"
    )
    dense_ms: dict[int, float] = {}
    with torch.inference_mode():
        for quant in quants:
            moe = build(args, quant).eval()
            mb = moe.weight_bytes()[0] / 1e6
            label = next((m.kind for m in moe.gate_up if not isinstance(m, Linear)), args.dtype)
            for t in (int(n) for n in args.tokens.split(",")):
                g = torch.Generator().manual_seed(t)
                x = torch.randn(t, args.hidden, generator=g).to(moe.router.dtype)  # [T, hidden]
                want = moe(x, silu_mul)
                for other in (per_expert_loop, per_token_loop):
                    check_equal(other(moe, x), want, quant)
                hit = int((moe.last_load > 0).sum())
                grouped = best_time(lambda x=x, m=moe: m(x, silu_mul), args.reps)
                loop_e = best_time(lambda x=x, m=moe: per_expert_loop(m, x), args.reps)
                loop_t = best_time(lambda x=x, m=moe: per_token_loop(m, x), max(1, args.reps // 2))
                if quant == "none":
                    dense_ms[t] = grouped
                vs = f"{dense_ms[t] / grouped:>8.2f}x" if t in dense_ms else f"{'-':>9}"
                print(
                    f"{label:>7} {mb:>8.1f} {t:>6} {hit:>4} {grouped * 1e3:>11.2f} "
                    f"{loop_e * 1e3:>14.2f} {loop_t * 1e3:>13.2f} {loop_e / grouped:>12.2f}x "
                    f"{loop_t / grouped:>11.2f}x {vs}",
                    flush=True,
                )
            del moe


if __name__ == "__main__":
    main()
