"""A GGUF file's tokenizer, converted once and kept as Hugging Face files.

transformers builds a fast tokenizer from a GGUF vocabulary by converting it (about 5 s
of one core for the default model's 49,152 tokens, on every server start, beside the
weights' load). The converted tokenizer is saved with ``save_pretrained`` into
``$HOUCHU_CACHE/tokenizers/<key>`` (``tokenizer.json``, ``tokenizer_config.json``, the
chat template), with the file's ``tokenizer.ggml.*`` scalar metadata beside them
(``gguf_metadata.json``: BOS, EOS and the vocabulary's kind), and later loads read
those files (about 0.3 s) without opening the GGUF file or importing torch (reading
GGUF metadata through transformers imports it: 1-3 s of a core at each start). The
key hashes the GGUF file's resolved path, size and modification time and the
transformers and tokenizers versions, so an edited file or an upgrade converts again. An
unwritable or damaged cache only costs the conversion.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from houchu.paths import cache_dir
from houchu.text.tokenizer.errors import TokenizerError

log = logging.getLogger(__name__)


def tokenizer_cache_dir() -> Path:
    """Where converted tokenizers are kept: ``$HOUCHU_CACHE/tokenizers``."""
    return cache_dir() / "tokenizers"


def cache_key(path: Path) -> str:
    """The cache folder name of the GGUF file ``path``'s converted tokenizer (24 hex)."""
    import tokenizers
    import transformers

    st = path.stat()
    text = (
        f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|"
        f"{transformers.__version__}|{tokenizers.__version__}"
    )
    return hashlib.sha256(text.encode()).hexdigest()[:24]


METADATA_FILE = "gguf_metadata.json"
#: Converted tokenizers kept (3-4 MB each): the most recently written ones.
KEEP_TOKENIZERS = 16
#: A temporary folder older than this (seconds) was left by a process that died.
STALE_TMP_S = 3600.0


def load_gguf_tokenizer(path: Path) -> tuple[Any, dict[str, Any]]:
    """The transformers fast tokenizer of the GGUF file ``path`` and the file's
    ``tokenizer.ggml.*`` scalar metadata: from the cache when it holds them for this
    file, else converted and read from the file, and cached.

    Raises:
        TokenizerError: the file's metadata cannot be read.
        Exception: what transformers raises for a GGUF file it cannot build a tokenizer
            from (the caller turns it into a ``TokenizerError``).
    """
    folder = tokenizer_cache_dir() / cache_key(path)
    if (folder / "tokenizer.json").is_file():
        try:
            from transformers import PreTrainedTokenizerFast  # not AutoTokenizer: no torch

            metadata = json.loads((folder / METADATA_FILE).read_text(encoding="utf-8"))
            return PreTrainedTokenizerFast.from_pretrained(str(folder)), metadata
        except Exception as exc:  # a damaged or older entry: convert again
            log.warning("cached tokenizer %s unreadable (%s); converting %s", folder, exc, path)
    from transformers import AutoTokenizer

    metadata = gguf_tokenizer_metadata(path)
    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    _save(hf, metadata, folder)
    return hf, metadata


def gguf_tokenizer_metadata(path: Path) -> dict[str, Any]:
    """The ``tokenizer.ggml.*`` scalar metadata of a GGUF file (string arrays, the
    vocabulary and merges, are not read).

    Raises:
        TokenizerError: the file's metadata cannot be read.
    """
    try:
        from transformers.integrations.gguf.reader import read_gguf_metadata

        metadata, _ = read_gguf_metadata(str(path))
    except ImportError:  # another transformers layout: fall back to the gguf package
        from houchu.model.gguf.file import open_gguf

        reader = open_gguf(path)
        metadata = {  # scalars only: one type, not [ARRAY, element type]
            key: field.contents()
            for key, field in reader.fields.items()
            if key.startswith("tokenizer.ggml.") and len(field.types) == 1
        }
    except Exception as exc:
        raise TokenizerError(f"cannot read GGUF metadata of {path}: {exc}") from exc
    return {
        k: v
        for k, v in metadata.items()
        if k.startswith("tokenizer.ggml.") and isinstance(v, (bool, int, float, str))
    }


def _save(hf: Any, metadata: dict[str, Any], folder: Path) -> None:
    """Write ``hf`` and ``metadata`` into ``folder`` atomically (a temporary folder
    renamed into place, so a reader never sees half an entry), replacing a damaged entry
    there; errors are logged, not raised."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        hf.save_pretrained(str(tmp))
        (tmp / METADATA_FILE).write_text(json.dumps(metadata), encoding="utf-8")
        if folder.exists():  # a damaged entry: moved aside (a rename onto it would fail)
            old = folder.with_name(f"{tmp.name}.damaged")
            os.replace(folder, old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.replace(tmp, folder)
        except OSError:  # another process cached it first
            shutil.rmtree(tmp, ignore_errors=True)
        prune_tokenizer_cache(folder.parent, KEEP_TOKENIZERS)
    except OSError as exc:
        log.warning("cannot cache the converted tokenizer in %s: %s", folder, exc)


def prune_tokenizer_cache(root: Path, keep: int) -> list[Path]:
    """Remove all but the ``keep`` most recently written entries of ``root``, and
    temporary folders older than ``STALE_TMP_S`` seconds (a converting process died);
    return what was removed. A reader of a removed entry converts again."""
    now = time.time()
    entries, removed = [], []
    for p in root.iterdir():
        try:
            mtime = p.stat().st_mtime
        except OSError:
            continue  # removed by another process meanwhile
        if p.name.startswith("."):
            if now - mtime > STALE_TMP_S:
                removed.append(p)
        elif p.is_dir():
            entries.append((mtime, p))
    removed += [p for _, p in sorted(entries, reverse=True)[keep:]]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed
