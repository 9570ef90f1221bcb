"""Hugging Face transformers' tokenizer and float32 model of a GGUF file, the golden tests'
reference, kept between test sessions.

transformers reads a GGUF checkpoint slowly: it parses the file twice with gguf-py's
reader and maps every tensor name (about 24 s of a core for the default model, of which
the dequantization is 2.5 s). What it builds is kept under
``$HOUCHU_CACHE/test-references/<key>``: the model's config (without the GGUF
quantization marker), its state dict as safetensors and the tokenizer's
``save_pretrained`` files; a later session loads transformers' model class from that
config with those weights (the same tensors, bit for bit) in about a second. The key is
the file's resolved path, size and mtime and the transformers and torch versions, so an
edited file or an upgrade builds anew; a damaged entry is rebuilt, an unwritable cache
only costs the slow load.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import torch

from houchu.model.fetch import cache_dir


def _key(gguf: Path) -> str:
    """The cache entry's name for ``gguf`` (see the module docstring)."""
    import transformers

    st = gguf.resolve().stat()
    raw = f"{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}|{transformers.__version__}|{torch.__version__}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _load_cached(entry: Path) -> tuple:
    """(tokenizer, float32 eval model) from a cache entry.

    Raises:
        Exception: a missing or damaged entry (OSError, safetensors' or json's errors).
    """
    from safetensors.torch import load_model
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(entry)
    config = AutoConfig.from_pretrained(entry)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    load_model(model, entry / "model.safetensors", strict=True)
    return tok, model.eval()


def _store(entry: Path, tok, model) -> None:  # noqa: ANN001 (transformers objects)
    """Write a cache entry atomically (a folder renamed into place)."""
    from safetensors.torch import save_model

    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=".tmp-"))
    try:
        config = model.config.to_dict()
        config.pop("quantization_config", None)  # the weights are plain float32 here
        type(model.config).from_dict(config).save_pretrained(tmp)
        save_model(model, str(tmp / "model.safetensors"))
        tok.save_pretrained(tmp)
        shutil.rmtree(entry, ignore_errors=True)
        os.replace(tmp, entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def hf_reference(gguf: Path) -> tuple:
    """(tokenizer, model): transformers' fast tokenizer and float32 eval model of
    ``gguf``, loaded from the cache entry when there is a good one, else by transformers'
    GGUF loader (then kept)."""
    entry = cache_dir() / "test-references" / _key(gguf)
    if (entry / "model.safetensors").exists():
        try:
            return _load_cached(entry)
        except Exception:  # noqa: BLE001 (safetensors, json, transformers: any damage)
            pass  # damaged: built again below
    tok, model = load_from_gguf(gguf)
    try:
        _store(entry, tok, model)
    except OSError:
        pass  # an unwritable cache: the next session loads slowly too
    return tok, model


def load_from_gguf(gguf: Path) -> tuple:
    """(tokenizer, float32 eval model) by transformers' GGUF loader (the slow load)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, f = str(gguf.parent), gguf.name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    return tok, model
