"""Load a Llama-family model's tensors from a GGUF file (the llama.cpp format).

Tensors are read with ``gguf.GGUFReader`` (memory-mapped, through
``gguf_file.open_gguf``) and dequantized with ``gguf.quants.dequantize`` to float32, then
cast to the requested dtype one tensor at a time (so peak memory is one fp32 tensor plus
the converted model). Every type that
``gguf.quants`` can dequantize is accepted: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
the K-quants Q2_K..Q6_K, and the IQ / TQ types.

Names are mapped to Hugging Face's Llama names (``model.layers.N.self_attn.q_proj.weight``
…), the canonical naming inside houchu. llama.cpp's converter permutes the rows of
``attn_q`` / ``attn_k`` so that RoPE rotates interleaved pairs (x0, x1), (x2, x3), …;
houchu's RoPE is Hugging Face's rotate-half form (pairs (x_i, x_{i+d/2})), so those rows
are permuted back here (``unpermute_qk``, the inverse of llama.cpp's ``permute``; the same
as transformers' ``LlamaTensorProcessor._reverse_permute_weights``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from houchu.model.config import ModelConfig, ModelLoadError, config_from_gguf_reader
from houchu.model.gguf_file import open_gguf
from houchu.model.quant import Int4Weight, gguf_q4_to_int4

Q4_TYPES = ("Q4_0", "Q4_1")  # kept as int4 (losslessly) when asked

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": "rope_freqs",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",  # Qwen3's QK-norm
    "attn_k_norm": "self_attn.k_norm",
    # DeepSeek-V2/V3 (``deepseek2``): MLA, and DeepSeekMoE's stacked and shared experts
    "attn_q_a": "self_attn.q_a_proj",
    "attn_q_a_norm": "self_attn.q_a_layernorm",
    "attn_q_b": "self_attn.q_b_proj",
    "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
    "attn_kv_a_norm": "self_attn.kv_a_layernorm",
    "attn_kv_b": "self_attn.kv_b_proj",
    "attn_k_b": "self_attn.k_b_proj",
    "attn_v_b": "self_attn.v_b_proj",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
    "ffn_up_shexp": "mlp.shared_experts.up_proj",
    "ffn_down_shexp": "mlp.shared_experts.down_proj",
    "exp_probs_b": "mlp.gate.e_score_correction",
}
#: Gemma 2/3's block norms (llama.cpp's names): its ``ffn_norm`` is the norm before the MLP
_GEMMA_BLOCK_NAMES = _BLOCK_NAMES | {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def gguf_to_hf_name(name: str, gemma: bool = False) -> str:
    """Map a GGUF tensor name to houchu's (Hugging Face) name (``gemma``: a Gemma 2/3
    file, whose block norms are named differently).

    Raises:
        ModelLoadError: the tensor is not part of a dense Llama model (e.g. MoE experts).
    """
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _BLOCK_RE.match(name)
    names = _GEMMA_BLOCK_NAMES if gemma else _BLOCK_NAMES
    if m and m.group(2) in names:
        return f"model.layers.{m.group(1)}.{names[m.group(2)]}.{m.group(3)}"
    raise ModelLoadError(f"unsupported GGUF tensor {name!r} (not a dense Llama weight)")


def unpermute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's interleaved-RoPE row permutation of a q or k projection.

    llama.cpp (convert_hf_to_gguf.py, ``LlamaModel.permute``) reorders the rows of each
    head from [first half; second half] to interleaved pairs. This applies the inverse.

    Args:
        w: ``[n_head * head_dim, in_features]`` (or ``[n_head * head_dim]`` for a bias),
            any dtype. ``n_head`` is num_heads for q and num_kv_heads for k.
    Returns:
        The same shape and dtype, rows in Hugging Face order.
    """
    rows = w.shape[0]
    if rows % (2 * n_head) != 0:
        raise ModelLoadError(f"q/k rows {rows} not divisible by 2 * {n_head} heads")
    half = rows // n_head // 2
    x = w.reshape(n_head, half, 2, *w.shape[1:])  # [heads, half, 2, in]
    return x.transpose(1, 2).reshape(w.shape)  # [heads, 2, half, in] -> rows


