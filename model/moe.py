"""A sparse mixture-of-experts MLP (Shazeer et al. 2017; top-k routing as Qwen3-MoE,
Qwen Team 2025): each token runs through ``top_k`` of ``E`` SwiGLU experts, weighted by
its router's softmax probabilities (renormalized over the chosen ``top_k`` where the
config says ``norm_topk_prob``).

Tokens are grouped by expert, not looped over: the (token, expert) pairs are sorted by
expert, each expert with tokens runs one ``[n, hidden] -> [n, 2·I]`` (gate_up) and one
``[n, I] -> [n, hidden]`` (down) projection on its contiguous slice, and the weighted
outputs are added back to their tokens with one ``index_add_``. An expert no token picked
costs nothing. Numerics follow transformers' ``Qwen3MoeExperts`` (router softmax in
float32, products in the model dtype).

Each expert's two projections are linear layers (``houchu.model.linear.dense.LinearBase``)
built by the decoder layer's own builder, so ``--quantization int4 / int8 / w8a8``
quantizes the routed experts (most of a MoE model's weights) as it does every other
projection, and a GGUF expert of a stored type (``gguf_blocks.STORED_TYPES``) stays as stored. The router stays dense, as
in vLLM and llama.cpp: it is small (``[E, hidden]``) and its rounding would move the
expert choice itself.

DeepSeekMoE (Dai et al. 2024; DeepSeek-AI 2024, "DeepSeek-V2" and "DeepSeek-V3") adds
to the same grouped experts: shared experts every token runs (``SharedExperts``, one
dense SwiGLU), group-limited routing (``Routing``: the experts are split in
``n_group`` groups and a token chooses only within its ``topk_group`` best groups),
DeepSeek-V3's sigmoid scores with a score-correction bias used for the choice only
(auxiliary-loss-free balancing), and a ``routed_scaling_factor`` on the routed weights.
Their router runs in float32, as transformers' ``DeepseekV3TopkRouter``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from houchu.model.config.core import ModelConfig
from houchu.model.linear.dense import Linear, LinearBase
from houchu.transport.levers import Lever, Unit, Verb
from houchu.transport.telemetry import LeverSample

SiluMul = Callable[[torch.Tensor], torch.Tensor]
#: builds one projection from the weights to fuse row-wise (``[N_i, K]`` tensors or
#: ``Int4Weight``s): the decoder layer's ``lin``
LinearBuilder = Callable[[list[Any]], LinearBase]


@dataclass(frozen=True)
class Routing:
    """How a token's experts are chosen from the router's logits.

    Attributes:
        method: "greedy" (softmax, top-k: Qwen3-MoE), "group_limited_greedy"
            (DeepSeek-V2: softmax; only the ``topk_group`` groups with the highest
            expert score are eligible) or "noaux_tc" (DeepSeek-V3: sigmoid; the
            score-correction bias is added for the choice only, and groups rank by the
            sum of their two best corrected scores).
        n_group, topk_group: the expert groups and how many a token may use.
        scaling: multiplies the chosen experts' weights (``routed_scaling_factor``).
        fp32_router: compute the router's logits in float32 (DeepSeek).
    """

    method: str = "greedy"
    n_group: int = 1
    topk_group: int = 1
    scaling: float = 1.0
    fp32_router: bool = False

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> Routing:
        """The routing ``cfg`` names (``topk_method``, groups, scaling factor)."""
        deepseek = cfg.is_mla or cfg.topk_method != "greedy"
        return cls(
            cfg.topk_method, cfg.n_group, cfg.topk_group, cfg.routed_scaling_factor, deepseek
        )


class SharedExperts(nn.Module):
    """DeepSeekMoE's shared experts: one SwiGLU ``down(silu(gate(x)) * up(x))`` of
    inner width ``n_shared_experts · moe_intermediate_size`` that every token runs.

    Args:
        gate_up: the fused ``[2·I_s, hidden]`` projection (any ``LinearBase``).
        down: ``[hidden, I_s]``.
    """

    def __init__(self, gate_up: nn.Module, down: nn.Module) -> None:
        super().__init__()
        self.gate_up, self.down = gate_up, down

    def forward(self, x: torch.Tensor, silu_mul: SiluMul) -> torch.Tensor:
        """x: ``[T, hidden]`` -> ``[T, hidden]``, same dtype."""
        return self.down(self.gate_up.forward_silu_mul(x, silu_mul))


class MoEMLP(nn.Module):
    """Top-k routed SwiGLU experts.

    Args:
        router: ``[E, hidden]`` router (gate) weight, dense (float32 for DeepSeek, else
            the model dtype).
        gate_up: ``E`` projections ``[hidden] -> [2·I]``: each expert's gate outputs,
            then its up outputs (any ``LinearBase``: dense or quantized).
        down: ``E`` projections ``[I] -> [hidden]``.
        top_k: experts per token.
        norm_topk_prob: renormalize the chosen experts' probabilities to sum to 1.
        routing: how experts are chosen (default: softmax top-k).
        score_bias: ``[E]`` float32 score-correction bias ("noaux_tc" routing), or None.
        shared: shared experts every token runs besides the routed ones, or None.
    Raises:
        ValueError: shapes that disagree, ``top_k`` not in ``[1, E]``, or groups that
            do not split the experts or hold fewer than ``top_k`` of them.
    """

    def __init__(
        self,
        router: torch.Tensor,
        gate_up: Sequence[LinearBase],
        down: Sequence[LinearBase],
        top_k: int,
        norm_topk_prob: bool,
        routing: Routing | None = None,
        score_bias: torch.Tensor | None = None,
        shared: SharedExperts | None = None,
    ) -> None:
        super().__init__()
        e, h = router.shape
        shapes = {
            (g.out_features, g.in_features, d.out_features, d.in_features)
            for g, d in zip(gate_up, down, strict=False)
        }
        if len(gate_up) != e or len(down) != e or len(shapes) != 1:
            raise ValueError(
                f"expert shapes disagree: router {tuple(router.shape)}, {len(gate_up)} "
                f"gate_up and {len(down)} down projections of shapes {sorted(shapes)}"
            )
        ((gu_out, gu_in, d_out, d_in),) = shapes
        if gu_in != h or d_out != h or gu_out != 2 * d_in:
            raise ValueError(
                f"expert shapes disagree: router {tuple(router.shape)}, gate_up "
                f"[{gu_out}, {gu_in}], down [{d_out}, {d_in}]"
            )
        if not 1 <= top_k <= e:
            raise ValueError(f"top_k {top_k} not in [1, {e}]")
        r = self.routing = routing or Routing()
        if e % r.n_group or not 1 <= r.topk_group <= r.n_group:
            raise ValueError(f"{e} experts, n_group {r.n_group}, topk_group {r.topk_group}")
        if r.topk_group * (e // r.n_group) < top_k:
            raise ValueError(f"top_k {top_k} exceeds the experts of {r.topk_group} groups")
        self.register_buffer("score_bias", score_bias, persistent=False)  # [E] fp32 or None
        self.shared = shared
        self.router = nn.Parameter(router, requires_grad=False)  # [E, hidden]
        self.gate_up = nn.ModuleList(gate_up)  # E x [hidden] -> [2I]
        self.down = nn.ModuleList(down)  # E x [I] -> [hidden]
        self.num_experts, self.top_k, self.norm_topk_prob = e, top_k, norm_topk_prob
        #: scalars of one expert's weights: gate, up and down (``3 · I · hidden``)
        self.expert_params = gu_out * gu_in + d_out * d_in
        #: tokens routed to each expert by the last forward: ``[E]`` int64 (expert load)
        self.last_load = torch.zeros(e, dtype=torch.int64)
        #: tokens routed to each expert since ``take_load``: ``[E]`` int64, or None
        self.load_since: torch.Tensor | None = None
        self.tokens_since = 0  # tokens through this layer since ``take_counts``

    @classmethod
    def from_weights(
        cls,
        cfg: ModelConfig,
        w: dict[str, Any],
        prefix: str,
        dtype: torch.dtype,
        linear: LinearBuilder,
    ) -> MoEMLP:
        """The MoE of the MLP at ``prefix`` from HF's per-expert tensors
        (``experts.{e}.{gate,up,down}_proj.weight``, ``gate.weight`` the router, and
        DeepSeek's ``gate.e_score_correction_bias`` and
        ``shared_experts.{gate,up,down}_proj.weight``); the tensors are consumed from
        ``w``. ``linear`` (the layer's own builder) makes each expert's fused gate_up
        and its down projection, and the shared experts', from a list of tensors or
        ``Int4Weight``s to fuse: they are quantized as the model's other projections.
        The router stays dense: float32 for DeepSeek, else ``dtype``.
        """
        gate_up, down = [], []
        for e in range(cfg.num_experts):
            parts = [w.pop(f"{prefix}.experts.{e}.{n}_proj.weight") for n in ("gate", "up", "down")]
            gate_up.append(linear(parts[:2]))  # [hidden] -> [2I]
            down.append(linear(parts[2:]))  # [I] -> [hidden]
        router = w.pop(f"{prefix}.gate.weight")  # [E, hidden]
        routing = Routing.from_config(cfg)
        bias = w.pop(f"{prefix}.gate.e_score_correction_bias", None)  # [E]
        if routing.method == "noaux_tc" and bias is None:
            bias = torch.zeros(cfg.num_experts)
        shared = None
        if cfg.n_shared_experts:
            s = f"{prefix}.shared_experts"
            gu = linear([w.pop(f"{s}.gate_proj.weight"), w.pop(f"{s}.up_proj.weight")])
            shared = SharedExperts(gu, linear([w.pop(f"{s}.down_proj.weight")]))
        return cls(
            router.to(torch.float32 if routing.fp32_router else dtype),
            gate_up,
            down,
            cfg.num_experts_per_tok,
            cfg.norm_topk_prob,
            routing,
            None if bias is None else bias.float(),
            shared,
        )

    @classmethod
    def from_stacked(
        cls, router: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, **kw: Any
    ) -> MoEMLP:
        """A MoE of dense experts from stacked weights: ``router [E, hidden]``,
        ``gate_up [E, 2·I, hidden]``, ``down [E, hidden, I]`` (each expert a ``Linear``
        over its slice); ``kw``: the constructor's other arguments (``top_k``,
        ``norm_topk_prob``, ...)."""
        return cls(router, [Linear(g) for g in gate_up], [Linear(d) for d in down], **kw)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: ``[T, hidden]`` -> ``(weights [T, top_k] in x's dtype, experts [T, top_k]
        int64)``."""
        if self.routing.method != "greedy" or self.routing.fp32_router:
            return self._route_grouped(x)
        probs = torch.softmax(x @ self.router.T, dim=-1, dtype=torch.float32)  # [T, E]
        weights, experts = torch.topk(probs, self.top_k, dim=-1)  # [T, k] each
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), experts

    def _route_grouped(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """DeepSeek's routing (see ``Routing``), as transformers' DeepSeek-V2/V3 routers:
        x ``[T, hidden]`` -> ``(weights [T, top_k] in x's dtype, experts [T, top_k])``."""
        r, t, e = self.routing, x.shape[0], self.num_experts
        logits = x.float() @ self.router.float().T  # [T, E] float32
        v3 = r.method == "noaux_tc"
        scores = logits.sigmoid() if v3 else logits.softmax(dim=-1)  # [T, E]
        choice = scores + self.score_bias if v3 and self.score_bias is not None else scores
        if r.method != "greedy":
            g = choice.view(t, r.n_group, e // r.n_group)  # [T, G, E/G]
            best = g.topk(2, dim=-1)[0].sum(dim=-1) if v3 else g.max(dim=-1).values  # [T, G]
            groups = torch.topk(best, r.topk_group, dim=-1, sorted=False)[1]  # [T, topk_group]
            keep = torch.zeros_like(best).scatter_(1, groups, 1.0).bool()  # [T, G]
            keep = keep.unsqueeze(-1).expand(-1, -1, e // r.n_group).reshape(t, e)  # [T, E]
            choice = choice.masked_fill(~keep, float("-inf") if v3 else 0.0)
        experts = torch.topk(choice, self.top_k, dim=-1, sorted=False)[1]  # [T, k]
        weights = scores.gather(1, experts)  # [T, k] float32
        if self.norm_topk_prob and self.top_k > 1:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return (weights * r.scaling).to(x.dtype), experts

    def forward(self, x: torch.Tensor, silu_mul: SiluMul) -> torch.Tensor:
        """x: ``[T, hidden]`` -> ``[T, hidden]`` in x's dtype; ``silu_mul`` maps
        ``[n, 2·I]`` (gate, up halves) to ``[n, I]`` ``silu(gate) * up``."""
        k = self.top_k
        weights, experts = self.route(x)
        flat = experts.reshape(-1)  # [T·k] expert of each (token, slot) pair
        order = torch.argsort(flat, stable=True)  # [T·k] pairs grouped by expert
        load = torch.bincount(flat, minlength=self.num_experts)  # [E]
        self.last_load = load
        self.load_since = load if self.load_since is None else self.load_since + load
        self.tokens_since += x.shape[0]
        tokens = order // k  # [T·k] the token of each sorted pair
        xs = x.index_select(0, tokens)  # [T·k, hidden]
        ys = torch.empty_like(xs)  # [T·k, hidden]
        start = 0
        for e, n in enumerate(load.tolist()):
            if n == 0:
                continue  # an expert no token picked: no work
            seg = xs[start : start + n]  # [n, hidden]
            inner = self.gate_up[e].forward_silu_mul(seg, silu_mul)  # [n, I]
            ys[start : start + n] = self.down[e](inner)
            start += n
        ys = ys * weights.reshape(-1).index_select(0, order).unsqueeze(1)  # [T·k, hidden]
        out = torch.zeros_like(x).index_add_(0, tokens, ys)  # [T, hidden]
        if self.shared is not None:
            out = out + self.shared(x, silu_mul)
        return out

    def take_counts(self) -> tuple[float, float]:
        """``(FLOPs not computed, router FLOPs)`` since the previous call: per token,
        the ``E - top_k`` experts it skipped (2 FLOPs per weight) against the router's
        ``2 · E · hidden``; then the count restarts."""
        n, self.tokens_since = self.tokens_since, 0
        skipped = 2.0 * n * (self.num_experts - self.top_k) * self.expert_params
        return skipped, 2.0 * n * self.router.numel()

    def take_load(self) -> list[int]:
        """Tokens routed to each expert (``E`` ints; a token counts once per expert it
        picked) since the previous call, all zero when none; then the count restarts."""
        load, self.load_since = self.load_since, None
        return [0] * self.num_experts if load is None else load.tolist()

    def active_params_per_token(self) -> int:
        """Expert weights one token reads: ``top_k`` experts' gate, up and down
        (scalars), plus the router (the shared experts are projections of their own,
        counted with the model's other linear layers)."""
        return self.top_k * self.expert_params + self.router.numel()

    def expert_linears(self) -> list[LinearBase]:
        """The routed experts' projections: ``E`` gate_up, then ``E`` down."""
        return [*self.gate_up, *self.down]

    def weight_bytes(self) -> tuple[int, int]:
        """``(bytes, bf16_bytes)`` one token's pass reads, as stored and in bfloat16:
        ``top_k`` experts (the mean expert's stored bytes: int4 codes and scales when
        int4) plus the dense router (float32 for DeepSeek)."""
        e, k = self.num_experts, self.top_k
        stored = sum(m.weight_bytes() for m in self.expert_linears())
        bf16 = sum(m.bf16_bytes() for m in self.expert_linears())
        router = self.router.numel() * self.router.element_size()
        return round(k * stored / e) + router, round(k * bf16 / e) + 2 * self.router.numel()

    def weight_bytes_at(self, rows: int) -> int:
        """Weight bytes a pass of ``rows`` tokens reads, expected under uniform routing:
        ``E · (1 - (1 - k/E)^rows)`` distinct experts (``top_k`` at one row), each on
        ``rows · k`` divided by that many rows (the weight copy its kernel reads at that
        row count), plus the router."""
        e, k = self.num_experts, self.top_k
        if rows <= 0:
            return 0
        hit = e * (1.0 - (1.0 - k / e) ** rows)  # expected experts with tokens
        per = max(1, math.ceil(rows * k / hit - 1e-6))  # rows each runs (ulps aside)
        mean = sum(m.weight_bytes_at(per) for m in self.expert_linears()) / e
        return round(hit * mean) + self.router.numel() * self.router.element_size()


def moe_lever_sample(moes: Iterable[MoEMLP], t: float) -> LeverSample | None:
    """The "moe_routed_experts" sample (compute_less) of ``moes`` since the previous
    call: the FLOPs of the experts each token skipped, against the routers' FLOPs; None
    when no token went through them."""
    counts = [m.take_counts() for m in moes]
    saved, spent = sum(c[0] for c in counts), sum(c[1] for c in counts)
    if not saved:
        return None
    return LeverSample(
        Lever.MOE_ROUTED_EXPERTS, Verb.COMPUTE_LESS, saved, Unit.FLOPS, spent, Unit.FLOPS, t
    )
