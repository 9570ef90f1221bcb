"""Measuring a lossy lever against the exact path (docs/architecture.md, "Correctness rule"): top-1
next-token agreement and the mean absolute difference of the log-probability each model
gives the text's actual next token, on a fixed text.

The text is fed in chunks (``chunk`` tokens a step, each attending over the earlier
chunks' K/V read back from the pool), so a quantized KV pool is really read, and the
matmuls run at decode-like row counts (the weight-only kernels, not the large-batch
dense path) unless ``chunk`` is large.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from houchu.model.attention.base import AttentionBackend
from houchu.model.attention.torch import TorchSDPABackend
from houchu.model.batch import build_batch
from houchu.model.kv.pool import KVPool
from houchu.model.llama import LlamaModel
from houchu.transport.messages import SeqWork


@dataclass
class Agreement:
    """``top1``: fraction of positions where both models' argmax agree; ``mean_abs_dlogp``:
    mean |log p(next) - log p_ref(next)| over the text's actual next tokens (nats);
    ``positions``: how many positions were compared."""

    top1: float
    mean_abs_dlogp: float
    positions: int


def text_logprobs(
    model: LlamaModel,
    ids: list[int],
    *,
    kv_dtype: str = "auto",
    chunk: int = 32,
    page_size: int = 16,
    backend: AttentionBackend | None = None,
) -> torch.Tensor:
    """Log-softmax of the model's logits at every position of ``ids``.

    Args:
        model: the model (any quantization).
        ids: the token ids (at least 2).
        kv_dtype: KV pool element type ("auto", "int8", "fp8").
        chunk: tokens per step.
        page_size: tokens per KV page.
        backend: attention backend (default: torch).
    Returns:
        ``[len(ids), vocab]`` float32 log-probabilities (row i predicts token i + 1).
    Raises:
        ValueError: fewer than 2 tokens.
    """
    if len(ids) < 2:
        raise ValueError("need at least 2 tokens")
    n_pages = -(-len(ids) // page_size)
    dev = model.embed.device
    pool = KVPool.for_model(
        model.cfg,
        page_size=page_size,
        dtype=model.dtype,
        device=dev,
        num_pages=n_pages,
        kv_dtype=kv_dtype,
    )
    backend = backend or TorchSDPABackend()
    table = list(range(n_pages))
    out = []
    with torch.inference_mode():
        for start in range(0, len(ids), chunk):
            piece = ids[start : start + chunk]
            work = [
                SeqWork(rid="t", token_ids=piece, start_pos=start, page_table=table, sample=True)
            ]
            b = build_batch(
                work,
                page_size=page_size,
                num_pages=n_pages,
                max_context=len(ids),
                vocab_size=model.cfg.vocab_size,
                device=dev,
            )
            b.sample_rows = torch.arange(len(piece), device=dev)  # every position
            out.append(model(b, pool, backend).log_softmax(-1))
    return torch.cat(out)  # [n, V]


def agreement(ref: torch.Tensor, got: torch.Tensor, ids: list[int]) -> Agreement:
    """Compare two ``text_logprobs`` results for the same ``ids``.

    ref, got: ``[n, V]`` float32 log-probabilities.
    """
    nxt = torch.tensor(ids[1:], device=ref.device)[:, None]  # [n-1, 1]
    r, g = ref[:-1], got[:-1]
    top1 = (r.argmax(-1) == g.argmax(-1)).float().mean().item()
    dlogp = (r.gather(1, nxt) - g.gather(1, nxt)).abs().mean().item()
    return Agreement(top1, dlogp, len(ids) - 1)
