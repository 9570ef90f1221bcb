"""A ``ModelConfig`` from a GGUF file's metadata (``general.architecture`` and the
``<arch>.*`` keys llama.cpp writes; see ``houchu.model.config.core``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from houchu.model.config.core import GGUF_ARCHITECTURES, ModelConfig, ModelLoadError, gguf_field
from houchu.model.config.structure import gguf_moe, gguf_structure


def config_from_gguf(path: Path) -> ModelConfig:
    """Read a ``.gguf`` file's metadata into a ``ModelConfig``.

    Raises:
        ModelLoadError: not a readable GGUF file, incomplete metadata, or an
            architecture outside ``GGUF_ARCHITECTURES``.
    """
    from houchu.model.gguf.index import open_gguf_index

    try:
        reader = open_gguf_index(path)
    except Exception as e:  # the gguf library raises ValueError/struct errors on bad files
        raise ModelLoadError(f"{path}: not a readable GGUF file ({e})") from e
    return config_from_gguf_reader(reader, path)


def config_from_gguf_reader(reader: Any, path: Path | str = "<gguf>") -> ModelConfig:
    """Build a ``ModelConfig`` from an open ``gguf.GGUFReader`` (see ``load_model_config``)."""
    arch = gguf_field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(
            f"{path}: architecture {arch!r} is not supported (houchu runs "
            f"{', '.join(repr(a) for a in GGUF_ARCHITECTURES)} GGUF models)"
        )

    def need(key: str) -> Any:
        v = gguf_field(reader, f"{arch}.{key}")
        if v is None:
            raise ModelLoadError(f"{path}: GGUF metadata lacks {arch}.{key}")
        return v

    def opt(key: str, default: Any) -> Any:
        return gguf_field(reader, f"{arch}.{key}", default)

    if arch == "deepseek2":  # MLA and DeepSeekMoE: DeepSeek-V2 / V3
        from houchu.model.config.deepseek import deepseek_config_from_gguf

        return deepseek_config_from_gguf(reader, path, opt, need)

    hidden = int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    kv_heads = int(opt("attention.head_count_kv", heads))
    head_dim = int(opt("attention.key_length", hidden // heads))
    tensor_names = {t.name for t in reader.tensors}
    vocab = opt("vocab_size", None)
    if vocab is None:
        tokens = gguf_field(reader, "tokenizer.ggml.tokens")
        vocab = len(tokens) if tokens is not None else None
    if vocab is None:
        emb = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
        if emb is None:
            raise ModelLoadError(f"{path}: cannot determine vocab size")
        vocab = int(emb.shape[1])
    eos = gguf_field(reader, "tokenizer.ggml.eos_token_id")
    bos = gguf_field(reader, "tokenizer.ggml.bos_token_id")
    scaling = opt("rope.scaling.type", "none")
    rope_type, rope_factor = "default", 1.0
    if scaling == "linear":
        rope_type, rope_factor = "linear", float(opt("rope.scaling.factor", 1.0))
    elif scaling not in ("none", None):
        raise ModelLoadError(f"{path}: unsupported RoPE scaling {scaling!r}")
    structure = gguf_structure(arch, opt, int(need("block_count")), hidden, heads, head_dim)
    if arch == "qwen3moe":
        try:
            structure |= gguf_moe(opt, tensor_names, int(need("block_count")))
        except ValueError as e:
            raise ModelLoadError(f"{path}: {e}") from e
    fields = dict(
        name=str(gguf_field(reader, "general.name", Path(str(path)).stem)),
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_layers=int(need("block_count")),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(opt("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(opt("rope.freq_base", 10000.0)),
        max_position=int(opt("context_length", 2048)),
        tie_word_embeddings="output.weight" not in tensor_names,
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=() if eos is None else (int(eos),),
        rope_type=rope_type,
        rope_factor=rope_factor,
        source="gguf",
        architecture=arch,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
        o_proj_bias="blk.0.attn_output.bias" in tensor_names,
    )
    return ModelConfig(**(fields | structure))