def dequantize_tensor(t: Any) -> np.ndarray:
    """Dequantize one ``gguf.ReaderTensor`` to float32.

    Returns:
        ``np.ndarray`` float32 shaped like the PyTorch tensor (GGUF's dims reversed), e.g.
        ``[out_features, in_features]`` for a weight matrix.
    Raises:
        ModelLoadError: ``gguf.quants`` cannot dequantize this type.
    """
    import gguf

    try:
        arr = gguf.quants.dequantize(t.data, t.tensor_type)
    except NotImplementedError as e:
        raise ModelLoadError(
            f"tensor {t.name}: GGUF type {t.tensor_type.name} cannot be dequantized"
        ) from e
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    out = np.asarray(arr, dtype=np.float32).reshape(shape)
    return out if out.flags.writeable else out.copy()  # never alias the read-only mmap


def iter_gguf_tensors(
    reader: Any, cfg: ModelConfig, dtype: torch.dtype = torch.float32, keep_q4: bool = False
) -> Iterator[tuple[str, torch.Tensor | Int4Weight]]:
    """Yield ``(hf_name, tensor)`` for every tensor of an open ``gguf.GGUFReader``.

    A Llama file's q and k projections come out un-permuted (see module docstring);
    llama.cpp's converter leaves Qwen2/Qwen3's and Gemma's rows in rotate-half order
    already. Gemma's norm weights, stored as 1 + w, come out as w (Hugging Face's).
    Tensors are dense, contiguous, on CPU, in ``dtype`` (``rope_freqs`` stays float32).
    With ``keep_q4``, Q4_0/Q4_1 projection weights come out as ``Int4Weight`` instead
    (not the embedding, whose rows are looked up densely; not an MLA model's).
    """
    for t in reader.tensors:
        name = gguf_to_hf_name(t.name, cfg.gemma_blocks)
        # MLA's projections are permuted and its experts kept dense: no int4 repacking
        q4 = keep_q4 and cfg.mla is None
        if q4 and t.tensor_type.name in Q4_TYPES and ".layers." in name:
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            w: torch.Tensor | Int4Weight = gguf_q4_to_int4(t.data, t.tensor_type.name, shape)
        else:
            w = torch.from_numpy(dequantize_tensor(t))
        llama = cfg.architecture in ("llama", "mistral")  # a GGUF Mistral is a Llama
        if llama and name.endswith("q_proj.weight"):
            w = _unpermute(w, cfg.num_heads)
        elif llama and name.endswith("k_proj.weight"):
            w = _unpermute(w, cfg.num_kv_heads)
        if cfg.gemma_blocks and name.endswith("norm.weight") and isinstance(w, torch.Tensor):
            w = w - 1.0  # llama.cpp's converter stores Gemma's norms as 1 + w (exact back)
        if isinstance(w, torch.Tensor):
            w = (w if name == "rope_freqs" else w.to(dtype)).contiguous()
        yield name, w


def _unpermute(w: torch.Tensor | Int4Weight, n_head: int) -> torch.Tensor | Int4Weight:
    if isinstance(w, Int4Weight):
        return w.permute_rows(lambda t: unpermute_qk(t, n_head).contiguous())
    return unpermute_qk(w, n_head)


def load_gguf(
    path: str | Path, dtype: torch.dtype = torch.float32, keep_q4: bool = False
) -> tuple[ModelConfig, dict[str, torch.Tensor | Int4Weight]]:
    """Load a GGUF Llama model.

    Args:
        path: the ``.gguf`` file.
        dtype: dtype of the returned weights (torch.float32 / bfloat16 / float16).
        keep_q4: keep Q4_0/Q4_1 projection weights as ``Int4Weight`` (lossless).
    Returns:
        ``(config, tensors)``: tensors keyed by Hugging Face name, CPU, ``dtype``.
    Raises:
        ModelLoadError: unreadable file, non-Llama architecture, unsupported tensor or type.
    """
    try:
        reader = open_gguf(path)
    except Exception as e:
        raise ModelLoadError(f"{path}: not a readable GGUF file ({e})") from e
    cfg = config_from_gguf_reader(reader, path)
    tensors = dict(iter_gguf_tensors(reader, cfg, dtype, keep_q4))
    if cfg.mla is not None:  # deepseek2: back to the Hugging Face checkpoint's layout
        from houchu.model.config_deepseek import split_gguf_deepseek

        tensors = split_gguf_deepseek(tensors, cfg)
    return cfg, tensors
