"""A ``ModelConfig`` from a Hugging Face model directory's ``config.json`` (see
``houchu.model.config.core``)."""

from __future__ import annotations

import json
from pathlib import Path

from houchu.model.config.core import ARCHITECTURES, HF_CLASSES, ModelConfig, ModelLoadError
from houchu.model.config.structure import STRUCTURE_FAMILIES, hf_structure


def config_from_hf(path: Path) -> ModelConfig:
    """Read a Hugging Face model directory's ``config.json`` into a ``ModelConfig``.

    Raises:
        ModelLoadError: unreadable or incomplete ``config.json``, or a family or
            option houchu does not run (named in the message).
    """
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}/config.json: unreadable ({e})") from e
    archs = raw.get("architectures") or []
    family = raw.get("model_type")
    if family not in ARCHITECTURES:
        family = next((HF_CLASSES[a] for a in archs if a in HF_CLASSES), None)
    if family is None:
        raise ModelLoadError(
            f"{path}: model_type {raw.get('model_type')!r} / architectures {archs} is not "
            f"supported (houchu runs {', '.join(HF_CLASSES)})"
        )
    if raw.get("mlp_bias"):
        raise ModelLoadError(f"{path}: mlp_bias=true is not supported")
    if family == "llama" and raw.get("attention_bias"):
        raise ModelLoadError(f"{path}: attention_bias=true is not supported for llama")
    if raw.get("use_sliding_window"):
        raise ModelLoadError(f"{path}: use_sliding_window=true is not supported")
    if family not in STRUCTURE_FAMILIES and raw.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{path}: hidden_act {raw.get('hidden_act')!r} is not supported")
    try:
        hidden = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
        theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        layers = int(raw["num_hidden_layers"])
        n_exp = raw.get("num_experts") or raw.get("num_local_experts") or 0
        experts = int(n_exp) if family == "qwen3_moe" else 0
        step = int(raw.get("decoder_sparse_step") or 1)
        dense_only = set(raw.get("mlp_only_layers") or [])
        moe_layers = tuple(
            i for i in range(layers) if experts and i not in dense_only and (i + 1) % step == 0
        )
        if rope_type == "yarn" and not family.startswith("deepseek"):
            raise ModelLoadError(f"{path}: YaRN RoPE is supported for DeepSeek models only")
        head_dim = int(raw.get("head_dim") or hidden // heads)
        try:
            structure = hf_structure(raw, family, layers, head_dim)
        except ValueError as e:
            raise ModelLoadError(f"{path}: {e}") from e
        fields = dict(
            name=str(raw.get("_name_or_path") or path.name),
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            max_position=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=tuple(int(e) for e in eos_ids),
            rope_type=str(rope_type),
            rope_factor=float(rope.get("factor", 1.0)),
            rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
            rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
            rope_original_max_position=int(rope.get("original_max_position_embeddings", 8192)),
            source="hf",
            architecture=family,
            # Qwen2's q/k/v projections always carry a bias (its config has no flag)
            attention_bias=family == "qwen2" or bool(raw.get("attention_bias", False)),
            qk_norm=family in ("qwen3", "qwen3_moe"),
            o_proj_bias=family != "qwen2" and bool(raw.get("attention_bias", False)),
            num_experts=experts,
            num_experts_per_tok=int(raw.get("num_experts_per_tok") or 0) if experts else 0,
            moe_intermediate_size=int(raw.get("moe_intermediate_size") or 0) if experts else 0,
            norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
            moe_layers=moe_layers,
            mtp_layers=int(raw.get("num_nextn_predict_layers") or 0),
        )
        base = ModelConfig(**(fields | structure))
        if family.startswith("deepseek"):
            from houchu.model.config.deepseek import deepseek_config

            return deepseek_config(base, raw, path)
        return base
    except KeyError as e:
        raise ModelLoadError(f"{path}/config.json lacks {e.args[0]!r}") from e
