"""A sparse mixture-of-experts MLP (Shazeer et al. 2017; top-k routing as Qwen3-MoE,
Qwen Team 2025): each token runs through ``top_k`` of ``E`` SwiGLU experts, weighted by
its router's softmax probabilities (renormalized over the chosen ``top_k`` where the
config says ``norm_topk_prob``).

Tokens are grouped by expert, not looped over: the (token, expert) pairs are sorted by
expert, each expert with tokens runs one ``[n, hidden] @ [hidden, 2·I]`` and one
``[n, I] @ [I, hidden]`` matmul on its contiguous slice, and the weighted outputs are
added back to their tokens with one ``index_add_``. An expert no token picked costs
nothing. Numerics follow transformers' ``Qwen3MoeExperts`` (router softmax in float32,
products in the model dtype).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from houchu.model.config import ModelConfig, ModelLoadError
from houchu.transport.telemetry import LeverSample

SiluMul = Callable[[torch.Tensor], torch.Tensor]


class MoEMLP(nn.Module):
    """Top-k routed SwiGLU experts.

    Args:
        router: ``[E, hidden]`` router (gate) weight.
        gate_up: ``[E, 2·I, hidden]``: each expert's gate rows, then its up rows.
        down: ``[E, hidden, I]``.
        top_k: experts per token.
        norm_topk_prob: renormalize the chosen experts' probabilities to sum to 1.
    Raises:
        ValueError: shapes that disagree, or ``top_k`` not in ``[1, E]``.
    """

    def __init__(
        self,
        router: torch.Tensor,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        top_k: int,
        norm_topk_prob: bool,
    ) -> None:
        super().__init__()
        e, h = router.shape
        if gate_up.shape[0] != e or gate_up.shape[2] != h or down.shape[:2] != (e, h):
            raise ValueError(
                f"expert shapes disagree: router {tuple(router.shape)}, gate_up "
                f"{tuple(gate_up.shape)}, down {tuple(down.shape)}"
            )
        if not 1 <= top_k <= e:
            raise ValueError(f"top_k {top_k} not in [1, {e}]")
        self.router = nn.Parameter(router, requires_grad=False)  # [E, hidden]
        self.gate_up = nn.Parameter(gate_up, requires_grad=False)  # [E, 2I, hidden]
        self.down = nn.Parameter(down, requires_grad=False)  # [E, hidden, I]
        self.num_experts, self.top_k, self.norm_topk_prob = e, top_k, norm_topk_prob
        #: tokens routed to each expert by the last forward: ``[E]`` int64 (expert load)
        self.last_load = torch.zeros(e, dtype=torch.int64)
        self.tokens_since = 0  # tokens through this layer since ``take_counts``

    @classmethod
    def from_weights(
        cls, cfg: ModelConfig, w: dict[str, Any], prefix: str, dtype: torch.dtype
    ) -> MoEMLP:
        """The MoE of the MLP at ``prefix`` from HF's per-expert tensors
        (``experts.{e}.{gate,up,down}_proj.weight``, ``gate.weight`` the router), in
        ``dtype``; the tensors are consumed from ``w``.

        Raises:
            ModelLoadError: an expert's tensor is quantized (experts are kept dense).
        """
        gate_up, down = [], []
        for e in range(cfg.num_experts):
            parts = [w.pop(f"{prefix}.experts.{e}.{n}_proj.weight") for n in ("gate", "up", "down")]
            if not all(isinstance(t, torch.Tensor) for t in parts):
                raise ModelLoadError(f"{prefix}.experts.{e}: quantized experts are not supported")
            gate_up.append(torch.cat(parts[:2]).to(dtype))  # [2I, hidden]
            down.append(parts[2].to(dtype))  # [hidden, I]
        router = w.pop(f"{prefix}.gate.weight")  # [E, hidden]
        return cls(
            router.to(dtype),
            torch.stack(gate_up),  # [E, 2I, hidden]
            torch.stack(down),  # [E, hidden, I]
            cfg.num_experts_per_tok,
            cfg.norm_topk_prob,
        )

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: ``[T, hidden]`` -> ``(weights [T, top_k] in x's dtype, experts [T, top_k]
        int64)``."""
        probs = torch.softmax(x @ self.router.T, dim=-1, dtype=torch.float32)  # [T, E]
        weights, experts = torch.topk(probs, self.top_k, dim=-1)  # [T, k] each
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), experts

    def forward(self, x: torch.Tensor, silu_mul: SiluMul) -> torch.Tensor:
        """x: ``[T, hidden]`` -> ``[T, hidden]`` in x's dtype; ``silu_mul`` maps
        ``[n, 2·I]`` (gate, up halves) to ``[n, I]`` ``silu(gate) * up``."""
        k = self.top_k
        weights, experts = self.route(x)
        flat = experts.reshape(-1)  # [T·k] expert of each (token, slot) pair
        order = torch.argsort(flat, stable=True)  # [T·k] pairs grouped by expert
        load = torch.bincount(flat, minlength=self.num_experts)  # [E]
        self.last_load = load
        self.tokens_since += x.shape[0]
        tokens = order // k  # [T·k] the token of each sorted pair
        xs = x.index_select(0, tokens)  # [T·k, hidden]
        ys = torch.empty_like(xs)  # [T·k, hidden]
        start = 0
        for e, n in enumerate(load.tolist()):
            if n == 0:
                continue  # an expert no token picked: no work
            seg = xs[start : start + n]  # [n, hidden]
            ys[start : start + n] = silu_mul(seg @ self.gate_up[e].T) @ self.down[e].T
            start += n
        ys = ys * weights.reshape(-1).index_select(0, order).unsqueeze(1)  # [T·k, hidden]
        return torch.zeros_like(x).index_add_(0, tokens, ys)  # [T, hidden]

    def take_counts(self) -> tuple[float, float]:
        """``(FLOPs not computed, router FLOPs)`` since the previous call: per token,
        the ``E - top_k`` experts it skipped (2 FLOPs per weight) against the router's
        ``2 · E · hidden``; then the count restarts."""
        n, self.tokens_since = self.tokens_since, 0
        per_expert = self.gate_up[0].numel() + self.down[0].numel()
        skipped = 2.0 * n * (self.num_experts - self.top_k) * per_expert
        return skipped, 2.0 * n * self.router.numel()

    def active_params_per_token(self) -> int:
        """Expert weights one token reads: ``top_k`` experts' gate, up and down
        (scalars), plus the router."""
        per_expert = self.gate_up[0].numel() + self.down[0].numel()
        return self.top_k * per_expert + self.router.numel()


def moe_lever_sample(moes: Iterable[MoEMLP], t: float) -> LeverSample | None:
    """The "moe_routed_experts" sample (compute_less) of ``moes`` since the previous
    call: the FLOPs of the experts each token skipped, against the routers' FLOPs; None
    when no token went through them."""
    counts = [m.take_counts() for m in moes]
    saved, spent = sum(c[0] for c in counts), sum(c[1] for c in counts)
    if not saved:
        return None
    return LeverSample("moe_routed_experts", "compute_less", saved, "flops", spent, "flops", t)
