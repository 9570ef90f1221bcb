"""The tiny sliding-window variants (Mistral, Gemma 2 and 3) the family tests build."""

from __future__ import annotations

WINDOW = 8
FAMILIES = {
    # every layer windowed; head_dim 64: the C++ decode kernel's vectorized group path
    "mistral": {"sliding_window": WINDOW, "head_dim": 64},
    # local/global layers, soft-caps on, query_pre_attn_scalar apart from head_dim
    "gemma2": {"sliding_window": WINDOW, "head_dim": 16, "query_pre_attn_scalar": 24},
    # the same with the head_dim scale GGUF implies, so it has a GGUF twin
    "gemma2-gguf": {"sliding_window": WINDOW, "head_dim": 16, "query_pre_attn_scalar": 16},
    # local, global, local; QK-norm; RoPE 1e6 global, 1e4 local; tied head
    "gemma3_text": {
        "sliding_window": WINDOW,
        "head_dim": 16,
        "num_hidden_layers": 3,
        "sliding_window_pattern": 2,
        "query_pre_attn_scalar": 16,
    },
}
