"""The error a tokenizer raises (shared by loading, chat rendering and encoding)."""

from __future__ import annotations


class TokenizerError(ValueError):
    """A tokenizer could not be loaded, or a prompt could not be tokenized.

    A ``ValueError``, so callers that map bad input to HTTP 400 catch it as such.
    """
