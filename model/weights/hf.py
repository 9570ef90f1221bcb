"""Load a Llama model's tensors from a Hugging Face directory (``config.json`` plus
``model.safetensors`` or shards listed in ``model.safetensors.index.json``), with the
``safetensors`` library. Tensor names stay Hugging Face's (houchu's canonical names).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from houchu.model.config.core import ModelConfig, ModelLoadError
from houchu.model.config.load import load_model_config
from houchu.model.weights.shard import Shard


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
            names = [n for n in st.keys() if not n.endswith("rotary_emb.inv_freq")]  # noqa: SIM118
            if shard is None:
                for name in names:
                    tensors[name] = st.get_tensor(name).to(dtype).contiguous()
                continue
        for name in names:  # one tensor per opening: see _read_shard
            with safe_open(str(f), framework="pt", device="cpu") as st:
                tensors[name] = _read_shard(st, name, shard, dtype)
    return cfg, tensors


def _read_shard(st: Any, name: str, shard: Shard, dtype: torch.dtype) -> torch.Tensor:
    """``shard``'s part of tensor ``name`` of the open safetensors file ``st`` (only those
    bytes are read), copied out of the file's mapping into ``dtype``, contiguous.

    ``safetensors`` maps the whole file while it is open, and a rank's rows of a tensor
    come out as a view of that mapping (no copy), which keeps the mapping, and every page
    of it the rank touched, in the rank's resident set for as long as the tensor lives
    (a column cut touches every page of its tensor). The caller opens the file once per
    tensor; with the copy, the mapping closes with it, so a rank's peak resident set is
    its shard and one tensor's pages, not its shard and most of the file."""
    kind = shard.kind(name)
    if kind is None:
        return st.get_tensor(name).to(dtype, copy=True)
    view = st.get_slice(name)
    shape = view.get_shape()
    if kind == "rows":
        return view[shard.span(shape[0])].to(dtype, copy=True)
    if kind == "cols":
        return view[:, shard.span(shape[1])].to(dtype, copy=True).contiguous()
    rows, pad = shard.vocab_span(shape[0])
    out = torch.zeros(rows.stop - rows.start + pad, *shape[1:], dtype=dtype)  # [V'/world, hidden]
    out[: rows.stop - rows.start] = view[rows]
    return out
