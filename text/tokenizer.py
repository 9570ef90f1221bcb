"""Loading a model's tokenizer and chat template: encode, decode, token bytes.

``load_tokenizer(path)`` accepts a ``.gguf`` file (vocabulary, merges, special ids and the
chat template come from its metadata, through transformers' GGUF support) or a Hugging Face
model directory (``tokenizer.json`` / ``tokenizer_config.json`` / ``chat_template.jinja``,
plus ``generation_config.json`` / ``config.json`` for the end-of-sequence ids).

The hot path (``encode``, ``decode``, ``token_bytes``) runs on the ``tokenizers`` backend
directly; transformers is used to load the tokenizer and to render the chat template, so a
prompt is tokenized exactly as ``AutoTokenizer.apply_chat_template`` would.

Decoding conventions (shared with :mod:`houchu.text.detokenizer`): special tokens are
skipped, ids the tokenizer does not know (for example the padded rows of a model's
embedding) decode to nothing, and no "clean up tokenization spaces" pass is applied.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from houchu.transport.messages import CHAT_ROLES as WIRE_ROLES
from houchu.transport.messages import ROLE_ALIASES, ChatMessage

log = logging.getLogger(__name__)

#: Roles a chat message may have: the wire's (what the gateway sends) and "tool", which a
#: chat template may render for a caller of this library. ``ROLE_ALIASES`` (``developer``,
#: OpenAI's newer name for system) are rendered as the role they stand for.
CHAT_ROLES = frozenset({*WIRE_ROLES, "tool"})

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


class TokenizerError(ValueError):
    """A tokenizer could not be loaded, or a prompt could not be tokenized.

    A ``ValueError``, so callers that map bad input to HTTP 400 catch it as such.
    """


def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's byte-to-unicode table: printable stand-in char -> byte.

    Byte-level BPE vocabularies spell every byte as one printable character: the bytes
    that are printable Latin-1 stand for themselves, the other 68 are shifted to
    U+0100 and up in byte order.
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


class TextTokenizer:
    """A loaded tokenizer: prompt encoding, chat template, decoding and token bytes.

    Build it with :func:`load_tokenizer`. Token ids are ``int``; text is ``str``; bytes
    are the UTF-8 bytes a token contributes to the output. Instances are immutable after
    construction and safe to share between threads.
    """

    def __init__(
        self,
        hf_tokenizer: Any,
        *,
        name: str,
        add_bos: bool,
        eos_token_ids: Sequence[int],
    ) -> None:
        """Wrap a transformers fast tokenizer.

        ``add_bos``: whether :meth:`encode` prepends BOS (the model's config says so).
        ``eos_token_ids``: every id that ends generation, the main EOS first.
        """
        self._hf = hf_tokenizer
        self._backend = hf_tokenizer.backend_tokenizer
        self.name: str = name
        self.add_bos: bool = add_bos
        self.bos_token_id: int | None = hf_tokenizer.bos_token_id
        self.eos_token_ids: list[int] = list(dict.fromkeys(eos_token_ids))
        self.vocab_size: int = self._backend.get_vocab_size(with_added_tokens=True)
        added = self._backend.get_added_tokens_decoder()
        self._added_text: dict[int, str] = {i: t.content for i, t in added.items()}
        self.special_ids: frozenset[int] = frozenset(i for i, t in added.items() if t.special)
        self._byte_mode, self._space_marker = _decoder_kind(self._backend.to_str())
        self._bytes_cache: dict[int, bytes] = {}

    # ------------------------------------------------------------------ properties

    @property
    def hf_tokenizer(self) -> Any:
        """The wrapped transformers fast tokenizer (for libraries that take one)."""
        return self._hf

    @property
    def chat_template(self) -> str | None:
        """The model's Jinja chat template, or None when it has none."""
        template = self._hf.chat_template
        return template if isinstance(template, str) else None

    # ------------------------------------------------------------------ encoding

    def encode(self, text: str) -> list[int]:
        """Token ids of a raw completion prompt.

        Special-token strings in ``text`` (such as ``<|im_start|>``) become their ids, as
        in Hugging Face. BOS is prepended only when the model's tokenizer config asks for
        it (``add_bos``) and the text does not already start with it. No EOS is added.
        """
        ids = self._backend.encode(text, add_special_tokens=False).ids
        if self.add_bos and self.bos_token_id is not None and ids[:1] != [self.bos_token_id]:
            ids.insert(0, self.bos_token_id)
        return ids

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of ``text`` alone, without the BOS that ``encode`` may prepend."""
        return self._backend.encode(text, add_special_tokens=False).ids

    def render_chat(
        self,
        messages: Sequence[ChatMessage],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        """The chat template rendered as text, with the assistant generation prompt
        (unless ``add_generation_prompt`` is false).

        Raises :class:`TokenizerError` when there are no messages, a role is not one of
        system / user / assistant / tool (``developer`` counts as system), the model has
        no chat template, or the template fails (for example ``raise_exception``).
        """
        return str(
            self._apply_template(
                messages, tools, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        )

    def apply_chat_template(
        self, messages: Sequence[ChatMessage], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """Token ids of a chat prompt, ending with the assistant generation prompt.

        Identical to ``AutoTokenizer.apply_chat_template(messages, tools=tools,
        add_generation_prompt=True)``: the template writes any BOS itself, so none is
        added. ``tools``: OpenAI ``tools`` entries, the template's ``tools`` variable
        (a template that does not read it ignores them). An assistant turn's tool calls
        reach the template as ``tool_calls`` (``function.arguments`` decoded from JSON
        when it parses), a tool turn's ``tool_call_id`` and ``name`` as such. Raises
        :class:`TokenizerError` as :meth:`render_chat` does.
        """
        ids = self._apply_template(messages, tools, tokenize=True)
        if hasattr(ids, "keys"):  # a BatchEncoding despite return_dict=False
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def _apply_template(
        self,
        messages: Sequence[ChatMessage],
        tools: list[dict[str, Any]] | None = None,
        *,
        tokenize: bool,
        add_generation_prompt: bool = True,
    ) -> Any:
        """Validate ``messages`` and run transformers' template renderer."""
        if self.chat_template is None:
            raise TokenizerError(
                f"model {self.name!r} has no chat template; use a completion prompt instead"
            )
        if not messages:
            raise TokenizerError("a chat request needs at least one message")
        conversation = []
        for index, message in enumerate(messages):
            role = ROLE_ALIASES.get(message.role, message.role)
            if role not in CHAT_ROLES:
                allowed = ", ".join(sorted(CHAT_ROLES | ROLE_ALIASES.keys()))
                raise TokenizerError(
                    f"messages[{index}].role is {message.role!r}; expected one of {allowed}"
                )
            conversation.append(_turn(role, message))
        try:
            return self._hf.apply_chat_template(
                conversation,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                tokenize=tokenize,
                return_dict=False,
            )
        except Exception as exc:  # jinja2 errors, raise_exception(), bad template input
            raise TokenizerError(f"chat template of {self.name!r} failed: {exc}") from exc

    # ------------------------------------------------------------------ decoding

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``: special tokens skipped, unknown ids ignored, no space cleanup.

        Incomplete or invalid UTF-8 at any point decodes to U+FFFD.
        """
        return self._backend.decode(list(ids), skip_special_tokens=True)

    def is_special(self, token_id: int) -> bool:
        """Whether ``token_id`` is a special token (skipped when decoding)."""
        return token_id in self.special_ids

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes token ``token_id`` stands for (OpenAI logprobs ``bytes``).

        Byte-level BPE pieces map back through the GPT-2 byte alphabet, so a piece that
        holds part of a UTF-8 character yields just those bytes; SentencePiece pieces
        turn the word marker into a space and ``<0xNN>`` into byte NN; added and special
        tokens give their text in UTF-8. Ids outside the vocabulary give ``b""``.
        """
        cached = self._bytes_cache.get(token_id)
        if cached is None:
            cached = self._compute_token_bytes(token_id)
            self._bytes_cache[token_id] = cached
        return cached

    def token_text(self, token_id: int) -> str:
        """Printable text of one token: its bytes decoded as UTF-8, invalid bytes as U+FFFD.

        Special tokens give their text (``"<|im_end|>"``); unknown ids give ``""``.
        """
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    def _compute_token_bytes(self, token_id: int) -> bytes:
        """Uncached :meth:`token_bytes`."""
        if token_id in self._added_text:
            return self._added_text[token_id].encode("utf-8")
        piece = self._backend.id_to_token(token_id) if token_id >= 0 else None
        if piece is None:
            return b""
        if self._byte_mode:
            try:
                return bytes(_BYTE_DECODER[ch] for ch in piece)
            except KeyError:
                return piece.encode("utf-8")
        if self._space_marker is not None:
            if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                try:
                    return bytes([int(piece[3:5], 16)])
                except ValueError:
                    pass
            return piece.replace(self._space_marker, " ").encode("utf-8")
        return self._backend.decode([token_id], skip_special_tokens=False).encode("utf-8")


def _turn(role: str, message: ChatMessage) -> dict[str, Any]:
    """One turn as chat templates read it."""
    turn: dict[str, Any] = {"role": role, "content": message.content}
    if message.tool_calls:
        turn["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": _arguments(c.arguments)},
            }
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        turn["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        turn["name"] = message.name
    return turn


def _arguments(text: str) -> Any:
    """A call's arguments decoded from JSON (templates write them with ``tojson``), or
    the text itself when it is not JSON."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _decoder_kind(tokenizer_json: str) -> tuple[bool, str | None]:
    """(is byte-level, SentencePiece word marker or None) from the decoder config."""
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


# ---------------------------------------------------------------------- loading


def load_tokenizer(model_path: str | os.PathLike[str]) -> TextTokenizer:
    """Load the tokenizer of a ``.gguf`` file or a Hugging Face model directory.

    Takes a few seconds (transformers import and vocabulary build); load once per process.
    Raises ``FileNotFoundError`` when the path does not exist and :class:`TokenizerError`
    when it holds no usable tokenizer.
    """
    path = Path(model_path)
    if not path.exists():
        raise FileNotFoundError(f"no model at {path}")
    from transformers import AutoTokenizer

    if path.is_file():
        if path.suffix != ".gguf":
            raise TokenizerError(f"{path} is neither a .gguf file nor a model directory")
        metadata = _gguf_metadata(path)
        try:
            hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        except Exception as exc:
            raise TokenizerError(f"cannot build a tokenizer from {path}: {exc}") from exc
        add_bos = metadata.get("tokenizer.ggml.add_bos_token")
        if add_bos is None:  # llama.cpp: SentencePiece vocabularies add BOS unless told not to
            add_bos = metadata.get("tokenizer.ggml.model") == "llama"
        declared = [metadata.get(key) for key in _GGUF_EOG_KEYS]
        name = path.stem
    else:
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
    return TextTokenizer(hf, name=name, add_bos=bool(add_bos), eos_token_ids=eos_ids)


def _end_of_turn_ids(hf: Any) -> list[int]:
    """Ids of end-of-turn special tokens that the chat template writes."""
    template = hf.chat_template if isinstance(hf.chat_template, str) else ""
    added = hf.backend_tokenizer.get_added_tokens_decoder()
    by_text = {t.content: i for i, t in added.items() if t.special}
    return [by_text[m] for m in _END_OF_TURN_MARKERS if m in by_text and m in template]


def _gguf_metadata(path: Path) -> dict[str, Any]:
    """Scalar metadata of a GGUF file (string arrays are not read)."""
    try:
        from transformers.integrations.gguf.reader import read_gguf_metadata

        metadata, _ = read_gguf_metadata(str(path))
        return metadata
    except ImportError:  # another transformers layout: fall back to the gguf package
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
        return {
            key: field.contents()
            for key, field in reader.fields.items()
            if key.startswith(("tokenizer.ggml.add_", "tokenizer.ggml.e", "tokenizer.ggml.model"))
        }
    except Exception as exc:
        raise TokenizerError(f"cannot read GGUF metadata of {path}: {exc}") from exc


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``, or ``{}`` when the file is missing or not an object."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
