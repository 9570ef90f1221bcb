"""DeepSeek-V2 / V3's part of a ``ModelConfig`` (DeepSeek-AI 2024, "DeepSeek-V2"; 2024,
"DeepSeek-V3"): multi-head latent attention's widths, DeepSeekMoE (shared experts,
group-limited routing, the first ``first_k_dense_replace`` layers dense) and YaRN RoPE,
read from a Hugging Face ``config.json`` as transformers' ``DeepseekV2Config`` /
``DeepseekV3Config`` name them, or from a GGUF ``deepseek2`` file as llama.cpp's
converter writes it (and its tensors brought back to the Hugging Face layout).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from houchu.model.config.core import MLAConfig, ModelConfig, ModelLoadError


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


#: llama.cpp's ``expert_gating_func`` values (gguf.ExpertGatingFuncType)
_GATING_SIGMOID = 2


def deepseek_config_from_gguf(reader: Any, path: Path | str, opt: Any, need: Any) -> ModelConfig:
    """A ``ModelConfig`` from a GGUF ``deepseek2`` file's metadata, as llama.cpp's
    converter writes it: MLA as multi-query attention with one KV head of
    ``kv_lora_rank + qk_rope_head_dim`` (``attention.key_length``), the per-head widths
    in ``attention.key_length_mla`` / ``value_length_mla`` (older files: in
    ``key_length`` / ``value_length``, with an unsplit ``attn_kv_b``), sigmoid gating
    for DeepSeek-V3 (``expert_gating_func`` 2) and the RoPE pairs interleaved.

    Args:
        reader: the open ``gguf.GGUFReader``.
        path: the file (for messages).
        opt, need: ``key -> value`` readers of ``deepseek2.{key}`` (``need`` raises
            ``ModelLoadError`` when the key is absent).
    Raises:
        ModelLoadError: metadata missing or naming an unsupported RoPE scaling.
    """
    from houchu.model.config.core import gguf_field

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    rope_dim = int(need("rope.dimension_count"))
    r = int(need("attention.kv_lora_rank"))
    if opt("attention.key_length_mla", None) is not None:
        nope = int(need("attention.key_length_mla")) - rope_dim
        v_dim = int(need("attention.value_length_mla"))
    else:
        nope, v_dim = (
            int(need("attention.key_length")) - rope_dim,
            int(need("attention.value_length")),
        )
    mla = MLAConfig(int(opt("attention.q_lora_rank", 0) or 0), r, nope, rope_dim, v_dim, True)
    layers = int(need("block_count"))
    experts = int(opt("expert_count", 0) or 0)
    first_dense = int(opt("leading_dense_block_count", 0) or 0)
    v3 = int(opt("expert_gating_func", 1) or 1) == _GATING_SIGMOID
    groups = int(opt("expert_group_count", 1) or 1)
    method = "noaux_tc" if v3 else ("group_limited_greedy" if groups > 1 else "greedy")
    scaling = opt("rope.scaling.type", "none")
    rope_type, factor, mscale = "default", 1.0, 0.0
    if scaling == "yarn":
        rope_type, factor = "yarn", float(opt("rope.scaling.factor", 1.0))
        mscale = float(opt("rope.scaling.yarn_log_multiplier", 0.0)) / 0.1  # = mscale_all_dim
    elif scaling not in ("none", None):
        raise ModelLoadError(f"{path}: unsupported RoPE scaling {scaling!r}")
    tensor_names = {t.name for t in reader.tensors}
    vocab = opt("vocab_size", None)
    if vocab is None:
        tokens = gguf_field(reader, "tokenizer.ggml.tokens")
        vocab = len(tokens) if tokens is not None else None
    if vocab is None:
        raise ModelLoadError(f"{path}: cannot determine vocab size")
    eos = gguf_field(reader, "tokenizer.ggml.eos_token_id")
    bos = gguf_field(reader, "tokenizer.ggml.bos_token_id")
    return ModelConfig(
        name=str(gguf_field(reader, "general.name", Path(str(path)).stem)),
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=rope_dim,
        rms_norm_eps=float(opt("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(opt("rope.freq_base", 10000.0)),
        max_position=int(opt("context_length", 2048)),
        tie_word_embeddings="output.weight" not in tensor_names,
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=() if eos is None else (int(eos),),
        rope_type=rope_type,
        rope_factor=factor,
        rope_original_max_position=int(opt("rope.scaling.original_context_length", 4096)),
        rope_mscale=mscale,
        rope_mscale_all_dim=mscale,
        source="gguf",
        architecture="deepseek_v3" if v3 else "deepseek_v2",
        mla=mla,
        num_experts=experts,
        num_experts_per_tok=int(opt("expert_used_count", 0) or 0) if experts else 0,
        moe_intermediate_size=int(opt("expert_feed_forward_length", 0) or 0) if experts else 0,
        norm_topk_prob=bool(opt("expert_weights_norm", False)),
        moe_layers=tuple(range(first_dense, layers)) if experts else (),
        n_shared_experts=int(opt("expert_shared_count", 0) or 0) if experts else 0,
        topk_method=method,
        n_group=groups,
        topk_group=int(opt("expert_group_used_count", 1) or 1),
        routed_scaling_factor=float(opt("expert_weights_scale", 1.0) or 1.0),
    )


def split_gguf_deepseek(w: dict[str, Any], cfg: ModelConfig) -> dict[str, Any]:
    """Turn a ``deepseek2`` GGUF's tensors (already in Hugging Face-style names, the
    stacked experts already split by ``weights_gguf.unstack_experts``) into the Hugging
    Face checkpoint's: ``k_b_proj`` ``[H, r, dn]`` (stored
    transposed) and ``v_b_proj`` ``[H, dv, r]`` back into ``kv_b_proj``
    ``[H·(dn + dv), r]``; ``gate.e_score_correction.bias`` to
    ``gate.e_score_correction_bias``. ``w`` is changed in place and returned.

    Raises:
        ModelLoadError: a k_b/v_b tensor of the wrong shape.
    """
    m = cfg.mla
    assert m is not None
    for name in [n for n in w if n.endswith("self_attn.k_b_proj.weight")]:
        k_b, v_b = w.pop(name), w.pop(name.replace("k_b_proj", "v_b_proj"))
        h = cfg.num_heads
        if tuple(k_b.shape) != (h, m.kv_lora_rank, m.qk_nope_head_dim):
            raise ModelLoadError(f"{name}: shape {tuple(k_b.shape)}")
        kv_b = torch.cat([k_b.transpose(1, 2), v_b.view(h, m.v_head_dim, -1)], dim=1)
        w[name.replace("k_b_proj", "kv_b_proj")] = kv_b.reshape(-1, m.kv_lora_rank).contiguous()
    for name in [n for n in w if n.endswith("gate.e_score_correction.bias")]:
        w[name.replace("e_score_correction.bias", "e_score_correction_bias")] = w.pop(name)
    return w
