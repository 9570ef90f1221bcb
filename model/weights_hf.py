"""Load a Llama model's tensors from a Hugging Face directory (``config.json`` plus
``model.safetensors`` or shards listed in ``model.safetensors.index.json``), with the
``safetensors`` library. Tensor names stay Hugging Face's (houchu's canonical names).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from houchu.model.config import ModelConfig, ModelLoadError, load_model_config
from houchu.model.shard import Shard


def safetensors_files(path: Path) -> list[Path]:
    """The safetensors files of a model directory, in a stable order.

    Raises:
        ModelLoadError: no safetensors file, or an index naming a missing shard.
    """
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise ModelLoadError(f"{index}: unreadable index ({e})") from e
        files = [path / f for f in sorted(set(weight_map.values()))]
    else:
        files = sorted(path.glob("*.safetensors"))
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ModelLoadError(f"{path}: missing safetensors shards {missing}")
    if not files:
        raise ModelLoadError(f"{path}: no *.safetensors files (pytorch .bin is not supported)")
    return files


def load_hf(
    path: str | Path, dtype: torch.dtype = torch.float32, shard: Shard | None = None
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Load a Hugging Face Llama directory.

    Args:
        path: directory with ``config.json`` and safetensors weights.
        dtype: dtype of the returned weights.
        shard: a tensor-parallel rank: read only its part of each tensor
            (``safetensors``' ``get_slice``; ``Shard.kind``), the vocabulary rows
            padded with zero rows to ``V' / world``.
    Returns:
        ``(config, tensors)``: tensors keyed by Hugging Face name, CPU, ``dtype``,
        contiguous. Non-weight buffers (``rotary_emb.inv_freq``) are dropped.
    Raises:
        ModelLoadError: bad config, non-Llama model, or missing weights.
    """
    from safetensors import safe_open

    p = Path(path)
    cfg = load_model_config(p)
    tensors: dict[str, torch.Tensor] = {}
    for f in safetensors_files(p):
        with safe_open(str(f), framework="pt", device="cpu") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a dict)
                if name.endswith("rotary_emb.inv_freq"):
                    continue
                tensors[name] = _read(st, name, shard).to(dtype).contiguous()
    return cfg, tensors


def _read(st: Any, name: str, shard: Shard | None) -> torch.Tensor:
    """Tensor ``name`` of the open safetensors file ``st``, or ``shard``'s part of it
    (only those bytes are read)."""
    kind = shard.kind(name) if shard is not None else None
    if kind is None:
        return st.get_tensor(name)
    view = st.get_slice(name)
    shape = view.get_shape()
    if kind == "rows":
        return view[shard.span(shape[0])]
    if kind == "cols":
        return view[:, shard.span(shape[1])]
    rows, pad = shard.vocab_span(shape[0])
    t = view[rows]  # [rows, hidden]
    return F.pad(t, (0, 0, 0, pad)) if pad else t  # [V'/world, hidden]
