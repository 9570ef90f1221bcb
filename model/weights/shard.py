"""Which part of each weight one tensor-parallel rank keeps, by Hugging Face name, so
that the loaders read only that part (``houchu.runner.tensor_parallel.shards`` has the layout
and its source: Megatron-LM's column- and row-parallel layers, vLLM's
``VocabParallelEmbedding``).

- ``rows``: q/k/v (weight and bias) and gate/up: output rows ``[r·N/W, (r+1)·N/W)``;
- ``cols``: o_proj and down_proj: input columns ``[r·K/W, (r+1)·K/W)``;
- ``vocab``: the embedding and the LM head: rows ``[r·V'/W, (r+1)·V'/W)`` of the
  vocabulary padded to ``V'`` (a multiple of ``W``) with zero rows;
- anything else (norms, RoPE frequencies, biases after a reduction): whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["rows", "cols", "vocab"]


class TensorParallelError(ValueError):
    """A model or an option that cannot run at this ``--tensor-parallel-size``."""


_LAYER = re.compile(
    r"^model\.layers\.\d+\.(?:self_attn\.(?P<attn>[qkvo])_proj|mlp\.(?P<mlp>gate|up|down)_proj)"
    r"\.(?P<part>weight|bias)$"
)
_VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


@dataclass(frozen=True)
class Shard:
    """Rank ``rank`` of ``world`` tensor-parallel ranks."""

    rank: int
    world: int

    def kind(self, name: str) -> Kind | None:
        """How the tensor ``name`` is cut (see the module docstring), or None: whole."""
        if name in _VOCAB:
            return "vocab"
        m = _LAYER.match(name)
        if m is None:
            return None
        which = m["attn"] or m["mlp"]
        if which in ("o", "down"):
            return "cols" if m["part"] == "weight" else None
        return "rows"

    def span(self, n: int) -> slice:
        """This rank's ``1/world`` of ``n`` rows or columns."""
        k = n // self.world
        return slice(self.rank * k, (self.rank + 1) * k)

    def vocab_span(self, vocab_size: int) -> tuple[slice, int]:
        """This rank's vocabulary rows that exist (``[a, b)`` clipped to ``vocab_size``)
        and how many zero rows follow them to make ``V' / world`` rows."""
        per = -(-vocab_size // self.world)  # V' / world
        start = min(self.rank * per, vocab_size)
        stop = min(start + per, vocab_size)
        return slice(start, stop), per - (stop - start)
