"""The model a runner serves, loaded as it starts: its quantization resolved for the file,
then the whole model (``houchu.model.weights.loader.load_model``) or, under tensor
parallelism, this rank's shard (``houchu.runner.tensor_parallel.shards.load_sharded``)."""

from __future__ import annotations

from pathlib import Path

import torch

from houchu.cpu import kernels as cpu_kernels
from houchu.model.config.core import resolve_model_file
from houchu.model.gguf.file import shared_gguf
from houchu.model.llama import LlamaModel
from houchu.model.quant.functions import QuantSpec
from houchu.model.quant.mode import resolve_quant_mode
from houchu.model.weights.loader import load_model
from houchu.options.runner_options import RunnerOptions
from houchu.runner.tensor_parallel.group import TPGroup
from houchu.runner.tensor_parallel.shards import load_sharded


def load_runner_model(
    path: str | Path,
    options: RunnerOptions,
    dtype: torch.dtype,
    device: torch.device,
    prepack: bool,
    tp: TPGroup | None = None,
) -> tuple[LlamaModel, QuantSpec]:
    """The model a runner serves, as it starts, and its ``QuantSpec``: ``options``'
    quantization resolved for the file (``resolve_quant_mode``), then ``load_model``
    (with ``tp``, this rank's shard: ``load_sharded``). On the CPU, houchu's C++ kernels
    build (the first start at an ISA level) while the weights load; the mode and the
    weights share one parse of a GGUF file (``gguf_file.shared_gguf``).

    Raises:
        ModelLoadError: see ``load_model``.
        ValueError: an unknown quantization mode.
    """
    o = options
    build = device.type == "cpu" and o.attention_backend in ("auto", "cpu")
    building = cpu_kernels.load_in_background() if build else None
    with shared_gguf(), torch.inference_mode():
        mode = resolve_quant_mode(o.quantization, resolve_model_file(path))
        quant = QuantSpec(
            mode,
            o.quant_group_size,
            o.int4_activations,
            o.int4_method,
            o.calibration_text,
        )
        if tp is None:
            model = load_model(path, dtype, device, prepack, quant)
        else:
            model = load_sharded(path, tp, dtype, device, prepack, quant)
    if building is not None:
        building.result()  # never raises: make_backend reports why the kernels are out
    return model, model.quant  # GPTQ not applied to stored Q4 weights: not in the label
