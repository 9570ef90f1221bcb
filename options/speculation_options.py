"""Speculative decoding options: the "speculative decoding" group of ``houchu serve``'s
flags."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from houchu.options.bounds import checked

#: The ways to propose tokens (``speculative``).
METHODS = ("ngram", "draft", "mtp")


class SpeculativeOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Speculative decoding, read by the scheduler (``houchu.speculative.scheduling``), the
    launcher and the draft actor; each field is the ``houchu serve`` flag of its name.

    Attributes:
        speculative: "ngram" (prompt lookup), "draft" (``draft_model``), "mtp" (the
            checkpoint's own next-token-prediction layers, DeepSeek-V3's
            ``num_nextn_predict_layers``), or None (off).
        draft_model: the draft model's .gguf file or HF folder (absolute path), sharing
            the model's tokenizer.
        num_speculative_tokens: most proposals verified per request per step.
        speculative_max_batch: speculate only while at most this many requests decode
            (None: the break-even batch size measured at start-up and while serving).
    """

    speculative: Literal["ngram", "draft", "mtp"] | None = None
    draft_model: str | None = None
    num_speculative_tokens: Annotated[int, Meta(ge=1)] = 4
    speculative_max_batch: Annotated[int, Meta(ge=0)] | None = None

    @property
    def enabled(self) -> bool:
        """Whether speculative decoding is on."""
        return self.speculative is not None

    @property
    def proposes_in_runner(self) -> bool:
        """Whether the model runner makes the proposals ("mtp": from its own hidden
        states), so that no draft actor runs."""
        return self.speculative == "mtp"

    @property
    def uses_draft_actor(self) -> bool:
        """Whether a draft actor proposes ("ngram", "draft")."""
        return self.enabled and not self.proposes_in_runner

    def validate(self) -> None:
        """Raises:
        ValueError: speculation is off or unknown, or a field out of its bounds (the
            fields' own, ``houchu.options.bounds.checked``)."""
        if self.speculative not in METHODS:
            raise ValueError(
                f"speculative method must be one of {METHODS}, got {self.speculative!r}"
            )
        checked(self)
