"""What the model's structure does to the other levers, said at startup: which levers
cannot apply to its blocks or attention, and what its sliding windows save.

A lever that cannot apply to a structure is never dropped silently: ``structure_notes``
gives one line per such case for the runner's start-up output.
"""

from __future__ import annotations

from houchu.model.attention.window import LayerAttention
from houchu.model.config.core import ModelConfig
from houchu.model.moe import Routing

#: families where int4 by rounding misses 0.95 top-1 against the exact path
#: (tests/unit/test_family_quant_quality.py: Gemma 2 0.930, Gemma 3 0.927; GPTQ 0.965/0.967)
ROUNDING_LOSES = ("gemma2", "gemma3_text")


def structure_notes(
    cfg: ModelConfig,
    layers: tuple[LayerAttention, ...],
    backend: str,
    fused_asked: bool,
    quant_mode: str = "none",
    int4_method: str = "mse",
    rounded: bool = True,
) -> list[str]:
    """One line per lever the model's structure limits.

    Args:
        cfg: the model's configuration.
        layers: each layer's ``LayerAttention``.
        backend: the attention backend's name ("cpu", "torch-sdpa", "triton", "flash-attn").
        fused_asked: the fused C++ decode layers were not turned off.
        quant_mode: the weights' ``QuantSpec.mode`` ("none", "int4", "int8", "w8a8").
        int4_method: ``QuantSpec.int4_method`` ("mse", "minmax", "gptq").
        rounded: some float weight was rounded to int4 (False: every int4 weight is a
            GGUF tensor served as stored, ``LlamaModel.rounded_int4``).
    Returns:
        Lines for the start-up output (empty for a plain Llama-family model).
    """
    out = []
    if (
        quant_mode == "int4"
        and rounded
        and int4_method != "gptq"
        and cfg.architecture in ROUNDING_LOSES
    ):
        out.append(
            f"--quantization int4: weights rounded to int4 agree less with the exact path on "
            f"{cfg.architecture} (top-1 0.93 on houchu's quality test, 0.95+ in other "
            "families); --int4-method gptq held 0.965, or use --quantization int8"
        )
    if quant_mode != "none" and cfg.is_moe:
        fp32 = Routing.from_config(cfg).fp32_router  # DeepSeek's routers
        out.append(
            f"--quantization {quant_mode}: the routed experts are quantized (each expert's "
            "gate_up and down projections, as attention, dense MLPs and shared experts); "
            f"the routers stay dense ({'float32' if fp32 else 'model dtype'})"
        )
    if quant_mode != "none" and cfg.is_mla:
        out.append(
            f"--quantization {quant_mode}: MLA's kv_b_proj stays dense (its key and value "
            "up-projections are absorbed per head)"
        )
    if fused_asked and backend == "cpu" and not cfg.plain_llama_layers:
        out.append(
            f"fused decode layers off: they compute plain Llama blocks only, and "
            f"{cfg.architecture}'s blocks differ (they run op by op)"
        )
    windowed = cfg.has_sliding_window  # some layer; each windowed layer's: cfg.sliding_window
    if windowed and fused_asked and backend == "cpu" and cfg.plain_llama_layers:
        out.append(
            f"fused decode layers run only while every sequence fits in the "
            f"{cfg.sliding_window}-token window (they attend the whole context); longer ones "
            "decode op by op"
        )
    if windowed and backend == "cpu":
        out.append(
            "sliding windows: the C++ decode and prefill attention kernels read only each "
            "layer's window"
        )
    if windowed and backend == "triton":
        out.append("sliding windows: windowed layers decode on torch SDPA (no Triton window)")
    if any(s.softcap for s in layers) and backend in ("cpu", "triton"):
        out.append(
            "attention soft-capping runs on torch ops (houchu's attention kernels do not soft-cap)"
        )
    if windowed and not cfg.every_layer_windowed:
        out.append(
            f"sliding-window page release off: {cfg.num_layers - len(cfg.sliding_layers)} "
            "global layers read the whole context (only the reads shrink)"
        )
    elif windowed:
        out.append(
            f"sliding-window page release on: pages before each request's "
            f"{cfg.sliding_window}-token window are released"
        )
    return out
