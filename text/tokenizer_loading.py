"""Reading a tokenizer's files: a ``.gguf`` file's metadata or a Hugging Face directory.

:func:`read_tokenizer` builds the transformers fast tokenizer and works out whether the
model adds BOS and which ids end generation; :func:`houchu.text.tokenizer.load_tokenizer`
wraps the result in a :class:`~houchu.text.tokenizer.TextTokenizer`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from houchu.text.tokenizer_cache import load_gguf_tokenizer
from houchu.text.tokenizer_errors import TokenizerError

log = logging.getLogger(__name__)

#: End-of-turn markers of common chat formats. When one of them is a special token of the
#: vocabulary *and* the chat template writes it, the model ends its turns with it, so it is
#: treated as an end-of-sequence id even if the metadata only declares another EOS.
_END_OF_TURN_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>")

# GGUF metadata keys holding ids that end generation (llama.cpp names).
_GGUF_EOG_KEYS = (
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id",
)


@dataclass(frozen=True)
class TokenizerFiles:
    """What a model's tokenizer files say.

    ``hf``: the transformers fast tokenizer; ``name``: the model's name (file stem or
    directory name); ``add_bos``: whether a completion prompt starts with BOS;
    ``eos_token_ids``: every id that ends generation, the main EOS first (may repeat).
    """

    hf: Any
    name: str
    add_bos: bool
    eos_token_ids: list[int]


def read_tokenizer(path: Path) -> TokenizerFiles:
    """Read the tokenizer of the ``.gguf`` file or Hugging Face model directory ``path``.

    Raises ``FileNotFoundError`` when the path does not exist and :class:`TokenizerError`
    when it holds no usable (fast, tokenizers-backed) tokenizer.
    """
    if not path.exists():
        raise FileNotFoundError(f"no model at {path}")
    if path.is_file():
        if path.suffix != ".gguf":
            raise TokenizerError(f"{path} is neither a .gguf file nor a model directory")
        try:
            hf, metadata = load_gguf_tokenizer(path)  # converted once, then from the cache
        except TokenizerError:
            raise
        except Exception as exc:
            raise TokenizerError(f"cannot build a tokenizer from {path}: {exc}") from exc
        add_bos = metadata.get("tokenizer.ggml.add_bos_token")
        if add_bos is None:  # llama.cpp: SentencePiece vocabularies add BOS unless told not to
            add_bos = metadata.get("tokenizer.ggml.model") == "llama"
        declared = [metadata.get(key) for key in _GGUF_EOG_KEYS]
        name = path.stem
    else:
        from transformers import AutoTokenizer

        try:
            hf = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
        except Exception as exc:
            raise TokenizerError(f"cannot load a tokenizer from {path}: {exc}") from exc
        add_bos = _read_json(path / "tokenizer_config.json").get("add_bos_token")
        if not isinstance(add_bos, bool):  # not stated: follow the post-processor
            probe = hf.backend_tokenizer.encode("a", add_special_tokens=True).ids
            add_bos = hf.bos_token_id is not None and probe[:1] == [hf.bos_token_id]
        declared = [hf.eos_token_id]
        for config in ("generation_config.json", "config.json"):
            value = _read_json(path / config).get("eos_token_id")
            declared.extend(value if isinstance(value, list) else [value])
        name = path.name
    if not getattr(hf, "is_fast", False) or getattr(hf, "backend_tokenizer", None) is None:
        raise TokenizerError(f"{path}: only fast (tokenizers-backed) tokenizers are supported")
    eos = [hf.eos_token_id, *declared, *_end_of_turn_ids(hf)]
    eos_ids = [int(i) for i in eos if isinstance(i, int) and not isinstance(i, bool) and i >= 0]
    if not eos_ids:
        log.warning("%s declares no end-of-sequence token; generation stops only by length", path)
    return TokenizerFiles(hf=hf, name=name, add_bos=bool(add_bos), eos_token_ids=eos_ids)


def _end_of_turn_ids(hf: Any) -> list[int]:
    """Ids of end-of-turn special tokens that the chat template writes."""
    template = hf.chat_template if isinstance(hf.chat_template, str) else ""
    added = hf.backend_tokenizer.get_added_tokens_decoder()
    by_text = {t.content: i for i, t in added.items() if t.special}
    return [by_text[m] for m in _END_OF_TURN_MARKERS if m in by_text and m in template]


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``, or ``{}`` when the file is missing or not an object."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
