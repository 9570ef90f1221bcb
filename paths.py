"""houchu's cache directory: ``$HOUCHU_CACHE``, else ``~/.cache/houchu``. Under it live
the default model (``models/``), the GGUF header indexes (``gguf-index/``), converted
tokenizers (``tokenizers/``), the database (``houchu.db``), the SSD KV tier (``kv/``)
and benchmark results (``bench/``).

At the bottom of the import order (the standard library only): every layer that keeps
files there imports ``cache_dir`` from here at module top, never from the command line
(``houchu.cli``), so an actor process imports nothing above its own layer to find it.
"""

from __future__ import annotations

from houchu.env import cache_dir

__all__ = ["cache_dir"]
