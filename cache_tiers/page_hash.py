"""Chained page hashes: the name of a KV page in the lower tiers.

The hash of page ``i`` of a sequence covers the token ids of pages ``0 .. i`` and the
model fingerprint: ``h_i = BLAKE2b-128(h_{i-1} || tokens_i)`` with ``h_{-1}`` the
fingerprint. Two pages have the same hash only if they hold the KV of the same prefix
under the same model and KV layout (the scheme of vLLM's prefix caching and SGLang's
HiCache).
"""

from __future__ import annotations

import hashlib
from array import array
from pathlib import Path

HASH_BYTES = 16


def model_fingerprint(model_path: str | Path, layout: str) -> bytes:
    """A 16-byte fingerprint of the model file(s) and the KV layout description.

    ``layout`` names everything that changes the bytes of a page (dtype, page size,
    layers, heads, head size). The model is identified by name, size and the first MiB
    of its weights file (cheap, and changes when the weights do).
    """
    p = Path(model_path)
    h = hashlib.blake2b(digest_size=HASH_BYTES)
    h.update(layout.encode())
    files = [p] if p.is_file() else sorted(p.glob("*.safetensors")) + sorted(p.glob("*.json"))
    for f in files:
        h.update(f.name.encode())
        h.update(str(f.stat().st_size).encode())
        with open(f, "rb") as fh:
            h.update(fh.read(1 << 20))
    return h.digest()


def page_hash(prev: bytes, tokens: list[int] | tuple[int, ...]) -> bytes:
    """The chained hash of a page holding ``tokens`` after the page hashed ``prev``."""
    h = hashlib.blake2b(prev, digest_size=HASH_BYTES)
    h.update(array("i", tokens).tobytes())
    return h.digest()


def chain_hashes(
    fingerprint: bytes, tokens: list[int], page_size: int, num_pages: int
) -> list[bytes]:
    """Hashes of the first ``num_pages`` full pages of ``tokens``."""
    out, prev = [], fingerprint
    for i in range(num_pages):
        prev = page_hash(prev, tokens[i * page_size : (i + 1) * page_size])
        out.append(prev)
    return out
