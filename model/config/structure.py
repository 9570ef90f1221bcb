"""The attention and block structure of the families beyond plain Llama blocks, read from
a Hugging Face ``config.json`` or GGUF metadata into ``ModelConfig`` fields:

| family | HF ``model_type`` / GGUF arch | structure |
|---|---|---|
| Mistral (Jiang et al. 2023) | ``mistral`` / ``llama`` with ``attention.sliding_window`` | sliding-window attention in every layer |
| Gemma 2 (Gemma Team 2024) | ``gemma2`` / ``gemma2`` | local (sliding) and global layers interleaved; (1 + w) RMSNorm; norms after attention and around the MLP; embedding × √hidden; GeLU-tanh MLP; attention and final logit soft-capping; ``query_pre_attn_scalar`` |
| Gemma 3 (Gemma Team 2025) | ``gemma3_text`` / ``gemma3`` | Gemma 2's blocks without soft-capping, with QK-norm and a RoPE base per layer type (``rope_local_base_freq`` for local layers) |

A sliding window of W tokens lets position i attend positions i - W + 1 .. i (Hugging
Face's ``sliding_window_overlay``: ``kv_idx > q_idx - sliding_window``; Beltagy et al.
2020, "Longformer"; Child et al. 2019).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: families whose structure this module reads
STRUCTURE_FAMILIES = ("mistral", "gemma2", "gemma3_text")
#: GGUF ``general.architecture`` -> houchu's family name
GGUF_FAMILY = {"gemma3": "gemma3_text"}
#: HF activation names of the gated MLP -> houchu's name
_ACTS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu_tanh"}
#: Gemma 2 / 3 27B scale queries by hidden / heads, not head_dim (llama.cpp's rule;
#: GGUF has no query_pre_attn_scalar key): their block counts
_GGUF_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def hidden_activation(raw: dict[str, Any], family: str) -> str:
    """The gated MLP's activation ("silu" or "gelu_tanh") of an HF config.

    Raises:
        ValueError: an activation houchu does not compute.
    """
    name = raw.get("hidden_activation") or raw.get("hidden_act") or "silu"
    if family.startswith("gemma") and name == "gelu":  # Gemma's configs mean the tanh form
        name = "gelu_pytorch_tanh"
    if name not in _ACTS or (name == "gelu" and not family.startswith("gemma")):
        raise ValueError(f"hidden_act {name!r} is not supported")
    return _ACTS[name]


def _sliding_layers(kinds: list[str] | None, layers: int, pattern: int) -> tuple[int, ...]:
    """Indices of the sliding-window layers: from ``layer_types`` when given, else every
    layer but each ``pattern``-th (Gemma's ``sliding_window_pattern``)."""
    if kinds:
        return tuple(i for i, k in enumerate(kinds) if k == "sliding_attention")
    return tuple(i for i in range(layers) if (i + 1) % pattern)


def hf_structure(raw: dict[str, Any], family: str, layers: int, head_dim: int) -> dict[str, Any]:
    """``ModelConfig`` fields of an HF config's structure (empty for the plain families).

    Args:
        raw: the parsed ``config.json``.
        family: the model's family (``ModelConfig.architecture``).
        layers: ``num_hidden_layers``.
        head_dim: the head width.
    Returns:
        Keyword overrides for ``ModelConfig``.
    Raises:
        ValueError: a bidirectional Gemma 3 (an encoder), or an unsupported RoPE setting.
    """
    if family not in STRUCTURE_FAMILIES:
        return {}
    window = int(raw.get("sliding_window") or 0)
    out: dict[str, Any] = {"hidden_act": hidden_activation(raw, family)}
    if family == "mistral":
        if window:
            out |= {"sliding_window": window, "sliding_layers": tuple(range(layers))}
        return out
    if raw.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention=true (an encoder) is not supported")
    pattern = int(raw.get("sliding_window_pattern") or (6 if family == "gemma3_text" else 2))
    scalar = float(raw.get("query_pre_attn_scalar") or head_dim)
    out |= {
        "sliding_window": window,
        "sliding_layers": _sliding_layers(raw.get("layer_types"), layers, pattern)
        if window
        else (),
        "attn_scale": scalar**-0.5,
        "attn_softcap": float(raw.get("attn_logit_softcapping") or 0.0),
        "final_softcap": float(raw.get("final_logit_softcapping") or 0.0),
        "gemma_blocks": True,
        "qk_norm": family == "gemma3_text",
        "tie_word_embeddings": bool(raw.get("tie_word_embeddings", True)),
    }
    if family == "gemma3_text":
        out |= _gemma3_rope(raw)
    return out


def _gemma3_rope(raw: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's two RoPE settings: global layers' base and scaling, local layers' base
    (``rope_parameters`` per layer type, or the older ``rope_theta`` /
    ``rope_local_base_freq`` / ``rope_scaling``)."""
    params = raw.get("rope_parameters") or {}
    full = dict(params.get("full_attention") or raw.get("rope_scaling") or {})
    local = dict(params.get("sliding_attention") or {})
    rope_type = full.get("rope_type", full.get("type", "default")) or "default"
    if local.get("rope_type", "default") != "default":
        raise ValueError(f"local layers' RoPE type {local['rope_type']!r} is not supported")
    return {
        "rope_theta": float(full.get("rope_theta", raw.get("rope_theta", 1_000_000.0))),
        "rope_local_theta": float(
            local.get("rope_theta", raw.get("rope_local_base_freq", 10_000.0))
        ),
        "rope_type": str(rope_type),
        "rope_factor": float(full.get("factor", 1.0)),
    }


def gguf_structure(
    arch: str, opt: Callable[[str, Any], Any], layers: int, hidden: int, heads: int, head_dim: int
) -> dict[str, Any]:
    """``ModelConfig`` fields of a GGUF file's structure, as llama.cpp reads them.

    Args:
        arch: ``general.architecture``.
        opt: ``opt(key, default)`` reads ``{arch}.{key}``.
        layers, hidden, heads, head_dim: the block count and widths.
    Returns:
        Keyword overrides for ``ModelConfig`` (a Llama file with
        ``llama.attention.sliding_window`` is a Mistral).
    """
    window = int(opt("attention.sliding_window", 0) or 0)
    if arch == "llama":
        if not window:
            return {}
        return {
            "architecture": "mistral",
            "sliding_window": window,
            "sliding_layers": tuple(range(layers)),
        }
    if arch not in ("gemma2", "gemma3"):
        return {}
    pattern = opt("attention.sliding_window_pattern", 6 if arch == "gemma3" else 2)
    if isinstance(pattern, list):  # one flag per layer (llama.cpp's newer form)
        sliding = tuple(i for i, s in enumerate(pattern) if s)
    else:
        sliding = _sliding_layers(None, layers, int(pattern))
    scalar = hidden / heads if layers == _GGUF_27B_LAYERS[arch] else head_dim
    out = {
        "architecture": GGUF_FAMILY.get(arch, arch),
        "hidden_act": "gelu_tanh",
        "sliding_window": window,
        "sliding_layers": sliding if window else (),
        "attn_scale": scalar**-0.5,
        "attn_softcap": float(opt("attn_logit_softcapping", 0.0) or 0.0),
        "final_softcap": float(opt("final_logit_softcapping", 0.0) or 0.0),
        "gemma_blocks": True,
    }
    if arch == "gemma3":
        out["rope_local_theta"] = float(opt("rope.freq_base_swa", 10_000.0))
    return out


def gguf_moe(opt: Callable[[str, Any], Any], tensor_names: set[str], layers: int) -> dict[str, Any]:
    """``ModelConfig`` fields of a ``qwen3moe`` GGUF file's experts, as llama.cpp's
    converter writes them (``Qwen2MoeModel.set_gguf_parameters``): ``expert_count``,
    ``expert_used_count``, ``expert_feed_forward_length``; the MoE layers are those with a
    router (``blk.N.ffn_gate_inp.weight``), the others dense (Hugging Face's
    ``mlp_only_layers``). llama.cpp always renormalises a Qwen3-MoE's top-k weights, so
    ``expert_weights_norm`` defaults to true.

    Args:
        opt: ``opt(key, default)`` reads ``qwen3moe.{key}``.
        tensor_names: the file's tensor names.
        layers: the block count.
    Returns:
        Keyword overrides for ``ModelConfig``.
    Raises:
        ValueError: the expert counts are missing, or no layer has a router.
    """
    experts, used = int(opt("expert_count", 0) or 0), int(opt("expert_used_count", 0) or 0)
    moe_layers = tuple(i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" in tensor_names)
    if not (experts and used and moe_layers):
        raise ValueError("a qwen3moe file needs expert_count, expert_used_count and routers")
    return {
        "architecture": "qwen3_moe",
        "num_experts": experts,
        "num_experts_per_tok": used,
        "moe_intermediate_size": int(opt("expert_feed_forward_length", 0) or 0),
        "norm_topk_prob": bool(opt("expert_weights_norm", True)),
        "moe_layers": moe_layers,
    }
