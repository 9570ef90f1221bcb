"""The quantization mode a model runs with: "auto" resolved against a GGUF file's stored
block types (``houchu.model.gguf.blocks``, which builds on ``houchu.model.quant.functions``'s
int4 weights, so this sits above both)."""

from __future__ import annotations

from pathlib import Path

from houchu.model.gguf.blocks import STORED_TYPES
from houchu.model.gguf.index import open_gguf_index
from houchu.model.quant.functions import QUANT_CHOICES, QUANT_MODES


def resolve_quant_mode(mode: str, model_path: str | Path) -> str:
    """The quantization mode to run ``model_path`` with.

    "auto" serves a GGUF file's quantized projections as stored: "int4" when every
    weight matrix of its blocks has a type houchu computes on as stored
    (``gguf_blocks.STORED_TYPES``: Q4_0/Q4_1/Q4_K as int4, Q5_0/Q5_1/Q5_K/Q6_K/Q8_0 as
    two int4 planes, all lossless), else "none" (dense, the exact path). Any other mode
    is returned as given.

    Raises:
        ValueError: ``mode`` is not "auto" or one of ``QUANT_MODES``.
    """
    if mode != "auto":
        if mode not in QUANT_MODES:
            raise ValueError(f"quantization must be one of {QUANT_CHOICES}, got {mode!r}")
        return mode
    p = Path(model_path)
    if not (p.is_file() and p.suffix == ".gguf"):
        return "none"
    reader = open_gguf_index(p)
    kinds = {
        t.tensor_type.name
        for t in reader.tensors
        if t.name.startswith("blk.") and t.name.endswith(".weight") and len(t.shape) >= 2
    }
    return "int4" if kinds and kinds <= STORED_TYPES.keys() else "none"
