"""Helpers for tests elsewhere in houchu: a tiny random Llama saved as a Hugging Face
directory (needs ``transformers``; imported lazily)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TINY_CONFIG: dict[str, Any] = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def make_tiny_llama(
    path: str | Path, *, tie_word_embeddings: bool = False, seed: int = 0, **overrides: Any
) -> Path:
    """Save a randomly initialised ``LlamaForCausalLM`` (float32, safetensors) to ``path``.

    Args:
        path: target directory (created).
        tie_word_embeddings: share the embedding and LM-head matrices.
        seed: torch seed for the random weights.
        overrides: ``LlamaConfig`` fields replacing ``TINY_CONFIG``'s.
    Returns:
        ``path`` as a ``Path``.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(**{**TINY_CONFIG, **overrides}, tie_word_embeddings=tie_word_embeddings)
    model = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():  # larger-than-default weights so logits differ visibly
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
    out = Path(path)
    model.save_pretrained(out, safe_serialization=True)
    return out
