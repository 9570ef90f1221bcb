"""The decode step compiled with ``torch.compile`` (Inductor), for the CPU.

Piecewise, as vLLM's and SGLang's compiled CPU/GPU paths: per layer, the dense work
before attention (RMSNorm, qkv projection, RoPE) and after it (o_proj, residual, RMSNorm,
gate/up projection, SiLU·mul, down projection, residual), and the final norm plus LM
head, are three compiled graphs; attention over the paged KV stays eager (its shapes
follow the sequences' lengths). The graphs call the model's own kernel set, so a step
computes the same as eagerly; houchu's C++ CPU kernels (``houchu.cpu.kernels``) stay
opaque calls inside them. Inputs are padded to a fixed batch-size bucket, so each
graph is compiled once per bucket, all at startup (``warmup``); every layer reuses the
same graphs (Dynamo lifts the layer's weights to graph inputs). Decode-only steps of at
most the largest bucket run compiled; prefill and mixed steps, and larger batches, run
eagerly. Padded rows compute garbage that never reaches attention, the pool or the
logits.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from houchu.model.attention.base import AttentionBackend
from houchu.model.batch import StepBatch
from houchu.model.decoder_layer import DecoderLayer
from houchu.model.kv.pool import KVPool
from houchu.model.llama import LlamaModel
from houchu.model.ops import TorchOps

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32)
RECOMPILE_LIMIT = 128  # compiled entries per piece, over all runners of a process


def _pre(
    layer: DecoderLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ops: TorchOps
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return layer.pre(x, cos, sin, ops)


def _post(layer: DecoderLayer, x: torch.Tensor, o: torch.Tensor, ops: TorchOps) -> torch.Tensor:
    return layer.post(x, o, ops)


def _head(model: LlamaModel, x: torch.Tensor) -> torch.Tensor:
    return model.head(x)


class CompiledDecode:
    """Compiled decode-step pieces for batch-size buckets.

    Args:
        model: the model (its layers' ``pre`` / ``post`` and ``head`` are compiled).
        buckets: batch sizes compiled, ascending; a decode step of B sequences runs at the
            smallest bucket >= B.
    Raises:
        ValueError: empty or non-positive buckets.
    """

    def __init__(self, model: LlamaModel, buckets: tuple[int, ...] = DEFAULT_BUCKETS) -> None:
        if not buckets or min(buckets) < 1:
            raise ValueError(f"compile buckets must be positive batch sizes, got {buckets}")
        self.model = model
        self.buckets = tuple(sorted(set(buckets)))
        # Dynamo keeps compiled entries per code object: every runner made in this
        # process adds one per bucket to the same three functions
        cfg = torch._dynamo.config
        cfg.recompile_limit = max(cfg.recompile_limit, RECOMPILE_LIMIT)
        opts = {"fullgraph": True, "dynamic": False}
        self._pre = torch.compile(_pre, **opts)
        self._post = torch.compile(_post, **opts)
        self._head = torch.compile(_head, **opts)
        self.compile_s = 0.0

    def bucket(self, batch: StepBatch) -> int | None:
        """The bucket a step runs at, or None when it must run eagerly (not decode-only,
        or more sequences than the largest bucket)."""
        if batch.num_tokens != batch.num_seqs or batch.num_seqs > self.buckets[-1]:
            return None
        return next(b for b in self.buckets if b >= batch.num_seqs)

    def warmup(self, buckets: tuple[int, ...] | None = None) -> float:
        """Compile the graphs of ``buckets`` (default: all) on dummy inputs through every
        layer; returns the seconds it took (also added to ``compile_s``)."""
        t0 = time.perf_counter()
        m = self.model
        dev = m.embed.device
        with torch.inference_mode():
            for b in self.buckets if buckets is None else buckets:
                ids = torch.zeros(b, dtype=torch.int64, device=dev)
                x, cos, sin = m.embed_and_rope(ids, ids)
                for layer in m.layers:
                    q, _, _ = self._pre(layer, x, cos, sin, m.ops)
                    x = self._post(layer, x, torch.zeros_like(q), m.ops)
                self._head(m, x)
        took = time.perf_counter() - t0
        self.compile_s += took
        return took

    def forward(
        self, batch: StepBatch, pool: KVPool, backend: AttentionBackend, bucket: int
    ) -> torch.Tensor:
        """Run a decode-only step at ``bucket`` (from ``bucket(batch)``).

        Returns:
            ``[R, vocab]`` float32 logits of ``batch.sample_rows``, as ``LlamaModel``'s.
        """
        m, n = self.model, batch.num_tokens
        pad = bucket - n
        ids = F.pad(batch.token_ids, (0, pad))  # [Bp]
        pos = F.pad(batch.positions, (0, pad))  # [Bp]
        x, cos, sin = m.embed_and_rope(ids, pos)
        meta = backend.prepare(batch, m.attention)
        for i, layer in enumerate(m.layers):
            q, k, v = self._pre(layer, x, cos, sin, m.ops)  # [Bp, H, D], [Bp, Hkv, D] x2
            o = backend.forward(i, q[:n], k[:n], v[:n], pool, batch, meta)  # [n, H, D]
            x = self._post(layer, x, F.pad(o, (0, 0, 0, 0, 0, pad)) if pad else o, m.ops)
        logits = self._head(m, x)  # [Bp, V]
        if batch.sample_rows.numel() == n:
            return logits[:n]
        return logits.index_select(0, batch.sample_rows)
