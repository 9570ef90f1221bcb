"""Reading a tokenizer's files: a ``.gguf`` file's metadata or a Hugging Face directory.

:func:`read_tokenizer` builds the transformers fast tokenizer and works out whether the
model adds BOS, which chat template it is served with (its own, its family's built-in
one, or ``--chat-template``'s: ``houchu.text.chat_templates``) and which ids end
generation; :func:`houchu.text.tokenizer.core.load_tokenizer` wraps the result in a
:class:`~houchu.text.tokenizer.core.TextTokenizer`.
"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from houchu.text.chat_templates import MARKER_TOKENS, ChatTemplateError, choose_template
from houchu.text.tokenizer.cache import load_gguf_tokenizer
from houchu.text.tokenizer.errors import TokenizerError

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
    ``eos_token_ids``: every id that ends generation, the main EOS first (may repeat);
    ``architecture``: GGUF ``general.architecture`` or HF ``model_type`` (None: not
    stated); ``template_source``: where ``hf.chat_template`` came from, for the
    start-up line (``houchu.text.chat_templates.TemplateChoice.source``).
    """

    hf: Any
    name: str
    add_bos: bool
    eos_token_ids: list[int]
    architecture: str | None = None
    template_source: str = "the model's own"


def read_tokenizer(path: Path, chat_template: str | None = None) -> TokenizerFiles:
    """Read the tokenizer of the ``.gguf`` file or Hugging Face model directory ``path``.

    ``chat_template``: ``--chat-template``'s value (a known name, a Jinja file or an
    inline template), which replaces the model's own; without it a model that has no
    template gets its family's (``houchu.text.chat_templates.choose_template``).

    Raises ``FileNotFoundError`` when the path does not exist and :class:`TokenizerError`
    when it holds no usable (fast, tokenizers-backed) tokenizer or ``chat_template`` is
    bad.
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
        architecture = gguf_architecture(path)
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
        architecture = hf_model_type(path)
    if not getattr(hf, "is_fast", False) or getattr(hf, "backend_tokenizer", None) is None:
        raise TokenizerError(f"{path}: only fast (tokenizers-backed) tokenizers are supported")
    source = _set_template(hf, architecture, chat_template)  # before the end-of-turn ids
    eos = [hf.eos_token_id, *declared, *_end_of_turn_ids(hf)]
    eos_ids = [int(i) for i in eos if isinstance(i, int) and not isinstance(i, bool) and i >= 0]
    if not eos_ids:
        log.warning("%s declares no end-of-sequence token; generation stops only by length", path)
    return TokenizerFiles(
        hf=hf,
        name=name,
        add_bos=bool(add_bos),
        eos_token_ids=eos_ids,
        architecture=architecture,
        template_source=source,
    )


def _set_template(hf: Any, architecture: str | None, flag: str | None) -> str:
    """Give ``hf`` the chat template it is served with (``choose_template``); return
    where it came from.

    Raises:
        TokenizerError: a bad ``flag``.
    """
    own = hf.chat_template
    if isinstance(own, dict):  # several named templates: the default one
        own = own.get("default")
    backend = hf.backend_tokenizer
    markers = {t for t in MARKER_TOKENS if backend.token_to_id(t) is not None}
    try:
        choice = choose_template(own if isinstance(own, str) else None, architecture, markers, flag)
    except ChatTemplateError as exc:
        raise TokenizerError(str(exc)) from None
    hf.chat_template = choice.template
    return choice.source


def hf_model_type(path: Path) -> str | None:
    """The ``model_type`` of a Hugging Face folder's ``config.json`` (a multimodal
    config's text model's where the top level has none), or None."""
    config = _read_json(path / "config.json")
    value = config.get("model_type")
    if not isinstance(value, str):
        text = config.get("text_config")
        value = text.get("model_type") if isinstance(text, dict) else None
    return value if isinstance(value, str) and value else None


#: Byte sizes of GGUF's scalar value types (``gguf.GGUFValueType``: UINT8 .. FLOAT64).
_GGUF_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def gguf_architecture(path: Path) -> str | None:
    """A GGUF file's ``general.architecture``, read from its header (the key comes
    first in files llama.cpp's tools write, so this reads a few hundred bytes and never
    the vocabulary); None when the file does not say or cannot be read."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                return None
            (version,) = struct.unpack("<I", f.read(4))
            if version < 2:
                return None
            _tensors, n_kv = struct.unpack("<QQ", f.read(16))
            for _ in range(n_kv):
                key = _gguf_string(f)
                (kind,) = struct.unpack("<I", f.read(4))
                if key == "general.architecture" and kind == _GGUF_STRING:
                    return _gguf_string(f) or None
                _skip_gguf_value(f, kind)
    except (OSError, struct.error, UnicodeDecodeError, ValueError):
        return None
    return None


def _gguf_string(f: Any) -> str:
    (n,) = struct.unpack("<Q", f.read(8))
    data = f.read(n)
    if len(data) != n:
        raise ValueError("truncated GGUF string")
    return data.decode("utf-8")


def _skip_gguf_value(f: Any, kind: int) -> None:
    """Move ``f`` past one metadata value of type ``kind``."""
    if kind in _GGUF_SCALAR_BYTES:
        f.seek(_GGUF_SCALAR_BYTES[kind], 1)
    elif kind == _GGUF_STRING:
        (n,) = struct.unpack("<Q", f.read(8))
        f.seek(n, 1)
    elif kind == _GGUF_ARRAY:
        item, count = struct.unpack("<IQ", f.read(12))
        if item in _GGUF_SCALAR_BYTES:
            f.seek(_GGUF_SCALAR_BYTES[item] * count, 1)
        else:
            for _ in range(count):
                _skip_gguf_value(f, item)
    else:
        raise ValueError(f"unknown GGUF value type {kind}")


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
