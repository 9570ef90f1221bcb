"""A GGUF file's tokenizer, converted once and kept as Hugging Face files.

transformers builds a fast tokenizer from a GGUF vocabulary by converting it (about 5 s
of one core for the default model's 49,152 tokens, on every server start, beside the
weights' load). The converted tokenizer is saved with ``save_pretrained`` into
``$HOUCHU_CACHE/tokenizers/<key>`` (``tokenizer.json``, ``tokenizer_config.json``, the
chat template), and later loads read those files (about 0.3 s). The key hashes the GGUF
file's resolved path, size and modification time and the transformers and tokenizers
versions, so an edited file or an upgrade converts again. An unwritable or damaged cache
only costs the conversion.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from houchu.cli.fetch import cache_dir

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


def load_gguf_tokenizer(path: Path) -> Any:
    """The transformers fast tokenizer of the GGUF file ``path``: from the cache when it
    holds one for this file, else converted from the file and cached.

    Raises:
        Exception: what transformers raises for a GGUF file it cannot build a tokenizer
            from (the caller turns it into a ``TokenizerError``).
    """
    from transformers import AutoTokenizer

    folder = tokenizer_cache_dir() / cache_key(path)
    if (folder / "tokenizer.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(str(folder))
        except Exception as exc:  # a damaged entry: convert again
            log.warning("cached tokenizer %s unreadable (%s); converting %s", folder, exc, path)
    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    _save(hf, folder)
    return hf


def _save(hf: Any, folder: Path) -> None:
    """Write ``hf`` into ``folder`` atomically (a temporary folder renamed into place, so
    a reader never sees half an entry); errors are logged, not raised."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        hf.save_pretrained(str(tmp))
        try:
            os.replace(tmp, folder)
        except OSError:  # another process cached it first
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as exc:
        log.warning("cannot cache the converted tokenizer in %s: %s", folder, exc)
