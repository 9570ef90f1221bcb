"""The tensor shapes a Llama-family checkpoint must have (``houchu.model.llama``), checked
before any weight is used."""

from __future__ import annotations

import torch

from houchu.model.config.core import ModelConfig, ModelLoadError, mla_of
from houchu.model.quant.functions import Int4Weight

#: a checkpoint's tensors by Hugging Face name (int4 ones already packed)
Weights = dict[str, "torch.Tensor | Int4Weight"]
#: a GGUF LM head's weight as stored (``Int4Weight``), beside its dense tensor
#: (``weights_gguf.iter_gguf_tensors``; ``LlamaModel`` builds the head from it)
HEAD_STORED = "lm_head.stored"


def check_shapes(cfg: ModelConfig, w: Weights) -> None:
    """Check that ``w`` holds every tensor ``cfg`` needs, each of its shape.

    Raises:
        ModelLoadError: a tensor is missing or has another shape (named in the message).
    """
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    want: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (cfg.vocab_size, h),
        "model.norm.weight": (h,),
    }
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}"
        want |= {
            f"{p}.input_layernorm.weight": (h,),
            f"{p}.post_attention_layernorm.weight": (h,),
        }
        if not cfg.is_mla:
            want |= {
                f"{p}.self_attn.q_proj.weight": (cfg.num_heads * d, h),
                f"{p}.self_attn.k_proj.weight": (cfg.num_kv_heads * d, h),
                f"{p}.self_attn.v_proj.weight": (cfg.num_kv_heads * d, h),
                f"{p}.self_attn.o_proj.weight": (h, cfg.num_heads * d),
            }
        else:  # MLA's own projections are checked by MLAAttention
            want[f"{p}.self_attn.o_proj.weight"] = (h, cfg.num_heads * mla_of(cfg).v_head_dim)
        if n in cfg.moe_layers:
            mi = cfg.moe_intermediate_size
            want[f"{p}.mlp.gate.weight"] = (cfg.num_experts, h)
            for e in range(cfg.num_experts):
                q = f"{p}.mlp.experts.{e}"
                want |= {
                    f"{q}.gate_proj.weight": (mi, h),
                    f"{q}.up_proj.weight": (mi, h),
                    f"{q}.down_proj.weight": (h, mi),
                }
            if cfg.n_shared_experts:
                si, q = cfg.n_shared_experts * mi, f"{p}.mlp.shared_experts"
                want |= {
                    f"{q}.gate_proj.weight": (si, h),
                    f"{q}.up_proj.weight": (si, h),
                    f"{q}.down_proj.weight": (h, si),
                }
        else:
            want |= {
                f"{p}.mlp.gate_proj.weight": (i, h),
                f"{p}.mlp.up_proj.weight": (i, h),
                f"{p}.mlp.down_proj.weight": (h, i),
            }
        if cfg.attention_bias:
            want |= {
                f"{p}.self_attn.q_proj.bias": (cfg.num_heads * d,),
                f"{p}.self_attn.k_proj.bias": (cfg.num_kv_heads * d,),
                f"{p}.self_attn.v_proj.bias": (cfg.num_kv_heads * d,),
            }
        if cfg.o_proj_bias:
            want[f"{p}.self_attn.o_proj.bias"] = (h,)
        if cfg.qk_norm:
            want |= {f"{p}.self_attn.q_norm.weight": (d,), f"{p}.self_attn.k_norm.weight": (d,)}
        if cfg.gemma_blocks:
            want |= {f"{p}.{n}_feedforward_layernorm.weight": (h,) for n in ("pre", "post")}
    if not cfg.tie_word_embeddings:
        want["lm_head.weight"] = (cfg.vocab_size, h)
    for name, shape in want.items():
        t = w.get(name)
        if t is None:
            raise ModelLoadError(f"missing tensor {name}")
        if tuple(t.shape) != shape:
            raise ModelLoadError(f"tensor {name}: shape {tuple(t.shape)}, expected {shape}")
