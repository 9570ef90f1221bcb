"""The model's tokenizer as llguidance needs it (``llguidance.LLTokenizer``), for
structured output (``houchu.model.grammar.matcher``): loaded once in the background, its
``tokenizers`` JSON cached beside the kernel builds (a GGUF vocabulary takes seconds to
convert).

Text a grammar forces (a choice, a JSON ``const``, a regex's literal) is tokenized by
this tokenizer. A Hugging Face tokenizer always reads the text of a special token
(``<|im_end|>``) as that token, so llguidance, given the tokenizer's JSON, would force
the special token (which is not the text, and is EOS here) and stop. llguidance's
documented default is the other reading, special-token text as ordinary bytes, which
its ``TokenizerWrapper`` protocol lets the caller give: ``TextAsText`` encodes with the
``tokenizers`` option that reads special-token text as text, so such text comes out as
ordinary tokens, as any other text does. The special tokens stay special (never part
of a text's mask; a Lark grammar still names them, ``<|im_end|>``). llguidance calls the
encoder (Python, under the GIL) only to tokenize text a grammar forces.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

from houchu.cpu import kernels as cpu_kernels
from houchu.text.token_bytes import decoder_kind, vocabulary_bytes

if TYPE_CHECKING:
    import llguidance


class TokenizerUnavailable(ValueError):
    """The model's tokenizer, which structured output needs, cannot be loaded."""


class GrammarTokenizer:
    """The model's tokenizer as llguidance needs it, loaded once in the background.

    Args:
        model_path: the model (its tokenizer is loaded as the tokenizer actor loads it:
            ``houchu.text.tokenizer.core.load_tokenizer``).
        vocab_size: the model's vocabulary (rows of its logits; may exceed the
            tokenizer's).
    """

    def __init__(self, model_path: str | Path, vocab_size: int) -> None:
        self.model_path, self.vocab_size = model_path, vocab_size
        self._lock = threading.Lock()
        self._future: Future[llguidance.LLTokenizer] | None = None

    def warm(self) -> None:
        """Start loading (on a thread of its own) unless already started."""
        with self._lock:
            if self._future is None:
                self._future = Future()
                threading.Thread(target=self._load, name="houchu-grammar-tok", daemon=True).start()

    def _load(self) -> None:
        assert self._future is not None
        try:
            import llguidance

            text, eos = self._tokenizer_json()
            wrapper = TextAsText(text, eos, self.vocab_size)
            lt = llguidance.LLTokenizer(wrapper, n_vocab=self.vocab_size, eos_token=eos)
            self._future.set_result(lt)
        except Exception as exc:  # no tokenizer in the model folder, say
            self._future.set_exception(exc)

    def _tokenizer_json(self) -> tuple[str, list[int]]:
        """The tokenizer as ``tokenizers`` JSON and its end-of-sequence ids: from the
        cache (a GGUF vocabulary takes seconds to convert), else loaded and cached."""
        path = Path(self.model_path)
        if path.is_dir():  # a Hugging Face folder: tokenizer.json loads quickly
            return self._convert(path)
        st = path.stat()
        key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
        cached = cpu_kernels.cache_dir() / "grammar_tokenizers" / f"{key.hexdigest()[:24]}.json"
        try:
            entry = json.loads(cached.read_text(encoding="utf-8"))
            return entry["tokenizer"], entry["eos"]
        except (OSError, ValueError, KeyError):
            pass
        text, eos = self._convert(path)
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"tokenizer": text, "eos": eos}), encoding="utf-8")
            tmp.replace(cached)
        except OSError:  # an unwritable cache: convert again next time
            pass
        return text, eos

    @staticmethod
    def _convert(path: Path) -> tuple[str, list[int]]:
        """Load the tokenizer as the tokenizer actor does; its JSON and EOS ids."""
        from houchu.text.tokenizer.core import load_tokenizer

        tok = load_tokenizer(path)
        backend = copy.copy(tok.hf_tokenizer.backend_tokenizer)
        backend.no_padding()
        backend.no_truncation()
        return backend.to_str(), tok.eos_token_ids

    def get(self) -> llguidance.LLTokenizer:
        """The tokenizer (waits for the load).

        Raises:
            TokenizerUnavailable: the model's tokenizer cannot be loaded.
        """
        self.warm()
        assert self._future is not None
        try:
            return self._future.result()
        except Exception as exc:
            raise TokenizerUnavailable(
                f"structured output needs the model's tokenizer: {exc}"
            ) from exc


class TextAsText:
    """A ``tokenizers`` tokenizer in llguidance's ``TokenizerWrapper`` protocol, reading
    the text of special tokens as text (module docstring).

    Args:
        tokenizer_json: the tokenizer (``tokenizers`` JSON).
        eos: its end-of-sequence ids (the first is the main one).
        n_vocab: the model's vocabulary (its logits' rows), at least the tokenizer's.

    Attributes:
        tokens: each token's bytes (special tokens: their text; llguidance marks them),
            ``b""`` for the model's rows past the tokenizer's vocabulary (llguidance
            takes the vocabulary's size from this list, never allowing such a row).
        special_token_ids: the special tokens (never text).
        eos_token_id, bos_token_id: as llguidance asks (no BOS: grammars follow output).
    """

    is_tokenizer_wrapper = True

    def __init__(self, tokenizer_json: str, eos: list[int], n_vocab: int = 0) -> None:
        from tokenizers import Tokenizer

        backend = Tokenizer.from_str(tokenizer_json)
        backend.encode_special_tokens = True  # "<|im_end|>" in a text is text
        self._backend = backend
        added = backend.get_added_tokens_decoder()
        added_text = {i: t.content for i, t in added.items()}
        byte_mode, marker = decoder_kind(tokenizer_json)
        self.tokens = [
            vocabulary_bytes(backend, i, added_text, byte_mode=byte_mode, space_marker=marker)
            for i in range(backend.get_vocab_size(with_added_tokens=True))
        ]
        self.tokens += [b""] * (n_vocab - len(self.tokens))
        self.special_token_ids = sorted(i for i, t in added.items() if t.special)
        self.eos_token_id = eos[0] if eos else None
        self.bos_token_id = None

    def __call__(self, text: str | bytes) -> list[int]:
        """The token ids of ``text`` (special-token text as ordinary tokens)."""
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._backend.encode(text, add_special_tokens=False).ids
