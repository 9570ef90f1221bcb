"""The exact bytes a vocabulary piece stands for (OpenAI logprobs ``bytes``).

Byte-level BPE vocabularies (GPT-2, Llama 3, Qwen) spell every byte as one printable
character; SentencePiece vocabularies mark word starts with a replacement character
(U+2581 by default) and spell raw bytes as ``<0xNN>``. Which kind a tokenizer is comes
from the ``decoder`` section of its ``tokenizer.json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's byte-to-unicode table: printable stand-in char -> byte.

    Byte-level BPE vocabularies spell every byte as one printable character: the bytes
    that are printable Latin-1 stand for themselves, the other 68 are shifted to
    U+0100 and up in byte order (source: GPT-2's ``encoder.py``, ``bytes_to_unicode``).
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


_BYTE_DECODER = _byte_decoder()


def decoder_kind(tokenizer_json: str) -> tuple[bool, str | None]:
    """(is byte-level, SentencePiece word marker or None) from the decoder config.

    ``tokenizer_json``: the serialized ``tokenizers`` tokenizer (``Tokenizer.to_str()``).
    """
    decoder = json.loads(tokenizer_json).get("decoder") or {}
    parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    types = {part.get("type") for part in parts}
    if "ByteLevel" in types:
        return True, None
    for part in parts:
        if part.get("type") == "Metaspace":
            return False, part.get("replacement", "\u2581")
        if part.get("type") == "Replace" and part.get("content") == " ":
            pattern = part.get("pattern", {})
            marker = pattern.get("String") if isinstance(pattern, dict) else None
            if marker:
                return False, marker
    if "ByteFallback" in types:
        return False, "\u2581"
    return False, None


def piece_bytes(piece: str, *, byte_mode: bool, space_marker: str | None) -> bytes | None:
    """The bytes vocabulary piece ``piece`` stands for, or None when neither spelling applies.

    ``byte_mode`` and ``space_marker`` come from :func:`decoder_kind`. Byte-level pieces
    map back through the GPT-2 byte alphabet (a piece holding part of a UTF-8 character
    yields just those bytes; a piece outside the alphabet gives its UTF-8); SentencePiece
    pieces turn the word marker into a space and ``<0xNN>`` into byte NN. None tells the
    caller to decode the token id with the tokenizer itself.
    """
    if byte_mode:
        try:
            return bytes(_BYTE_DECODER[ch] for ch in piece)
        except KeyError:
            return piece.encode("utf-8")
    if space_marker is not None:
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            try:
                return bytes([int(piece[3:5], 16)])
            except ValueError:
                pass
        return piece.replace(space_marker, " ").encode("utf-8")
    return None


def vocabulary_bytes(
    backend: Any,
    token_id: int,
    added_text: Mapping[int, str],
    *,
    byte_mode: bool,
    space_marker: str | None,
) -> bytes:
    """The bytes token ``token_id`` of a ``tokenizers`` tokenizer stands for.

    Args:
        backend: a ``tokenizers.Tokenizer``.
        token_id: the id (outside the vocabulary: ``b""``).
        added_text: added and special tokens' ids -> their text (given as UTF-8).
        byte_mode, space_marker: :func:`decoder_kind` of ``backend``.
    """
    if token_id in added_text:
        return added_text[token_id].encode("utf-8")
    piece = backend.id_to_token(token_id) if token_id >= 0 else None
    if piece is None:
        return b""
    spelled = piece_bytes(piece, byte_mode=byte_mode, space_marker=space_marker)
    if spelled is not None:
        return spelled
    return backend.decode([token_id], skip_special_tokens=False).encode("utf-8")
