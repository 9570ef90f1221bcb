"""GGUF files of tiny Hugging Face models, written the way llama.cpp's converter
(``convert_hf_to_gguf.py``) writes them, with the ``gguf`` package's ``GGUFWriter``: the
twins the family tests load against their safetensors folders (Llama, Mistral, Qwen2,
Qwen3, Qwen3-MoE, Gemma 2/3: ``write_llama_gguf``; DeepSeek-V2/V3: ``write_deepseek_gguf``).
Needs ``gguf`` and ``safetensors`` (imported lazily)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

_HF_TO_GGUF_BLOCK = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate": "ffn_gate_inp",  # a MoE layer's router [E, hidden]
}
#: Gemma 2/3's block norms as llama.cpp names them
_HF_TO_GGUF_GEMMA = _HF_TO_GGUF_BLOCK | {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
#: houchu's family -> the GGUF architecture llama.cpp writes (Mistral is a Llama there)
_GGUF_ARCH = {"mistral": "llama", "gemma3_text": "gemma3", "qwen3_moe": "qwen3moe"}


def permute_qk(w: Any, n_head: int) -> Any:
    """llama.cpp's converter permutation of q/k rows (rotate-half -> interleaved pairs).

    w: ``[n_head * head_dim, in]`` numpy array; returns the same shape.
    """
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_llama_gguf(
    hf_dir: str | Path,
    out: str | Path,
    *,
    qtype: str = "F32",
    arch: str | None = None,
    drop_output: bool = False,
) -> Path:
    """Convert a Hugging Face Llama-family directory to GGUF the way llama.cpp does (a
    Llama's q/k rows permuted, names mapped), quantizing 2-D weights to ``qtype`` (a
    ``gguf.GGMLQuantizationType`` name: F32, F16, Q8_0, Q4_0, Q4_1, the K-quants Q4_K,
    Q5_K, Q6_K (``gguf_blocks.quantize_blocks``) …); norms and biases
    stay F32. A Mistral is written as a Llama with ``attention.sliding_window``; Gemma
    2/3 with their norms as 1 + w, the window, soft-caps, one sliding flag per layer
    (``attention.sliding_window_pattern``) and Gemma 3's local RoPE base
    (``rope.freq_base_swa``). A Qwen3-MoE is written as ``qwen3moe``: each MoE layer's
    experts stacked into ``ffn_{gate,up,down}_exps`` ``[E, out, in]`` (quantized to
    ``qtype`` too), its router as ``ffn_gate_inp``, the expert counts and widths, and
    ``expert_weights_norm`` (``norm_topk_prob``; llama.cpp's converter writes no such
    key for Qwen3-MoE and its graph always renormalises).

    Args:
        hf_dir: directory from ``make_tiny_model``.
        out: target ``.gguf`` path.
        arch: the ``general.architecture`` to declare: the model's family by default
            (tests declare a wrong one on purpose).
        drop_output: omit ``output.weight`` (a tied-embedding model).
    Returns:
        ``out`` as a ``Path``.
    Raises:
        ValueError: a Gemma whose ``query_pre_attn_scalar`` is not its head_dim (GGUF has
            no key for it: llama.cpp scales by head_dim).
    """
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    from houchu.model.config.load import load_model_config
    from houchu.model.gguf.blocks import quantize_blocks

    cfg = load_model_config(hf_dir)
    tensors: dict[str, np.ndarray] = {}
    for f in sorted(Path(hf_dir).glob("*.safetensors")):
        tensors |= load_file(str(f))
    qt = gguf.GGMLQuantizationType[qtype]
    gguf_arch = arch or _GGUF_ARCH.get(cfg.architecture, cfg.architecture)
    # llama.cpp keeps Qwen's and Gemma's rotate-half rows
    permute = cfg.architecture in ("llama", "mistral")
    gemma = cfg.gemma_blocks
    if gemma and cfg.attn_scale is not None and abs(cfg.attn_scale * cfg.head_dim**0.5 - 1) > 1e-9:
        raise ValueError("GGUF has no query_pre_attn_scalar: llama.cpp scales by head_dim")
    block_names = _HF_TO_GGUF_GEMMA if gemma else _HF_TO_GGUF_BLOCK
    w = gguf.GGUFWriter(str(out), gguf_arch)
    w.add_name("tiny-llama")
    w.add_block_count(cfg.num_layers)
    w.add_context_length(cfg.max_position)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_bos_token_id(cfg.bos_token_id or 1)
    w.add_eos_token_id(cfg.eos_token_ids[0] if cfg.eos_token_ids else 2)
    if cfg.sliding_window:
        w.add_sliding_window(cfg.sliding_window)
    if cfg.num_experts:
        w.add_expert_count(cfg.num_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        w.add_expert_weights_norm(cfg.norm_topk_prob)
        for i in cfg.moe_layers:  # llama.cpp's converter: one 3-D tensor per projection
            for proj in ("gate_proj", "up_proj", "down_proj"):
                names = [
                    f"model.layers.{i}.mlp.experts.{e}.{proj}.weight"
                    for e in range(cfg.num_experts)
                ]
                tensors[f"blk.{i}.ffn_{proj[:-5]}_exps.weight"] = np.stack(
                    [tensors.pop(n) for n in names]
                )  # [E, out, in]
    if gemma:
        flags = [i in cfg.sliding_layers for i in range(cfg.num_layers)]
        w.add_array(f"{gguf_arch}.attention.sliding_window_pattern", flags)
        if cfg.attn_softcap:
            w.add_attn_logit_softcapping(cfg.attn_softcap)
        if cfg.final_softcap:
            w.add_final_logit_softcapping(cfg.final_softcap)
        if cfg.rope_local_theta:
            w.add_float32(f"{gguf_arch}.rope.freq_base_swa", cfg.rope_local_theta)
    for name, t in tensors.items():
        t = t.astype(np.float32)
        if gemma and name.endswith("norm.weight"):
            t = t + np.float32(1.0)  # llama.cpp's converter stores Gemma's norms as 1 + w
        if name.startswith("blk."):  # stacked experts, named already
            gname = name
        elif name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            if drop_output:
                continue
            gname = "output.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            part, kind = rest.rsplit(".", 1)  # kind: weight or bias
            gname = f"blk.{layer}.{block_names[part]}.{kind}"
            if permute and part == "self_attn.q_proj":
                t = permute_qk(t, cfg.num_heads)
            elif permute and part == "self_attn.k_proj":
                t = permute_qk(t, cfg.num_kv_heads)
        block = gguf.GGML_QUANT_SIZES[qt][0]  # a row not a whole number of blocks: F32
        if t.ndim >= 2 and qt != gguf.GGMLQuantizationType.F32 and t.shape[-1] % block == 0:
            w.add_tensor(
                gname,
                quantize_blocks(t.reshape(-1, t.shape[-1]), qtype).reshape(*t.shape[:-1], -1),
                raw_dtype=qt,
            )
        else:
            w.add_tensor(gname, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out)


_DEEPSEEK_TO_GGUF = {
    "self_attn.q_a_proj": "attn_q_a",
    "self_attn.q_a_layernorm": "attn_q_a_norm",
    "self_attn.q_b_proj": "attn_q_b",
    "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
    "self_attn.kv_a_layernorm": "attn_kv_a_norm",
    "mlp.gate": "ffn_gate_inp",
    "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
    "mlp.shared_experts.up_proj": "ffn_up_shexp",
    "mlp.shared_experts.down_proj": "ffn_down_shexp",
}


def write_deepseek_gguf(hf_dir: str | Path, out: str | Path) -> Path:
    """Convert a Hugging Face DeepSeek-V2/V3 directory to a float32 GGUF ``deepseek2``
    the way llama.cpp's converter (``DeepseekV2Model``) does: MLA declared as one KV head
    of ``kv_lora_rank + qk_rope_head_dim`` with the per-head widths in
    ``key_length_mla`` / ``value_length_mla``; ``kv_b_proj`` split into ``attn_k_b``
    (transposed, ``[H, r, dn]``) and ``attn_v_b``; each MoE layer's experts stacked into
    ``ffn_{gate,up,down}_exps`` ``[E, out, in]``; the routing bias as ``exp_probs_b``;
    YaRN as ``rope.scaling.*`` (``yarn_log_multiplier = 0.1 · mscale_all_dim``); RoPE
    rows left in DeepSeek's interleaved order (so a checkpoint with ``rope_interleave``
    false has no faithful GGUF: llama.cpp rotates adjacent pairs).

    Returns:
        ``out`` as a ``Path``.
    """
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    from houchu.model.config.load import load_model_config

    cfg = load_model_config(hf_dir)
    m = cfg.mla
    assert m is not None, "not a DeepSeek model"
    t: dict[str, np.ndarray] = {}
    for f in sorted(Path(hf_dir).glob("*.safetensors")):
        t |= load_file(str(f))
    w = gguf.GGUFWriter(str(out), "deepseek2")
    w.add_name("tiny-deepseek")
    w.add_block_count(cfg.num_layers)
    w.add_context_length(cfg.max_position)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(1)
    w.add_key_length(m.kv_lora_rank + m.qk_rope_head_dim)
    w.add_value_length(m.kv_lora_rank)
    w.add_key_length_mla(m.qk_nope_head_dim + m.qk_rope_head_dim)
    w.add_value_length_mla(m.v_head_dim)
    if m.q_lora_rank:
        w.add_q_lora_rank(m.q_lora_rank)
    w.add_kv_lora_rank(m.kv_lora_rank)
    w.add_rope_dimension_count(m.qk_rope_head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    if cfg.rope_type == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(cfg.rope_factor)
        w.add_rope_scaling_orig_ctx_len(cfg.rope_original_max_position)
        w.add_rope_scaling_yarn_log_mul(0.1 * cfg.rope_mscale_all_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_leading_dense_block_count(min(cfg.moe_layers, default=cfg.num_layers))
    w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    w.add_expert_count(cfg.num_experts)
    w.add_expert_shared_count(cfg.n_shared_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_expert_weights_scale(cfg.routed_scaling_factor)
    w.add_expert_weights_norm(cfg.norm_topk_prob)
    sigmoid = cfg.topk_method == "noaux_tc"
    w.add_expert_gating_func(
        gguf.ExpertGatingFuncType.SIGMOID if sigmoid else gguf.ExpertGatingFuncType.SOFTMAX
    )
    w.add_expert_group_count(cfg.n_group)
    w.add_expert_group_used_count(cfg.topk_group)
    w.add_bos_token_id(cfg.bos_token_id or 0)
    w.add_eos_token_id(cfg.eos_token_ids[0] if cfg.eos_token_ids else 1)
    h, dn = cfg.num_heads, m.qk_nope_head_dim
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}"
        for e_proj in ("gate_proj", "up_proj", "down_proj") if i in cfg.moe_layers else ():
            stack = [t.pop(f"{p}.mlp.experts.{e}.{e_proj}.weight") for e in range(cfg.num_experts)]
            w.add_tensor(f"blk.{i}.ffn_{e_proj[:-5]}_exps.weight", np.stack(stack))
        kv_b = t.pop(f"{p}.self_attn.kv_b_proj.weight").reshape(h, -1, m.kv_lora_rank)
        w.add_tensor(f"blk.{i}.attn_k_b.weight", np.ascontiguousarray(kv_b[:, :dn].swapaxes(1, 2)))
        w.add_tensor(f"blk.{i}.attn_v_b.weight", np.ascontiguousarray(kv_b[:, dn:]))
        bias = t.pop(f"{p}.mlp.gate.e_score_correction_bias", None)
        if bias is not None:
            w.add_tensor(f"blk.{i}.exp_probs_b.bias", bias.astype(np.float32))
    for name, a in t.items():
        a = a.astype(np.float32)
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            part, kind = rest.rsplit(".", 1)
            block = _DEEPSEEK_TO_GGUF.get(part) or _HF_TO_GGUF_BLOCK[part]
            gname = f"blk.{layer}.{block}.{kind}"
        w.add_tensor(gname, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out)
