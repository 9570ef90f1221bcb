"""DeepSeek-V2 / V3's part of a ``ModelConfig`` (DeepSeek-AI 2024, "DeepSeek-V2"; 2024,
"DeepSeek-V3"): multi-head latent attention's widths, DeepSeekMoE (shared experts,
group-limited routing, the first ``first_k_dense_replace`` layers dense) and YaRN RoPE,
read from a Hugging Face ``config.json`` as transformers' ``DeepseekV2Config`` /
``DeepseekV3Config`` name them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from houchu.model.config import MLAConfig, ModelConfig, ModelLoadError


def deepseek_config(base: ModelConfig, raw: dict[str, Any], path: Path) -> ModelConfig:
    """``base`` (the fields every family shares, read from ``raw``) with the DeepSeek
    fields of ``raw`` (a ``deepseek_v2`` or ``deepseek_v3`` ``config.json``).

    Raises:
        ModelLoadError: a field houchu does not implement (attention or MLP bias, an
            explicit YaRN ``attention_factor``), or widths that disagree.
        KeyError: a required field is missing (the caller names it).
    """
    family = base.architecture
    if raw.get("attention_bias") or raw.get("mlp_bias"):
        raise ModelLoadError(f"{path}: attention_bias / mlp_bias are not supported for {family}")
    rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    if rope.get("attention_factor") is not None:
        raise ModelLoadError(f"{path}: an explicit YaRN attention_factor is not supported")
    mla = MLAConfig(
        q_lora_rank=int(raw.get("q_lora_rank") or 0),
        kv_lora_rank=int(raw["kv_lora_rank"]),
        qk_nope_head_dim=int(raw["qk_nope_head_dim"]),
        qk_rope_head_dim=int(raw["qk_rope_head_dim"]),
        v_head_dim=int(raw["v_head_dim"]),
        # DeepSeek-V2 always rotates adjacent pairs; V3 as its config says (default True)
        rope_interleave=family == "deepseek_v2" or bool(raw.get("rope_interleave", True)),
    )
    layers = base.num_layers
    experts = int(raw.get("n_routed_experts") or 0)
    first_dense = int(raw.get("first_k_dense_replace") or 0)
    freq = int(raw.get("moe_layer_freq") or 1)
    moe_layers = tuple(i for i in range(layers) if experts and i >= first_dense and i % freq == 0)
    if family == "deepseek_v3":
        method = "noaux_tc"
    else:
        method = str(raw.get("topk_method") or "greedy")
    factor = float(rope.get("factor") or 1.0)
    return dataclasses.replace(
        base,
        head_dim=mla.qk_rope_head_dim,
        num_kv_heads=base.num_heads,
        attention_bias=False,
        o_proj_bias=False,
        qk_norm=False,
        mla=mla,
        num_experts=experts,
        num_experts_per_tok=int(raw.get("num_experts_per_tok") or 0) if experts else 0,
        moe_intermediate_size=int(raw.get("moe_intermediate_size") or 0) if experts else 0,
        norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
        moe_layers=moe_layers,
        n_shared_experts=int(raw.get("n_shared_experts") or 0) if experts else 0,
        topk_method=method,
        n_group=int(raw.get("n_group") or 1),
        topk_group=int(raw.get("topk_group") or 1),
        routed_scaling_factor=float(raw.get("routed_scaling_factor") or 1.0),
        rope_factor=factor,
        rope_beta_fast=float(rope.get("beta_fast") or 32.0),
        rope_beta_slow=float(rope.get("beta_slow") or 1.0),
        rope_mscale=float(rope.get("mscale") or 0.0),
        rope_mscale_all_dim=float(rope.get("mscale_all_dim") or 0.0),
        rope_original_max_position=int(
            rope.get("original_max_position_embeddings") or base.max_position
        ),
    )
