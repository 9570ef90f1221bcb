"""Loading a model's tokenizer and chat template: encode, decode, token bytes.

``load_tokenizer(path)`` accepts a ``.gguf`` file (vocabulary, merges, special ids and the
chat template come from its metadata, through transformers' GGUF support) or a Hugging Face
model directory (``tokenizer.json`` / ``tokenizer_config.json`` / ``chat_template.jinja``,
plus ``generation_config.json`` / ``config.json`` for the end-of-sequence ids). A model
without a chat template gets its family's built-in one, and ``load_tokenizer(path,
chat_template=...)`` (``--chat-template``) replaces any (``houchu.text.chat_templates``).

The hot path (``encode``, ``decode``, ``token_bytes``) runs on the ``tokenizers`` backend
directly; transformers is used to load the tokenizer and to render the chat template, so a
prompt is tokenized exactly as ``AutoTokenizer.apply_chat_template`` would.

Decoding conventions (shared with :mod:`houchu.text.detokenizer`): special tokens are
skipped, ids the tokenizer does not know (for example the padded rows of a model's
embedding) decode to nothing, and no "clean up tokenization spaces" pass is applied.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
import jinja2.sandbox

from houchu.text.chat_turns import conversation
from houchu.text.token_bytes import decoder_kind, vocabulary_bytes
from houchu.text.tokenizer.errors import TokenizerError
from houchu.text.tokenizer.loading import read_tokenizer
from houchu.transport.messages import CHAT_ROLES, ChatMessage

__all__ = ["CHAT_ROLES", "TextTokenizer", "TokenizerError", "load_tokenizer", "reads_variable"]


def reads_variable(template: str, name: str) -> bool:
    """Whether the Jinja ``template`` reads the variable ``name`` from its context
    (``jinja2.meta.find_undeclared_variables``; a template that does not parse: False)."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment()
    try:
        return name in jinja2.meta.find_undeclared_variables(env.parse(template))
    except jinja2.TemplateError:
        return False


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
        chat_template_source: str = "the model's own",
    ) -> None:
        """Wrap a transformers fast tokenizer.

        ``add_bos``: whether :meth:`encode` prepends BOS (the model's config says so).
        ``eos_token_ids``: every id that ends generation, the main EOS first.
        ``chat_template_source``: where the tokenizer's chat template came from, for the
        start-up line (``houchu.text.chat_templates.TemplateChoice.source``).
        """
        self._hf = hf_tokenizer
        self._backend = hf_tokenizer.backend_tokenizer
        self.name: str = name
        self.add_bos: bool = add_bos
        self.chat_template_source: str = chat_template_source
        self.bos_token_id: int | None = hf_tokenizer.bos_token_id
        self.eos_token_ids: list[int] = list(dict.fromkeys(eos_token_ids))
        self.vocab_size: int = self._backend.get_vocab_size(with_added_tokens=True)
        added = self._backend.get_added_tokens_decoder()
        self._added_text: dict[int, str] = {i: t.content for i, t in added.items()}
        self.special_ids: frozenset[int] = frozenset(i for i, t in added.items() if t.special)
        self._byte_mode, self._space_marker = decoder_kind(self._backend.to_str())
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

    @property
    def template_reads_tools(self) -> bool:
        """Whether the chat template reads the ``tools`` variable (a template that does
        not never shows the model the request's tools)."""
        return self.chat_template is not None and reads_variable(self.chat_template, "tools")

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
        **options: Any,
    ) -> str:
        """The chat template rendered as text, with the assistant generation prompt
        (``options`` as :meth:`apply_chat_template` takes them).

        Raises :class:`TokenizerError` when there are no messages, a role is not one of
        system / user / assistant / tool (``developer`` counts as system), the model has
        no chat template, or the template fails (for example ``raise_exception``, or a
        final message to continue that the template does not write out).
        """
        return str(self._apply_template(messages, tools, tokenize=False, **options))

    def apply_chat_template(
        self,
        messages: Sequence[ChatMessage],
        tools: list[dict[str, Any]] | None = None,
        **options: Any,
    ) -> list[int]:
        """Token ids of a chat prompt, ending with the assistant generation prompt.

        Identical to ``AutoTokenizer.apply_chat_template(messages, tools=tools,
        add_generation_prompt=True)``: the template writes any BOS itself, so none is
        added. ``tools``: OpenAI ``tools`` entries, the template's ``tools`` variable
        (a template that does not read it ignores them). An assistant turn's tool calls
        reach the template as ``tool_calls`` (``function.arguments`` decoded from JSON
        when it parses), a tool turn's ``tool_call_id`` and ``name`` as such.
        ``options`` (vLLM's chat fields): ``add_generation_prompt`` (default true),
        ``continue_final_message`` (default false: the last message is left open for
        the model to continue; not with ``add_generation_prompt``) and
        ``chat_template_kwargs`` (extra template variables, or None). Raises
        :class:`TokenizerError` as :meth:`render_chat` does.
        """
        ids = self._apply_template(messages, tools, tokenize=True, **options)
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
        continue_final_message: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """Validate ``messages`` and run transformers' template renderer."""
        if self.chat_template is None:
            raise TokenizerError(
                f"model {self.name!r} has no chat template; use a completion prompt instead "
                "(or start the server with --chat-template NAME|FILE)"
            )
        turns = conversation(messages)
        try:
            return self._hf.apply_chat_template(
                turns,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tokenize=tokenize,
                return_dict=False,
                **(chat_template_kwargs or {}),
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
        return vocabulary_bytes(
            self._backend,
            token_id,
            self._added_text,
            byte_mode=self._byte_mode,
            space_marker=self._space_marker,
        )


def load_tokenizer(
    model_path: str | os.PathLike[str], chat_template: str | None = None
) -> TextTokenizer:
    """Load the tokenizer of a ``.gguf`` file or a Hugging Face model directory.

    ``chat_template``: ``--chat-template``'s value (a known template name, a Jinja file
    or an inline template) to serve instead of the model's own; without it a model
    that has none gets its family's (``houchu.text.chat_templates``).

    Takes a few seconds (transformers import and vocabulary build); load once per process.
    Raises ``FileNotFoundError`` when the path does not exist and :class:`TokenizerError`
    when it holds no usable tokenizer or ``chat_template`` is bad.
    """
    files = read_tokenizer(Path(model_path), chat_template)
    return TextTokenizer(
        files.hf,
        name=files.name,
        add_bos=files.add_bos,
        eos_token_ids=files.eos_token_ids,
        chat_template_source=files.template_source,
    )
