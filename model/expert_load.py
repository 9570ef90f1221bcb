"""Expert load per step: how many tokens each routed expert of each MoE layer received.
Read by the runner actor after each step for its ``StepRecord``; the imbalance is
computed where it is shown (``houchu.storage.expert_load_view``)."""

from __future__ import annotations

from torch import nn

from houchu.model.moe import MoEMLP


class ExpertLoadReader:
    """Reads the expert load of ``model``'s MoE layers (found once, in layer order)."""

    def __init__(self, model: nn.Module) -> None:
        self.layers = [m for m in model.modules() if isinstance(m, MoEMLP)]

    def take(self) -> list[list[int]]:
        """Tokens per expert of each MoE layer (``[L][E]``) since the previous call;
        ``[]`` for a model without MoE layers."""
        return [m.take_load() for m in self.layers]
