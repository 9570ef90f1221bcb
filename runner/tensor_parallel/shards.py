"""Tensor parallelism (Megatron-LM: Shoeybi et al. 2019, "Megatron-LM: Training
Multi-Billion Parameter Language Models Using Model Parallelism", section 3; the layout
vLLM's ``ColumnParallelLinear`` / ``RowParallelLinear`` / ``VocabParallelEmbedding``
use): each of N ranks holds 1/N of every block's weights and its own 1/N of the KV heads.

Per block, rank ``r`` of ``N``:

- q/k/v: the rows of its query heads ``[r·H/N, (r+1)·H/N)`` and KV heads
  ``[r·Hkv/N, (r+1)·Hkv/N)`` (column-parallel: no communication), so attention and its
  KV pool are the rank's heads only;
- o_proj: the matching input columns (row-parallel), then one all-reduce of the
  ``[T, hidden]`` partial sums;
- gate/up: rows ``[r·I/N, (r+1)·I/N)`` of each (column-parallel); down: the matching
  input columns (row-parallel), then one all-reduce;
- embedding and LM head: vocabulary rows ``[r·V'/N, (r+1)·V'/N)`` (V' = V rounded up to a
  multiple of N, padded with zero rows); the embedding of a token outside the rank's
  rows is zero and an all-reduce sums the one non-zero row; the LM head's ``[R, V'/N]``
  logits are all-gathered to ``[R, V]``.

Each rank reads only its shard from the checkpoint (``houchu.model.weights.shard``: safetensors
slices, a GGUF's tensor views cut before dequantizing), before the layers are built, so
quantized layers quantize their shard (an int4 group size must divide each row-parallel
shard's input width), and a GGUF's quantized tensors are cut along their blocks. Norms, RoPE and biases after a
reduction are replicated. ``TensorParallelError`` says at startup what cannot be
sharded.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from houchu.model.config.core import ModelConfig, num_parameters
from houchu.model.config.load import load_model_config
from houchu.model.llama import LlamaModel, Weights
from houchu.model.quant.functions import Int4Weight, QuantSpec
from houchu.model.weights.loader import load_tensors
from houchu.model.weights.shapes import HEAD_STORED, check_shapes
from houchu.model.weights.shard import Shard, TensorParallelError
from houchu.runner.tensor_parallel.group import TPGroup
from houchu.transport.levers import Lever, Unit, Verb
from houchu.transport.telemetry import LeverSample

__all__ = ["TensorParallelError", "TPLlamaModel", "check_shardable", "load_sharded"]


def check_shardable(cfg: ModelConfig, world: int, quant: QuantSpec) -> None:
    """Raise ``TensorParallelError`` (one line) unless ``cfg`` shards over ``world`` ranks.

    Requires a dense-MLP, multi-head-attention model (no MoE, no MLA) whose query heads,
    KV heads and MLP width divide by ``world``, and, for int4, a group size dividing
    each row-parallel shard's input width.
    """
    flag = f"--tensor-parallel-size {world}"
    if cfg.is_mla:
        raise TensorParallelError(f"{flag}: multi-head latent attention (MLA) is not sharded")
    if cfg.is_moe:
        raise TensorParallelError(f"{flag}: MoE layers are not sharded (use tp 1)")
    bad = [
        f"{what} ({n})"
        for what, n in (
            ("attention heads", cfg.num_heads),
            ("KV heads", cfg.num_kv_heads),
            ("MLP width", cfg.intermediate_size),
        )
        if n % world
    ]
    if bad:
        sizes = [
            n
            for n in range(2, cfg.num_kv_heads + 1)
            if not (cfg.num_heads % n or cfg.num_kv_heads % n or cfg.intermediate_size % n)
        ]
        hint = f"sizes that divide them: {sizes}" if sizes else "only tp 1 fits this model"
        raise TensorParallelError(
            f"{flag}: {cfg.name!r} has {', '.join(bad)} not divisible by {world}; {hint}"
        )
    if quant.mode == "int4":
        g = quant.group_size
        for what, k in (
            ("o_proj", cfg.num_heads * cfg.head_dim // world),
            ("down_proj", cfg.intermediate_size // world),
        ):
            if k % g:
                raise TensorParallelError(
                    f"{flag}: the int4 group size {g} does not divide {what}'s input width "
                    f"per rank ({k}); pick --quant-group-size dividing it"
                )


def shard_config(cfg: ModelConfig, world: int) -> ModelConfig:
    """The configuration one rank's layers and KV pool are built from: ``H/N`` query and
    ``Hkv/N`` KV heads, MLP width ``I/N``; vocabulary, hidden size and head width
    unchanged."""
    return dataclasses.replace(
        cfg,
        num_heads=cfg.num_heads // world,
        num_kv_heads=cfg.num_kv_heads // world,
        intermediate_size=cfg.intermediate_size // world,
    )


def padded_vocab(vocab_size: int, world: int) -> int:
    """``V`` rounded up to a multiple of ``world`` (the vocabulary rows ranks split)."""
    return -(-vocab_size // world) * world


def _rows(t: torch.Tensor | Int4Weight, rank: int, world: int) -> torch.Tensor | Int4Weight:
    """Rank ``rank``'s ``1/world`` of ``t``'s rows (``[N, ...]`` -> ``[N/world, ...]``)."""
    n = t.shape[0] // world
    s = slice(rank * n, (rank + 1) * n)
    if isinstance(t, Int4Weight):
        return t.rows(s)
    return t[s].contiguous()


def _cols(t: torch.Tensor | Int4Weight, rank: int, world: int) -> torch.Tensor | Int4Weight:
    """Rank ``rank``'s ``1/world`` of ``t``'s input columns (``[N, K]`` ->
    ``[N, K/world]``); an int4 weight is cut at group boundaries.

    Raises:
        TensorParallelError: an int4 weight whose groups straddle the cut.
    """
    k = t.shape[1] // world
    if isinstance(t, Int4Weight):
        g = t.group_size
        if k % g:
            raise TensorParallelError(
                f"a Q4 tensor's groups of {g} do not divide its input width per rank ({k})"
            )
        return t.columns(rank * k, (rank + 1) * k)
    return t[:, rank * k : (rank + 1) * k].contiguous()


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` ``[V, hidden]`` with zero rows appended to ``[rows, hidden]``."""
    return F.pad(t, (0, 0, 0, rows - t.shape[0])) if rows > t.shape[0] else t


