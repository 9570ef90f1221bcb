"""A stand-in of the default model for a machine it cannot reach: its GGUF skeleton, and
the model rebuilt from it with random weights.

The default model's GGUF (SmolLM2-135M-Instruct Q4_1, 94 MiB) is larger than what the
device tool carries to a GPU machine in one call (64 MiB, the working tree included), and
that machine reaches no registry to fetch it. Its skeleton is small (1.7 MiB): the GGUF
header verbatim (metadata, tokenizer, chat template, tensor table) and, in a JSON file
beside it, each tensor's type, shape, byte offset and size. ``build_standin`` writes a GGUF
with that header and random tensor data of the same types and sizes: the same shapes,
quantization (Q4_1 projections, so ``--quantization auto`` picks int4), tokenizer and
context as the default model, hence the same work per token; its text is noise.

    skeleton: ``write_skeleton(gguf, dir)`` -> DIR/default-model.skeleton(.json)
    stand-in: ``build_standin(dir, out)`` -> a .gguf of the original's size
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SKELETON = "default-model.skeleton"
#: Bytes per block and weights per block of the GGUF types a stand-in can hold.
BLOCKS = {"F32": (4, 1), "F16": (2, 1), "Q4_0": (18, 32), "Q4_1": (20, 32), "Q8_0": (34, 32)}


def write_skeleton(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Write ``gguf_path``'s skeleton into ``out_dir``: ``default-model.skeleton`` (the
    header bytes, up to the tensor data) and ``default-model.skeleton.json`` (``source``,
    ``file_size`` in bytes, ``header_bytes``, and ``tensors``: ``[name, type, shape,
    offset, nbytes]`` each, offsets absolute, in bytes). Needs the ``gguf`` package.

    Returns:
        The JSON file's path.
    Raises:
        ValueError: a tensor type outside ``BLOCKS`` (its random data could not be made).
    """
    from gguf import GGUFReader

    src = Path(gguf_path)
    reader = GGUFReader(str(src))
    tensors = []
    for t in reader.tensors:
        kind = t.tensor_type.name
        if kind not in BLOCKS:
            raise ValueError(f"{src.name}: tensor {t.name} is {kind}; a stand-in holds {BLOCKS}")
        shape = [int(x) for x in t.shape]
        tensors.append([t.name, kind, shape, int(t.data_offset), int(t.n_bytes)])
    header = min(t[3] for t in tensors)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as f:
        (out / SKELETON).write_bytes(f.read(header))
    meta = {
        "source": src.name,
        "file_size": src.stat().st_size,
        "header_bytes": header,
        "tensors": tensors,
    }
    path = out / f"{SKELETON}.json"
    path.write_text(json.dumps(meta))
    return path


def skeleton_in(folder: str | Path | None) -> Path | None:
    """The skeleton's JSON file in ``folder``, or None when there is none."""
    if folder is None:
        return None
    path = Path(folder) / f"{SKELETON}.json"
    return path if path.is_file() and (Path(folder) / SKELETON).is_file() else None


def _tensor_bytes(kind: str, shape: list[int], nbytes: int, rng: Any) -> bytes:
    """``nbytes`` of random ``kind`` data for a tensor of ``shape``: quantized blocks with
    a scale of 0.02 / levels (weights of about N(0, 0.02²)'s spread), 1-D float tensors
    (norms) around 1, other float tensors N(0, 0.02²)."""
    import numpy as np

    size, per = BLOCKS[kind]
    n = nbytes // size
    if kind in ("F32", "F16"):
        dt = np.float32 if kind == "F32" else np.float16
        center = 1.0 if len([d for d in shape if d > 1]) <= 1 else 0.0
        return rng.normal(center, 0.02, n).astype(dt).tobytes()
    blocks = rng.integers(0, 256, (n, size), dtype=np.uint8)
    levels = 256 if kind == "Q8_0" else 16
    d = np.float16(0.04 / levels)
    blocks[:, 0:2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
    if kind == "Q4_1":  # d, then m (the minimum): codes 0..15 around zero
        m = np.float16(-8 * float(d))
        blocks[:, 2:4] = np.frombuffer(m.tobytes(), dtype=np.uint8)
    return blocks.tobytes()


def build_standin(skeleton_dir: str | Path, out: str | Path, seed: int = 0) -> Path:
    """Write the stand-in GGUF of the skeleton in ``skeleton_dir`` to ``out`` (the
    original's header, random data of each tensor's type at its offset, the file the
    original's size). Kept when ``out`` already holds a file of that size.

    Returns:
        ``out`` as a ``Path``.
    Raises:
        FileNotFoundError: no skeleton in ``skeleton_dir``.
    """
    import numpy as np

    meta_path = skeleton_in(skeleton_dir)
    if meta_path is None:
        raise FileNotFoundError(f"no {SKELETON}(.json) in {skeleton_dir}")
    meta = json.loads(meta_path.read_text())
    dst = Path(out)
    if dst.is_file() and dst.stat().st_size == meta["file_size"]:
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    part = dst.with_suffix(".part")
    with open(part, "wb") as f:
        f.write((Path(skeleton_dir) / SKELETON).read_bytes())
        for _name, kind, shape, offset, nbytes in meta["tensors"]:
            f.seek(offset)
            f.write(_tensor_bytes(kind, shape, nbytes, rng))
        f.truncate(meta["file_size"])
    part.replace(dst)
    return dst


def standin_name(skeleton_dir: str | Path) -> str:
    """The stand-in's file name: the original's with ``.standin`` before ``.gguf``."""
    meta_path = skeleton_in(skeleton_dir)
    source = json.loads(meta_path.read_text())["source"] if meta_path else "model.gguf"
    return source.removesuffix(".gguf") + ".standin.gguf"
