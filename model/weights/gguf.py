"""Load a Llama-family model's tensors from a GGUF file (the llama.cpp format).

Tensors are read with ``gguf.GGUFReader`` (memory-mapped, through
``gguf_file.open_gguf``, or the same views from its kept index:
``gguf_index.open_gguf_index``) and dequantized with ``gguf.quants.dequantize`` to
float32 (Q4_0/Q4_1/Q8_0 by torch's ops, bit for bit the same) a few rows at a time,
each chunk cast into the tensor in the requested dtype (so peak memory is the converted
model plus one chunk's temporaries: ``dequantized_part``). Every type that
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

from houchu.model.config.core import ModelConfig, ModelLoadError
from houchu.model.config.gguf import config_from_gguf_reader
from houchu.model.gguf.blocks import STORED_TYPES, gguf_to_int4
from houchu.model.gguf.index import open_gguf_index
from houchu.model.quant.functions import Int4Weight, q4_block_parts
from houchu.model.weights.shapes import HEAD_STORED
from houchu.model.weights.shard import Shard, TensorParallelError

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
    return dequantize_data(t.data, t.tensor_type, torch_shape(t), t.name)


def torch_shape(t: Any) -> tuple[int, ...]:
    """A ``gguf.ReaderTensor``'s shape in PyTorch order (GGUF's dims reversed)."""
    return tuple(int(d) for d in reversed(t.shape.tolist()))


def dequantize_data(data: np.ndarray, qtype: Any, shape: tuple[int, ...], name: str) -> np.ndarray:
    """Dequantize a GGUF tensor's data (or rows and block columns of it) to float32.

    Args:
        data: ``[rows, bytes per row]`` ``uint8`` for a quantized type, else the
            elements ``[rows, cols]`` (as ``gguf.ReaderTensor.data`` holds them, or a
            slice of that).
        qtype: its ``gguf.GGMLQuantizationType``.
        shape: the dense tensor's shape (PyTorch order).
        name: for the error message.
    Returns:
        float32 ``np.ndarray`` of ``shape`` (writeable, never the read-only mmap).
    Raises:
        ModelLoadError: ``gguf.quants`` cannot dequantize this type.
    """
    import gguf

    fast = _dequantize_blocks(data, qtype.name)
    if fast is not None:
        return fast.reshape(shape)
    try:
        arr = gguf.quants.dequantize(np.ascontiguousarray(data), qtype)
    except NotImplementedError as e:
        raise ModelLoadError(f"tensor {name}: GGUF type {qtype.name} cannot be dequantized") from e
    out = np.asarray(arr, dtype=np.float32).reshape(shape)
    return out if out.flags.writeable else out.copy()  # never alias the read-only mmap


#: GGUF block types dequantized with torch's vectorized ops: bytes per block of 32
#: elements (a float16 scale d, for Q4_1 a float16 minimum m, then the codes).
_TORCH_BLOCKS = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


def _dequantize_blocks(data: np.ndarray, qtype_name: str) -> np.ndarray | None:
    """Q4_0 / Q4_1 / Q8_0 data (``[rows, bytes per row]`` uint8) dequantized with torch's
    vectorized ops, bit for bit what ``gguf.quants.dequantize`` gives (the same float32
    products and sums, in the same order: ``d * q`` then ``+ m``; ``q - 8`` for Q4_0)
    in under half its time (0.33 s instead of 0.73 s for SmolLM2-135M's tensors);
    None for another type. Returns float32 ``[elements]``, writeable."""
    block = _TORCH_BLOCKS.get(qtype_name)
    if block is None:
        return None
    raw = torch.from_numpy(np.ascontiguousarray(data, dtype=np.uint8).reshape(-1, block).copy())
    if qtype_name == "Q8_0":
        d = raw[:, 0:2].contiguous().view(torch.float16).float()  # [B, 1]
        q = raw[:, 2:].contiguous().view(torch.int8).float()  # [B, 32]
        return (q * d).reshape(-1).numpy()
    d, m, q = q4_block_parts(raw, block - 16)  # [B, 1] x2 (m None for Q4_0), [B, 32] uint8
    if m is None:
        return (d * (q.to(torch.int8) - 8).float()).reshape(-1).numpy()
    return (d * q.float() + m).reshape(-1).numpy()


def shard_view(t: Any, kind: str, shard: Shard) -> tuple[np.ndarray, tuple[int, ...], int]:
    """``shard``'s part of a GGUF tensor, before it is dequantized: a view of its rows,
    or of whole quantization blocks of its columns.

    Returns:
        ``(data, shape, pad)``: the view (as ``dequantize_data`` takes it), the dense
        shape it holds, and the zero rows to append (``vocab``: ``Shard.vocab_span``).
    Raises:
        TensorParallelError: a column cut inside a quantization block.
    """
    import gguf

    shape = torch_shape(t)
    data = t.data
    if kind == "rows":
        rows = shard.span(shape[0])
        return data[rows], (rows.stop - rows.start, *shape[1:]), 0
    if kind == "vocab":
        rows, pad = shard.vocab_span(shape[0])
        return data[rows], (rows.stop - rows.start, *shape[1:]), pad
    block, block_bytes = gguf.GGML_QUANT_SIZES[t.tensor_type]
    k = shape[1] // shard.world
    if k % block:
        raise TensorParallelError(
            f"{t.name}: its {t.tensor_type.name} blocks of {block} do not divide its input "
            f"width per rank ({k})"
        )
    if data.shape[-1] == shape[1]:  # elements per row (a float type)
        cols = shard.span(shape[1])
    else:  # bytes per row: whole blocks
        per = k // block * block_bytes
        cols = slice(shard.rank * per, (shard.rank + 1) * per)
    return data[:, cols], (shape[0], k), 0


def tensor_part(t: Any, name: str, shard: Shard | None) -> tuple[np.ndarray, tuple[int, ...], int]:
    """``shard_view`` of ``t`` (whole without ``shard``, or for a tensor ranks keep
    whole): ``(data, dense shape, zero rows to append)``."""
    kind = shard.kind(name) if shard is not None else None
    if kind is None:
        return t.data, torch_shape(t), 0
    return shard_view(t, kind, shard)


#: a matrix is dequantized this many float32 elements (1 MiB) at a time, at most
CHUNK_ELEMENTS = 1 << 18


def dequantized_part(
    t: Any, name: str, shard: Shard | None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``tensor_part`` of ``t`` dequantized, its vocabulary rows padded with zero rows
    (``[V'/world, hidden]``).

    A matrix ``[rows, cols]`` comes out in ``dtype``: whole rows (whole quantization
    blocks) are dequantized to float32 ``CHUNK_ELEMENTS`` at a time and cast into the
    result, so that reading a tensor holds the result and one chunk's temporaries (not
    a float32 copy of the tensor and the dequantizer's several temporaries of its size,
    which the allocator keeps as free heap a rank's resident set never gives back). The
    values are the same as dequantizing the whole tensor, then casting: each row is
    dequantized on its own. Any other tensor (a norm, a bias, stacked experts) comes out
    whole, float32, for the caller to cast.
    """
    data, shape, pad = tensor_part(t, name, shard)
    if len(shape) != 2:
        return torch.from_numpy(dequantize_data(data, t.tensor_type, shape, t.name))
    rows, cols = shape
    out = torch.empty(rows + pad, cols, dtype=dtype)  # [rows + pad, cols]
    step = max(1, CHUNK_ELEMENTS // max(cols, 1))
    for a in range(0, rows, step):
        b = min(a + step, rows)
        part = dequantize_data(data[a:b], t.tensor_type, (b - a, cols), t.name)
        out[a:b] = torch.from_numpy(part)  # float32 [b - a, cols], cast to dtype
    out[rows:].zero_()
    return out


def iter_gguf_tensors(
    reader: Any,
    cfg: ModelConfig,
    dtype: torch.dtype = torch.float32,
    keep_q4: bool = False,
    shard: Shard | None = None,
) -> Iterator[tuple[str, torch.Tensor | Int4Weight | list[Int4Weight]]]:
    """Yield ``(hf_name, tensor)`` for every tensor of an open ``gguf.GGUFReader``.

    A Llama file's q and k projections come out un-permuted (see module docstring);
    llama.cpp's converter leaves Qwen2/Qwen3's and Gemma's rows in rotate-half order
    already. Gemma's norm weights, stored as 1 + w, come out as w (Hugging Face's). With
    ``shard``, each tensor is that tensor-parallel rank's part (``shard_view``: cut
    before it is dequantized or repacked; a cut inside a quantization block raises
    ``TensorParallelError``), the vocabulary rows padded with zero rows.
    Tensors are dense, contiguous, on CPU, in ``dtype`` (``rope_freqs`` stays float32).
    With ``keep_q4``, projection weights of a type houchu computes on as stored
    (``gguf_blocks.STORED_TYPES``: Q4_0/Q4_1/Q4_K as one int4 plane, Q5_0/Q5_1/Q5_K/Q6_K/
    Q8_0 as two) come out as lossless ``Int4Weight``s instead
    (not the embedding, whose rows are looked up densely; not a MoE layer's router,
    which ``model.moe`` keeps dense; of an MLA model only the routed experts), and a
    MoE layer's stacked Q4 experts ``[E, out, in]`` as a list of ``E`` ``Int4Weight``s
    (each expert's blocks converted on their own, as a 2-D tensor's), which
    ``unstack_experts`` names one per expert. The LM head of such a type (``output``,
    or the embedding when the file has no ``output``) also comes out as stored, under
    ``HEAD_STORED`` (not with ``shard``).
    """
    for t in reader.tensors:
        name = gguf_to_hf_name(t.name, cfg.gemma_blocks)
        experts = ".mlp.experts." in name  # stacked [E, out, in]
        # MLA's projections are permuted and split (``split_gguf_deepseek``), routers
        # kept dense: no int4 repacking; routed experts are neither
        q4 = keep_q4 and ".mlp.gate." not in name and (not cfg.is_mla or experts)
        w: torch.Tensor | Int4Weight | list[Int4Weight]
        if q4 and t.tensor_type.name in STORED_TYPES and ".layers." in name:
            data, shape, _ = tensor_part(t, name, shard)
            kind = t.tensor_type.name
            if experts:  # data [E, out, in / block · block bytes]: one expert's rows each
                w = [gguf_to_int4(data[e], kind, shape[1:]) for e in range(shape[0])]
            else:
                w = gguf_to_int4(data, kind, shape)
        else:
            w = dequantized_part(t, name, shard, dtype)  # a matrix in dtype, else float32
        world = shard.world if shard is not None else 1  # a rank un-permutes its heads
        llama = cfg.architecture in ("llama", "mistral")  # a GGUF Mistral is a Llama
        if llama and name.endswith("q_proj.weight"):
            w = _unpermute(w, cfg.num_heads // world)
        elif llama and name.endswith("k_proj.weight"):
            w = _unpermute(w, cfg.num_kv_heads // world)
        if cfg.gemma_blocks and name.endswith("norm.weight") and isinstance(w, torch.Tensor):
            w = w - 1.0  # llama.cpp's converter stores Gemma's norms as 1 + w (exact back)
        if isinstance(w, torch.Tensor):
            w = (w if name == "rope_freqs" else w.to(dtype)).contiguous()
        yield name, w
        if keep_q4 and shard is None and t.tensor_type.name in STORED_TYPES:
            head = name == "lm_head.weight" or (
                name == "model.embed_tokens.weight" and cfg.tie_word_embeddings
            )
            if head:  # the LM head as stored too (the embedding's rows are looked up dense)
                yield HEAD_STORED, gguf_to_int4(t.data, t.tensor_type.name, torch_shape(t))


def _unpermute(w: torch.Tensor | Int4Weight, n_head: int) -> torch.Tensor | Int4Weight:
    if isinstance(w, Int4Weight):
        return w.permute_rows(lambda t: unpermute_qk(t, n_head).contiguous())
    return unpermute_qk(w, n_head)


def load_gguf_shard(
    path: str | Path, dtype: torch.dtype, keep_q4: bool, shard: Shard
) -> tuple[ModelConfig, dict[str, torch.Tensor | Int4Weight]]:
    """``load_gguf`` for one tensor-parallel rank: only ``shard``'s part of each tensor
    (``iter_gguf_tensors``) of a dense, multi-head-attention model (what tensor
    parallelism shards).

    Raises:
        ModelLoadError: see ``load_gguf``.
        TensorParallelError: a column cut inside a quantization block.
    """
    try:
        reader = open_gguf_index(path)
    except Exception as e:
        raise ModelLoadError(f"{path}: not a readable GGUF file ({e})") from e
    cfg = config_from_gguf_reader(reader, path)
    return cfg, dict(iter_gguf_tensors(reader, cfg, dtype, keep_q4, shard))


def load_gguf(
    path: str | Path, dtype: torch.dtype = torch.float32, keep_q4: bool = False
) -> tuple[ModelConfig, dict[str, torch.Tensor | Int4Weight]]:
    """Load a GGUF Llama model.

    Args:
        path: the ``.gguf`` file.
        dtype: dtype of the returned weights (torch.float32 / bfloat16 / float16).
        keep_q4: keep projection weights of ``STORED_TYPES`` as ``Int4Weight`` (lossless).
    Returns:
        ``(config, tensors)``: tensors keyed by Hugging Face name, CPU, ``dtype``.
    Raises:
        ModelLoadError: unreadable file, non-Llama architecture, unsupported tensor or type.
    """
    try:
        reader = open_gguf_index(path)
    except Exception as e:
        raise ModelLoadError(f"{path}: not a readable GGUF file ({e})") from e
    cfg = config_from_gguf_reader(reader, path)
    tensors = dict(iter_gguf_tensors(reader, cfg, dtype, keep_q4))
    if cfg.is_moe:
        unstack_experts(tensors, cfg)
    if cfg.is_mla:  # deepseek2: back to the Hugging Face checkpoint's layout
        from houchu.model.config.deepseek import split_gguf_deepseek

        tensors = split_gguf_deepseek(tensors, cfg)
    return cfg, tensors


def unstack_experts(w: dict[str, Any], cfg: ModelConfig) -> dict[str, Any]:
    """Split llama.cpp's stacked experts (``ffn_{gate,up,down}_exps``, here
    ``model.layers.N.mlp.experts.{gate,up,down}_proj.weight``: a ``[E, out, in]`` tensor,
    or ``E`` ``Int4Weight``s of ``[out, in]`` for a Q4 tensor kept int4) into the Hugging
    Face checkpoint's one ``[out, in]`` weight per expert (``mlp.experts.{e}.{proj}.weight``).
    ``w`` is changed in place and returned.

    Raises:
        ModelLoadError: a stacked tensor that is not ``[num_experts, out, in]``.
    """
    for name in [n for n in w if ".mlp.experts." in n and n.count(".") == 6]:
        t = w.pop(name)
        stacked = isinstance(t, torch.Tensor) and t.dim() == 3
        if not (stacked or isinstance(t, list)) or len(t) != cfg.num_experts:
            raise ModelLoadError(f"{name}: expected [{cfg.num_experts}, out, in] experts")
        head, proj, kind = name.rsplit(".", 2)
        for e in range(cfg.num_experts):
            w[f"{head}.{e}.{proj}.{kind}"] = t[e].contiguous() if stacked else t[e]
    return w
