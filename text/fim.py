"""Fill-in-the-middle prompts for the completions API's ``suffix``.

A model trained for fill-in-the-middle has three special tokens, prefix, suffix and
middle; the prompt is written prefix-suffix-middle (PSM): ``<PRE> prompt <SUF> suffix
<MID>``, and the model writes the middle (Bavarian et al. 2022, "Efficient Training of
Language Models to Fill in the Middle"; the spellings are StarCoder's, Qwen2.5-Coder's,
DeepSeek-Coder's and CodeLlama's, as their tokenizers define them). A tokenizer
without one of these triples cannot serve ``suffix``.
"""

from __future__ import annotations

from dataclasses import dataclass

from houchu.text.tokenizer.core import TextTokenizer

#: (prefix, suffix, middle) token texts, per model family.
FIM_SPELLINGS: tuple[tuple[str, str, str], ...] = (
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, SantaCoder
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek-Coder
    ("▁<PRE>", "▁<SUF>", "▁<MID>"),  # CodeLlama
)


@dataclass(frozen=True)
class FimTokens:
    """The token ids of a model's prefix, suffix and middle markers."""

    prefix: int
    suffix: int
    middle: int

    def prompt_ids(self, prefix_ids: list[int], suffix_ids: list[int]) -> list[int]:
        """The PSM prompt: ``[PRE] + prefix_ids + [SUF] + suffix_ids + [MID]``."""
        return [self.prefix, *prefix_ids, self.suffix, *suffix_ids, self.middle]


def fim_tokens(tok: TextTokenizer) -> FimTokens | None:
    """The fill-in-the-middle tokens of ``tok``'s vocabulary, or None when it has none."""
    vocab = tok.hf_tokenizer.get_vocab()
    for spelling in FIM_SPELLINGS:
        ids = [i for i in (vocab.get(s) for s in spelling) if isinstance(i, int)]
        if len(ids) == len(spelling):
            return FimTokens(*ids)
    return None


def fim_prompt(tok: TextTokenizer, prompt: str | list[int], suffix: str) -> list[int] | None:
    """The token ids of a fill-in-the-middle prompt (``prompt`` as text or ids, then
    ``suffix``), with the BOS the model asks for first when ``prompt`` is text; None
    when ``tok`` has no FIM tokens."""
    fim = fim_tokens(tok)
    if fim is None:
        return None
    prefix_ids = tok.encode_plain(prompt) if isinstance(prompt, str) else list(prompt)
    ids = fim.prompt_ids(prefix_ids, tok.encode_plain(suffix))
    if isinstance(prompt, str) and tok.add_bos and tok.bos_token_id is not None:
        ids.insert(0, tok.bos_token_id)
    return ids
