"""Load a model from disk: GGUF file or Hugging Face directory, by what the path is."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import torch

from houchu.model.config.core import ModelConfig, ModelLoadError, resolve_model_file
from houchu.model.gguf.blocks import STORED_TYPES
from houchu.model.linear.quantized import Int4Linear
from houchu.model.llama import LlamaModel, Weights
from houchu.model.quant.functions import Int4Weight, QuantSpec
from houchu.model.weights.shapes import HEAD_STORED
from houchu.model.weights.shard import Shard

log = logging.getLogger(__name__)

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def parse_dtype(name: str) -> torch.dtype:
    """``"float32"`` / ``"bfloat16"`` / ``"float16"`` (or fp32/bf16/fp16) to a torch dtype.

    Raises:
        ValueError: another name.
    """
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r} (use float32, bfloat16 or float16)") from None


def load_tensors(
    path: str | Path, dtype: torch.dtype, keep_q4: bool = False, shard: Shard | None = None
) -> tuple[ModelConfig, Weights]:
    """Config and Hugging Face-named CPU tensors of the model at ``path`` (with
    ``keep_q4``, a GGUF file's projections of ``STORED_TYPES`` as lossless ``Int4Weight``; with
    ``shard``, only that tensor-parallel rank's part of each tensor, read as such).

    Raises:
        ModelLoadError: not a GGUF file / HF directory, or unsupported model.
        TensorParallelError: a GGUF tensor's quantization blocks straddle ``shard``'s cut.
    """
    p = resolve_model_file(path)
    if p.is_file() and p.suffix == ".gguf":
        from houchu.model.weights.gguf import load_gguf, load_gguf_shard

        if shard is not None:
            return load_gguf_shard(p, dtype, keep_q4, shard)
        return load_gguf(p, dtype, keep_q4)
    if p.is_dir():
        from houchu.model.weights.hf import load_hf

        return load_hf(p, dtype, shard)
    raise ModelLoadError(f"{path}: expected a .gguf file or a Hugging Face model directory")


def load_model(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    prepack: bool = True,
    quant: QuantSpec | None = None,
) -> LlamaModel:
    """Load and build the ``LlamaModel`` at ``path`` (weights in ``dtype`` on ``device``;
    ``prepack``: oneDNN-packed dense matmul weights on CPU where available; ``quant``:
    quantized projections, see ``QuantSpec``).

    Raises:
        ModelLoadError: see ``load_tensors``; missing or mis-shaped tensors.
        ValueError: an int4 group size that does not divide a layer's input width.
    """
    quant = quant or QuantSpec()
    cfg, tensors = load_tensors(path, dtype, quant.keeps_gguf_q4)
    stored_q4 = any(isinstance(t, Int4Weight) for t in tensors.values())
    if quant.gptq and not stored_q4:
        return load_gptq(path, cfg, tensors, device, prepack, quant)
    stored = stored_types({k: t for k, t in tensors.items() if k != HEAD_STORED})
    model = LlamaModel.from_tensors(cfg, tensors, device, prepack, quant)
    head = model.lm_head
    if isinstance(head, Int4Linear) and head.stored:  # a head kept as stored (not requantized)
        stored[head.stored] = stored.get(head.stored, 0) + 1
    if stored:  # said at start-up (``LlamaModel.load_notes``)
        model.load_notes.append(stored_note(stored))
    if quant.gptq:  # said at start-up, and not in the label
        model.load_notes.append(
            "--int4-method gptq not applied: the file's quantized projections stay as "
            "stored (lossless); its other float weights are rounded"
        )
        model.quant = dataclasses.replace(quant, int4_method="mse")
    return model


#: how the start-up line on the weights served as stored begins (``stored_note``)
STORED_NOTE = "weights as stored (lossless): "


def stored_types(tensors: Weights) -> dict[str, int]:
    """How many projection weights of each GGUF type ``tensors`` keep as stored
    (``Int4Weight``s with a ``kind``; a MoE layer's stacked experts count one each)."""
    count: dict[str, int] = {}
    for t in tensors.values():
        for w in t if isinstance(t, list) else [t]:
            if isinstance(w, Int4Weight) and w.kind:
                count[w.kind] = count.get(w.kind, 0) + 1
    return dict(sorted(count.items()))


def stored_note(count: dict[str, int]) -> str:
    """The start-up line on the weights computed on as stored, e.g. "weights as stored
    (lossless): Q4_K x27 int4, Q5_0 x81 two int4 planes"."""
    parts = [
        f"{k} x{n} " + ("int4" if STORED_TYPES[k] <= 4 else "two int4 planes")
        for k, n in sorted(count.items())
    ]
    return STORED_NOTE + ", ".join(parts)


def load_gptq(
    path: str | Path,
    cfg: ModelConfig,
    tensors: Weights,
    device: torch.device | str,
    prepack: bool,
    quant: QuantSpec,
) -> LlamaModel:
    """The model built dense, run over the calibration text (``quant.calibration``, read
    with the model's tokenizer) and its projections turned int4 by GPTQ
    (``houchu.model.quant.gptq``). Logs the time it took.

    Raises:
        ValueError: an unreadable or too short calibration text.
        TokenizerError: the model has no usable tokenizer.
    """
    from houchu.model.quant.calibration import calibration_ids
    from houchu.model.quant.gptq import quantize_model_gptq

    t0 = time.perf_counter()
    ids = calibration_ids(path, quant.calibration)
    model = LlamaModel.from_tensors(cfg, tensors, device, False, QuantSpec())
    done = quantize_model_gptq(model, ids, quant, prepack)
    note = (
        f"GPTQ: {done.quantized} projections int4 over {len(ids)} calibration tokens in "
        f"{time.perf_counter() - t0:.1f}s"
    )
    if done.rounded:
        note += (
            f"; {done.rounded} the calibration text never reached (experts never routed to) rounded"
        )
    model.load_notes.append(note)
    log.info(note)
    return model
