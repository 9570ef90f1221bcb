"""Decode steps captured as CUDA graphs, one per batch-size bucket, and replayed.

A captured graph replays fixed kernels on fixed addresses, so the step reads its inputs
from static buffers sized for the largest bucket: token ids, positions, KV slots, a
block table ``[B, max_pages]`` and KV lengths. ``StaticDecode`` owns those buffers and
runs the fixed-shape step (``forward_static``: every layer's ``pre``, the backend's
``decode_static``, ``post``, then the head); ``CudaGraphDecode`` captures it per bucket
at startup and replays it (removing the per-kernel launch cost, which dominates small
decode batches on a GPU). Rows past the real batch are padding: they write their K/V to
the pool's scratch page (``KVPool(scratch_pages=1)``), which no sequence owns, and attend
to it alone. ``StaticDecode`` runs without a GPU, so the static path is tested on the
CPU; only capture and replay need CUDA.
"""

from __future__ import annotations

import time

import torch

from houchu.model.attention.base import AttentionBackend
from houchu.model.batch import StepBatch
from houchu.model.kv.pool import KVPool
from houchu.model.llama import LlamaModel


def forward_static(
    model: LlamaModel,
    backend: AttentionBackend,
    pool: KVPool,
    token_ids: torch.Tensor,
    positions: torch.Tensor,
    slots: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
) -> torch.Tensor:
    """One decode step with fixed shapes (B rows, one new token each).

    Args:
        token_ids, positions, slots: ``[B]`` int64.
        block_table: ``[B, max_pages]`` int32.
        seq_lens: ``[B]`` int32 (positions + 1).
    Returns:
        ``[B, vocab]`` float32 logits of every row.
    """
    x, cos, sin = model.embed_and_rope(token_ids, positions)
    for i, layer in enumerate(model.layers):
        q, k, v = layer.pre(x, cos, sin, model.ops)
        o = backend.decode_static(i, q, k, v, pool, slots, block_table, seq_lens)
        x = layer.post(x, o, model.ops)
    return model.head(x)


class StaticDecode:
    """Static input buffers and the fixed-shape decode step, per batch-size bucket.

    Args:
        model, pool, backend: the runner's (the backend must support ``decode_static``;
            the pool needs a scratch page).
        buckets: batch sizes served.
    Raises:
        ValueError: the pool has no scratch page or the backend no static path.
    """

    def __init__(
        self, model: LlamaModel, pool: KVPool, backend: AttentionBackend, buckets: tuple[int, ...]
    ) -> None:
        if pool.scratch_pages < 1 or not backend.supports_static:
            raise ValueError("a static decode step needs a scratch page and a static backend")
        self.model, self.pool, self.backend = model, pool, backend
        self.buckets = tuple(sorted(set(buckets)))
        ps, dev = pool.page_size, model.embed.device
        self.max_pages = min(pool.num_pages, -(-model.cfg.max_position // ps))
        self.scratch = pool.num_pages  # the first scratch page
        b = self.buckets[-1]
        self.ids = torch.zeros(b, dtype=torch.int64, device=dev)  # [Bmax]
        self.pos = torch.zeros(b, dtype=torch.int64, device=dev)  # [Bmax]
        self.slots = torch.full((b,), self.scratch * ps, dtype=torch.int64, device=dev)  # [Bmax]
        self.table = torch.full((b, self.max_pages), self.scratch, dtype=torch.int32, device=dev)
        self.lens = torch.ones(b, dtype=torch.int32, device=dev)  # [Bmax]
        self.compile_s = 0.0

    def bucket(self, batch: StepBatch) -> int | None:
        """The bucket a step runs at, or None (not decode-only, too many sequences, or a
        page table wider than the static one)."""
        if batch.num_tokens != batch.num_seqs or batch.num_seqs > self.buckets[-1]:
            return None
        if batch.page_tables.shape[1] > self.max_pages:
            return None
        return next(b for b in self.buckets if b >= batch.num_seqs)

    def _load(self, batch: StepBatch, bucket: int) -> None:
        """Copy the step into the static buffers; rows n..bucket-1 become padding."""
        n, w = batch.num_tokens, batch.page_tables.shape[1]
        self.ids[:n].copy_(batch.token_ids)
        self.pos[:n].copy_(batch.positions)
        self.slots[:n].copy_(batch.slot_mapping)
        self.table[:n, :w].copy_(batch.page_tables)
        self.table[:n, w:].fill_(self.scratch)
        lens = torch.tensor(batch.kv_lens, dtype=torch.int32)
        self.lens[:n].copy_(lens.to(self.lens.device, non_blocking=True))
        self.ids[n:bucket].zero_()
        self.pos[n:bucket].zero_()
        self.slots[n:bucket].fill_(self.scratch * self.pool.page_size)
        self.table[n:bucket].fill_(self.scratch)
        self.lens[n:bucket].fill_(1)

    def _run(self, bucket: int) -> torch.Tensor:
        """The static step on the first ``bucket`` rows of the buffers -> ``[bucket, V]``."""
        return forward_static(
            self.model,
            self.backend,
            self.pool,
            self.ids[:bucket],
            self.pos[:bucket],
            self.slots[:bucket],
            self.table[:bucket],
            self.lens[:bucket],
        )

    def warmup(self) -> float:
        """Run every bucket once (compiles lazily built kernels); returns seconds."""
        t0 = time.perf_counter()
        with torch.inference_mode():
            for b in self.buckets:
                self._run(b)
        self.compile_s = time.perf_counter() - t0
        return self.compile_s

    def _logits(self, bucket: int) -> torch.Tensor:
        return self._run(bucket)

    def forward(
        self, batch: StepBatch, pool: KVPool, backend: AttentionBackend, bucket: int
    ) -> torch.Tensor:
        """Run a decode-only step at ``bucket``; ``[R, vocab]`` float32 logits of
        ``batch.sample_rows``."""
        self._load(batch, bucket)
        logits = self._logits(bucket)[: batch.num_tokens]
        if batch.sample_rows.numel() == batch.num_tokens:
            return logits.clone()
        return logits.index_select(0, batch.sample_rows)


class CudaGraphDecode(StaticDecode):
    """``StaticDecode`` captured as one CUDA graph per bucket (largest first, sharing one
    memory pool) and replayed per step."""

    def __init__(
        self, model: LlamaModel, pool: KVPool, backend: AttentionBackend, buckets: tuple[int, ...]
    ) -> None:
        super().__init__(model, pool, backend, buckets)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def warmup(self) -> float:
        """Warm up (Triton compiles, cuBLAS workspaces) and capture every bucket."""
        t0 = time.perf_counter()
        mempool = torch.cuda.graph_pool_handle()
        with torch.inference_mode():
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for b in self.buckets:
                    self._run(b)
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            for b in reversed(self.buckets):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=mempool):
                    self.outputs[b] = self._run(b)  # [b, V], lives in the graph's pool
                self.graphs[b] = g
        torch.cuda.synchronize()
        self.compile_s = time.perf_counter() - t0
        return self.compile_s

    def _logits(self, bucket: int) -> torch.Tensor:
        self.graphs[bucket].replay()
        return self.outputs[bucket]