def shard_weights(cfg: ModelConfig, w: Weights, rank: int, world: int) -> Weights:
    """Slice whole Hugging Face-named weights to rank ``rank``'s shard, in place (``w`` is
    returned; ``houchu.model.weights.shard.Shard.kind`` says what each rank keeps). The
    embedding and an untied LM head become ``[V'/N, hidden]`` (``padded_vocab``). The
    loaders cut the same shard as they read (``load_tensors(..., shard=)``)."""
    shard = Shard(rank, world)
    vp = padded_vocab(cfg.vocab_size, world)
    w.pop(HEAD_STORED, None)  # a rank's head is its vocabulary rows of the dense one
    for key in list(w):
        kind = shard.kind(key)
        if kind == "rows":
            w[key] = _rows(w[key], rank, world)
        elif kind == "cols":
            w[key] = _cols(w[key], rank, world)
        elif kind == "vocab":
            w[key] = _rows(_pad_rows(w[key], vp), rank, world)  # type: ignore[arg-type]
    return w


class RowParallel(nn.Module):
    """A row-parallel projection: the rank's input columns, then one all-reduce.

    x ``[T, K/N]`` -> ``[T, out]`` (the sum over ranks), in the layer's dtype.
    """

    def __init__(self, inner: nn.Module, group: TPGroup) -> None:
        super().__init__()
        self.inner = inner
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(self.inner(x).contiguous())


