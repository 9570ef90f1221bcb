"""The tiny Qwen variants (dense, QK-norm, biases, MoE) the family tests build."""

from __future__ import annotations

FAMILIES = {
    "qwen2": {},
    "qwen3": {"head_dim": 24},  # Qwen3 sets head_dim apart from hidden / heads
    "qwen3-bias": {"head_dim": 16, "attention_bias": True},
    # 8 experts, top-2, layer 0 dense (mlp_only_layers), normalized top-k weights
    "qwen3_moe": {
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 48,
        "mlp_only_layers": [0],
        "norm_topk_prob": True,
    },
    "qwen3_moe-unnormalized": {
        "num_experts": 4,
        "num_experts_per_tok": 3,
        "moe_intermediate_size": 32,
    },
}