class TPLlamaModel(LlamaModel):
    """One rank's shard of a ``LlamaModel`` (see the module docstring). ``cfg`` is the
    whole model's configuration; ``w`` its whole weights, or with ``sharded`` this
    rank's shard already (as ``load_tensors(..., shard=)`` reads it); ``forward`` is
    ``LlamaModel``'s and returns the full ``[R, V]`` logits on every rank."""

    def __init__(
        self,
        cfg: ModelConfig,
        w: Weights,
        group: TPGroup,
        device: torch.device | str = "cpu",
        prepack: bool = True,
        quant: QuantSpec | None = None,
        sharded: bool = False,
    ) -> None:
        world = group.world
        shard = shard_config(cfg, world)
        vocab_shard = padded_vocab(cfg.vocab_size, world) // world
        local = dataclasses.replace(shard, vocab_size=vocab_shard)
        if not sharded:  # whole weights: cut them here
            shard_weights(cfg, w, group.rank, world)
        check_shapes(local, w)
        super().__init__(local, w, device, prepack, quant)
        self.full_cfg = cfg
        self.vocab_shard = vocab_shard
        self.cfg = dataclasses.replace(shard, vocab_size=cfg.vocab_size)
        self.group = group
        self.vocab_start = group.rank * self.vocab_shard
        for layer in self.layers:
            layer.o_proj = RowParallel(layer.o_proj, group)
            layer.down = RowParallel(layer.down, group)
        self._num_params = num_parameters(cfg).total

    def embed_and_rope(
        self, token_ids: torch.Tensor, positions: torch.Tensor, max_pos: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``LlamaModel.embed_and_rope`` over the rank's vocabulary rows: a token outside
        them embeds to zeros, and the all-reduce sums the ranks' rows. token_ids,
        positions ``[T]`` int64 -> x ``[T, hidden]``, cos / sin as ``LlamaModel``'s."""
        local = token_ids - self.vocab_start  # [T]
        inside = (local >= 0) & (local < self.vocab_shard)  # [T] bool
        x, cos, sin = super().embed_and_rope(torch.where(inside, local, 0), positions, max_pos)
        x = x.masked_fill(~inside.unsqueeze(1), 0)  # [T, hidden]
        return self.group.all_reduce(x.contiguous()), cos, sin

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm, the rank's LM-head rows, all-gather: x ``[R, hidden]`` -> ``[R, V]``
        float32 logits."""
        part = super().head(x)  # [R, V'/N]
        return self.group.all_gather_cols(part.contiguous())[:, : self.full_cfg.vocab_size]


def load_sharded(
    path: str | Path,
    group: TPGroup,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    prepack: bool = True,
    quant: QuantSpec | None = None,
) -> TPLlamaModel:
    """Load rank ``group.rank``'s shard of the model at ``path`` (``load_model``'s
    arguments otherwise). The loaders read only the shard: safetensors slices
    (``get_slice``), a GGUF's tensor views cut before they are dequantized or repacked.

    Raises:
        TensorParallelError: the model cannot be sharded over ``group.world`` ranks (a
            GGUF's quantization blocks straddling a cut included).
        ModelLoadError: see ``houchu.model.weights.loader.load_model``.
    """
    quant = quant or QuantSpec()
    check_shardable(load_model_config(path), group.world, quant)
    shard = Shard(group.rank, group.world)
    cfg, tensors = load_tensors(path, dtype, quant.keeps_gguf_q4, shard=shard)
    return TPLlamaModel(cfg, tensors, group, device, prepack, quant, sharded=True)


def tp_lever_sample(group: TPGroup, rank_weight_bytes: int, now: float) -> LeverSample:
    """The ``tensor_parallel`` ledger row ("fill") since the previous call: saved, the
    weight bytes this rank did not read (the other ranks' shards, ``(N - 1) ×`` its own
    per forward pass); spent, the seconds in collectives (all-reduces and the logits'
    all-gather, waiting for the slowest rank included)."""
    steps, spent = group.take_ledger()
    saved = float(steps * (group.world - 1) * rank_weight_bytes)
    return LeverSample(
        Lever.TENSOR_PARALLEL, Verb.FILL, saved, Unit.BYTES, spent, Unit.SECONDS, now
    )
